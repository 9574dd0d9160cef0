"""Registration on top of the operator definitions (`anysoftmax.ops`, a leaf): their autograd
(`autodiff`, `fused_autodiff`), vmap rules (`batching`) and the torch.compile routing that hands
a traced request to the Triton kernels' `triton_op`s (`traced_ops`).

Imported by `anysoftmax.api` on the first call that needs a derivative or is compiled (the
operators pull in torch._dynamo). The layering, one way:

    registration -> autodiff, fused_autodiff, batching -> ops -> dispatch
    registration -> traced_ops (on the first traced call) -> dispatch

Routing (torch.compile): dynamo records the public operators, which carry autograd, vmap and
fake implementations. While AOTAutograd traces that graph under FunctionalTensorMode, a
torch_dispatch rule registered here asks `traced_ops` whether the selected backend runs traced
Triton kernels for the request and, if so, traces the matching `*_triton` operator instead
(`traced_ops` says when and why). Nothing here runs on the eager path.
"""

from __future__ import annotations

import threading

import torch

from . import autodiff, batching, fused_autodiff, ops

# ---- autograd ---------------------------------------------------------------------------------


def _setup_forward(ctx, inputs, output):
    x, dim, _dtype, backend = inputs
    ctx.save_for_backward(output)
    ctx.dim, ctx.backend, ctx.x_dtype = dim, backend, x.dtype


def _setup_backward(ctx, inputs, output):
    grad, y, dim, log, backend = inputs
    ctx.save_for_backward(grad, y)
    ctx.dim, ctx.log, ctx.backend = dim, log, backend


def _softmax_grad(ctx, grad):
    return autodiff.op_forward_backward(ctx, grad, False)


def _log_softmax_grad(ctx, grad):
    return autodiff.op_forward_backward(ctx, grad, True)


def _register_plain(softmax, log_softmax, backward) -> None:
    softmax.register_autograd(_softmax_grad, setup_context=_setup_forward)
    log_softmax.register_autograd(_log_softmax_grad, setup_context=_setup_forward)
    backward.register_autograd(autodiff.op_backward_backward, setup_context=_setup_backward)
    softmax.register_vmap(batching.softmax_vmap)
    log_softmax.register_vmap(batching.log_softmax_vmap)
    backward.register_vmap(batching.softmax_backward_vmap)


def _register_fused(fused, fused_backward) -> None:
    fused.register_autograd(fused_autodiff.op_fused_backward, setup_context=fused_autodiff.setup_fused)
    fused_backward.register_autograd(fused_autodiff.op_fused_backward_backward,
                                     setup_context=fused_autodiff.setup_fused_backward)
    fused.register_vmap(batching.softmax_fused_vmap)
    fused_backward.register_vmap(batching.softmax_fused_backward_vmap)


_register_plain(ops.softmax_op, ops.log_softmax_op, ops.softmax_backward_op)
_register_fused(ops.softmax_fused_op, ops.softmax_fused_backward_op)


# ---- torch.compile: routing to the triton_ops (anysoftmax.traced_ops) -------------------------

_traced_lock = threading.Lock()
_traced = []


def traced_ops():
    """`anysoftmax.traced_ops`, imported (and its operators' autograd and vmap rules
    registered, the same as the public operators') on first use: registering a triton_op
    imports Triton, which waits until a graph is traced."""
    with _traced_lock:
        if not _traced:
            from . import traced_ops as module

            _register_plain(module.softmax_triton, module.log_softmax_triton, module.softmax_backward_triton)
            _register_fused(module.softmax_fused_triton, module.softmax_fused_backward_triton)
            _traced.append(module)
        return _traced[0]


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


_SIGNATURES = {
    "softmax": (("x", "dim", "dtype", "backend"), {"dtype": None, "backend": None}),
    "log_softmax": (("x", "dim", "dtype", "backend"), {"dtype": None, "backend": None}),
    "backward": (("grad", "y", "dim", "log", "backend"), {"backend": None}),
    "fused": (("x", "mask", "sinks", "dim", "dtype", "scale", "softcap", "causal", "empty_rows", "log", "backend"),
              {"backend": None}),
    "fused_backward": (("grad", "y", "x", "mask", "sinks", "p", "dim", "scale", "softcap", "causal", "empty_rows",
                        "log", "backend"), {"backend": None}),
}


def _routing_rule(kind: str):
    """A torch_dispatch rule for FunctionalTensorMode (AOTAutograd's tracing mode): run the
    matching `triton_op` instead of the opaque operator when `traced_ops` says so; otherwise
    trace the operator as it is. `triton_op`'s own decomposition is the model (and, like it,
    nothing is decomposed for torch.export)."""
    names, defaults = _SIGNATURES[kind]

    def rule(mode, op, types, args, kwargs):
        target = None
        plain = all(issubclass(t, (torch._subclasses.FakeTensor, torch._subclasses.functional_tensor.FunctionalTensor))
                    or t is torch.Tensor for t in types)
        if plain and not _export_keeps_ops():
            values = _bound(args, kwargs, names, defaults)
            target = traced_ops().target(kind, values)
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
    for op, kind in ((ops.softmax_op, "softmax"), (ops.log_softmax_op, "log_softmax"),
                     (ops.softmax_backward_op, "backward"), (ops.softmax_fused_op, "fused"),
                     (ops.softmax_fused_backward_op, "fused_backward")):
        op.register_torch_dispatch(FunctionalTensorMode, _routing_rule(kind))


_install_routing()
