"""The gloo tests' fixture of one rank, and the workers of those that need ranks to disagree
(`tests/distributed`): spawned processes import them from here."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist


@pytest.fixture
def one_rank(tmp_path):
    """A default process group of one gloo rank in this process (removed after the test): a
    call with sinks takes the sharded path there, whose result is the local op's."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1,
                            timeout=timedelta(seconds=60))
    yield
    dist.destroy_process_group()


def one_rank_sharded_launcher(x: torch.Tensor, *, want_lse: bool = False, slots: int = 8):
    """The triton backend's one-read sharded launcher of `x` (rows along dim 1, a scale) on one
    rank, whose mailbox of `slots` rows per half waits on no peer: `f(x, mask, sinks, scale,
    softcap, epoch, slot_base) -> (y, lse)`."""
    from anysoftmax.backends.triton.backend import TritonBackend

    words = torch.zeros(2 * slots, dtype=torch.int64, device=x.device)
    peers = torch.tensor([words.data_ptr()], dtype=torch.int64, device=x.device)
    run = TritonBackend.sharded_softmax_launcher(x, 1, log=False, has_scale=True, has_cap=False, mask=None,
                                                 has_sink=False, want_lse=want_lse, rank=0, world=1, words=words,
                                                 peers=peers)
    run.mailbox = (words, peers)  # (kept alive with the launcher: it holds their addresses)
    return run


def mismatched_rows(rank: int, init: str, out: str) -> None:
    """Rank r calls with r more rows than rank 0; writes the error each rank got to out.<r>."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    import anysoftmax.distributed as asd

    try:
        asd.softmax(torch.randn(3 + rank, 5), -1)
        message = "no error"
    except RuntimeError as exc:
        message = str(exc)
    with open(f"{out}.{rank}", "w") as f:
        f.write(message)
    dist.destroy_process_group()


# The ops that read a tensor's value on the host: on a GPU each waits for the stream, so one
# between the collectives would serialise the ranks.
HOST_SYNCS = ("aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::nonzero", "aten::tolist")
COLLECTIVE_PREFIXES = ("gloo:", "nccl:", "c10d::")


def _counts(fn, local_names: tuple[str, ...]):
    """Run `fn` once under torch.profiler: (collectives by name, host syncs by name outside the
    `local_names` ranges, host syncs inside them)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    collectives, ours, local = {}, {}, {}
    for e in prof.events():
        if e.name.startswith(COLLECTIVE_PREFIXES):
            collectives[e.name] = collectives.get(e.name, 0) + 1
        elif e.name in HOST_SYNCS:
            parent, inside = e.cpu_parent, False
            while parent is not None:
                inside = inside or parent.name in local_names
                parent = parent.cpu_parent
            where = local if inside else ours
            where[e.name] = where.get(e.name, 0) + 1
    return collectives, ours, local


def profiled_calls(rank: int, init: str, out: str) -> None:
    """For each call form: the collectives and host syncs of one forward and of one backward
    (after a warm-up call), written as JSON to out.<rank>. The local fused softmax and
    logsumexp run inside profiler ranges named "local": syncs there are the backend's."""
    import json

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    import anysoftmax.distributed as asd
    from anysoftmax.distributed import functions, states

    def ranged(fn):
        def run(*args, **kwargs):
            with torch.profiler.record_function("local"):
                return fn(*args, **kwargs)
        return run

    functions._local_softmax = ranged(functions._local_softmax)
    states._local_lse = ranged(states._local_lse)
    g = torch.Generator().manual_seed(rank)
    mask = torch.rand(4, 9, generator=g) < 0.5
    mask[0] = True  # (row 0 is empty on this rank: empty on both)
    forms = {
        "softmax": (asd.softmax, {}),
        "log_softmax-scale-softcap": (asd.log_softmax, {"scale": 0.5, "softcap": 3.0}),
        "softmax-sinks": (asd.softmax, {"sinks": torch.randn(4, 1, generator=g)}),
        "softmax-bool-nan": (asd.softmax, {"mask": mask, "empty_rows": "nan"}),
        "softmax-bool-uniform": (asd.softmax, {"mask": mask, "empty_rows": "uniform"}),
        "softmax-additive": (asd.softmax, {"mask": torch.randn(4, 9, generator=g)}),
        "logsumexp-sinks": (asd.logsumexp, {"sinks": torch.randn(4, 1, generator=g)}),
    }
    result = {}
    for name, (fn, kw) in forms.items():
        x = torch.randn(4, 9, generator=g, requires_grad=True)
        fn(x, -1, **kw).sum().backward()  # warm-up (plans, memos)
        y = None

        def forward():
            nonlocal y
            y = fn(x, -1, **kw)

        inference = _counts(lambda: fn(x.detach(), -1, **kw), ("local",))
        fwd = _counts(forward, ("local",))
        bwd = _counts(lambda: y.backward(torch.ones_like(y)), ("local",))
        result[name] = {"inference": inference, "forward": fwd, "backward": bwd}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def _split_sizes(vocab: int, world: int, g: torch.Generator) -> list[int]:
    """`world` shard sizes >= 1 summing to `vocab`, uneven."""
    cuts = sorted(torch.randperm(vocab - 1, generator=g)[:world - 1].add(1).tolist())
    return [b - a for a, b in zip([0] + cuts, cuts + [vocab])]


def _distinct_logits(rows: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    """Rows of distinct logits spaced 0.3 apart (no probability within rounding of another)."""
    return torch.stack([torch.randperm(vocab, generator=g) for _ in range(rows)]).float() * 0.3


def _near_boundary(x: torch.Tensor, kw: dict, margin: float = 1e-6) -> torch.Tensor:
    """[rows] bool: rows of `x` where, in float64, a token sits within `margin` (relative) of the
    top_k, top_p or min_p boundary of `kw` (a number each): either side is a float32 answer."""
    z = x.double() / kw.get("temperature", 1.0)
    zs = z.sort(-1, descending=True).values
    near = torch.zeros(len(z), dtype=torch.bool)
    k = kw.get("top_k")
    if k and k < z.shape[-1]:
        kth, nxt = zs[:, k - 1], zs[:, k]
        near |= (kth != nxt) & ((kth - nxt).abs() <= margin * kth.abs().clamp(min=1))
        zs = torch.where(zs >= kth[:, None], zs, -torch.inf)
    p = torch.softmax(zs, -1)
    top_p = kw.get("top_p")
    if top_p is not None and top_p < 1:
        near |= ((p.cumsum(-1) - p - top_p).abs() <= margin).any(-1)
    min_p = kw.get("min_p")
    if min_p:
        near |= ((p - min_p * p[:, :1]).abs() <= margin * p[:, :1]).any(-1)
    return near


def sampler_checks(rank: int, world: int, init: str, out: str, seed: int) -> None:
    """Every rank samples its shard of the same logits; the ids (the same on every rank) must
    equal `anysoftmax.sampling.sample` of the whole logits for the same seed and offset:
    exactly on distinct probabilities, in >= 99.9 % of rows on random ones; logprobs and top-n
    likewise. Writes the failures (one per line) to out.<rank>."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    import math

    import anysoftmax.distributed as asd
    import anysoftmax.sampling as sampling

    g = torch.Generator().manual_seed(seed)  # (the same on every rank: the same logits)
    failures = []

    def shard(x, sizes):
        start = sum(sizes[:rank])
        return x[..., start:start + sizes[rank]]

    def same_on_every_rank(t, what):
        every = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(every, t.contiguous())
        if not all(torch.equal(e, every[0]) for e in every):
            failures.append(f"{what}: the ranks returned different results")

    def compare(x, sizes, what, near_ties=False, **kw):
        ids, lp = asd.sample(shard(x, sizes), return_logprobs=True, **kw)
        want, want_lp = sampling.sample(x, return_logprobs=True, **kw)
        same_on_every_rank(ids, what)
        # Random logits: a row with a token within float32 rounding of a filter's boundary may keep
        # it or not (another id, or the same id under another normaliser); every other row is exact.
        exact = ~_near_boundary(x, kw) if near_ties else torch.ones(len(ids), dtype=torch.bool)
        if int((~exact).sum()) > max(1, len(ids) // 100):
            failures.append(f"{what}: {int((~exact).sum())} rows near a boundary: the test's margin is too wide")
        if not torch.equal(ids[exact], want[exact]):
            failures.append(f"{what}: ids differ from the unsharded sampler in {int((ids != want)[exact].sum())} rows")
        close = torch.isclose(lp, want_lp, rtol=1e-5, atol=2e-5) | (torch.isnan(lp) & torch.isnan(want_lp))
        if not bool(close[exact].all()):
            failures.append(f"{what}: return_logprobs differs from the unsharded sampler")

    rows, vocab = 48, 40
    sizes = _split_sizes(vocab, world, g)
    x = _distinct_logits(rows, vocab, g)
    per_row_t = torch.rand(rows, generator=g) + 0.2
    per_row_k = torch.randint(0, vocab + 3, (rows,), generator=g)
    seeds = torch.randint(-2**62, 2**62, (rows,), generator=g)
    for name, kw in {"plain": {}, "top_k": dict(top_k=5), "top_p": dict(top_p=0.6),
                     "all": dict(temperature=0.8, top_k=9, top_p=0.7, min_p=0.02),
                     "per-row": dict(temperature=per_row_t, top_k=per_row_k, top_p=torch.rand(rows, generator=g) * 0.9
                                     + 0.1, min_p=torch.rand(rows, generator=g) * 0.1),
                     "top_k-off": dict(top_k=vocab), "min_p": dict(min_p=0.3), "greedy": dict(temperature=0.0)}.items():
        for s, o in ((11, 0), (seeds, torch.arange(rows))):
            compare(x, sizes, f"distinct {name} seed={'per-row' if torch.is_tensor(s) else s}", seed=s, offset=o, **kw)
    # Ties: the k-th value tied across shards; greedy ties (lowest id); invalid rows.
    ties = torch.zeros(6, vocab)
    ties[:, ::3] = 1.0
    ties[1, -1] = math.nan
    ties[2] = -math.inf
    ties[3, 0] = math.inf
    lead = ties.clone()
    lead[:, 1] = 2.0  # (top-p on the top-k set counts every tied copy of the k-th value)
    compare(lead[[0, 4, 5]], sizes, "ties top_k then top_p", seed=6, top_k=2, top_p=0.45)
    for name, kw in {"ties top_k": dict(top_k=2), "ties top_p": dict(top_p=0.5),
                     "greedy": dict(temperature=torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 1.0]))}.items():
        compare(ties, sizes, name, seed=5, **kw)
    # Random logits: a token within float32 rounding of a boundary may go either way.
    xr = torch.randn(400, vocab, generator=g) * 3
    compare(xr, sizes, "random top_k top_p min_p", near_ties=True, seed=3, offset=2, top_k=7, top_p=0.8,
            min_p=0.01)
    compare(xr, sizes, "random top_p", near_ties=True, seed=4, top_p=0.9, temperature=1.5)
    # A flat row whose top-p set reaches below every shard's candidates: the rows are gathered.
    from anysoftmax.distributed.sampling import TOP_P_CANDIDATES

    wide = 2 * world * TOP_P_CANDIDATES
    flat = torch.randn(2, wide, generator=g) * 0.01
    compare(flat, _split_sizes(wide, world, g), "flat top_p (gathered)", seed=9, top_p=0.95)
    # No seed: every rank draws with rank 0's, which torch.manual_seed reproduces.
    torch.manual_seed(seed + rank)
    ids = asd.sample(shard(x, sizes), top_k=6)
    same_on_every_rank(ids, "no seed")
    if rank == 0:
        torch.manual_seed(seed)
        if not torch.equal(ids, sampling.sample(x, top_k=6)):
            failures.append("no seed: not the draw of rank 0's default generator")
    # logprobs and top-n.
    pick = torch.randint(0, vocab, (rows, 3), generator=g)
    for t in (None, 0.7, 0.0, per_row_t):
        got = asd.logprobs(shard(x, sizes), pick, temperature=t, top_n=5)
        want = sampling.logprobs(x, pick, temperature=t, top_n=5)
        what = f"logprobs temperature={'per-row' if torch.is_tensor(t) else t}"
        same_on_every_rank(got[2], what)
        for a, b, part in zip(got, want, ("values", "top values", "top ids")):
            if not torch.allclose(a.double(), b.double(), rtol=1e-5, atol=2e-5, equal_nan=True) \
                    or not torch.equal(a == -math.inf, b == -math.inf):
                failures.append(f"{what}: {part} differ from the unsharded logprobs")
    got = asd.logprobs(shard(ties, sizes), pick[:6], top_n=vocab)
    want = sampling.logprobs(ties, pick[:6], top_n=vocab)
    if not torch.equal(got[2], want[2]):
        failures.append("logprobs ties: top ids differ (by value, the lower id first)")
    # An empty shard: every rank raises, naming the shard sizes.
    try:
        asd.sample(x[..., :0] if rank == world - 1 else x, seed=1)
        failures.append("an empty shard was not refused")
    except ValueError as exc:
        if "shard sizes" not in str(exc):
            failures.append(f"an empty shard raised {exc!r}")
    with open(f"{out}.{rank}", "w") as f:
        f.write("\n".join(failures))
    dist.destroy_process_group()


def kernel_sampler_checks(rank: int, world: int, init: str, out: str, seed: int, words_all=None) -> None:
    """`anysoftmax.distributed.sample(..., backend="triton")` on equal shards of distinct
    logits: the ids (the same on every rank) and log-probabilities equal the gathered logits'
    `anysoftmax.sampling.sample` and the torch-ops path's, for number and per-row keywords,
    greedy rows, per-row seeds, no seed, a row the candidates cannot decide (the kernels give
    -2 there and the exact path draws it) and unequal shards (the exact path). Records which
    calls the kernels drew; writes the failures (one per line) to out.<rank>. `words_all`
    (int64 [world, words], shared memory): the workspaces cross through mailboxes in it (the
    exchange kernel, interpreted) instead of the all-gather."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    import anysoftmax.distributed as asd
    import anysoftmax.sampling as sampling
    from anysoftmax.distributed import kernel_sampling
    from anysoftmax.distributed import sampling as dsampling
    from anysoftmax.distributed.mailbox import Mailbox

    box = None
    if words_all is not None:
        cap = words_all.shape[1] // (2 * world)
        box = Mailbox(words_all[rank], torch.tensor([w.data_ptr() for w in words_all], dtype=torch.int64), cap, world)

        def shared(group, device, n_words, world_):
            assert n_words <= cap, f"the test's mailbox holds {cap} words a rank, the call needs {n_words}"
            return box

        kernel_sampling.mailbox_refusal = lambda device, world_: None
        kernel_sampling.symmetric = shared

    drawn = []  # (ids the kernels returned) per call that took them
    kernel_runner = kernel_sampling.runner

    def spied_runner(*a, **k):  # (every draw of the kernels goes through a runner's run)
        run = kernel_runner(*a, **k)
        return lambda *b: drawn.append(run(*b)) or drawn[-1]

    kernel_sampling.runner = spied_runner
    exact = []  # (calls of the torch-ops path)
    torch_sample = dsampling._torch_sample

    def spied_exact(*a, **k):
        exact.append(1)
        return torch_sample(*a, **k)

    dsampling._torch_sample = spied_exact
    g = torch.Generator().manual_seed(seed)  # (the same on every rank: the same logits)
    failures = []
    rows, shard_vocab = 12, 300  # (a chunk of 512 keeps 256 candidates: top-k serves k <= 128)
    vocab = world * shard_vocab
    x = _distinct_logits(rows, vocab, g)
    mine = x[:, rank * shard_vocab:(rank + 1) * shard_vocab]

    def check(what, kernels=True, undecided=0, shard=mine, **kw):
        drawn.clear()
        exact.clear()
        ids, lp = asd.sample(shard, backend="triton", return_logprobs=True, **kw)
        if kernels and bool(exact) != bool(undecided):
            failures.append(f"{what}: the torch-ops path {'ran' if exact else 'did not run'} for "
                            f"{undecided} undecided rows")
        ops_ids, ops_lp = asd.sample(shard, backend="torch", return_logprobs=True, **kw)
        want, want_lp = sampling.sample(x, return_logprobs=True, **kw)
        every = [torch.empty_like(ids) for _ in range(world)]
        dist.all_gather(every, ids)
        if not all(torch.equal(e, every[0]) for e in every):
            failures.append(f"{what}: the ranks returned different ids")
        if not torch.equal(ids, want) or not torch.equal(ids, ops_ids):
            failures.append(f"{what}: ids {ids.tolist()}, the gathered sample's {want.tolist()}, the torch-ops "
                            f"path's {ops_ids.tolist()}")
        # float32 z = x / temperature reaches a few hundred here: its rounding (2 ulps) bounds the error.
        t = kw.get("temperature")
        t_min = float(t[t > 0].min()) if torch.is_tensor(t) and bool((t > 0).any()) else t or 1.0
        atol = 2e-5 + 2 * 2.0**-23 * float(x.abs().max()) / t_min
        if not torch.allclose(lp, want_lp, rtol=1e-5, atol=atol) or not torch.allclose(lp, ops_lp, rtol=1e-5,
                                                                                       atol=atol):
            failures.append(f"{what}: return_logprobs {lp.tolist()} differ from {want_lp.tolist()}")
        if kernels != bool(drawn):
            failures.append(f"{what}: the shard kernels {'did not draw' if kernels else 'drew'}")
        elif drawn and int((drawn[0].ids == -2).sum()) != undecided:
            failures.append(f"{what}: {int((drawn[0].ids == -2).sum())} undecided rows, expected {undecided}")

    per_row = dict(temperature=torch.rand(rows, generator=g) + 0.3, top_k=torch.randint(0, 60, (rows,), generator=g),
                   top_p=torch.rand(rows, generator=g) * 0.8 + 0.2, min_p=torch.rand(rows, generator=g) * 0.05)
    seeds = torch.randint(-2**62, 2**62, (rows,), generator=g)
    for name, kw in {"plain": {}, "numbers": dict(temperature=0.8, top_k=9, top_p=0.7, min_p=0.02),
                     "top_p": dict(top_p=0.6), "per-row": per_row, "greedy": dict(temperature=0.0),
                     "greedy rows": dict(temperature=torch.tensor([0.0, 1.0] * (rows // 2)), top_k=5)}.items():
        for s, o in ((11, 0), (seeds, torch.arange(rows)), (5, 3)):
            check(f"{name} seed={'per-row' if torch.is_tensor(s) else s} offset={o if isinstance(o, int) else 'per-row'}",
                  seed=s, offset=o, **kw)
    # top_k above the candidates a chunk keeps: that row alone needs the whole row (-2).
    wide_k = torch.full((rows,), 4)
    wide_k[3] = 200
    check("a row the candidates cannot decide", undecided=1, seed=2, top_k=wide_k, top_p=0.95)
    # Unequal shards: the exact path, the same ids.
    if world == 2:
        cut = shard_vocab + 7
        check("unequal shards", kernels=False, shard=x[:, :cut] if rank == 0 else x[:, cut:], seed=4, top_k=7)
    # No seed: every rank draws with rank 0's, which torch.manual_seed reproduces.
    torch.manual_seed(seed + rank)
    ids = asd.sample(mine, top_k=6, top_p=0.8, backend="triton")
    every = [torch.empty_like(ids) for _ in range(world)]
    dist.all_gather(every, ids)
    if not all(torch.equal(e, every[0]) for e in every):
        failures.append("no seed: the ranks returned different ids")
    if rank == 0:
        torch.manual_seed(seed)
        if not torch.equal(ids, sampling.sample(x, top_k=6, top_p=0.8)):
            failures.append("no seed: not the draw of rank 0's default generator")
    if box is not None and box.epoch == 0:
        failures.append("the mailbox exchange never ran")
    with open(f"{out}.{rank}", "w") as f:
        f.write("\n".join(failures))
    dist.destroy_process_group()
