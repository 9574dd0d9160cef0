"""The operators' autograd (`autodiff`), vmap rules (`batching`) and torch.compile routing to the `triton_op`s
(`traced_ops`, imported on the first traced call); imported on the first call that needs a derivative or is
compiled, never on the eager path."""

from __future__ import annotations

import threading

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

from . import autodiff, batching, ops


def _register(forward, backward) -> None:
    forward.register_autograd(autodiff.op_forward_backward, setup_context=autodiff.setup_op_forward)
    backward.register_autograd(autodiff.op_backward_backward, setup_context=autodiff.setup_op_backward)
    forward.register_vmap(batching.softmax_vmap)
    backward.register_vmap(batching.softmax_backward_vmap)


_register(ops.softmax_op, ops.softmax_backward_op)


# ---- torch.compile: routing to the triton_ops (anysoftmax.traced_ops) -------------------------

_traced_lock = threading.Lock()
_traced = []


def traced_ops():
    """`traced_ops`, imported and registered on first use (registering a triton_op imports Triton)."""
    with _traced_lock:
        if not _traced:
            from . import traced_ops as module

            _register(module.softmax_triton, module.softmax_backward_triton)
            _traced.append(module)
        return _traced[0]


def _export_keeps_ops() -> bool:
    # torch.export keeps triton_ops whole (no backend kernels in an exported program); so do we.
    try:
        from torch.export._trace import custom_triton_ops_decomposition_disabled
    except ImportError:  # pragma: no cover - older torch: no such switch
        return False
    return custom_triton_ops_decomposition_disabled()


def _routing_rule(target: str):
    """A torch_dispatch rule for FunctionalTensorMode (AOTAutograd's tracing mode): run the
    `triton_op` that `traced_ops.<target>` picks for the call instead of the opaque operator, as
    `triton_op`'s own decomposition does (and, like it, never for torch.export)."""

    def rule(mode, op, types, args, kwargs):
        target_op = None
        if all(issubclass(t, (FakeTensor, FunctionalTensor)) or t is torch.Tensor for t in types) \
                and not _export_keeps_ops():
            target_op = getattr(traced_ops(), target)(*args, **kwargs)
        if target_op is None:
            return mode.__torch_dispatch__(op, types, args, kwargs)
        with mode:
            return target_op(*args, **kwargs)

    return rule


ops.softmax_op.register_torch_dispatch(FunctionalTensorMode, _routing_rule("forward_target"))
ops.softmax_backward_op.register_torch_dispatch(FunctionalTensorMode, _routing_rule("backward_target"))
