"""The `cute` backend: CuTe DSL kernels that split a long row over a thread-block cluster.

It serves NVIDIA GPUs of compute capability 9.0+ (Hopper: clusters and distributed shared
memory) with `nvidia-cutlass-dsl` installed; float32, float16 and bfloat16; softmax and
log_softmax, forward and backward; reductions over a dim whose elements are contiguous (the last
dim), rows equally spaced (any row stride, 0 included), and reductions over a strided dim
followed by contiguous positions (dim 0 of a matrix: the column kernels) whose columns one
cluster holds; of the fused family, the row kernels fuse `scale` and `softcap` (forward and
backward). `anysoftmax.logsumexp` runs the row kernels' first pass alone (`kernels.states_entry`)
for rows whose reduced elements are adjacent in x (any dim), with scale, softcap and sinks (a
sink folded in after the kernel). Everything else is refused with the reason, and the automatic
choice passes it on to the `triton` backend.

Its priority is below `triton`'s: it is chosen automatically only where the device's
selection table (`anysoftmax/configs/selection/<GPU>.yaml`) measured it faster.
"""

from __future__ import annotations

import math

import torch

from ...core.backend import Backend
from ...core.cache import OnceCache
from ...core.layout import ColumnView, RowLayout, column_view, contiguous_strides
from ...core.pieces import row_shape
from ...core.request import BWD, FWD, LSE, plan_key
from ...core.spec import SoftmaxSpec, dtype_name
from ...core.variant import CAUSAL_NONE
from . import compiler, env, launch
from .plan import DTYPE_BYTES, KernelKey, make_column_plan, make_plan

# (direction, dtypes, log, row length, alignment, arch, convention, overrides) -> KernelKey.
_plans: OnceCache[KernelKey] = OnceCache(maxsize=4096)


def _pow2_alignment(value: int) -> int:
    """The largest power of two dividing `value` (64 for 0: any vector width divides it)."""
    return 64 if value == 0 else min(value & -value, 64)


def request_layout(spec: SoftmaxSpec, in_strides: tuple[int, ...]) -> tuple[int, int, int] | ColumnView | str:
    """How the kernels read a request with input strides `in_strides` (output contiguous):
    (rows, row length, input row stride) for the row kernels when the reduced elements are
    adjacent and the rows equally spaced; the (outer, n, inner) `ColumnView` for the column
    kernels when the reduced dim is strided and followed by contiguous positions; else why
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
    """(rows, row length, input row stride) when the rows of `layout` are one equally spaced
    dim (or a single row), else why not."""
    dims = [(s, i) for s, i in zip(layout.row_sizes, layout.in_row_strides) if s != 1]
    if len(dims) > 1:
        return f"rows are not equally spaced (row dims {[d[0] for d in dims]} with input strides {[d[1] for d in dims]})"
    return layout.n_rows, layout.n_cols, dims[0][1] if dims else layout.n_cols


def lse_rows_of(spec: SoftmaxSpec, in_strides: tuple[int, ...]) -> tuple[int, int, int] | str:
    """The row kernels' (rows, row length, input row stride) of a logsumexp request, else why
    not. Its result is contiguous over the rows, so only x's layout matters: the reduced elements
    adjacent (any dim: a transposed input too) and the rows equally spaced, in the result's
    order (dims merge only where x and the result both chain: row r's lse is element r)."""
    out = tuple(0 if d == spec.dim else st for d, st in enumerate(contiguous_strides(row_shape(spec.shape, spec.dim))))
    layout = RowLayout.from_strides(spec.shape, in_strides, out, spec.dim)
    if layout is None:
        return "rows spread over more than 3 irregular dimensions"
    if layout.n_cols > 1 and layout.in_col_stride != 1:
        return (f"the reduced dim {spec.dim} of {list(spec.shape)} is strided (input stride {layout.in_col_stride}): "
                f"cute's logsumexp runs the row kernels only; backend 'triton' reduces any dim")
    return _equally_spaced(layout)


def rows_of(spec: SoftmaxSpec, in_strides: tuple[int, ...]) -> tuple[int, int, int] | str:
    """`request_layout` for the row kernels: their (rows, row length, row stride), else why not."""
    got = request_layout(spec, in_strides)
    if isinstance(got, ColumnView):
        return f"the reduced dim {spec.dim} of {list(spec.shape)} is not contiguous (input stride {got.in_red_stride})"
    return got


def columns_of(spec: SoftmaxSpec, in_strides: tuple[int, ...]) -> ColumnView | str:
    """`request_layout` for the column kernels: their `ColumnView`, else why not."""
    got = request_layout(spec, in_strides)
    return f"the reduced dim {spec.dim} of {list(spec.shape)} is contiguous: the row kernels' case" \
        if isinstance(got, tuple) else got


def _column_alignment(view: ColumnView, offset_elems: int) -> int:
    """The alignment (elements) of a column request's pointer and outer/reduced strides, in
    input and output: what the vector width may assume."""
    align = _pow2_alignment(offset_elems)
    for stride in (view.in_outer_stride, view.in_red_stride, view.out_outer_stride, view.out_red_stride):
        align = math.gcd(align, _pow2_alignment(stride))
    return align


def _fused_steps(spec: SoftmaxSpec, sinks: bool = False) -> tuple[bool, bool] | str:
    """(scaled, capped): the fused prologue steps of `spec` the row kernels apply, or why the
    request's variant is not served (masks and causal are not fused here; sinks only where the
    caller folds them in itself, `sinks`: logsumexp)."""
    v = spec.variant
    if spec.is_plain:
        return False, False
    if v.mask is not None or v.causal != CAUSAL_NONE or (v.sinks is not None and not sinks):
        what, rest = (("cute's logsumexp takes scale, softcap and sinks", "masks and causal") if sinks else
                      ("cute fuses scale and softcap", "masks, causal and sinks"))
        return f"{what} only, not {v.describe()} ({rest}: backend 'triton')"
    return v.scale is not None, v.softcap is not None


def _device_and_dtypes(spec: SoftmaxSpec) -> str | None:
    """Why the kernels cannot take `spec`'s device or dtypes, or None."""
    if spec.device.type != "cuda":
        return f"device type {spec.device.type!r} is not supported (NVIDIA sm_90+ GPUs)"
    for dtype in (spec.in_dtype, spec.out_dtype):
        if dtype_name(dtype) not in DTYPE_BYTES:
            return (f"{dtype_name(dtype)} is not supported by the cute kernels (float32, float16, bfloat16); "
                    f"backend 'triton' handles it")
    return None


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
        fused = _fused_steps(spec)
        if isinstance(fused, str):
            return fused
        reason = _device_and_dtypes(spec)
        if reason is not None:
            return reason
        if spec.numel == 0:
            return None  # nothing to launch: the API returns the empty result itself
        got = request_layout(spec, spec.strides)
        if isinstance(got, str):
            return got
        if isinstance(got, ColumnView):
            if any(fused):
                return (f"the fused steps ({spec.variant.describe()}) run in the row kernels only, and the reduced "
                        f"dim {spec.dim} of {list(spec.shape)} is strided; backend 'triton' fuses them over any dim")
            # Both directions must have a kernel: the forward's input strides, the backward's
            # contiguous operands.
            for backward, view in ((False, got), (True, columns_of(spec, contiguous_strides(spec.shape)))):
                key = view if isinstance(view, str) else self.column_plan(backward, spec, view,
                                                                          _column_alignment(view, 0))
                if isinstance(key, str):
                    return key
        return env.capable(spec.device)

    # ---- planning

    def plan(self, backward: bool, spec: SoftmaxSpec, n_cols: int, align_elems: int, states: bool = False) -> KernelKey:
        """The compiled kernel's key for this request (memoised per shape class); `states`: the
        logsumexp kernel of the forward's plan."""
        tvm_ffi = env.tvm_ffi_available()
        arch = env.compile_arch()
        in_dtype, out_dtype = dtype_name(spec.in_dtype), dtype_name(spec.out_dtype)
        scaled, capped = _fused_steps(spec, sinks=states)
        key = plan_key(spec, LSE if states else BWD if backward else FWD, align_elems, extra=("rows", arch, tvm_ffi))
        return _plans.get(key, lambda: make_plan(backward, in_dtype, out_dtype, spec.log, n_cols, align_elems, arch,
                                                 tvm_ffi, scaled=scaled, capped=capped, states=states))

    def column_plan(self, backward: bool, spec: SoftmaxSpec, view: ColumnView, align_elems: int) -> KernelKey | str:
        """The column kernel's key for this request, or why there is none (memoised)."""
        tvm_ffi = env.tvm_ffi_available()
        arch = env.compile_arch()
        in_dtype, out_dtype = dtype_name(spec.in_dtype), dtype_name(spec.out_dtype)
        key = plan_key(spec, BWD if backward else FWD, align_elems, extra=("columns", arch, tvm_ffi))
        return _plans.get(key, lambda: make_column_plan(backward, in_dtype, out_dtype, spec.log, view.n_red,
                                                        view.n_inner, align_elems, arch, tvm_ffi))

    def launcher(self, x: torch.Tensor, spec: SoftmaxSpec):
        """`f(x) -> y` bound to this request (dispatch memoises it per request, 16-byte
        alignment included)."""
        got = request_layout(spec, tuple(x.stride()))
        if isinstance(got, str):
            raise ValueError(f"cute: {got}")
        if isinstance(got, ColumnView):
            key = self.column_plan(False, spec, got, _column_alignment(got, x.data_ptr() // x.element_size()))
            if isinstance(key, str):
                raise ValueError(f"cute: {key}")
            return launch.columns_forward(launch.bind(compiler.kernel(key), key), spec, got)
        n_rows, n_cols, row_stride = got
        esize = x.element_size()
        align = math.gcd(_pow2_alignment(x.data_ptr() // esize), _pow2_alignment(row_stride))
        key = self.plan(False, spec, n_cols, align)
        call = launch.bind(compiler.kernel(key), key)
        # (A fused spec that reaches a backend has a step: `empty_rows` alone is normalised away.)
        return launch.forward(call, spec, n_rows, n_cols, row_stride, fused=key.fused)

    def backward_launcher(self, y: torch.Tensor, spec: SoftmaxSpec):
        """`f(y, grad) -> dx` bound to this request; y, grad and dx are read contiguous (as rows, or
        as columns for a reduction over a strided dim)."""
        got = request_layout(spec, contiguous_strides(spec.shape))
        if isinstance(got, str):
            raise ValueError(f"cute: {got}")
        if isinstance(got, ColumnView):
            key = self.column_plan(True, spec, got, _column_alignment(got, 0))
            if isinstance(key, str):
                raise ValueError(f"cute: {key}")
            return launch.columns_backward(launch.bind(compiler.kernel(key), key), spec, got,
                                           key.vec * y.element_size())
        n_rows, n_cols, _ = got
        key = self.plan(True, spec, n_cols, 64)  # contiguous operands, checked per call
        call = launch.bind(compiler.kernel(key), key)
        return launch.backward(call, spec, n_rows, n_cols, key.vec * y.element_size(), fused=key.fused,
                               reads_x=key.capped)

    def fused_backward_launcher(self, y: torch.Tensor, spec: SoftmaxSpec):
        """`f(grad, y, x, operands, p_sink) -> (dx, None)` bound to this fused request (scale,
        softcap: row kernels only, `supports()` refuses fused columns)."""
        return self.backward_launcher(y, spec)

    # ---- logsumexp (core.pieces): the forward kernel's first pass

    def supports_logsumexp(self, spec: SoftmaxSpec) -> str | None:
        """The requests the row kernels read (`lse_rows_of`), plain or with scale, softcap and
        sinks; masks, causal and reductions over a strided dim are refused with the reason."""
        fused = _fused_steps(spec, sinks=True)
        if isinstance(fused, str):
            return fused
        reason = _device_and_dtypes(spec)
        if reason is not None or spec.numel == 0:
            return reason
        got = lse_rows_of(spec, spec.strides)
        return got if isinstance(got, str) else env.capable(spec.device)

    def logsumexp_launcher(self, x: torch.Tensor, spec: SoftmaxSpec, operands):
        """`f(x, operands) -> lse` bound to this request (dispatch memoises it): the softmax
        forward's plan for these rows (the same CTAs, clusters and tiles), compiled in its states
        form, which writes one float a row."""
        got = lse_rows_of(spec, tuple(x.stride()))
        if isinstance(got, str):
            raise ValueError(f"cute: {got}")
        n_rows, n_cols, row_stride = got
        align = math.gcd(_pow2_alignment(x.data_ptr() // x.element_size()), _pow2_alignment(row_stride))
        key = self.plan(False, spec, n_cols, align, states=True)
        return launch.logsumexp(launch.bind(compiler.kernel(key), key), spec, n_rows, n_cols, row_stride)
