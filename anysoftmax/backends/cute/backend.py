"""The `cute` backend: CuTe DSL kernels for NVIDIA GPUs of compute capability 9.0+; what it serves and
refuses, and why its priority is below `triton`'s: docs/cute.md."""

from __future__ import annotations

import math

import torch

from ...core.backend import Backend
from ...core.cache import OnceCache
from ...core.layout import ColumnView, RowLayout, column_view, contiguous_strides
from ...core.lse_merge import row_shape
from ...core.request import BWD, FWD, LSE, plan_key
from ...core.spec import SoftmaxSpec, dtype_name
from ...core.variant import CAUSAL_NONE
from . import compiler, env, launch
from .plan import DTYPE_BYTES, KernelKey, make_column_plan, make_plan

# (direction, dtypes, log, row length, alignment, arch, convention, overrides) -> KernelKey.
_plans: OnceCache[KernelKey] = OnceCache(maxsize=4096)


def _alignment(offset_elems: int, *strides: int) -> int:
    """The alignment (elements, at most 64) of a pointer `offset_elems` elements in and of `strides`:
    what the vector width may assume (0 divides by anything)."""
    return math.gcd(*(64 if v == 0 else min(v & -v, 64) for v in (offset_elems, *strides)))


def _column_alignment(view: ColumnView, offset_elems: int) -> int:
    return _alignment(offset_elems, view.in_outer_stride, view.in_red_stride, view.out_outer_stride,
                      view.out_red_stride)


def _checked(got):
    """`got` unless it is the reason a request cannot run, raised as ValueError."""
    if isinstance(got, str):
        raise ValueError(f"cute: {got}")
    return got


def request_layout(spec: SoftmaxSpec, in_strides: tuple[int, ...]) -> tuple[int, int, int] | ColumnView | str:
    """How the kernels read `spec` with input strides `in_strides` (output contiguous): (rows, row
    length, input row stride) for the row kernels, the `ColumnView` for the column kernels, else why
    neither can."""
    layout = RowLayout.from_strides(spec.shape, in_strides, contiguous_strides(spec.shape), spec.dim)
    if layout is None:
        return "rows spread over more than 3 irregular dimensions"
    if layout.n_cols <= 1 or (layout.in_col_stride == 1 and layout.out_col_stride == 1):
        return _equally_spaced(layout)
    view = column_view(layout)
    if view is None:
        return (f"the reduced dim {spec.dim} of {list(spec.shape)} (input strides {list(in_strides)}) is neither "
                f"contiguous nor followed by contiguous positions; backend 'triton' reads any strides")
    return view


def _equally_spaced(layout: RowLayout) -> tuple[int, int, int] | str:
    """(rows, row length, input row stride) when the rows of `layout` are one equally spaced dim."""
    dims = [(s, i) for s, i in zip(layout.row_sizes, layout.in_row_strides) if s != 1]
    if len(dims) > 1:
        return f"rows are not equally spaced (row dims {[d[0] for d in dims]} with input strides {[d[1] for d in dims]})"
    return layout.n_rows, layout.n_cols, dims[0][1] if dims else layout.n_cols


def lse_rows_of(spec: SoftmaxSpec, in_strides: tuple[int, ...]) -> tuple[int, int, int] | str:
    """The row kernels' (rows, row length, input row stride) of a logsumexp request, else why not:
    the reduced elements adjacent in x (any dim), the rows equally spaced in the result's order."""
    out = tuple(0 if d == spec.dim else st for d, st in enumerate(contiguous_strides(row_shape(spec.shape, spec.dim))))
    layout = RowLayout.from_strides(spec.shape, in_strides, out, spec.dim)
    if layout is None:
        return "rows spread over more than 3 irregular dimensions"
    if layout.n_cols > 1 and layout.in_col_stride != 1:
        return (f"the reduced dim {spec.dim} of {list(spec.shape)} is strided (input stride {layout.in_col_stride}): "
                f"cute's logsumexp runs the row kernels only; backend 'triton' reduces any dim")
    return _equally_spaced(layout)


def _refusal(spec: SoftmaxSpec, sinks: bool = False) -> str | None:
    """Why the kernels cannot take `spec`'s variant (masks and causal never; sinks only where the
    caller folds them in, `sinks`: logsumexp), device or dtypes, or None."""
    v = spec.variant
    if v.mask is not None or v.causal != CAUSAL_NONE or (v.sinks is not None and not sinks):
        what, rest = (("cute's logsumexp takes scale, softcap and sinks", "masks and causal") if sinks else
                      ("cute fuses scale and softcap", "masks, causal and sinks"))
        return f"{what} only, not {v.describe()} ({rest}: backend 'triton')"
    if spec.device.type != "cuda":
        return f"device type {spec.device.type!r} is not supported (NVIDIA sm_90+ GPUs)"
    for dtype in (spec.in_dtype, spec.out_dtype):
        if dtype_name(dtype) not in DTYPE_BYTES:
            return (f"{dtype_name(dtype)} is not supported by the cute kernels (float32, float16, bfloat16); "
                    f"backend 'triton' handles it")
    return None


def _memo(spec: SoftmaxSpec, direction: str, align: int, kind: str, make) -> KernelKey | str:
    """`make(in_dtype, out_dtype, arch, tvm_ffi)`, memoised per request class."""
    tvm_ffi, arch = env.tvm_ffi_available(), env.compile_arch()
    key = plan_key(spec, direction, align, extra=(kind, arch, tvm_ffi))
    return _plans.get(key, lambda: make(dtype_name(spec.in_dtype), dtype_name(spec.out_dtype), arch, tvm_ffi))


class CuteBackend(Backend):
    name = "cute"
    devices = ("cuda",)
    priority = 90  # below triton (100): chosen automatically where the selection table says so
    fused = True  # the fused family's elementwise prologue (scale, softcap); supports() refuses the rest
    merge_states_refusal = "no merge_states kernel (use backend='triton' or 'torch')"
    sampler_refusal = "no sampler kernels (its kernels are the softmax's; use backend='triton' or 'torch')"

    @staticmethod
    def status_note() -> str:
        """How calls reach the kernels (TVM-FFI, or the slower DLPack fallback)."""
        if env.tvm_ffi_available():
            return "kernels called through TVM-FFI"
        return "apache-tvm-ffi not installed: kernels called through DLPack wrappers (slower per call)"

    def is_available(self) -> str | None:
        # Cheap checks first: no import of the DSL on a machine that could not run it anyway.
        return env.dsl_missing(check_import=False) or env.device_missing() or env.dsl_missing()

    def supports(self, spec: SoftmaxSpec) -> str | None:
        reason = _refusal(spec)
        if reason is not None or spec.numel == 0:  # nothing to launch: the API returns the empty result
            return reason
        got = request_layout(spec, spec.strides)
        if isinstance(got, str):
            return got
        if isinstance(got, ColumnView):
            if spec.variant.scale is not None or spec.variant.softcap is not None:
                return (f"the fused steps ({spec.variant.describe()}) run in the row kernels only, and the reduced "
                        f"dim {spec.dim} of {list(spec.shape)} is strided; backend 'triton' fuses them over any dim")
            # Both directions need a kernel: the forward's input strides, the backward's contiguous operands.
            backward = request_layout(spec, contiguous_strides(spec.shape))
            for is_backward, view in ((False, got), (True, backward)):
                key = self.column_plan(is_backward, spec, view, _column_alignment(view, 0))
                if isinstance(key, str):
                    return key
        return env.capable(spec.device)

    def plan(self, backward: bool, spec: SoftmaxSpec, n_cols: int, align_elems: int, states: bool = False) -> KernelKey:
        """The row kernel's key for this request (memoised); `states`: the logsumexp kernel of the forward's plan."""
        def make(in_dtype, out_dtype, arch, tvm_ffi):
            return make_plan(backward, in_dtype, out_dtype, spec.log, n_cols, align_elems, arch, tvm_ffi,
                             scaled=spec.variant.scale is not None, capped=spec.variant.softcap is not None,
                             states=states)
        return _memo(spec, LSE if states else BWD if backward else FWD, align_elems, "rows", make)

    def column_plan(self, backward: bool, spec: SoftmaxSpec, view: ColumnView, align_elems: int) -> KernelKey | str:
        """The column kernel's key for this request, or why there is none (memoised)."""
        return _memo(spec, BWD if backward else FWD, align_elems, "columns", lambda ins, outs, arch, ffi:
                     make_column_plan(backward, ins, outs, spec.log, view.n_red, view.n_inner, align_elems, arch, ffi))

    @staticmethod
    def _bound(key: KernelKey, spec: SoftmaxSpec):
        return launch.bind(compiler.kernel(key), key, spec.device)

    def launcher(self, x: torch.Tensor, spec: SoftmaxSpec):
        """`f(x) -> y` bound to this request (memoised by dispatch, 16-byte alignment included)."""
        got = _checked(request_layout(spec, tuple(x.stride())))
        offset = x.data_ptr() // x.element_size()
        if isinstance(got, ColumnView):
            key = _checked(self.column_plan(False, spec, got, _column_alignment(got, offset)))
            return launch.columns_forward(self._bound(key, spec), spec, got)
        n_rows, n_cols, row_stride = got
        key = self.plan(False, spec, n_cols, _alignment(offset, row_stride))
        # (A fused spec that reaches a backend has a step: `empty_rows` alone is normalised away.)
        return launch.forward(self._bound(key, spec), spec, n_rows, n_cols, row_stride, fused=key.fused)

    def backward_launcher(self, y: torch.Tensor, spec: SoftmaxSpec):
        """`f(y, grad) -> dx` bound to this request; y, grad and dx are read contiguous."""
        got = _checked(request_layout(spec, contiguous_strides(spec.shape)))
        if isinstance(got, ColumnView):
            key = _checked(self.column_plan(True, spec, got, _column_alignment(got, 0)))
            return launch.columns_backward(self._bound(key, spec), spec, got, key.vec * y.element_size())
        n_rows, n_cols, _ = got
        key = self.plan(True, spec, n_cols, 64)  # contiguous operands, checked per call
        return launch.backward(self._bound(key, spec), spec, n_rows, n_cols, key.vec * y.element_size(),
                               fused=key.fused, reads_x=key.capped)

    # `f(grad, y, x, operands, p_sink) -> (dx, None)`: the row kernels' (fused columns are refused).
    fused_backward_launcher = backward_launcher

    def supports_logsumexp(self, spec: SoftmaxSpec) -> str | None:
        """The rows `lse_rows_of` reads, plain or with scale, softcap and sinks; else the reason."""
        reason = _refusal(spec, sinks=True)
        if reason is not None or spec.numel == 0:
            return reason
        got = lse_rows_of(spec, spec.strides)
        return got if isinstance(got, str) else env.capable(spec.device)

    def logsumexp_launcher(self, x: torch.Tensor, spec: SoftmaxSpec, operands):
        """`f(x, operands) -> lse` bound to this request: the softmax forward's plan for these rows,
        compiled in its states form (one float a row)."""
        n_rows, n_cols, row_stride = _checked(lse_rows_of(spec, tuple(x.stride())))
        key = self.plan(False, spec, n_cols, _alignment(x.data_ptr() // x.element_size(), row_stride), states=True)
        return launch.logsumexp(self._bound(key, spec), spec, n_rows, n_cols, row_stride)
