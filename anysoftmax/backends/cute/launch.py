"""Calling a compiled kernel on torch tensors, bound once per request: the per-call path.
TVM-FFI (`KernelKey.tvm_ffi`) takes torch tensors as they are, on torch's current stream; the
slower DLPack fallback wraps each. Kernels see views, never copies: (rows, n) or (outer, n, inner).
"""

from __future__ import annotations

from typing import Callable

import torch

from ...core.layout import new_output, new_output_like
from ...core.lse_merge import row_shape
from .plan import DTYPE_BYTES, KernelKey


def rows_view(t: torch.Tensor, n_rows: int, n_cols: int, row_stride: int) -> torch.Tensor:
    """`t` as (n_rows, n_cols) with strides (row_stride, 1) (rows equally spaced: the backend checks)."""
    if t.is_contiguous() and row_stride == n_cols:
        return t.view(n_rows, n_cols)
    return t.as_strided((n_rows, n_cols), (row_stride, 1), t.storage_offset())


def _dlpack_call(fn, key: KernelKey) -> Callable:
    """fn(*tensors) through DLPack wrappers and an explicit stream."""
    import cuda.bindings.driver as cuda

    from .env import import_dsl

    cute = import_dsl()

    def wrap(t: torch.Tensor, dtype: str):
        vec = key.vec if t.dim() > 1 else 1  # a logsumexp's result is written one float at a time
        return cute.runtime.from_dlpack(t, assumed_align=vec * DTYPE_BYTES[dtype]).mark_layout_dynamic(
            leading_dim=t.dim() - 1)

    dtypes = key.operand_dtypes
    n_tensors = len(dtypes)

    def call(*args) -> None:  # the tensors, then a fused kernel's (scale, softcap)
        stream = cuda.CUstream(torch.cuda.current_stream(args[0].device).cuda_stream)
        fn(*(wrap(t, d) for t, d in zip(args, dtypes)), *args[n_tensors:], stream)

    return call


def bind(fn, key: KernelKey, device: torch.device | None = None) -> Callable:
    """`call(*tensors)` launching the compiled `fn` of `key` on (rows, n) tensors, with `device` current
    where the process sees more than one GPU."""
    call = fn if key.tvm_ffi else _dlpack_call(fn, key)
    if device is None or torch.cuda.device_count() <= 1:
        return call

    def run(*tensors: torch.Tensor) -> None:
        with torch.cuda.device(device):
            call(*tensors)

    return run


def forward(call: Callable, spec, n_rows: int, n_cols: int, x_row_stride: int, fused: bool = False) -> Callable:
    """`f(x) -> y` for requests like `spec` read as rows; with `fused` (the scale/softcap prologue)
    `f(x, operands) -> (y, None)`. A 2-D input needs no view, and y is made `empty_like` x."""
    shape, dtype = spec.shape, spec.out_dtype
    flat = len(shape) == 2 and spec.strides[1] == 1 and shape == (n_rows, n_cols)

    def run(x: torch.Tensor, *values: float) -> torch.Tensor:
        y = new_output_like(x, dtype)
        call(x if flat else rows_view(x, n_rows, n_cols, x_row_stride), y if flat else y.view(n_rows, n_cols), *values)
        return y

    return (lambda x, ops: (run(x, ops.scale, ops.softcap), None)) if fused else run


def logsumexp(call: Callable, spec, n_rows: int, n_cols: int, x_row_stride: int) -> Callable:
    """`f(x, operands) -> lse` (keepdim, float32) for logsumexp requests like `spec` read as rows
    (`backend.lse_rows_of`); a sink is folded in after the kernel, lse = logaddexp(lse, s)."""
    shape, device = row_shape(spec.shape, spec.dim), spec.device
    sinks = spec.variant.sinks is not None

    def run(x: torch.Tensor, ops) -> torch.Tensor:
        out = new_output(shape, torch.float32, device)
        call(rows_view(x, n_rows, n_cols, x_row_stride), out.view(n_rows), ops.scale, ops.softcap)
        if sinks:
            torch.logaddexp(out, ops.sinks, out=out)
        return out

    return run


def _aligned(t: torch.Tensor, align_bytes: int) -> torch.Tensor:
    """`t` contiguous with its data aligned to `align_bytes` (a copy only when it is not)."""
    t = t.contiguous()
    return t if t.data_ptr() % align_bytes == 0 else t.clone()


def backward_operands(y: torch.Tensor, grad: torch.Tensor, dtype: torch.dtype, align_bytes: int):
    """y and grad contiguous and aligned to `align_bytes` (the compiled vector), grad in y's dtype."""
    return _aligned(y, align_bytes), _aligned(grad if grad.dtype == dtype else grad.to(dtype), align_bytes)


def backward(call: Callable, spec, n_rows: int, n_cols: int, align_bytes: int, fused: bool = False,
             reads_x: bool = False) -> Callable:
    """`f(y, grad) -> dx` for requests like `spec`; with `fused` (the prologue's derivative)
    `f(grad, y, x, operands, p_sink) -> (dx, None)`, x (in y's dtype) read only with `reads_x`."""
    shape, dtype = spec.shape, spec.out_dtype
    flat = shape == (n_rows, n_cols)

    def run(y: torch.Tensor, grad: torch.Tensor, *extra) -> torch.Tensor:  # extra: a fused kernel's x, values
        y, grad = backward_operands(y, grad, dtype, align_bytes)
        dx = new_output_like(y, dtype)
        tensors = (y, grad, dx, *extra[:1])
        call(*(tensors if flat else (t.view(n_rows, n_cols) for t in tensors)), *extra[1:])
        return dx

    if not fused:
        return run

    def run_fused(grad: torch.Tensor, y: torch.Tensor, x: torch.Tensor, ops, p_sink) -> tuple:
        x = _aligned(x if x.dtype == dtype else x.to(dtype), align_bytes) if reads_x else y
        return run(y, grad, x, ops.scale, ops.softcap), None

    return run_fused


def _columns(t: torch.Tensor, view, outer_stride: int, red_stride: int) -> torch.Tensor:
    """`t` as the (outer, n, inner) tensor of a column request (a view over its storage)."""
    return t.as_strided((view.n_outer, view.n_red, view.n_inner), (outer_stride, red_stride, 1), t.storage_offset())


def columns_forward(call: Callable, spec, view) -> Callable:
    """`f(x) -> y` for a reduction over a strided dim (`core.layout.ColumnView` of `spec`)."""
    shape, dtype, device = spec.shape, spec.out_dtype, spec.device

    def run(x: torch.Tensor) -> torch.Tensor:
        y = new_output(shape, dtype, device)
        call(_columns(x, view, view.in_outer_stride, view.in_red_stride),
             _columns(y, view, view.out_outer_stride, view.out_red_stride))
        return y

    return run


def columns_backward(call: Callable, spec, view, align_bytes: int) -> Callable:
    """`f(y, grad) -> dx` for a reduction over a strided dim (operands as `backward_operands`)."""
    shape, dtype, device = spec.shape, spec.out_dtype, spec.device

    def run(y: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        y, grad = backward_operands(y, grad, dtype, align_bytes)
        dx = new_output(shape, dtype, device)
        call(*(_columns(t, view, view.out_outer_stride, view.out_red_stride) for t in (y, grad, dx)))
        return dx

    return run
