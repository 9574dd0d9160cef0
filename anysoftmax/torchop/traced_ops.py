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
      (and CPU tensors under the Triton interpreter, how CI traces the kernels, except when
      Inductor compiles the graph: it needs a Triton driver for the tensors' device, and the
      interpreter is none), and
  (c) shapes and strides are concrete ints (a dynamic-shape graph keeps the opaque operator: a
      plan is chosen per shape), the tensor is not empty, and $ANYSOFTMAX_COMPILE_KERNELS is
      not "0" (read at trace time: set it to keep the opaque operators, e.g. to compare).

Otherwise the public operator stays in the graph (opaque; other backends, CPU). Selection or
planning errors are not raised here: the operator then runs, and fails, at run time as before.

Nothing here runs on the eager path (eager calls never enter FunctionalTensorMode). This module
is imported by the rule on its first use (registering a `triton_op` imports Triton), and
`anysoftmax.registration` registers these operators' autograd and vmap rules (the public
operators' own) when it imports it.

The fused family has the same pair: ``softmax_fused_triton`` / ``softmax_fused_backward_triton``
(the backend's `traced_fused_forward` / `traced_fused_backward`).
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from typing import Optional

import torch
from torch.library import triton_op

from .. import dispatch
from ..core.spec import SoftmaxSpec, check_backward_args
from ..dispatch import FusedArgs

ENV = "ANYSOFTMAX_COMPILE_KERNELS"


def _inductor_compiles() -> bool:
    """True while Inductor traces a graph it will compile (its fake mode is installed)."""
    virtualized = sys.modules.get("torch._inductor.virtualized")
    return virtualized is not None and not isinstance(virtualized.V.fake_mode, virtualized.NullHandler)


def _backend_for(spec: SoftmaxSpec, backend: Optional[str]):
    """The backend that serves `spec` when it can run traced, else None. Selection runs with
    torch.compile's tracing modes off: availability probes (the interpreter check) run small
    real kernels, and their verdict is cached."""
    from torch.utils._python_dispatch import _disable_current_modes

    if spec.device.type == "cpu" and _inductor_compiles():
        # Inductor compiles a user kernel for its device, which needs a Triton driver: a CPU
        # tensor's kernels run through the interpreter, which is none. The operator runs them.
        return None
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
    spec = check_backward_args(y, grad, dim, log)
    if spec.numel == 0:
        return torch.empty(spec.shape, dtype=y.dtype, device=y.device)
    spec = replace(spec, in_dtype=y.dtype, out_dtype=y.dtype)
    return _traced_backend(spec, backend, "softmax_backward_triton").traced_backward(y, grad, spec)


def _register_kernel_sources() -> None:
    # torch's AOTAutograd cache keys a graph on the source of the Triton kernels its custom ops
    # run (found by reading the op's body for `wrap_triton(name)`; ours pick the kernel from a
    # plan, so name them here), for these operators and for the public ones routed to them.
    table = getattr(torch._library.triton, "triton_ops_to_kernels", None)
    if table is None:
        return
    from ..backends._triton_common.traced import kernels

    found = kernels()
    for name in ("softmax", "log_softmax", "softmax_backward", "softmax_fused", "softmax_fused_backward"):
        table[f"anysoftmax::{name}_triton"] = found
        table[f"anysoftmax::{name}"] = found


_register_kernel_sources()


# ---- the fused family ---------------------------------------------------------------------------

def _empty_p(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(0, dtype=torch.float32)


@triton_op("anysoftmax::softmax_fused_triton", mutates_args=())
def softmax_fused_triton(x: torch.Tensor, mask: Optional[torch.Tensor], sinks: Optional[torch.Tensor], dim: int,
                         dtype: Optional[torch.dtype], scale: Optional[float], softcap: Optional[float], causal: str,
                         empty_rows: str, log: bool, backend: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`anysoftmax::softmax_fused` as Triton kernels torch.compile can see (GPU backends)."""
    a = FusedArgs(scale, mask, causal, softcap, sinks, empty_rows)
    prepared, spec = dispatch.prepare_fused(x, dim, dtype, log, a)
    if spec.numel == 0:
        y, p = dispatch.empty_outputs(spec, x.device, sinks is not None)
        return y, (_empty_p(x) if p is None else p)
    chosen = _traced_backend(spec, backend, "softmax_fused_triton")
    y, p = chosen.traced_fused_forward(prepared, spec, a)
    return y, (_empty_p(x) if p is None else p)


@triton_op("anysoftmax::softmax_fused_backward_triton", mutates_args=())
def softmax_fused_backward_triton(grad: torch.Tensor, y: torch.Tensor, x: Optional[torch.Tensor],
                                  mask: Optional[torch.Tensor], sinks: Optional[torch.Tensor], p_sink: torch.Tensor,
                                  dim: int, scale: Optional[float], softcap: Optional[float], causal: str,
                                  empty_rows: str, log: bool, backend: Optional[str] = None
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """`anysoftmax::softmax_fused_backward` as Triton kernels torch.compile can see."""
    a = FusedArgs(scale, mask, causal, softcap, sinks, empty_rows)
    check_backward_args(y, grad, dim, log)
    spec, _ = SoftmaxSpec.from_request(y, dim, log=log, fused=a.as_kwargs())
    if spec.numel == 0:
        return torch.empty_like(y), (_empty_p(y) if sinks is None else torch.empty_like(p_sink))
    spec = replace(spec, in_dtype=y.dtype, out_dtype=y.dtype)
    chosen = _traced_backend(spec, backend, "softmax_fused_backward_triton")
    dx, ds = chosen.traced_fused_backward(grad, y, x, spec, a, p_sink if sinks is not None else None)
    return dx, (_empty_p(y) if ds is None else ds)


# ---- routing (the FunctionalTensorMode rule on the public operators, `anysoftmax.registration`) ----

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
        spec = check_backward_args(y, grad, dim, log)
        if spec.numel == 0 or _backend_for(spec, backend) is None:
            return None
    except Exception:
        return None
    return torch.ops.anysoftmax.softmax_backward_triton.default


def fused_forward_target(x, mask, sinks, dim, dtype, scale, softcap, causal, empty_rows, log, backend):
    """`softmax_fused_triton` to trace instead of `softmax_fused`, or None."""
    if os.environ.get(ENV, "1") == "0" or not isinstance(x, torch.Tensor) or \
            not _concrete(*(t for t in (x, mask, sinks) if isinstance(t, torch.Tensor))):
        return None
    try:
        a = FusedArgs(scale, mask, causal, softcap, sinks, empty_rows)
        spec, _ = SoftmaxSpec.from_request(x, dim, dtype, log=log, fused=a.as_kwargs())
        if spec.needs_input_cast:
            spec = replace(spec, in_dtype=spec.out_dtype)
        chosen = _backend_for(spec, backend)
        if spec.numel == 0 or chosen is None or not hasattr(chosen, "traced_fused_forward"):
            return None
    except Exception:  # reported by the operator at run time, as without routing
        return None
    return torch.ops.anysoftmax.softmax_fused_triton.default


def fused_backward_target(grad, y, x, mask, sinks, p, dim, scale, softcap, causal, empty_rows, log, backend):
    """`softmax_fused_backward_triton` to trace instead of `softmax_fused_backward`, or None."""
    tensors = [t for t in (grad, y, x, mask, sinks, p) if isinstance(t, torch.Tensor)]
    if os.environ.get(ENV, "1") == "0" or not all(isinstance(t, torch.Tensor) for t in (grad, y)) \
            or not _concrete(*tensors):
        return None
    try:
        a = FusedArgs(scale, mask, causal, softcap, sinks, empty_rows)
        check_backward_args(y, grad, dim, log)
        spec, _ = SoftmaxSpec.from_request(y, dim, log=log, fused=a.as_kwargs())
        chosen = _backend_for(spec, backend)
        if spec.numel == 0 or chosen is None or not hasattr(chosen, "traced_fused_backward"):
            return None
    except Exception:
        return None
    return torch.ops.anysoftmax.softmax_fused_backward_triton.default


_TARGETS = {
    "softmax": lambda v: forward_target(*v, log=False),
    "log_softmax": lambda v: forward_target(*v, log=True),
    "backward": lambda v: backward_target(*v),
    "fused": lambda v: fused_forward_target(*v),
    "fused_backward": lambda v: fused_backward_target(*v),
}


def target(kind: str, values: list):
    """The `*_triton` operator to trace instead of the public operator of `kind` (its bound
    arguments `values`), or None to trace that operator as it is."""
    return _TARGETS[kind](values)
