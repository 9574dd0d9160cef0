"""anysoftmax's Triton kernels inside torch.compile graphs (docs/kernels.md, "torch.compile"): the `triton_op`s
and the targets of `registration`'s rule that routes the public operators to them while AOTAutograd traces."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from functools import partial
from typing import Optional

import torch
from torch.library import triton_op

from .. import dispatch
from ..core import registry
from ..core.spec import SoftmaxSpec
from ..dispatch import FusedArgs
from .ops import backward_spec, forward_spec, is_plain, no_sinks, sinks_rows

ENV = "ANYSOFTMAX_COMPILE_KERNELS"


def _inductor_compiles() -> bool:
    """True while Inductor traces a graph it will compile (its fake mode is installed)."""
    virtualized = sys.modules.get("torch._inductor.virtualized")
    return virtualized is not None and not isinstance(virtualized.V.fake_mode, virtualized.NullHandler)


def _backend_for(spec: SoftmaxSpec, backend: Optional[str]):
    """The backend that serves `spec` when it can run traced, else None (selected with tracing off)."""
    from torch.utils._python_dispatch import _disable_current_modes

    if spec.device.type == "cpu" and _inductor_compiles():
        # Inductor compiles a user kernel for its device, which needs a Triton driver: a CPU
        # tensor's kernels run through the interpreter, which is none. The operator runs them.
        return None
    with _disable_current_modes():
        chosen = registry.select(spec, backend)
    traceable = getattr(chosen, "traceable", None)
    return chosen if traceable is not None and traceable(spec) else None


def _traced_backend(spec: SoftmaxSpec, backend: Optional[str], op: str):
    chosen = _backend_for(spec, backend)
    if chosen is None:
        raise RuntimeError(f"anysoftmax: the {op} operator needs a backend that runs traced Triton kernels; "
                           f"{spec.describe()} is served by another backend")
    return chosen


@triton_op("anysoftmax::softmax_triton", mutates_args=())
def softmax_triton(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype] = None, log: bool = False,
                   mask: Optional[torch.Tensor] = None, sinks: Optional[torch.Tensor] = None,
                   scale: Optional[float] = None, softcap: Optional[float] = None, causal: str = "none",
                   empty_rows: str = "zero", backend: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`anysoftmax::softmax` as Triton kernels torch.compile can see (GPU backends)."""
    a = FusedArgs(scale, mask, causal, softcap, sinks, empty_rows)
    plain = is_plain(mask, sinks, scale, softcap, causal, empty_rows)
    prepared, spec = dispatch.prepare(x, dim, dtype, log) if plain else dispatch.prepare_fused(x, dim, dtype, log, a)
    if spec.numel == 0:
        return x.new_empty(spec.shape, dtype=spec.out_dtype), sinks_rows(x, spec, sinks)
    chosen = _traced_backend(spec, backend, "softmax_triton")
    if spec.is_plain:
        return chosen.traced_forward(prepared, spec), no_sinks(x)
    y, p = chosen.traced_fused_forward(prepared, spec, a)
    return y, (no_sinks(x) if p is None else p)


@triton_op("anysoftmax::softmax_backward_triton", mutates_args=())
def softmax_backward_triton(grad: torch.Tensor, y: torch.Tensor, dim: int, log: bool = False,
                            x: Optional[torch.Tensor] = None, p_sink: Optional[torch.Tensor] = None,
                            mask: Optional[torch.Tensor] = None, sinks: Optional[torch.Tensor] = None,
                            scale: Optional[float] = None, softcap: Optional[float] = None, causal: str = "none",
                            empty_rows: str = "zero", backend: Optional[str] = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """`anysoftmax::softmax_backward` as Triton kernels torch.compile can see (GPU backends)."""
    spec = backward_spec(grad, y, dim, log, mask, sinks, scale, softcap, causal, empty_rows)
    if spec.numel == 0:
        return torch.empty_like(y), sinks_rows(y, spec, sinks)
    spec = replace(spec, in_dtype=y.dtype, out_dtype=y.dtype)
    chosen = _traced_backend(spec, backend, "softmax_backward_triton")
    if spec.is_plain:
        return chosen.traced_backward(y, grad, spec), no_sinks(y)
    a = FusedArgs(scale, mask, causal, softcap, sinks, empty_rows)
    dx, ds = chosen.traced_fused_backward(grad, y, x, spec, a, p_sink if sinks is not None else None)
    return dx, (no_sinks(y) if ds is None else ds)


def _register_kernel_sources() -> None:
    # torch's AOTAutograd cache keys a graph on the source of the Triton kernels its custom ops
    # run (found by reading the op's body for `wrap_triton(name)`; ours pick the kernel from a
    # plan, so name them here), for these operators and for the public ones routed to them.
    table = getattr(torch._library.triton, "triton_ops_to_kernels", None)
    if table is None:
        return
    from ..backends._triton_common.traced import kernels

    found = kernels()
    for name in ("softmax", "softmax_backward"):
        table[f"anysoftmax::{name}_triton"] = found
        table[f"anysoftmax::{name}"] = found


_register_kernel_sources()


# ---- routing (the FunctionalTensorMode rule on the public operators, `registration`) ----------

def _concrete(*tensors) -> bool:
    return all(type(s) is int for t in tensors if isinstance(t, torch.Tensor) for s in (*t.shape, *t.stride()))


def _routed(spec_of, backend: Optional[str], traced_method: str) -> bool:
    # Whether the call `spec_of()` validates runs traced kernels; not where it is invalid (the
    # operator reports that at run time, as without routing).
    try:
        spec = spec_of()
        if spec.needs_input_cast:  # (the operator converts x first)
            spec = replace(spec, in_dtype=spec.out_dtype)
        chosen = None if spec.numel == 0 else _backend_for(spec, backend)
    except Exception:
        return False
    return chosen is not None and (spec.is_plain or hasattr(chosen, traced_method))


def forward_target(x, dim, dtype=None, log=False, mask=None, sinks=None, scale=None, softcap=None, causal="none",
                   empty_rows="zero", backend=None):
    """`softmax_triton` to trace instead of the `softmax` operator with these arguments, or None."""
    if os.environ.get(ENV, "1") == "0" or not isinstance(x, torch.Tensor) or not _concrete(x, mask, sinks) \
            or not _routed(partial(forward_spec, x, dim, dtype, log, mask, sinks, scale, softcap, causal, empty_rows),
                           backend, "traced_fused_forward"):
        return None
    return torch.ops.anysoftmax.softmax_triton.default


def backward_target(grad, y, dim, log=False, x=None, p_sink=None, mask=None, sinks=None, scale=None, softcap=None,
                    causal="none", empty_rows="zero", backend=None):
    """`softmax_backward_triton` to trace instead of `softmax_backward` with these arguments, or None."""
    if os.environ.get(ENV, "1") == "0" or not all(isinstance(t, torch.Tensor) for t in (grad, y)) \
            or not _concrete(grad, y, x, mask, sinks, p_sink) \
            or not _routed(partial(backward_spec, grad, y, dim, log, mask, sinks, scale, softcap, causal, empty_rows),
                           backend, "traced_fused_backward"):
        return None
    return torch.ops.anysoftmax.softmax_backward_triton.default
