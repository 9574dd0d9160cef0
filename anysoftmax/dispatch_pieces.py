"""From a pieces request (`core.pieces`: logsumexp, merge_states) to a backend's kernel.

Planned on every call for now (validation, selection, the backend's launch): cheap next to a
kernel launch, and one memo key for every op (`anysoftmax.core.request`) is to come. The one
place a key would be built is `_pieces_key`, unused until then.
"""

from __future__ import annotations

import torch

from .core import registry
from .core.pieces import LOGSUMEXP, MERGE_STATES, MergeSpec, logsumexp_formula, logsumexp_request, merge_formula
from .core.variant import runtime_values
from . import dispatch  # noqa: F401  (registers the backends' loader)


def _pieces_key(op: str, *tensors, backend=None):
    """The memo key of a pieces request (to be routed through `core.request` at merge): each
    tensor's layout, dtype, device and alignment, the backend choice and registry generation."""
    return (op, tuple(None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15)
                      for t in tensors), backend, registry.generation())


def logsumexp(x, dim, backend=None, *, scale=None, mask=None, causal=False, softcap=None, sinks=None) -> torch.Tensor:
    """logsumexp with keepdim (x's shape with size 1 in `dim`) in the accumulation dtype, no autograd."""
    dispatch._fresh()
    spec, operands = logsumexp_request(x, dim, scale=scale, mask=mask, causal=causal, softcap=softcap, sinks=sinks)
    if spec.needs_input_cast:
        raise TypeError(f"logsumexp: input dtype {x.dtype} is not floating")
    chosen = registry.select_op(LOGSUMEXP, spec, backend)
    s, c = runtime_values(scale, softcap)
    operands = operands._replace(scale=s, softcap=c)
    if spec.numel == 0 or x.dim() == 0:
        # Zero-length rows are -inf (s with a sink), no rows give an empty result: the formula
        # states both exactly; no kernel is launched for them.
        from dataclasses import replace
        v = replace(spec.variant, scale=None if spec.variant.scale is None else s,
                    softcap=None if spec.variant.softcap is None else c)
        return logsumexp_formula(x, v, spec.dim, mask, sinks, spec.acc_dtype)
    return chosen.run_logsumexp(x, spec, operands)


def merge_states(outputs, lses, backend=None, out=None, lse_out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of merge_states, no autograd; written into `out` / `lse_out` when given
    (validated by the caller: shapes [..., D] / [...], any strides)."""
    dispatch._fresh()
    spec = MergeSpec.from_tensors(outputs, lses)
    chosen = registry.select_op(MERGE_STATES, spec, backend)
    if spec.n_rows == 0 or spec.head_size == 0:
        o, lse = merge_formula(list(outputs), list(lses), spec.acc_dtype, spec.dtype, spec.out_lse_dtype)
        return (o if out is None else out.copy_(o)), (lse if lse_out is None else lse_out.copy_(lse))
    if out is None and lse_out is None:
        return chosen.run_merge_states(list(outputs), list(lses), spec)
    return chosen.run_merge_states(list(outputs), list(lses), spec, out=out, lse_out=lse_out)


__all__ = ["logsumexp", "merge_states"]
