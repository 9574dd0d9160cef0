"""From a pieces request (`core.pieces`: logsumexp, merge_states) to a backend's kernel.

Keyed and memoised exactly as softmax (`dispatch`): the key is `core.request.request_key`
with the op's direction (`LSE`, `MERGE`), the entry lives in dispatch's one memo, so a
repeated request costs a key, a lookup and the backend's launch: no validation, no selection.
"""

from __future__ import annotations

import torch

from .core import registry
from .core.pieces import LOGSUMEXP, MERGE_STATES, MergeSpec, logsumexp_formula, logsumexp_request, merge_formula
from .core.request import LSE, MERGE, Request, request_key
from .core.variant import NO_OPERANDS, Operands, runtime_values
from . import dispatch
from .dispatch import FusedArgs

_lookup = dispatch._lookup
_memo = dispatch._memo
stats = dispatch.stats


def _lse_entry(chosen, x, spec, mask, sinks):
    """`f(x, operands) -> lse` for one request: the formula for empty inputs (zero-length rows
    are -inf, or s with a sink; no rows give an empty result; no kernel is launched), else the
    backend's bound launcher when it offers one, else its per-call planner."""
    if spec.numel == 0 or x.dim() == 0:
        from dataclasses import replace
        v0 = spec.variant

        def formula(x, ops):
            v = replace(v0, scale=None if v0.scale is None else ops.scale,
                        softcap=None if v0.softcap is None else ops.softcap)
            return logsumexp_formula(x, v, spec.dim, ops.mask, ops.sinks, spec.acc_dtype)
        return formula
    make = getattr(chosen, "logsumexp_launcher", None)
    if make is not None:
        return make(x, spec, Operands(mask, sinks, 1.0, 1.0))
    run = chosen.run_logsumexp
    return lambda x, ops: run(x, spec, ops)


def logsumexp(x, dim, backend=None, *, scale=None, mask=None, causal=False, softcap=None, sinks=None) -> torch.Tensor:
    """logsumexp with keepdim (x's shape with size 1 in `dim`) in the accumulation dtype, no autograd."""
    a = FusedArgs(scale, mask, causal, softcap, sinks)
    hit = _lookup(request_key(LSE, x, dim, None, backend, False, None, a))
    if hit is None:
        dispatch._fresh()
        spec, _ = logsumexp_request(x, dim, scale=scale, mask=mask, causal=causal, softcap=softcap, sinks=sinks)
        if spec.needs_input_cast:
            raise TypeError(f"logsumexp: x dtype {x.dtype} is not floating")
        chosen = registry.select_op(LOGSUMEXP, spec, backend)
        request = Request.build(request_key(LSE, x, dim, None, backend, False, None, a), spec, LSE, backend,
                                x, mask, sinks)
        hit = _lse_entry(chosen, x, spec, mask, sinks)
        if request.key is not None:
            _memo.put(request.key, hit)
    else:
        stats["hits"] += 1
    if scale is None and softcap is None and mask is None and sinks is None:
        return hit(x, NO_OPERANDS)
    s, c = runtime_values(scale, softcap)
    return hit(x, Operands(mask, sinks, s, c))


def _merge_entry(chosen, outputs, lses, spec: MergeSpec):
    """`f(outputs, lses, out, lse_out) -> (out, lse)` for one request: the formula when there
    is nothing to merge, else the backend's bound launcher when it offers one, else its
    per-call planner."""
    if spec.n_rows == 0 or spec.head_size == 0:
        def formula(outputs, lses, out, lse_out):
            o, lse = merge_formula(list(outputs), list(lses), spec.acc_dtype, spec.dtype, spec.out_lse_dtype)
            return (o if out is None else out.copy_(o)), (lse if lse_out is None else lse_out.copy_(lse))
        return formula
    make = getattr(chosen, "merge_states_launcher", None)
    if make is not None:
        return make(outputs, lses, spec)
    run = chosen.run_merge_states

    def launch(outputs, lses, out, lse_out):
        if out is None and lse_out is None:  # (backends written before out= take no keywords)
            return run(list(outputs), list(lses), spec)
        return run(list(outputs), list(lses), spec, out=out, lse_out=lse_out)
    return launch


def merge_states(outputs, lses, backend=None, out=None, lse_out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of merge_states, no autograd; written into `out` / `lse_out` when given
    (validated by the caller: shapes [..., D] / [...], any strides)."""
    hit = _lookup(request_key(MERGE, outputs, lses, None, backend, False, out, None, lse_out))
    if hit is None:
        dispatch._fresh()
        spec = MergeSpec.from_tensors(outputs, lses)
        chosen = registry.select_op(MERGE_STATES, spec, backend)
        request = Request.build(request_key(MERGE, outputs, lses, None, backend, False, out, None, lse_out), spec,
                                MERGE, backend, *outputs, *lses, out, lse_out)
        hit = _merge_entry(chosen, outputs, lses, spec)
        if request.key is not None:
            _memo.put(request.key, hit)
    else:
        stats["hits"] += 1
    return hit(outputs, lses, out, lse_out)


__all__ = ["logsumexp", "merge_states"]
