"""The sampler over a vocabulary sharded across the ranks of a `torch.distributed` group:
`anysoftmax.distributed.sample` and `logprobs`, through two all-gathers of small tensors (row
states and candidates, then each shard's race winner), never the logits. The protocol, its
limits and its host reads: docs/sampling.md ("A sharded vocabulary"). On CUDA/ROCm logits the
Triton sampler's shard kernels draw instead (`kernel_sampling`); this path serves what they cannot.
"""

from __future__ import annotations

import dataclasses
import math
import weakref

import torch

from .. import sampling
from ..sampling.reference import scaled_logits, top_n_rows
from ..sampling.rng import MASK32, exponential_race, row_words
from ..core import registry
from ..core.cache import BoundedDict
from ..sampling.spec import KEYWORDS, SamplingSpec, SpecForm, check_ids, check_top_n, form_key, invalid_keyword_rows
from . import kernel_sampling
from .collective import forget_shard_sizes, gather_states, group_object, group_rank_and_size, shard_sizes

BACKENDS = (None, "torch", kernel_sampling.KERNEL_BACKEND)  # (None: the kernels on CUDA/ROCm logits)
TOP_P_CANDIDATES = 1024
_STATES = 4  # max z, sum exp(z - max), NaN/+inf held, count at the max


def _shard(who: str, logits, group):
    """(rank, world, every shard's size, this shard's first global id)."""
    rank, world = group_rank_and_size(group, who)
    if not isinstance(logits, torch.Tensor) or logits.dim() == 0:
        raise ValueError(f"{who}: logits_shard must be a tensor [..., V_r] (this rank's part of the vocabulary)")
    sizes = shard_sizes(logits.shape[-1], world, group, logits.device)
    if min(sizes) == 0:  # (every rank sees the sizes: every rank raises)
        raise ValueError(f"{who}: every rank's logits_shard needs at least one token; the shard sizes are "
                         f"{list(sizes)} (rank order)")
    return rank, world, sizes, sum(sizes[:rank])


def _merged_rows(who: str, every: torch.Tensor, sizes: tuple[int, ...], group, spec: SamplingSpec):
    """Every rank's row states merged from the first collective ([world, payload]: the [rows, 4]
    states first, the rank's shard size last): (max z, sum of exp(z - max) over the vocabulary,
    [rows, 1] invalid rows, count of tokens at the max). A rank's size other than the one exchanged
    before raises on the CPU (on every rank: they read the same values) and makes every row
    invalid on an accelerator (where that read would synchronise)."""
    sent = every[:, -1]
    changed = (sent != torch.tensor(sizes, dtype=sent.dtype, device=sent.device)).any()
    if sent.device.type == "cpu" and bool(changed):
        forget_shard_sizes(group)
        raise ValueError(f"{who}: the shard sizes are {[int(s) for s in sent.tolist()]}, not the {list(sizes)} "
                         f"exchanged for this rank's size: every rank must change its shard size in the same call")
    top_r, mass_r, bad, at_r = every[:, :spec.rows * _STATES].view(len(sizes), spec.rows, _STATES).unbind(-1)
    top = top_r.amax(0)
    mass = (mass_r * torch.exp(top_r - torch.where(torch.isfinite(top), top, 0))).sum(0)
    invalid = ((bad > 0).any(0) | (top == -math.inf))[:, None] | invalid_keyword_rows(spec) | changed
    return top, mass, invalid, torch.where(top_r == top, at_r, 0).sum(0)


def _row_states(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """([rows, 4] float64 states of this shard, z with NaN read as -inf)."""
    bad = (torch.isnan(z) | (z == math.inf)).any(-1)
    zc = torch.where(torch.isnan(z), -math.inf, z)
    top = zc.amax(-1, keepdim=True)
    mass = torch.exp(zc - torch.where(torch.isfinite(top), top, 0)).sum(-1)
    at_top = (zc == top).sum(-1)
    return torch.stack([top[:, 0].double(), mass.double(), bad.double(), at_top.double()], -1), zc



def _candidates(zc: torch.Tensor, count: int) -> torch.Tensor:
    """[rows, count + 1] float64: the shard's `count` largest z (-inf past its size) and how
    many of its tokens equal the last of them."""
    rows, vocab = zc.shape
    top = zc.topk(min(count, vocab), -1).values
    if count > vocab:
        top = torch.cat([top, top.new_full((rows, count - vocab), -math.inf)], -1)
    equal_last = (zc == top[:, -1:]).sum(-1, keepdim=True)
    return torch.cat([top.double(), equal_last.double()], -1)


def _cuts(cands: torch.Tensor, top: torch.Tensor, mass: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor,
          vocab: int, dtype: torch.dtype):
    """(k-th largest z, smallest z top-p keeps, rows top-p cannot be cut from the candidates),
    [rows, 1] each, from every shard's candidates [world, rows, C + 1]. Weights and masses in
    `dtype` (the sampler's compute dtype), summed in z's order as the unsharded sampler does."""
    values, equal_last = cands[..., :-1].to(dtype), cands[..., -1]
    world, rows, count = values.shape
    # The last candidate stands for every token of its shard equal to it (ties at the floor).
    copies = torch.ones_like(values)
    copies[..., -1] += (equal_last - (cands[..., :-1] == cands[..., -2:-1]).sum(-1)).to(dtype)
    base = torch.where(torch.isfinite(top), top, 0).to(dtype)
    weights = torch.exp(values - base[None, :, None]) * copies
    z_sorted, order = values.permute(1, 0, 2).reshape(rows, world * count).sort(dim=-1, descending=True, stable=True)
    w_sorted = weights.permute(1, 0, 2).reshape(rows, world * count).gather(-1, order)
    k_on = (k > 0) & (k < vocab)
    kth = torch.where(k_on, z_sorted.gather(-1, (k.clamp(1, world * count) - 1)), -math.inf)
    in_k = z_sorted >= kth
    total = torch.where(k_on, torch.where(in_k, w_sorted, 0).sum(-1, keepdim=True), mass[:, None].to(dtype))
    q = w_sorted / total
    before = q.cumsum(-1) - q
    starts = torch.ones_like(in_k)
    starts[:, 1:] = z_sorted[:, 1:] != z_sorted[:, :-1]
    position = torch.arange(world * count, device=q.device).expand(rows, -1)
    above = before.gather(-1, torch.where(starts, position, 0).cummax(-1).values)
    p_on = top_p < 1
    keep = in_k & (above < top_p) & (z_sorted > -math.inf)
    tau = torch.where(p_on, torch.where(keep, z_sorted, math.inf).amin(-1, keepdim=True), -math.inf)
    floor = values[..., -1].amax(0)[:, None]  # every token above it, on every shard, is a candidate
    mass_at_floor = torch.where(z_sorted >= floor, q, 0).sum(-1, keepdim=True)
    undecided = p_on & ~k_on & (mass_at_floor < top_p) & (torch.exp(floor - base[:, None]) > 0)
    return kth, tau, undecided


def _candidate_count(spec: SamplingSpec, vocab: int, widest: int) -> tuple[int, bool]:
    """(C, whether a row may have top_p without top_k): C is the largest top_k in use (a
    per-row tensor is read on the host), else `TOP_P_CANDIDATES` when top_p is on, else 0; at
    most the widest shard."""
    p_on = isinstance(spec.top_p, torch.Tensor) or spec.top_p < 1
    if isinstance(spec.top_k, torch.Tensor):
        k = spec.top_k
        largest = int(torch.where((k > 0) & (k < vocab), k, 0).max()) if k.numel() else 0
        alone = p_on
    else:
        largest = spec.top_k if 0 < spec.top_k < vocab else 0
        alone = p_on and not largest
    return min(largest if largest else TOP_P_CANDIDATES if p_on else 0, widest), alone


def _seed_words(words, spec: SamplingSpec) -> torch.Tensor:
    """This rank's batch seed as two exact float64 words (rank 0's serves every rank when the
    seed comes from each rank's default generator)."""
    seed = words[0][:1] if spec.rows else torch.zeros(1, dtype=torch.int64, device=spec.device)
    return torch.cat([(seed & MASK32).double(), ((seed >> 32) & MASK32).double()])


def _gathered_sample(logits, sizes, world, group, spec, seed, keywords, return_logprobs):
    """The whole rows, gathered (padded to the widest shard), sampled on every rank."""
    widest, rows = max(sizes), spec.rows
    x = logits.reshape(rows, -1).to(spec.compute_dtype)
    x = torch.cat([x, x.new_zeros(rows, widest - x.shape[-1])], -1)
    every = gather_states(x.reshape(-1), world, group).view(world, rows, widest)
    full = torch.cat([every[r, :, :n] for r, n in enumerate(sizes)], -1).reshape(*spec.batch_shape, sum(sizes))
    return sampling.sample(full, seed=seed, return_logprobs=return_logprobs, **keywords)


def uses_kernels(backend: str | None, device: torch.device) -> bool:
    """Whether `sample` tries the Triton shard kernels: named, or by default on CUDA/ROCm logits."""
    return backend == kernel_sampling.KERNEL_BACKEND or (backend is None and device.type == "cuda")


def sample(logits_shard: torch.Tensor, *, group=None, temperature=None, top_k=None, top_p=None, min_p=None,
           seed=None, offset=0, return_logprobs: bool = False, backend: str | None = None):
    """One token id per row, the same on every rank of `group`: the id `anysoftmax.sampling.sample`
    draws from the gathered logits for the same seed and offset, whose rank-r shard (the global
    ids ``[start_r, start_r + V_r)``, in rank order) is `logits_shard` ``[..., V_r]``. Keywords as
    there (the same on every rank); small collectives, never the logits. `backend`: "torch" (the
    torch-ops path), "triton" (the Triton sampler's shard kernels, the torch-ops path drawing what
    they cannot), None ("triton" on CUDA/ROCm logits, else "torch"): docs/sampling.md."""
    who = "anysoftmax.distributed.sample"
    if not isinstance(return_logprobs, bool):
        raise TypeError(f"{who}: return_logprobs must be a bool, got {type(return_logprobs).__name__}")
    values = (temperature, top_k, top_p, min_p, seed, offset)
    key = _run_key(logits_shard, values, backend)
    runs = _runs_of(group) if key is not None else None
    found = runs.get(key) if runs is not None else None
    if found is not None:  # (a repeated request: its runner, and only the call's values checked)
        form, shard, run = found
        done = run(logits_shard, form.read(values))
        return _finish(who, logits_shard, done, lambda: form.spec(values), shard, group, values,
                       return_logprobs)
    if backend not in BACKENDS:
        raise ValueError(f"{who}: backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    shard = rank, world, sizes, start = _shard(who, logits_shard, group)
    spec = SamplingSpec.from_request(who, logits_shard, **dict(zip(KEYWORDS, values)))
    if not uses_kernels(backend, spec.device) or kernel_sampling.refusal(spec, sizes) is not None:
        return _torch_sample(who, logits_shard, spec, shard, group, _keywords(values), return_logprobs)
    if seed is None:  # (every rank draws with rank 0's seed, agreed by a collective each call)
        done = kernel_sampling.draw(spec, logits_shard, start, sum(sizes), rank, world, group)
        return _finish(who, logits_shard, done, lambda: done.spec, shard, group, values, return_logprobs)
    run = kernel_sampling.runner(spec, start, sum(sizes), rank, world, group)
    if key is not None:
        _kernel_runs.setdefault(group_object(group), BoundedDict(maxsize=64)).put(
            key, (SpecForm(who, logits_shard, values), shard, run))
    done = run(logits_shard, [getattr(spec, name) for name in KEYWORDS])
    return _finish(who, logits_shard, done, lambda: spec, shard, group, values, return_logprobs)


# group -> {a request's key: (its form, the shard's (rank, world, sizes, start), the kernels'
# runner)}: what a repeated request of the shard kernels runs without building a `SamplingSpec`.
_kernel_runs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _runs_of(group):
    try:
        return _kernel_runs.get(group_object(group))
    except TypeError:  # (no group: `_shard` raises naming it)
        return None


def _run_key(logits_shard, values: tuple, backend) -> tuple | None:
    """A request's key in `_kernel_runs` (None: never kept): the logits' and keywords' form
    (`form_key`; the shard size among it), the backend asked for, the registry's generation."""
    key = form_key(logits_shard, values)
    return None if key is None else (backend, registry.current_generation[0], key)


def _keywords(values: tuple) -> dict:
    return dict(zip(("temperature", "top_k", "top_p", "min_p"), values[:4]), offset=values[5])


def _finish(who, logits_shard, done, spec_of, shard, group, values, return_logprobs):
    """`done`'s ids (and logprobs), the rows its candidates cannot decide drawn by the torch-ops
    path (`spec_of()`: the call's request, its seed the one every rank used)."""
    done, undecided = kernel_sampling.undecided_rows(done)
    ids, lp = done.ids, done.logprobs
    if undecided is not None:  # (every rank reads the same ids, so all take this branch)
        exact_ids, exact_lp = _torch_sample(who, logits_shard, spec_of(), shard, group, _keywords(values), True)
        ids, lp = torch.where(undecided, exact_ids, ids), torch.where(undecided, exact_lp, lp)
    return (ids, lp) if return_logprobs else ids


def _torch_sample(who, logits_shard, spec, shard, group, keywords, return_logprobs):
    """The torch-ops path of `sample` (the module's two collectives) for the validated `spec`."""
    _, world, sizes, start = shard
    seed = spec.seed
    vocab, dtype = sum(sizes), spec.compute_dtype
    z, greedy, _ = scaled_logits(logits_shard, spec, dtype)
    words = row_words(spec)
    states, zc = _row_states(z)
    count, p_alone = _candidate_count(spec, vocab, max(sizes))
    parts = [states.reshape(-1)]
    if count:
        parts.append(_candidates(zc, count).reshape(-1))
    parts += [_seed_words(words, spec), states.new_full((1,), spec.vocab)]
    every = gather_states(torch.cat(parts), world, group)
    top, mass, invalid, _ = _merged_rows(who, every, sizes, group, spec)
    if seed is None:  # every rank draws with rank 0's seed
        agreed = (every[0, -3].long() | (every[0, -2].long() << 32)).reshape(())
        words = (agreed.expand(spec.rows),) + words[1:]
    rows = spec.rows
    kth = tau = torch.full((rows, 1), -math.inf, dtype=dtype, device=z.device)
    if count:
        cands = every[:, rows * _STATES:rows * (_STATES + count + 1)].view(world, rows, count + 1)
        kth, tau, undecided = _cuts(cands, top, mass, spec.column("top_k"), spec.column("top_p"), vocab, dtype)
        if p_alone and bool((undecided & ~invalid & ~greedy).any()):  # (the host read deciding the gather)
            return _gathered_sample(logits_shard, sizes, world, group, spec,
                                    words[0][0] if seed is None else seed, keywords, return_logprobs)
    top_z = top.to(dtype)[:, None]
    w = torch.exp(zc - torch.where(torch.isfinite(top_z), top_z, 0))
    kept = (zc >= kth) & (zc >= tau) & (w >= spec.column("min_p")) & (w > 0)
    at_top = zc == top_z
    kept = torch.where(greedy, at_top, kept) & ~invalid
    ids, keys = exponential_race(zc, kept, words, start)
    # Greedy rows: the lowest global index at the max wins (key 0 beats a shard without one).
    first = at_top.to(torch.int8).argmax(-1) + start
    ids = torch.where(greedy[:, 0], first, ids)
    keys = torch.where(greedy[:, 0], torch.where(at_top.any(-1), 0.0, -math.inf).to(keys.dtype), keys)
    chosen_z = zc.gather(-1, (ids - start)[:, None])[:, 0]
    kept_mass = torch.where(kept, w, 0).sum(-1)
    draw = torch.stack([keys.double(), ids.double(), chosen_z.double(), kept_mass.double()], -1)
    keys_r, ids_r, z_r, mass_r = gather_states(draw.reshape(-1), world, group).view(world, rows, 4).unbind(-1)
    best = keys_r.amax(0)
    winner = torch.where(keys_r == best, ids_r, math.inf).amin(0)
    z_win = torch.where(ids_r == winner, z_r, 0).sum(0)
    lp = torch.where(greedy[:, 0], 0.0, z_win - top - torch.log(mass_r.sum(0)))
    bad = invalid[:, 0] | (best == -math.inf)
    ids = torch.where(bad, -1, torch.where(bad, 0, winner).long()).reshape(spec.batch_shape)
    if not return_logprobs:
        return ids
    return ids, torch.where(bad, math.nan, lp).to(torch.float32).reshape(spec.batch_shape)


def logprobs(logits_shard: torch.Tensor, ids: torch.Tensor, *, group=None, temperature=None, top_n: int = 0):
    """float32 log-probabilities of the global token `ids` (``logits.shape[:-1] + (K,)``, the
    same on every rank) under ``log_softmax(logits / temperature)`` of the whole vocabulary,
    whose rank-r shard is `logits_shard`; with ``top_n > 0`` also the top-n values and global
    ids, as `anysoftmax.sampling.logprobs`. One collective (two with top_n), never the logits."""
    who = "anysoftmax.distributed.logprobs"
    _, world, sizes, start = _shard(who, logits_shard, group)
    local = SamplingSpec.from_request(who, logits_shard, temperature=temperature)
    spec = dataclasses.replace(local, vocab=sum(sizes))  # (ids and top_n are global)
    flat_ids = check_ids(who, spec, ids)
    n = check_top_n(who, spec, top_n)
    z, greedy, _ = scaled_logits(logits_shard, local, local.compute_dtype)
    states, zc = _row_states(z)
    rows, mine = local.rows, flat_ids - start
    owned = (mine >= 0) & (mine < local.vocab)
    picked = torch.where(owned, z.gather(-1, mine.clamp(0, max(local.vocab - 1, 0))), 0).double()
    payload = torch.cat([states.reshape(-1), picked.reshape(-1), states.new_full((1,), local.vocab)])
    every = gather_states(payload, world, group)
    top, mass, invalid, at_top = _merged_rows(who, every, sizes, group, local)
    lse = (top + torch.log(mass))[:, None]
    limit = -torch.log(at_top)[:, None]  # temperature 0: -log n on the n tied maxima, -inf elsewhere
    z_ids = every[:, rows * _STATES:-1].view(world, *flat_ids.shape).sum(0)
    lp = torch.where(greedy, torch.where(z_ids == top[:, None], limit, -math.inf), z_ids - lse)
    in_range = (flat_ids >= 0) & (flat_ids < spec.vocab)
    lp = torch.where(invalid | ~in_range, math.nan, lp).to(torch.float32).reshape(ids.shape)
    if not n:
        return lp
    values, top_ids = _top_n(zc, top, lse, limit, greedy, invalid, n, start, world, group)
    shape = tuple(ids.shape[:-1]) + (n,)
    return lp, values.to(torch.float32).reshape(shape), top_ids.reshape(shape)


def _top_n(zc, top, lse, limit, greedy, invalid, n: int, start: int, world: int, group):
    """The global top-n log-probabilities and ids (by value, the lower id first among ties):
    each shard's top-n of its log-probabilities, gathered, merged on every rank."""
    rows, vocab = zc.shape
    lp = torch.where(greedy, torch.where(zc == top[:, None].to(zc.dtype), limit.to(zc.dtype), -math.inf),
                     zc - lse.to(zc.dtype))
    values, local_ids = top_n_rows(torch.where(invalid, 0, lp), min(n, vocab))
    pad = n - values.shape[-1]  # (a shard narrower than n: entries that sort last)
    values = torch.cat([values.double(), values.new_full((rows, pad), -math.inf, dtype=torch.float64)], -1)
    ids = torch.cat([(local_ids + start).double(), values.new_full((rows, pad), math.inf)], -1)
    every = gather_states(torch.cat([values, ids], -1).reshape(-1), world, group).view(world, rows, 2, n)
    values, ids = (every[:, :, i].permute(1, 0, 2).reshape(rows, world * n) for i in (0, 1))
    by_id = ids.argsort(dim=-1, stable=True)
    values, ids = values.gather(-1, by_id), ids.gather(-1, by_id)
    by_value = values.argsort(dim=-1, descending=True, stable=True)[:, :n]
    values, ids = values.gather(-1, by_value), ids.gather(-1, by_value)
    return torch.where(invalid, math.nan, values), torch.where(invalid, -1, ids.long())
