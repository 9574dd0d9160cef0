"""Conformance of `anysoftmax.distributed` (softmax, log_softmax, logsumexp over a dim sharded
across ranks), against the float64 reference of the *global* function.

    from anysoftmax.testing.distributed import check_distributed, spawn_checks
    failures = check_distributed(backend="mine")        # on every rank of an initialised group
    spawn_checks(world_size=3)                          # gloo on the CPU, one process per rank

Every rank makes the same global tensors from `seed`, takes its shard (uneven shards, empty
ones, split points drawn per case), runs forward and backward (eagerly, or through torch.func,
vmap or torch.compile: `ShardCase.mode`), and rank 0 checks the gathered shards with
`anysoftmax.testing.compare` (gradients of x, of an additive mask and of the sinks too). All
ranks return the same list of failures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from .compare import compare, compare_backward, compare_fused_backward, compare_mask_gradient
from ..core.reference import prologue
from ..core.spec import TOLERANCES, SoftmaxSpec
from ..core.variant import keep_mask

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
OPS = ("softmax", "log_softmax", "logsumexp")


@dataclass(frozen=True)
class ShardCase:
    """One global request, sharded along `dim`. `mask`: None, "bool" (some rows empty
    everywhere), "bool_rows" (a [rows, 1] mask broadcast along dim), "additive" (per element),
    "bias" (additive, broadcast over the rows); `special`: None, "neginf" (a row -inf on
    one rank), "nan", "posinf" (one element). `mode`: how the call and its gradient run: None
    (eager autograd), "func" (`torch.func.vjp`), "vmap" (`torch.func.vmap` over the leading dim,
    differentiated by `torch.func.vjp`), "compile" (`torch.compile(fullgraph=True)`, AOTAutograd
    without Inductor's codegen: the trace is what is checked). `dtypes`: the dtypes it runs in
    (None: every one asked for)."""

    name: str
    shape: tuple[int, ...]
    dim: int
    fused: dict = field(default_factory=dict)  # scale, softcap, sinks (bool), empty_rows
    mask: str | None = None
    special: str | None = None
    mode: str | None = None
    dtypes: tuple | None = None


CASES = (
    ShardCase("plain", (3, 17), -1),
    ShardCase("dim0", (13, 2, 3), 0),
    ShardCase("scale-softcap", (4, 19), 1, {"scale": 1.7, "softcap": 5.0}),
    ShardCase("bool-zero", (5, 16), -1, {"empty_rows": "zero"}, mask="bool"),
    ShardCase("bool-nan-sinks", (5, 16), -1, {"empty_rows": "nan", "sinks": True}, mask="bool"),
    ShardCase("bool-uniform", (2, 3, 15), -1, {"empty_rows": "uniform", "scale": 0.5}, mask="bool_rows"),
    ShardCase("additive-sinks", (2, 3, 14), -1, {"sinks": True, "softcap": 4.0}, mask="additive"),
    ShardCase("bias", (4, 18), -1, {"scale": 2.0}, mask="bias"),
    ShardCase("neginf-shard", (3, 16), -1, special="neginf"),
    ShardCase("nan-posinf", (4, 16), -1, {"sinks": True}, special="nan"),
    # Rows a broadcast bool mask empties on every rank, with sinks: logsumexp is the sink there.
    ShardCase("bool-rows-sinks", (3, 2, 13), -1, {"sinks": True, "scale": 0.7}, mask="bool_rows"),
    # torch.func, vmap and torch.compile take the all-gather path (docs/semantics.md).
    ShardCase("func-vjp", (3, 15), -1, {"sinks": True, "softcap": 4.0}, mask="additive", mode="func",
              dtypes=(torch.float32,)),
    ShardCase("vmap", (2, 3, 14), -1, {"sinks": True, "empty_rows": "uniform"}, mask="bool", mode="vmap",
              dtypes=(torch.float32,)),
    ShardCase("compile", (4, 13), 1, {"sinks": True, "scale": 0.5}, mode="compile", dtypes=(torch.float32,)),
)
MODES = (None, "func", "vmap", "compile")


def _split(n: int, world: int, g: torch.Generator) -> list[int]:
    """Uneven shard sizes summing to n; in two cases of three one shard (any) is empty."""
    edges = [0] + sorted(torch.randint(0, n + 1, (world - 1,), generator=g).tolist()) + [n]
    if world > 1 and torch.randint(0, 3, (1,), generator=g).item():
        k = torch.randint(0, world, (1,), generator=g).item()
        if k == world - 1:
            edges[k] = n  # the last shard empty
        else:
            edges[k + 1] = edges[k]  # shard k empty
        edges = sorted(edges)
    return [b - a for a, b in zip(edges, edges[1:])]


def _operands(case: ShardCase, dtype, g: torch.Generator):
    """The global x, mask, sinks and upstream gradient of `case` (same on every rank)."""
    shape, dim = case.shape, case.dim % len(case.shape)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2).to(dtype)
    rows = tuple(1 if d == dim else s for d, s in enumerate(shape))
    mask = None
    if case.mask == "bool":
        mask = torch.rand(shape, generator=g) < 0.4
        mask.narrow(1 if dim == 0 else 0, 0, 1).fill_(True)  # the first rows empty on every rank
    elif case.mask == "bool_rows":
        mask = torch.rand(rows, generator=g) < 0.5
        mask.view(-1)[0] = True
    elif case.mask == "additive":
        mask = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    elif case.mask == "bias":
        mask = torch.randn(tuple(1 if d != dim else s for d, s in enumerate(shape)), generator=g,
                           dtype=torch.float64).to(torch.float32)
    sinks = torch.randn(rows, generator=g, dtype=torch.float64).to(dtype) if case.fused.get("sinks") else None
    if case.special == "neginf":
        x.narrow(0, 0, 1).fill_(-math.inf)  # a row of only -inf: NaN, as torch
        x.narrow(0, 1, 1).narrow(dim, 0, max(1, shape[dim] // 2)).fill_(-math.inf)
    elif case.special == "nan":
        x.view(-1)[3] = math.nan
        x.view(-1)[-2] = math.inf
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return x, mask, sinks, dy


def _shard(t, full: int, dim: int, off: int, n: int):
    """This rank's part of `t` (None stays None); `t` broadcast along dim (size 1 there, the
    global length `full` is not) is the same on every rank."""
    if t is None or t.shape[dim] == 1 and full != 1:
        return t
    return t.narrow(dim, off, n)


def _run_case(case: ShardCase, op: str, dtype, seed: int, backend, group, rank: int, world: int, device=None):
    import anysoftmax.distributed as asd

    g = torch.Generator().manual_seed(seed)
    host = _operands(case, dtype, g)  # made on the CPU (the same on every rank), run on `device`
    x, mask, sinks, dy = (None if t is None else t.to(device or "cpu") for t in host)
    dim = case.dim % x.dim()
    sizes = _split(x.shape[dim], world, g)
    off = sum(sizes[:rank])
    xs = x.narrow(dim, off, sizes[rank]).clone().requires_grad_()
    ms = _shard(mask, x.shape[dim], dim, off, sizes[rank])
    if ms is not None:
        ms = ms.clone().requires_grad_(ms.dtype.is_floating_point)
    ss = None if sinks is None else sinks.clone().requires_grad_()
    kw = {k: v for k, v in case.fused.items() if k != "sinks"}
    if op == "logsumexp":
        kw.pop("empty_rows", None)
        fn = asd.logsumexp
    else:
        fn = asd.log_softmax if op == "log_softmax" else asd.softmax
    named = [(n, t) for n, t in (("x", xs), ("mask", ms), ("sinks", ss)) if t is not None and t.requires_grad]
    out, pullback = _run_mode(case, fn, xs, ms, ss, group, backend, kw, [n for n, _ in named])
    if op == "logsumexp":
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
        grad_out = grad_out.to(device=out.device, dtype=out.dtype)
    else:
        grad_out = dy.narrow(dim, off, sizes[rank])
    got = dict(zip([n for n, _ in named], pullback(grad_out)))
    return {"out": out.detach(), "dx": got.get("x"), "dmask": got.get("mask"), "dsinks": got.get("sinks"),
            "grad_out": grad_out, "sizes": sizes}, (*host, dim)


def _run_mode(case: ShardCase, fn, xs, ms, ss, group, backend, kw: dict, names: list[str]):
    """(this rank's result, pullback: its gradient -> the gradients of the operands `names`)
    of `fn` on the shards, run the way `case.mode` says."""
    operands = {"x": xs, "mask": ms, "sinks": ss}
    primals = [operands[n] for n in names]

    def call(x, mask, sinks, dim=case.dim):
        return fn(x, dim, group=group, mask=mask, sinks=sinks, backend=backend, **kw)

    if case.mode is None or case.mode == "compile":
        run = call if case.mode is None else torch.compile(call, fullgraph=True, backend="aot_eager")
        out = run(xs, ms, ss)
        return out, lambda g: torch.autograd.grad(out, primals, g)
    if case.mode == "vmap":  # over the leading dim: the operands that have it batched, the rest broadcast
        if case.dim % len(case.shape) == 0:
            raise ValueError(f"case {case.name!r}: vmap runs over dim 0, the sharded dim must be another")
        in_dims = tuple(0 if t is not None and t.dim() == len(case.shape) and t.shape[0] == case.shape[0] else None
                        for t in (xs, ms, ss))
        sample_dim = case.dim if case.dim < 0 else case.dim - 1
        call = torch.func.vmap(lambda x, mask, sinks: fn(x, sample_dim, group=group, mask=mask, sinks=sinks,
                                                         backend=backend, **kw), in_dims=in_dims)
    elif case.mode != "func":
        raise ValueError(f"case {case.name!r}: unknown mode {case.mode!r} (one of {MODES})")

    def differentiable(*diff):
        given = dict(operands, **dict(zip(names, diff)))
        return call(given["x"], given["mask"], given["sinks"])

    return torch.func.vjp(differentiable, *[t.detach() for t in primals])


def _reference_lse(x, spec: SoftmaxSpec, mask, sinks):
    """The global logsumexp in float64 (differentiable in x, mask and sinks)."""
    z = prologue(x, spec.variant, mask, torch.float64)
    keep = keep_mask(tuple(z.shape), spec.variant, mask, z.device)
    if keep is not None:
        z = z.masked_fill(~keep, -math.inf)
    terms = z if sinks is None else torch.cat([z, sinks.to(torch.float64).expand(
        tuple(1 if d == spec.dim else s for d, s in enumerate(z.shape)))], spec.dim)
    lse = torch.logsumexp(terms, spec.dim)
    if keep is not None and sinks is None:  # (a row with nothing kept but its sink s is s)
        lse = lse.masked_fill(~keep.any(spec.dim), -math.inf)
    return lse


def _close(got, want, bound, what):
    got, want = got.to(torch.float64), want.to(torch.float64)
    if not torch.equal(torch.isnan(got), torch.isnan(want)):
        return f"{what}: NaN where the reference has none (or the reverse)"
    inf = torch.isinf(want)
    if not torch.equal(got[inf], want[inf]) or torch.isinf(got[~inf]).any():
        return f"{what}: infinities differ from the reference"
    fin = torch.isfinite(want)
    err = (got - want).abs()[fin]
    ratio = (err / bound.expand(want.shape)[fin]).max().item() if err.numel() else 0.0
    return None if ratio <= 1.0 else f"{what}: error {err.max().item():.3g} is {ratio:.3g}x the bound"


def _check_lse(parts, x, mask, sinks, dim, spec: SoftmaxSpec, backward: bool) -> list[str]:
    bad = []
    acc = spec.acc_dtype
    eps = torch.finfo(acc).eps
    x64 = x.to(torch.float64).requires_grad_()
    s64 = None if sinks is None else sinks.to(torch.float64).requires_grad_()
    m64 = None if mask is None else (mask if mask.dtype == torch.bool else mask.to(torch.float64).requires_grad_())
    want = _reference_lse(x64, spec, m64, s64)
    zmax = prologue(x64.detach(), spec.variant, None if m64 is None else m64.detach(), torch.float64).abs()
    zmax = zmax.nan_to_num(0, 0, 0).amax(dim)
    bound = 16 * eps * (1 + zmax + math.log(max(x.shape[dim], 1) + 1))
    for r, p in enumerate(parts):
        if p["out"].dtype != acc:
            bad.append(f"rank {r}: logsumexp dtype {p['out'].dtype} != {acc}")
        why = _close(p["out"], want.detach(), bound, f"rank {r}: logsumexp")
        if why:
            bad.append(why)
    if not backward:
        return bad
    g = parts[0]["grad_out"].to(torch.float64)
    wants = [t for t in (x64, m64, s64) if t is not None and t.requires_grad]
    exp = dict(zip([n for n, t in (("x", x64), ("mask", m64), ("sinks", s64)) if t is not None and t.requires_grad],
                   torch.autograd.grad(want, wants, g.masked_fill(torch.isinf(want), 0.0))))
    # Bounds: the rounding of the result to x's dtype (2 rtol), atol, and the error of the
    # global softmax p the gradient is made of: its log carries ~eps (1 + |z|) from the
    # prologue and the states (times softcap's factor, itself rounded absolutely).
    tol = TOLERANCES[x.dtype]
    v = spec.variant
    scale = 1.0 if v.scale is None else abs(v.scale)
    z = prologue(x64.detach(), v, None if m64 is None else m64.detach(), torch.float64)
    p = torch.exp(z - want.detach().unsqueeze(dim)).nan_to_num(0.0)
    gb = g.unsqueeze(dim).abs()
    slack = 16 * eps * gb * p * (1 + z.abs().nan_to_num(0.0, 0.0, 0.0))
    arg = (x64.detach() * (1.0 if v.scale is None else v.scale) / (v.softcap or 1.0)).abs()
    dx = torch.cat([p["dx"] for p in parts], dim)
    # The rounding to x's dtype near zero is absolute: half a subnormal step (float16: 3e-8),
    # whatever g's size (atol · |g| alone fails a correctly rounded float16 subnormal).
    sub = torch.finfo(x.dtype).smallest_normal * torch.finfo(x.dtype).eps
    bx = tol.atol * gb * max(1.0, scale) + sub + 2 * tol.rtol * exp["x"].abs() + slack * scale * (1 + arg)
    why = _close(dx, exp["x"], bx, "logsumexp dx")
    if why:
        bad.append(why)
    if "mask" in exp:
        if mask.dim() == x.dim() and mask.shape[dim] == x.shape[dim]:
            dmask = torch.cat([p["dmask"] for p in parts], dim)
        else:
            dmask = sum(p["dmask"] for p in parts)
        # (+ the absolute rounding near zero to the mask's dtype, as for dx: a float16 dmask of
        # -9.0e-8 is correctly -1.2e-7, its nearest subnormal)
        mi = torch.finfo(mask.dtype)
        bm = (tol.atol * gb + 2 * tol.rtol * gb * p + slack).sum_to_size(mask.shape) \
            + 2 * mi.eps * exp["mask"].abs() + mi.smallest_normal * mi.eps
        why = _close(dmask, exp["mask"], bm, "logsumexp dmask")
        if why:
            bad.append(why)
    if "sinks" in exp:
        for r, p in enumerate(parts):
            why = _close(p["dsinks"], exp["sinks"], tol.atol + 4 * tol.rtol * exp["sinks"].abs() + 16 * eps * g.abs()
                         .reshape(exp["sinks"].shape), f"rank {r}: logsumexp dsinks")
            if why:
                bad.append(why)
    return bad


def _check_softmax(parts, x, mask, sinks, dy, dim, log: bool, fused: dict, backward: bool) -> list[str]:
    y = torch.cat([p["out"] for p in parts], dim)
    spec, _ = SoftmaxSpec.from_request(x, dim, None, log=log, fused=dict(fused, mask=mask, sinks=sinks))
    res = compare(y, x, spec, mask=mask, sinks=sinks)
    bad = [] if res.ok else [f"forward: {res.detail}"]
    if not backward:
        return bad
    dx = torch.cat([p["dx"] for p in parts], dim)
    if spec.is_plain:
        res = compare_backward(dx, y, dy, spec)
        bad += [] if res.ok else [f"dx: {res.detail}"]
        return bad
    for r, p in enumerate(parts):  # sinks are replicated: every rank holds the whole gradient
        res = compare_fused_backward(dx, y, dy, x, spec, mask, sinks, p["dsinks"])
        bad += [] if res.ok else [f"rank {r}: dx/dsinks: {res.detail}"]
    if mask is not None and mask.dtype.is_floating_point:
        if mask.dim() == x.dim() and mask.shape[dim] == x.shape[dim]:
            dmask = torch.cat([p["dmask"] for p in parts], dim)
        else:  # shared by the ranks: each holds its part
            dmask = sum(p["dmask"] for p in parts)
        res = compare_mask_gradient(dmask, y, dy, x, spec, mask, sinks)
        bad += [] if res.ok else [f"dmask: {res.detail}"]
    return bad


def _check(case: ShardCase, op: str, parts, x, mask, sinks, dy, dim) -> list[str]:
    x, mask, sinks, dy = (None if t is None else t.cpu() for t in (x, mask, sinks, dy))
    if op == "logsumexp":
        spec, _ = SoftmaxSpec.from_request(x, dim, fused=dict(case.fused, sinks=sinks, mask=mask, empty_rows="zero"))
        return _check_lse(parts, x, mask, sinks, dim, spec, backward=case.special is None)
    fused = {k: v for k, v in case.fused.items() if k != "sinks"}
    return _check_softmax(parts, x, mask, sinks, dy, dim, op == "log_softmax", fused, backward=case.special is None)


def check_distributed(backend: str | None = None, *, group=None, seed: int = 0, dtypes=DTYPES, ops=OPS,
                      cases=CASES) -> list[str]:
    """Run every (case, op, dtype) on this rank of `group` (an initialised process group;
    CPU tensors for gloo, this rank's GPU for NCCL: the current CUDA device) and return the
    failures (the same list on every rank; empty when everything matches)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else None
    failures = []
    for i, case in enumerate(cases):
        for op in ops:
            for j, dtype in enumerate(dtypes):
                if case.dtypes is not None and dtype not in case.dtypes:
                    continue
                case_seed = seed * 1000003 + i * 97 + j
                name = f"{case.name}/{op}/{str(dtype).removeprefix('torch.')}"
                try:
                    part, (x, mask, sinks, dy, dim) = _run_case(case, op, dtype, case_seed, backend, group, rank,
                                                                world, device)
                    part = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in part.items()}
                except Exception as exc:  # noqa: BLE001 - reported, with the case's name
                    part, x = {"error": f"{type(exc).__name__}: {exc}"}, None
                parts = [None] * world
                dist.all_gather_object(parts, part, group=group)
                bad = [f"rank {r}: {p['error']}" for r, p in enumerate(parts) if "error" in p]
                if not bad and rank == 0:
                    try:
                        bad = _check(case, op, parts, x, mask, sinks, dy, dim)
                    except Exception as exc:  # noqa: BLE001 - a check that crashes is a failure, on every rank
                        bad = [f"the check raised {type(exc).__name__}: {exc}"]
                failures += [f"{name} (shards {parts[0].get('sizes')}): {b}" for b in bad]
    verdict = [failures]
    dist.broadcast_object_list(verdict, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    return verdict[0]


def _worker(rank: int, world: int, init: str, backend, seed: int, out: str, kw: dict):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=120))
    try:
        failures = check_distributed(backend, seed=seed, **kw)
        if rank == 0:
            with open(out, "w") as f:
                f.write("\n".join(failures))
    finally:
        dist.destroy_process_group()


def spawn_checks(world_size: int, backend: str | None = None, *, seed: int = 0, quick: bool = False,
                 timeout: float = 300.0, **kw) -> list[str]:
    """`check_distributed` in `world_size` new processes over gloo on the CPU (rendezvous in a
    temporary file); returns the failures. `quick`: float32 and bfloat16 only; `kw` passes
    `dtypes`, `ops`, `cases` on. A process that dies or hangs past `timeout` seconds raises."""
    if quick:
        kw.setdefault("dtypes", DTYPES[:2])
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/failures.txt"
        run_ranks(_worker, world_size, (world_size, f"file://{tmp}/rendezvous", backend, seed, out, kw), timeout)
        text = open(out).read()
    return [line for line in text.splitlines() if line]


def _run_rank(rank: int, fn, args: tuple, finished: str) -> None:
    """One rank of `run_ranks`: ``fn(rank, *args)``, then a mark that it finished, then an exit
    that skips the interpreter's teardown."""
    import os
    import sys

    fn(rank, *args)
    open(os.path.join(finished, f"rank{rank}"), "w").close()
    sys.stdout.flush()
    sys.stderr.flush()
    # The rank's work is done and its results written. Tearing the interpreter down would run the
    # destructors of torch's C++ singletons and threads, which on a loaded machine can abort the
    # process ("terminate called without an active exception") after everything it was asked
    # for succeeded; os._exit ends it without them.
    os._exit(0)


def run_ranks(fn, world_size: int, args: tuple, timeout: float = 300.0) -> None:
    """``fn(rank, *args)`` in `world_size` new processes (spawned), waited for; a process that
    dies raises (naming the ranks that had finished `fn`), one still running after `timeout`
    seconds is killed and TimeoutError raised. `fn` must be importable (spawn pickles it)."""
    import os
    import tempfile
    import time

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as finished:
        ctx = mp.start_processes(_run_rank, args=(fn, args, finished), nprocs=world_size, join=False,
                                 start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() > deadline:
                    for p in ctx.processes:
                        p.kill()
                    raise TimeoutError(f"{world_size} processes still running after {timeout:g} s")
        except mp.ProcessExitedException as exc:
            done = sorted(int(name.removeprefix("rank")) for name in os.listdir(finished))
            raise RuntimeError(f"{exc} (ranks that had finished {getattr(fn, '__name__', fn)}: "
                               f"{done or 'none'})") from exc
