"""anysoftmax as PyTorch operators: ``torch.ops.anysoftmax.softmax``, ``.log_softmax`` and
``.softmax_backward`` (registered with `torch.library.custom_op`).

Why operators: `torch.compile` cannot trace into a backend (registry lookups, Triton launches,
IREE calls), and a graph break per softmax would split every attention block. As opaque
operators with fake (meta) implementations the compiler sees only shapes and dtypes, keeps one
graph, and calls the real implementation at run time; autograd is registered on the operator,
so compiled and eager training share one backward (`softmax_backward`, itself an operator).

Outputs are always fresh contiguous tensors (the fake implementations promise exactly that).

The fused family (`core.variant`) has its own pair: ``anysoftmax::softmax_fused`` returns
(y, p_sink) — p_sink being each row's sink share in the accumulation dtype (float32; float64
for float64 outputs), the one statistic the sinks' gradient needs ([0]-shaped without sinks) — and ``anysoftmax::softmax_fused_backward`` returns
(dx, per-row dsinks).

This module only defines the operators (a leaf: it imports dispatch and core). Their autograd,
vmap rules and torch.compile routing are registered on top of it by `anysoftmax.registration`,
which imports this module, `autodiff`, `batching` and (when a graph is traced) `traced_ops`.
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import dispatch
from ..core.spec import SoftmaxSpec, check_backward_args
from ..dispatch import FusedArgs


def _contiguous(y: torch.Tensor) -> torch.Tensor:
    # Backends return row-major outputs already; this only guards the fake/real contract.
    return y if y.is_contiguous() else y.contiguous()


def _forward_impl(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], backend: Optional[str],
                  log: bool) -> torch.Tensor:
    return _contiguous(dispatch.forward(x, dim, dtype, backend, log))


def _forward_fake(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], backend: Optional[str],
                  log: bool) -> torch.Tensor:
    # The same validation as eager, at trace time: a bad dim or dtype fails while compiling.
    spec = SoftmaxSpec.from_tensor(x, dim, dtype, log=log)
    return x.new_empty(spec.shape, dtype=spec.out_dtype)


@torch.library.custom_op("anysoftmax::softmax", mutates_args=())
def softmax_op(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype] = None,
               backend: Optional[str] = None) -> torch.Tensor:
    """`anysoftmax.softmax` as an operator (same arguments)."""
    return _forward_impl(x, dim, dtype, backend, log=False)


@torch.library.custom_op("anysoftmax::log_softmax", mutates_args=())
def log_softmax_op(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype] = None,
                   backend: Optional[str] = None) -> torch.Tensor:
    """`anysoftmax.log_softmax` as an operator (same arguments)."""
    return _forward_impl(x, dim, dtype, backend, log=True)


@softmax_op.register_fake
def _softmax_fake(x, dim, dtype=None, backend=None):
    return _forward_fake(x, dim, dtype, backend, log=False)


@log_softmax_op.register_fake
def _log_softmax_fake(x, dim, dtype=None, backend=None):
    return _forward_fake(x, dim, dtype, backend, log=True)


@torch.library.custom_op("anysoftmax::softmax_backward", mutates_args=())
def softmax_backward_op(grad: torch.Tensor, y: torch.Tensor, dim: int, log: bool,
                        backend: Optional[str] = None) -> torch.Tensor:
    """Gradient w.r.t. the input of softmax (`log`: log_softmax) from its output `y` and the
    output gradient `grad`, in `y`'s dtype (argument order of aten's _softmax_backward_data)."""
    return _contiguous(dispatch.backward(y, grad, dim, log=log, backend=backend))


@softmax_backward_op.register_fake
def _softmax_backward_fake(grad, y, dim, log, backend=None):
    check_backward_args(y, grad, dim, log)
    return y.new_empty(y.shape)



# ---- the fused family -------------------------------------------------------------------------

def _fused_args(mask, sinks, scale, softcap, causal, empty_rows) -> FusedArgs:
    return FusedArgs(scale, mask, causal, softcap, sinks, empty_rows)


def _no_sinks(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(0, dtype=torch.float32)


def row_shape(shape, dim: int) -> tuple:
    """x's shape with size 1 in `dim`: the shape of per-row statistics."""
    return tuple(1 if d == dim else s for d, s in enumerate(shape))


@torch.library.custom_op("anysoftmax::softmax_fused", mutates_args=())
def softmax_fused_op(x: torch.Tensor, mask: Optional[torch.Tensor], sinks: Optional[torch.Tensor], dim: int,
                     dtype: Optional[torch.dtype], scale: Optional[float], softcap: Optional[float], causal: str,
                     empty_rows: str, log: bool, backend: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused family (`anysoftmax.softmax` with its fused keywords) as an operator:
    (y, p_sink), p_sink the rows' sink shares (float32; [0]-shaped without sinks)."""
    y, p = dispatch.forward_fused(x, dim, dtype, backend, log, _fused_args(mask, sinks, scale, softcap, causal,
                                                                        empty_rows))
    return _contiguous(y), (_no_sinks(x) if p is None else _contiguous(p))


@softmax_fused_op.register_fake
def _softmax_fused_fake(x, mask, sinks, dim, dtype, scale, softcap, causal, empty_rows, log, backend=None):
    spec, _ = SoftmaxSpec.from_request(x, dim, dtype, log=log, fused=_fused_args(mask, sinks, scale, softcap, causal,
                                                                                  empty_rows).as_kwargs())
    p = x.new_empty(row_shape(spec.shape, spec.dim), dtype=spec.acc_dtype) if sinks is not None else _no_sinks(x)
    return x.new_empty(spec.shape, dtype=spec.out_dtype), p


@torch.library.custom_op("anysoftmax::softmax_fused_backward", mutates_args=())
def softmax_fused_backward_op(grad: torch.Tensor, y: torch.Tensor, x: Optional[torch.Tensor],
                              mask: Optional[torch.Tensor], sinks: Optional[torch.Tensor], p_sink: torch.Tensor,
                              dim: int, scale: Optional[float], softcap: Optional[float], causal: str,
                              empty_rows: str, log: bool, backend: Optional[str] = None
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of `softmax_fused` from its output: (dx in y's dtype, per-row dsinks in
    float32, [0]-shaped without sinks). `x` is read with softcap only."""
    dx, ds = dispatch.backward_fused(grad, y, x, dim, log, _fused_args(mask, sinks, scale, softcap, causal, empty_rows),
                                     p_sink if sinks is not None else None, backend)
    return _contiguous(dx), (_no_sinks(y) if ds is None else _contiguous(ds))


@softmax_fused_backward_op.register_fake
def _softmax_fused_backward_fake(grad, y, x, mask, sinks, p_sink, dim, scale, softcap, causal, empty_rows, log,
                                 backend=None):
    check_backward_args(y, grad, dim, log)
    spec, _ = SoftmaxSpec.from_request(y, dim, log=log, fused=_fused_args(mask, sinks, scale, softcap, causal,
                                                                           empty_rows).as_kwargs())
    ds = y.new_empty(row_shape(spec.shape, spec.dim), dtype=spec.acc_dtype) if sinks is not None else _no_sinks(y)
    return y.new_empty(y.shape), ds
