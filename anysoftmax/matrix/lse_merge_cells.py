"""Matrix cells of the pieces ops (`ops: [logsumexp, merge_states]`, `core.lse_merge`).

* `logsumexp`: the cell's shape and dim as for softmax; the result (float32/float64, a peer's
  in its own dtype) against the float64 reference. Bytes moved: the input plus one float per row.
* `merge_states`: the cell's shape is `[K, ..., D]`: K partials of `[..., D]` (random, in the
  cell's dtype) with float32 LSEs of `[...]` (random, spread like attention's); `dims` is not
  read (the merge is over the partials). Bytes: K partials and LSEs read, one of each written.

Forward only, plain variant only: a backward or fused cell of these ops is skipped with the
reason (their autograd and fused keywords are checked by the tests and the kit). Providers:
anysoftmax backends and `auto`; `peer:torch` (`torch.logsumexp`, or the merge formula in torch
ops), `peer:torch.compile` (the same, compiled) and `peer:copy` (a clone of the input).
"""

from __future__ import annotations

import math

import torch

from ..core.lse_merge import LOGSUMEXP, MERGE_STATES, logsumexp_request
from ..core.spec import TOLERANCES, SoftmaxSpec, parse_dtype
from ..testing.compare import Comparison, compare_logsumexp, compare_merge, compare_values, reference_logsumexp
from .cells import Cell

PIECES_OPS = (LOGSUMEXP, MERGE_STATES)


def refusal(cell: Cell) -> str | None:
    """Why a pieces cell is skipped before anything is allocated, or None."""
    if cell.op not in PIECES_OPS:
        return None
    if cell.direction != "forward":
        return f"{cell.op}: forward cells only (its autograd is checked by tests/api/test_lse_merge.py)"
    if not cell.variant.is_plain:
        return f"{cell.op}: plain cells only (the fused keywords are checked by the conformance kit)"
    if cell.op == MERGE_STATES and len(cell.shape) < 2:
        return "merge_states: a cell's shape is [K, ..., D] (at least 2 dims)"
    return None


def torch_merge(outs, lses):
    """merge_states as an engine writes it in torch ops, -inf guarded: the torch peer of the
    matrix and the bench."""
    L = torch.stack(lses)
    m = L.amax(0)
    ms = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(L - ms)
    s = w.sum(0)
    out = (torch.stack(outs).float() * (w / s).unsqueeze(-1)).sum(0)
    return out.to(outs[0].dtype), ms + torch.log(s)


def provider(cell: Cell, device: str):
    """fn(inputs) -> result of the cell's provider (inputs: x, or (outputs, lses))."""
    from . import providers

    import anysoftmax

    name, dim = cell.backend, cell.dim
    if not providers.is_peer(name):
        backend = providers.backend_argument(name)
        if cell.op == LOGSUMEXP:
            return lambda x: anysoftmax.logsumexp(x, dim, backend=backend)
        return lambda t: anysoftmax.merge_states(*t, backend=backend)
    peer = name[len(providers.PEER_PREFIX):]
    if peer == "copy":
        return (lambda x: x.clone()) if cell.op == LOGSUMEXP else (lambda t: [o.clone() for o in t[0]])
    fn = (lambda x: torch.logsumexp(x, dim)) if cell.op == LOGSUMEXP else (lambda t: torch_merge(*t))
    if peer == "torch":
        return fn
    if peer == "torch.compile":
        return providers.fresh_compiled(fn)
    from ..core.errors import UnsupportedRequestError
    raise UnsupportedRequestError(f"{name} has no {cell.op}")


def make_inputs(cell: Cell, device: str, seed: int):
    """The cell's input(s) from `seed`: x, or (K partials, K float32 LSEs)."""
    from .conformance import make_input

    dtype = parse_dtype(cell.dtype)
    if cell.op == LOGSUMEXP:
        return make_input(cell.shape, dtype, device, seed)
    k, rest = cell.shape[0], tuple(cell.shape[1:])
    outs = [make_input(rest, dtype, device, seed + i, scale=1.0) for i in range(k)]
    lses = [make_input(rest[:-1], torch.float32, device, seed + k + i) for i in range(k)]
    return outs, lses


def check(cell: Cell, device: str) -> tuple[Comparison, SoftmaxSpec]:
    """Run the cell once on fresh data and compare with the float64 reference: (verdict, a spec
    whose `tolerance` is the one applied)."""
    from .conformance import reference_device

    ref = reference_device(device)
    inputs = make_inputs(cell, device, cell.seed)
    got = provider(cell, device)(inputs)
    if cell.op == MERGE_STATES:
        spec = SoftmaxSpec.from_tensor(inputs[0][0], -1)
        if isinstance(got, list):  # the copy peer: nothing to check
            return Comparison(True, 0.0, 0.0), spec
        return compare_merge(got[0], got[1], *inputs, device=ref), spec
    x = inputs
    spec, _ = logsumexp_request(x, cell.dim)
    if got.shape == x.shape:  # the copy peer
        return Comparison(True, 0.0, 0.0), spec
    keep = got.unsqueeze(spec.dim) if x.dim() else got
    if keep.dtype == spec.acc_dtype:
        return compare_logsumexp(keep, x, spec, device=ref), spec
    # A peer's logsumexp in the input's dtype (torch.logsumexp): its own dtype's tolerance.
    expected = reference_logsumexp(x, spec, device=ref)
    scale = expected.abs().nan_to_num(0.0, 0.0, 0.0) + 4 * x.detach().to(ref).double().abs().amax(
        spec.dim, keepdim=True).nan_to_num(0.0, 0.0, 0.0)
    return compare_values(keep, expected.to(keep.dtype).double(), scale, TOLERANCES[keep.dtype]), spec


def bench_inputs(cell: Cell, device: str):
    """(inputs to rotate, fn(input), bytes read + written per call) of a pieces cell."""
    from .. import perf

    dtype = parse_dtype(cell.dtype)
    if cell.op == LOGSUMEXP:
        numel = math.prod(cell.shape)
        rows = numel // max(cell.shape[cell.dim], 1) if cell.shape else 1
        moved = numel * dtype.itemsize + rows * 4
    else:
        k, part = cell.shape[0], math.prod(cell.shape[1:])
        rows = part // cell.shape[-1]
        moved = (k + 1) * (part * dtype.itemsize + rows * 4)
    n = perf.rotation_count(moved)
    return [make_inputs(cell, device, cell.seed + 7 * j) for j in range(n)], provider(cell, device), moved


__all__ = ["PIECES_OPS", "bench_inputs", "check", "provider", "refusal"]
