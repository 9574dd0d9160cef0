"""anysoftmax as PyTorch operators: ``torch.ops.anysoftmax.softmax``, ``.log_softmax`` and
``.softmax_backward`` (registered with `torch.library.custom_op`).

Why operators: `torch.compile` cannot trace into a backend (registry lookups, Triton launches,
IREE calls), and a graph break per softmax would split every attention block. As opaque
operators with fake (meta) implementations the compiler sees only shapes and dtypes, keeps one
graph, and calls the real implementation at run time; autograd is registered on the operator,
so compiled and eager training share one backward (`softmax_backward`, itself an operator).

Outputs are always fresh contiguous tensors (the fake implementations promise exactly that).

Under torch.compile a request the `triton` backend serves does not stay opaque: while
AOTAutograd traces the graph, a rule registered here hands it to the `anysoftmax::*_triton`
`triton_op`s, whose kernels then appear in the graph as user-defined Triton kernels
(`anysoftmax.traced_ops` says when and why).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import dispatch
from .core.spec import SoftmaxSpec


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
    dispatch.check_backward_args(y, grad, dim, log)
    return y.new_empty(y.shape)


# Derivatives (reverse, double backward, forward mode) live in `anysoftmax.autodiff` and vmap
# rules in `anysoftmax.batching`; they are registered here, importing those modules on first
# use (they import this one).

def _setup_forward(ctx, inputs, output):
    x, dim, _dtype, backend = inputs
    ctx.save_for_backward(output)
    ctx.dim, ctx.backend, ctx.x_dtype = dim, backend, x.dtype


def _setup_backward(ctx, inputs, output):
    grad, y, dim, log, backend = inputs
    ctx.save_for_backward(grad, y)
    ctx.dim, ctx.log, ctx.backend = dim, log, backend


def _softmax_grad(ctx, grad):
    from .autodiff import op_forward_backward
    return op_forward_backward(ctx, grad, False)


def _log_softmax_grad(ctx, grad):
    from .autodiff import op_forward_backward
    return op_forward_backward(ctx, grad, True)


def _backward_grad(ctx, gdx):
    from .autodiff import op_backward_backward
    return op_backward_backward(ctx, gdx)


def _vmap_rule(name: str):
    def rule(*args, **kwargs):
        from . import batching
        return getattr(batching, name)(*args, **kwargs)
    return rule


softmax_op.register_autograd(_softmax_grad, setup_context=_setup_forward)
log_softmax_op.register_autograd(_log_softmax_grad, setup_context=_setup_forward)
softmax_backward_op.register_autograd(_backward_grad, setup_context=_setup_backward)
softmax_op.register_vmap(_vmap_rule("softmax_vmap"))
log_softmax_op.register_vmap(_vmap_rule("log_softmax_vmap"))
softmax_backward_op.register_vmap(_vmap_rule("softmax_backward_vmap"))


# ---- torch.compile: routing to the triton_ops (anysoftmax.traced_ops) -------------------------

def _bound(args, kwargs, names, defaults):
    values = dict(zip(names, args))
    values.update(kwargs)
    return [values.get(n, defaults.get(n)) for n in names]


def _export_keeps_ops() -> bool:
    # torch.export keeps triton_ops whole (no backend kernels in an exported program); so do we.
    try:
        from torch.export._trace import custom_triton_ops_decomposition_disabled
    except ImportError:  # pragma: no cover - older torch: no such switch
        return False
    return custom_triton_ops_decomposition_disabled()


def _routing_rule(kind: str):
    """A torch_dispatch rule for FunctionalTensorMode (AOTAutograd's tracing mode): run the
    matching `triton_op` instead of the opaque operator when `traced_ops` says so; otherwise
    trace the operator as it is. `triton_op`'s own decomposition is the model (and, like it,
    nothing is decomposed for torch.export)."""
    if kind == "backward":
        names, defaults = ("grad", "y", "dim", "log", "backend"), {"backend": None}
    else:
        names, defaults = ("x", "dim", "dtype", "backend"), {"dtype": None, "backend": None}

    def rule(mode, op, types, args, kwargs):
        target = None
        plain = all(issubclass(t, (torch._subclasses.FakeTensor, torch._subclasses.functional_tensor.FunctionalTensor))
                    or t is torch.Tensor for t in types)
        if plain and not _export_keeps_ops():
            from . import traced_ops

            values = _bound(args, kwargs, names, defaults)
            target = traced_ops.backward_target(*values) if kind == "backward" else \
                traced_ops.forward_target(*values, log=kind == "log_softmax")
        if target is None:
            return mode.__torch_dispatch__(op, types, args, kwargs)
        with mode:
            return target(*values)

    return rule


def _install_routing() -> None:
    try:
        from torch._subclasses.functional_tensor import FunctionalTensorMode
    except ImportError:  # pragma: no cover
        return
    softmax_op.register_torch_dispatch(FunctionalTensorMode, _routing_rule("softmax"))
    log_softmax_op.register_torch_dispatch(FunctionalTensorMode, _routing_rule("log_softmax"))
    softmax_backward_op.register_torch_dispatch(FunctionalTensorMode, _routing_rule("backward"))


_install_routing()
