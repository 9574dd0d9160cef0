"""anysoftmax's softmax as PyTorch operators with fakes (docs/kernels.md, "Operators"): ``anysoftmax::softmax``
-> (y, p_sink) and ``::softmax_backward`` -> (dx, ds); `registration` adds autograd, vmap and routing."""

from __future__ import annotations

from typing import Optional

import torch

from .. import dispatch
from ..core.lse_merge import row_shape
from ..core.spec import SoftmaxSpec, check_backward_args
from ..core.variant import causal_name, runtime_values
from ..dispatch import FusedArgs


def is_plain(mask, sinks, scale, softcap, causal: str, empty_rows: str) -> bool:
    """True when no fused keyword is set: the call is torch's softmax (`dispatch.forward`)."""
    return mask is None and sinks is None and scale is None and softcap is None and causal == "none" \
        and empty_rows == "zero"


def no_sinks(t: torch.Tensor) -> torch.Tensor:
    """The operators' second output without sinks: empty, of one shape for every rank."""
    return t.new_empty(0, dtype=torch.float32)


def run_forward(x, dim, dtype, log, mask, sinks, scale, softcap, causal, empty_rows, backend):
    """The forward operator's work without the operator: (y, p_sink or None) from dispatch."""
    if is_plain(mask, sinks, scale, softcap, causal, empty_rows):
        return dispatch.forward(x, dim, dtype, backend, log), None
    return dispatch.forward_fused(x, dim, dtype, backend, log, FusedArgs(scale, mask, causal, softcap, sinks,
                                                                         empty_rows))


def run_backward(grad, y, dim, log, x, p_sink, mask, sinks, scale, softcap, causal, empty_rows, backend):
    """The backward operator's work without the operator: (dx, ds or None) from dispatch."""
    if is_plain(mask, sinks, scale, softcap, causal, empty_rows):
        return dispatch.backward(y, grad, dim, log, backend), None
    return dispatch.backward_fused(grad, y, x, dim, log, FusedArgs(scale, mask, causal, softcap, sinks, empty_rows),
                                   p_sink if sinks is not None else None, backend)


def op_arguments(scale, softcap, causal):
    """(scale, softcap, causal) as the operators' schema takes them (validated)."""
    if scale is not None or softcap is not None:
        s, c = runtime_values(scale, softcap)
        scale, softcap = (None if scale is None else s), (None if softcap is None else c)
    return scale, softcap, causal_name(causal)


def fresh(*outputs: torch.Tensor, inputs=()) -> tuple[torch.Tensor, ...]:
    """`outputs`, contiguous, none sharing memory with another or with `inputs` (as an operator's)."""
    seen = {t.untyped_storage().data_ptr() for t in inputs if t is not None}
    out = []
    for t in outputs:
        t = t.contiguous()
        if t.untyped_storage().data_ptr() in seen:  # (empty tensors' storages all read 0: cloned, cheaply)
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out.append(t)
    return tuple(out)


def forward_spec(x, dim, dtype, log, mask, sinks, scale, softcap, causal, empty_rows) -> SoftmaxSpec:
    """The forward request's spec (its variant included), validated as in eager mode."""
    fused = FusedArgs(scale, mask, causal, softcap, sinks, empty_rows).as_kwargs()
    return SoftmaxSpec.from_request(x, dim, dtype, log=log, fused=fused)[0]


def backward_spec(grad, y, dim, log, mask, sinks, scale, softcap, causal, empty_rows) -> SoftmaxSpec:
    """The backward request's spec (of y), validated as in eager mode."""
    fused = FusedArgs(scale, mask, causal, softcap, sinks, empty_rows).as_kwargs()
    return check_backward_args(y, grad, dim, log, fused)


def sinks_rows(t: torch.Tensor, spec: SoftmaxSpec, sinks) -> torch.Tensor:
    """An empty per-row statistic (p_sink, ds) for `spec`, or the placeholder without sinks."""
    return t.new_empty(row_shape(spec.shape, spec.dim), dtype=spec.acc_dtype) if sinks is not None else no_sinks(t)


@torch.library.custom_op("anysoftmax::softmax", mutates_args=())
def softmax_op(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype] = None, log: bool = False,
               mask: Optional[torch.Tensor] = None, sinks: Optional[torch.Tensor] = None,
               scale: Optional[float] = None, softcap: Optional[float] = None, causal: str = "none",
               empty_rows: str = "zero", backend: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`anysoftmax.softmax` (`log_softmax` with `log`) as an operator: (y, p_sink)."""
    y, p = run_forward(x, dim, dtype, log, mask, sinks, scale, softcap, causal, empty_rows, backend)
    return fresh(y, no_sinks(x) if p is None else p)


@softmax_op.register_fake
def _softmax_fake(x, dim, dtype=None, log=False, mask=None, sinks=None, scale=None, softcap=None, causal="none",
                  empty_rows="zero", backend=None):
    spec = forward_spec(x, dim, dtype, log, mask, sinks, scale, softcap, causal, empty_rows)
    return x.new_empty(spec.shape, dtype=spec.out_dtype), sinks_rows(x, spec, sinks)


@torch.library.custom_op("anysoftmax::softmax_backward", mutates_args=())
def softmax_backward_op(grad: torch.Tensor, y: torch.Tensor, dim: int, log: bool = False,
                        x: Optional[torch.Tensor] = None, p_sink: Optional[torch.Tensor] = None,
                        mask: Optional[torch.Tensor] = None, sinks: Optional[torch.Tensor] = None,
                        scale: Optional[float] = None, softcap: Optional[float] = None, causal: str = "none",
                        empty_rows: str = "zero", backend: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of `softmax` from its output `y` and `grad`: (dx in y's dtype, ds)."""
    dx, ds = run_backward(grad, y, dim, log, x, p_sink, mask, sinks, scale, softcap, causal, empty_rows, backend)
    return fresh(dx, no_sinks(y) if ds is None else ds)


@softmax_backward_op.register_fake
def _softmax_backward_fake(grad, y, dim, log=False, x=None, p_sink=None, mask=None, sinks=None, scale=None,
                           softcap=None, causal="none", empty_rows="zero", backend=None):
    spec = backward_spec(grad, y, dim, log, mask, sinks, scale, softcap, causal, empty_rows)
    return y.new_empty(y.shape), sinks_rows(y, spec, sinks)
