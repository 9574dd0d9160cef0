"""anysoftmax's Triton kernels inside torch.compile graphs: `torch.library.triton_op`s, and the
rule that routes the public operators to them while a graph is traced.

    torch.ops.anysoftmax.softmax_triton(x, dim, dtype=None, backend=None)
    torch.ops.anysoftmax.log_softmax_triton(x, dim, dtype=None, backend=None)
    torch.ops.anysoftmax.softmax_backward_triton(grad, y, dim, log, backend=None)

Each is a `triton_op` whose body (the backend's `traced_forward` / `traced_backward`) is torch
ops plus `wrap_triton(kernel)[grid](...)`: AOTAutograd decomposes it into
`triton_kernel_wrapper_functional` nodes and Inductor compiles those as user-defined Triton
kernels (scheduled and CUDA-graphed with the rest of the graph, instead of an opaque call into
Python).

Routing. Dynamo still records the public operators (`anysoftmax::softmax`, `::log_softmax`,
`::softmax_backward`, `anysoftmax.ops`): they carry autograd (reverse, double backward),
vmap rules and the fake implementations, and the dynamo graph and its guards stay what they
were. The decision is taken one level lower, when AOTAutograd traces that graph under
`FunctionalTensorMode` (torch.compile, also for the backward graph the registered autograd
produces): a torch_dispatch rule registered for that mode on each public operator — the same
mechanism by which `triton_op` itself decomposes — selects the backend for the (fake) request
exactly as eager dispatch would, and calls the matching `*_triton` operator when

  (a) a graph is being traced (the rule only exists under FunctionalTensorMode, and not for
      torch.export, which keeps custom ops whole: `custom_triton_ops_decomposition_disabled`),
  (b) the selected backend says `traceable(spec)`: the `triton` backend, for CUDA/HIP tensors
      (and CPU tensors under the Triton interpreter, how CI traces the kernels), and
  (c) shapes and strides are concrete ints (a dynamic-shape graph keeps the opaque operator: a
      plan is chosen per shape), the tensor is not empty, and $ANYSOFTMAX_COMPILE_KERNELS is
      not "0" (read at trace time: set it to keep the opaque operators, e.g. to compare).

Otherwise the public operator stays in the graph (opaque; other backends, CPU). Selection or
planning errors are not raised here: the operator then runs, and fails, at run time as before.

Nothing here runs on the eager path (eager calls never enter FunctionalTensorMode). This module
is imported by the rule on its first use (registering a `triton_op` imports Triton).
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Optional

import torch
from torch.library import triton_op

from . import dispatch, ops
from .core.spec import SoftmaxSpec

ENV = "ANYSOFTMAX_COMPILE_KERNELS"


def _backend_for(spec: SoftmaxSpec, backend: Optional[str]):
    """The backend that serves `spec` when it can run traced, else None. Selection runs with
    torch.compile's tracing modes off: availability probes (the interpreter check) run small
    real kernels, and their verdict is cached."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        chosen = dispatch.select(spec, backend)
    traceable = getattr(chosen, "traceable", None)
    return chosen if traceable is not None and traceable(spec) else None


def _traced_backend(spec: SoftmaxSpec, backend: Optional[str], op: str):
    chosen = _backend_for(spec, backend)
    if chosen is None:
        raise RuntimeError(f"anysoftmax: the {op} operator needs a backend that runs traced Triton kernels; "
                           f"{spec.describe()} is served by another backend")
    return chosen


def _traced_forward(x, dim, dtype, backend, log):
    prepared, spec = dispatch.prepare(x, dim, dtype, log)
    if spec.numel == 0:
        return torch.empty(spec.shape, dtype=spec.out_dtype, device=x.device)
    return _traced_backend(spec, backend, f"{'log_' if log else ''}softmax_triton").traced_forward(prepared, spec)


@triton_op("anysoftmax::softmax_triton", mutates_args=())
def softmax_triton(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype] = None,
                   backend: Optional[str] = None) -> torch.Tensor:
    """`anysoftmax.softmax` as Triton kernels torch.compile can see (GPU backends)."""
    return _traced_forward(x, dim, dtype, backend, False)


@triton_op("anysoftmax::log_softmax_triton", mutates_args=())
def log_softmax_triton(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype] = None,
                       backend: Optional[str] = None) -> torch.Tensor:
    """`anysoftmax.log_softmax` as Triton kernels torch.compile can see (GPU backends)."""
    return _traced_forward(x, dim, dtype, backend, True)


@triton_op("anysoftmax::softmax_backward_triton", mutates_args=())
def softmax_backward_triton(grad: torch.Tensor, y: torch.Tensor, dim: int, log: bool,
                            backend: Optional[str] = None) -> torch.Tensor:
    """`softmax_backward` as Triton kernels torch.compile can see (GPU backends)."""
    spec = dispatch.check_backward_args(y, grad, dim, log)
    if spec.numel == 0:
        return torch.empty(spec.shape, dtype=y.dtype, device=y.device)
    spec = replace(spec, in_dtype=y.dtype, out_dtype=y.dtype)
    return _traced_backend(spec, backend, "softmax_backward_triton").traced_backward(y, grad, spec)


# The same derivatives and vmap rules as the public operators (anysoftmax.ops, whose handlers
# call anysoftmax.autodiff's formulas), so a direct call of these operators is differentiable too.
softmax_triton.register_autograd(ops._softmax_grad, setup_context=ops._setup_forward)
log_softmax_triton.register_autograd(ops._log_softmax_grad, setup_context=ops._setup_forward)
softmax_backward_triton.register_autograd(ops._backward_grad, setup_context=ops._setup_backward)
softmax_triton.register_vmap(ops._vmap_rule("softmax_vmap"))
log_softmax_triton.register_vmap(ops._vmap_rule("log_softmax_vmap"))
softmax_backward_triton.register_vmap(ops._vmap_rule("softmax_backward_vmap"))


def _register_kernel_sources() -> None:
    # torch's AOTAutograd cache keys a graph on the source of the Triton kernels its custom ops
    # run (found by reading the op's body for `wrap_triton(name)`; ours pick the kernel from a
    # plan, so name them here), for these operators and for the public ones routed to them.
    table = getattr(torch._library.triton, "triton_ops_to_kernels", None)
    if table is None:
        return
    from .backends._triton_common.traced import kernels

    found = kernels()
    for name in ("softmax", "log_softmax", "softmax_backward"):
        table[f"anysoftmax::{name}_triton"] = found
        table[f"anysoftmax::{name}"] = found


_register_kernel_sources()


# ---- routing (the FunctionalTensorMode rule on the public operators, `ops.install_routing`) ----

def _concrete(*tensors: torch.Tensor) -> bool:
    return all(type(s) is int for t in tensors for s in (*t.shape, *t.stride()))


def forward_target(x, dim, dtype, backend, log: bool):
    """The `*_triton` operator to trace instead of the public forward operator, or None."""
    if os.environ.get(ENV, "1") == "0" or not isinstance(x, torch.Tensor) or not _concrete(x):
        return None
    try:
        spec = SoftmaxSpec.from_tensor(x, dim, dtype, log=log)
        if spec.needs_input_cast:
            spec = replace(spec, in_dtype=spec.out_dtype)
        if spec.numel == 0 or _backend_for(spec, backend) is None:
            return None
    except Exception:  # reported by the operator at run time, as without routing
        return None
    return (torch.ops.anysoftmax.log_softmax_triton if log else torch.ops.anysoftmax.softmax_triton).default


def backward_target(grad, y, dim, log, backend):
    """The `softmax_backward_triton` operator to trace instead of `softmax_backward`, or None."""
    if os.environ.get(ENV, "1") == "0" or not all(isinstance(t, torch.Tensor) for t in (grad, y)) \
            or not _concrete(grad, y):
        return None
    try:
        spec = dispatch.check_backward_args(y, grad, dim, log)
        if spec.numel == 0 or _backend_for(spec, backend) is None:
            return None
    except Exception:
        return None
    return torch.ops.anysoftmax.softmax_backward_triton.default
