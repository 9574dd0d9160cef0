"""The pieces ops (`core.pieces`) as Triton kernels shared by `triton` and `triton_ascend`:
`lse_kernel` (the row state) and `merge_kernel` (K partial results into one). The backends
size the tiles and the grid (`LsePlan`, `MergePlan`); everything else is here.

* `lse_kernel`: persistent over blocks of BLOCK_M rows; each row is read once in BLOCK_N-wide
  sub-blocks with the row kernels' fused prologue (`fused.prologue`, causal prefixes) and
  online normalizer (a running max and rescaled sum per lane), closed with the sink. A row may
  be cut into CHUNKS pieces held by different programs (long rows, few rows: the grid would
  otherwise idle): each piece writes its own (lse) state and the host reduces the few states
  per row (`torch.logsumexp` over CHUNKS floats a row, a negligible read).
* `merge_kernel`: persistent over (BLOCK_R rows x BLOCK_D) tiles of the output, up to MAX_K
  partials unrolled (K a constexpr); more partials are merged MAX_K - 1 at a time into a
  float32/64 intermediate.

Numerics: accumulation in fp32 (fp64 for fp64); the row max is kept out of exp when it is
+-inf (`_sub`) so empty rows end as log(0) = -inf and -inf partials weigh exactly 0; a NaN
reaches the result through the sums (`tl.maximum` may drop it on the GPU: fmax), and a +inf
row is +inf where inf - inf would make it NaN (as `torch.logsumexp`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...core.layout import RowLayout, cdiv, contiguous_strides, new_output, new_output_like
from ...core.pieces import MergeSpec, row_shape
from ...core.spec import SoftmaxSpec
from ...core.variant import BOTTOM_RIGHT, CAUSAL_NONE, MASK_BOOL, MASK_NONE, Operands
from .fused import col_limit, exp_acc, prologue
from .plan import INT32_MAX, scalars
from .rows import _row_offsets

MAX_K = 8


@triton.jit
def _sub(m):
    """The max subtracted before exp: 0 where it is +-inf (exp(z - m) would be NaN for z = m)."""
    return tl.where((m == float("-inf")) | (m == float("inf")), 0.0, m)


@triton.jit
def _rescale(s, m_old, m_new, ACC_FP64: tl.constexpr):
    """s (a sum of exp(z - sub(m_old))) re-based on m_new; 0 while nothing was summed (guards
    0 * inf when the new max is far below 0), unless a NaN was (fmax may have hidden it from m)."""
    return tl.where((m_old == float("-inf")) & (s == s), 0.0, s * exp_acc(_sub(m_old) - _sub(m_new), ACC_FP64))


@triton.jit
def lse_kernel(
    x_ptr, o_ptr, m_ptr, s_ptr, n_rows, n_cols, chunk_cols,
    S1, S2, xs0, xs1, xs2, xsn, ms0, ms1, ms2, msn, ss0, ss1, ss2, SQ, Q_DIV, C_OFF,
    scale_hi, scale_lo, cap_hi, cap_lo,
    ACC_FP64: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_CAP: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_SINK: tl.constexpr, PRECISE: tl.constexpr,
):
    """o[row * CHUNKS + c] = log(sum over the kept columns of chunk c of exp(z)) (+ the sink in
    chunk 0): CHUNKS = 1 gives the row's logsumexp itself."""
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    cols0 = tl.arange(0, BLOCK_N)
    n_work = tl.cdiv(n_rows, BLOCK_M) * CHUNKS
    for w in tl.range(tl.program_id(0), n_work, tl.num_programs(0)):
        blk = w // CHUNKS
        c = w % CHUNKS
        rows = tl.cast(blk, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < n_rows
        x_off = _row_offsets(rows, S1, S2, xs0, xs1, xs2)
        m_off = _row_offsets(rows, S1, S2, ms0, ms1, ms2)
        lim = col_limit(rows, n_cols, SQ, Q_DIV, C_OFF, CAUSAL)
        lo = c * chunk_cols
        hi = tl.minimum(lim, lo + chunk_cols)
        # Per row: the running max m and the sum s of exp(z - sub(m)), rescaled once per
        # sub-block (one exp per element; the per-lane form of the row kernels costs two, and
        # at ~1.5 G bf16 elements/s the H100's exp units would be the limit).
        m = tl.full([BLOCK_M], float("-inf"), acc_ty)
        s = tl.zeros([BLOCK_M], acc_ty)
        for start in tl.range(lo, lo + chunk_cols, BLOCK_N):
            cols = start + cols0
            if CAUSAL:
                live = row_ok[:, None] & (cols[None, :] < hi[:, None])
            else:
                live = row_ok[:, None] & (cols[None, :] < hi)
            x = tl.load(x_ptr + x_off[:, None] + cols[None, :] * xsn, mask=live, other=float("-inf")).to(acc_ty)
            z, _ = prologue(x, live, m_ptr + m_off[:, None] + cols[None, :] * msn, scale_hi, scale_lo, cap_hi,
                            cap_lo, HAS_SCALE, HAS_CAP, MASK, ACC_FP64, PRECISE)
            m_new = tl.maximum(m, tl.max(z, axis=1))
            s = _rescale(s, m, m_new, ACC_FP64) + tl.sum(exp_acc(z - _sub(m_new)[:, None], ACC_FP64), axis=1)
            m = m_new
        if HAS_SINK:  # the sink joins chunk 0 of its row
            sink = tl.load(s_ptr + _row_offsets(rows, S1, S2, ss0, ss1, ss2), mask=row_ok, other=0.0).to(acc_ty)
            sink = tl.where(c == 0, sink, float("-inf"))
            m_new = tl.maximum(m, sink)
            s = _rescale(s, m, m_new, ACC_FP64) + exp_acc(sink - _sub(m_new), ACC_FP64)
            s = tl.where(sink != sink, float("nan"), s)  # (max may drop a NaN: the sum keeps it)
            m = m_new
        lse = _sub(m) + tl.log(s)
        # +inf (and no NaN, which the sum carries) is +inf, as torch.logsumexp gives it.
        lse = tl.where((m == float("inf")) & (s == s), float("inf"), lse)
        tl.store(o_ptr + rows * CHUNKS + c, lse.to(o_ptr.dtype.element_ty), mask=row_ok)


@dataclass(frozen=True)
class LsePlan:
    """Tiles and grid of one logsumexp launch (the backend's choice)."""

    block_m: int
    block_n: int
    chunks: int
    grid: int
    num_warps: int | None = None


def _sinks_rows(sinks: torch.Tensor, shape: tuple, dim: int, dtype) -> torch.Tensor:
    # The sinks copied to one value per row (contiguous over x's shape with size 1 in dim): their
    # broadcast strides would stop x's row dims from merging (`core.layout.operand_strides`).
    return sinks.to(dtype).expand(row_shape(shape, dim)).contiguous()


def lse_layout(x: torch.Tensor, spec: SoftmaxSpec, operands: Operands):
    """(x, layout, mask tensor, sinks rows): x's rows with the mask's and the sinks' strides."""
    v = spec.variant
    ops = []
    if v.mask is not None:
        ops.append(v.mask.strides)
    sinks = None
    if v.sinks is not None:
        sinks = _sinks_rows(operands.sinks, spec.shape, spec.dim, spec.acc_dtype)
        rs = contiguous_strides(row_shape(spec.shape, spec.dim))
        ops.append(tuple(0 if d == spec.dim else st for d, st in enumerate(rs)))
    out_strides = contiguous_strides(spec.shape)  # unused by the kernel: only x and the operands chain
    layout = RowLayout.from_strides(spec.shape, tuple(x.stride()), out_strides, spec.dim, tuple(ops))
    mask = operands.mask
    if layout is None:
        x = x.contiguous()
        if mask is not None:
            mask = mask.expand(spec.shape).contiguous()
            ops[0] = tuple(mask.stride())
        layout = RowLayout.from_strides(spec.shape, tuple(x.stride()), out_strides, spec.dim, tuple(ops))
    if mask is not None and mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)
    return x, layout, mask, sinks


def launch_lse(x: torch.Tensor, spec: SoftmaxSpec, operands: Operands, plan: LsePlan, layout_parts=None) -> torch.Tensor:
    """The logsumexp of `spec` (keepdim, accumulation dtype) with `plan`'s tiles and grid."""
    x, layout, mask, sinks = layout_parts or lse_layout(x, spec, operands)
    v = spec.variant
    n_rows, n_cols = layout.n_rows, layout.n_cols
    chunks = max(1, plan.chunks)
    chunk_cols = cdiv(n_cols, chunks)
    chunk_cols = cdiv(chunk_cols, plan.block_n) * plan.block_n  # whole sub-blocks per chunk
    chunks = cdiv(n_cols, chunk_cols)
    out = new_output((n_rows * chunks,), spec.acc_dtype, x.device)
    k = 0
    m_rows, m_col = (0, 0, 0), 0
    if v.mask is not None:
        m_rows, m_col, k = layout.op_row_strides[0], layout.op_col_strides[0], 1
    s_rows = layout.op_row_strides[k] if v.sinks is not None else (0, 0, 0)
    _, S1, S2 = layout.row_sizes
    sq = spec.shape[-2] if v.causal != CAUSAL_NONE else 1
    c_off = spec.shape[-1] - spec.shape[-2] if v.causal == BOTTOM_RIGHT else 0
    q_div = layout.inner_div if v.causal != CAUSAL_NONE else 1
    mask_code = 0 if v.mask_kind == MASK_NONE else (1 if v.mask_kind == MASK_BOOL else 2)
    options = {} if plan.num_warps is None else dict(num_warps=plan.num_warps)
    lse_kernel[(max(1, plan.grid),)](
        x, out, mask if mask is not None else x, sinks if sinks is not None else out, n_rows, n_cols, chunk_cols,
        S1, S2, *layout.in_row_strides, layout.in_col_stride, *m_rows, m_col, *s_rows, sq, q_div, c_off,
        *scalars(operands.scale, operands.softcap),
        ACC_FP64=spec.acc_dtype == torch.float64, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, CHUNKS=chunks,
        HAS_SCALE=v.scale is not None, HAS_CAP=v.softcap is not None, MASK=mask_code,
        CAUSAL=v.causal != CAUSAL_NONE, HAS_SINK=v.sinks is not None,
        PRECISE=spec.in_dtype in (torch.float32, torch.float64), **options)
    if chunks > 1:
        out = torch.logsumexp(out.view(n_rows, chunks), 1)
    # Rows are numbered over x's row dims in logical order (outer to inner), as the result's.
    return out.view(row_shape(spec.shape, spec.dim))


# ---- merge_states -----------------------------------------------------------------------------

@triton.jit
def _load_part(o_ptr, l_ptr, o_off, l_off, cols, osd, live, row_ok, ACC_FP64: tl.constexpr):
    lse = tl.load(l_ptr + l_off, mask=row_ok, other=float("-inf"))
    o = tl.load(o_ptr + o_off[:, None] + cols[None, :] * osd, mask=live, other=0.0)
    return lse.to(tl.float64 if ACC_FP64 else tl.float32), o


@triton.jit
def _add_part(lse, o, m_sub, s, acc, ACC_FP64: tl.constexpr):
    w = exp_acc(lse - m_sub, ACC_FP64)
    w = tl.where(lse == float("-inf"), 0.0, w)
    # A partial of weight 0 is selected away, so what an empty segment's output holds (NaN
    # too) never reaches the sums.
    acc += tl.where((w == 0)[:, None], 0.0, w[:, None] * o.to(acc.dtype))
    return s + w, acc


@triton.jit
def _as_element_of(v, ptr):
    """v converted to the element type of `ptr`, a float64 value to a narrower type through
    float32: the interpreter's float64 -> bfloat16 cast gives NaN, and the compiled kernel
    (which could cast in one step) takes the same two roundings, so both are one code path."""
    ty = ptr.dtype.element_ty
    if v.dtype == tl.float64:
        if ty != tl.float64:
            v = v.to(tl.float32)
    return v.to(ty)


@triton.jit
def merge_kernel(
    o0, o1, o2, o3, o4, o5, o6, o7, l0, l1, l2, l3, l4, l5, l6, l7, out_ptr, lse_ptr,
    n_rows, D, S1, os0, os1, osd, ls0, ls1, ys0, ys1, ysd, zs0, zs1,
    K: tl.constexpr, ACC_FP64: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, WIDE: tl.constexpr,
):
    """out = sum_i exp(l_i - lse) o_i, lse = log sum_i exp(l_i): rows r = (r // S1, r % S1)
    through (stride0, stride1) per tensor kind (partials, their lses, out, lse out).

    Every partial and lse of a tile is loaded before the first is used: the tile costs one
    memory round trip (at decode sizes that round trip is most of the merge's time; loads
    issued after the lses' maximum would wait for it: two). Offsets are 32-bit unless an
    operand spans 2**31 elements (`WIDE`): the merge does little arithmetic per byte, and 64-bit
    row division and addressing was most of its instructions (NVIDIA H100, K = 8, head size 64:
    issue-bound beside the copy)."""
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    n_dt = tl.cdiv(D, BLOCK_D)
    n_tiles = tl.cdiv(n_rows, BLOCK_R) * n_dt
    for t in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        rb = t // n_dt
        dt = t % n_dt
        if WIDE:
            rows = tl.cast(rb, tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        else:
            rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = dt * BLOCK_D + tl.arange(0, BLOCK_D)
        row_ok = rows < n_rows
        live = row_ok[:, None] & (cols < D)[None, :]
        r0 = rows // S1
        r1 = rows % S1
        o_off = r0 * os0 + r1 * os1
        l_off = r0 * ls0 + r1 * ls1
        p0, v0 = _load_part(o0, l0, o_off, l_off, cols, osd, live, row_ok, ACC_FP64)
        if K > 1:
            p1, v1 = _load_part(o1, l1, o_off, l_off, cols, osd, live, row_ok, ACC_FP64)
        if K > 2:
            p2, v2 = _load_part(o2, l2, o_off, l_off, cols, osd, live, row_ok, ACC_FP64)
        if K > 3:
            p3, v3 = _load_part(o3, l3, o_off, l_off, cols, osd, live, row_ok, ACC_FP64)
        if K > 4:
            p4, v4 = _load_part(o4, l4, o_off, l_off, cols, osd, live, row_ok, ACC_FP64)
        if K > 5:
            p5, v5 = _load_part(o5, l5, o_off, l_off, cols, osd, live, row_ok, ACC_FP64)
        if K > 6:
            p6, v6 = _load_part(o6, l6, o_off, l_off, cols, osd, live, row_ok, ACC_FP64)
        if K > 7:
            p7, v7 = _load_part(o7, l7, o_off, l_off, cols, osd, live, row_ok, ACC_FP64)
        m = p0
        bad = p0 != p0
        if K > 1:
            m, bad = tl.maximum(m, p1), bad | (p1 != p1)
        if K > 2:
            m, bad = tl.maximum(m, p2), bad | (p2 != p2)
        if K > 3:
            m, bad = tl.maximum(m, p3), bad | (p3 != p3)
        if K > 4:
            m, bad = tl.maximum(m, p4), bad | (p4 != p4)
        if K > 5:
            m, bad = tl.maximum(m, p5), bad | (p5 != p5)
        if K > 6:
            m, bad = tl.maximum(m, p6), bad | (p6 != p6)
        if K > 7:
            m, bad = tl.maximum(m, p7), bad | (p7 != p7)
        # -inf: every partial empty (weights 0, out 0); +inf: weights inf/inf (NaN, by design).
        m_sub = tl.where((m == float("-inf")) | (m == float("inf")), 0.0, m)
        s = tl.zeros([BLOCK_R], acc_ty)
        acc = tl.zeros([BLOCK_R, BLOCK_D], acc_ty)
        s, acc = _add_part(p0, v0, m_sub, s, acc, ACC_FP64)
        if K > 1:
            s, acc = _add_part(p1, v1, m_sub, s, acc, ACC_FP64)
        if K > 2:
            s, acc = _add_part(p2, v2, m_sub, s, acc, ACC_FP64)
        if K > 3:
            s, acc = _add_part(p3, v3, m_sub, s, acc, ACC_FP64)
        if K > 4:
            s, acc = _add_part(p4, v4, m_sub, s, acc, ACC_FP64)
        if K > 5:
            s, acc = _add_part(p5, v5, m_sub, s, acc, ACC_FP64)
        if K > 6:
            s, acc = _add_part(p6, v6, m_sub, s, acc, ACC_FP64)
        if K > 7:
            s, acc = _add_part(p7, v7, m_sub, s, acc, ACC_FP64)
        m_inf = m == float("inf")
        out = acc * tl.where(s == 0, 0.0, 1.0 / s)[:, None]  # (one division per row, not per element)
        out = tl.where((bad | m_inf)[:, None], float("nan"), out)
        tl.store(out_ptr + (r0 * ys0 + r1 * ys1)[:, None] + cols[None, :] * ysd, _as_element_of(out, out_ptr),
                 mask=live)
        lse = m_sub + tl.log(s)
        lse = tl.where(m_inf, float("inf"), lse)
        lse = tl.where(bad, float("nan"), lse)
        tl.store(lse_ptr + r0 * zs0 + r1 * zs1, _as_element_of(lse, lse_ptr), mask=row_ok & ((tl.zeros([BLOCK_R], tl.int32) + dt) == 0))


@dataclass(frozen=True)
class MergePlan:
    """Tiles and grid of one merge launch (the backend's choice)."""

    block_r: int
    block_d: int
    grid: int
    num_warps: int | None = None


def _two_row_dims(t: torch.Tensor, lead: int) -> tuple[int, int] | None:
    """(stride of r // S1, stride of r % S1) of t's first `lead` dims as rows (S1 the size of
    the last of them), or None when the outer ones do not chain into one stride."""
    if lead == 0:
        return 0, 0
    shape, st = t.shape, t.stride()
    outer = [(shape[d], st[d]) for d in range(lead - 1) if shape[d] != 1]
    for (_, a), (size_b, b) in zip(outer, outer[1:]):
        if a != size_b * b:
            return None
    return (outer[-1][1] if outer else 0), st[lead - 1]


def _shared_strides(ts, lead):
    """One (stride0, stride1[, stride_d]) for every tensor of `ts`, or None (then copied)."""
    first = _two_row_dims(ts[0], lead)
    if first is None:
        return None
    for t in ts[1:]:
        if _two_row_dims(t, lead) != first or (t.dim() > lead and t.stride()[lead] != ts[0].stride()[lead]):
            return None
    return first


def launch_merge(outputs, lses, spec: MergeSpec, plan_for, out=None, lse_out=None):
    """merge_states of `spec` (`plan_for(k)` -> MergePlan); into `out` / `lse_out` when given
    (any strides with the same row structure: vLLM's [heads, tokens] lse)."""
    lead = len(spec.shape) - 1
    acc = spec.acc_dtype
    outputs, lses = list(outputs), list(lses)
    while len(outputs) > MAX_K:  # merge MAX_K at a time into a wide intermediate
        o, l_ = _merge_group(outputs[:MAX_K], lses[:MAX_K], lead, acc, acc, acc, plan_for)
        outputs, lses = [o] + outputs[MAX_K:], [l_] + lses[MAX_K:]
    return _merge_group(outputs, lses, lead, spec.dtype, spec.out_lse_dtype, acc, plan_for, out, lse_out)


def merge_launcher(spec: MergeSpec, plan_for):
    """`f(outputs, lses, out, lse_out) -> (out, lse)` bound to one merge request (dispatch
    memoises it per request key, which fixes every operand's shape, strides, dtype and
    alignment, `out` and `lse_out` included). The first call works out, from its own tensors,
    which inputs are converted or copied, the strides, plan, grid, integer arguments and
    constexprs, and launches through `merge_kernel[grid]` (it compiles); later calls only
    allocate the outputs not given and launch the compiled kernel through the native launcher
    (`native_merge`, one C++ call with the tensors) or Triton's low-level launcher
    (`launcher.fast_state`), where the JIT entry's argument binding and specialisation would
    cost more than the launch itself. K > MAX_K (merged in groups) always takes `launch_merge`."""
    from . import native_launch
    from .launcher import FAST_LAUNCH, _constexpr_tails, _interpreter_lock, fast_state, interpreter_quiet, launch_lock
    from .request import _guard_for

    if spec.k > MAX_K:
        return lambda outputs, lses, out, lse_out: launch_merge(outputs, lses, spec, plan_for, out, lse_out)
    lead = len(spec.shape) - 1
    acc, out_dtype, lse_dtype = spec.acc_dtype, spec.dtype, spec.out_lse_dtype
    shape, device, k = tuple(spec.shape), spec.device, spec.k
    pad = MAX_K - k
    lock = launch_lock(merge_kernel)
    interpreted = lock is _interpreter_lock
    guard = _guard_for(device, None)
    # bound: (cast outputs, copy outputs, cast lses, copy lses, grid, integers, constexprs)
    state = {"bound": None, "prepare": False, "compiled": False, "fast": None, "native": None,
             "native_reason": "not launched yet" if native_launch.LAUNCHER == "native" else "ANYSOFTMAX_LAUNCHER is triton"}

    def prepared(outputs, lses, how):
        cast_o, copy_o, cast_l, copy_l = how
        if cast_o:
            outputs = [t.to(acc) for t in outputs]
        if copy_o:
            outputs = [t.contiguous() for t in outputs]
        if cast_l:
            lses = [t.to(acc) for t in lses]
        if copy_l:
            lses = [t.contiguous() for t in lses]
        return outputs, lses

    def bind_first(outputs, lses, out, lse_out):
        # The decisions `_merge_group` makes per call, made once: they depend only on what the
        # request key fixes (layouts and dtypes).
        cast_o = len({t.dtype for t in outputs}) > 1
        cast_l = len({t.dtype for t in lses}) > 1
        outputs, lses = prepared(outputs, lses, (cast_o, False, cast_l, False))
        copy_o = _shared_strides(outputs, lead) is None
        copy_l = _shared_strides(lses, lead) is None
        how = (cast_o, copy_o, cast_l, copy_l)
        outputs, lses = prepared(outputs, lses, (False, copy_o, False, copy_l))
        out = new_output(shape, out_dtype, device) if out is None else out
        lse_out = new_output(shape[:-1], lse_dtype, device) if lse_out is None else lse_out
        static = _row_args(outputs, lses, out, lse_out, lead)
        plan = plan_for(k, static[0], static[1])
        meta = dict(K=k, ACC_FP64=acc == torch.float64, BLOCK_R=plan.block_r, BLOCK_D=plan.block_d,
                    WIDE=_wide(outputs[0], lses[0], out, lse_out, rows=static[0] + plan.block_r))
        if plan.num_warps is not None:
            meta["num_warps"] = plan.num_warps
        state["bound"] = (how, max(1, plan.grid), static, meta)
        state["prepare"] = any(how)
        return outputs, lses, out, lse_out

    lse_shape = shape[:-1]

    def launch(outputs, lses, out, lse_out):
        fast = state["fast"]
        if fast is not None:
            calls, hooks, stream_of, index, enter, leave, enter_calls, leave_calls = fast
            # (Launch hooks, e.g. profilers, need Triton's own path, which builds their metadata.)
            if hooks.launch_enter_hook is enter and hooks.launch_exit_hook is leave and not enter_calls \
                    and not leave_calls:
                if state["prepare"]:
                    outputs, lses = prepared(outputs, lses, state["bound"][0])
                if out is None:
                    out = new_output_like(outputs[0], out_dtype)
                if lse_out is None:
                    lse_out = new_output_like(lses[0], lse_dtype)
                if state["native"] is not None:
                    state["native"][0](*outputs, *lses, out, lse_out)
                    return out, lse_out
                # (the kernel takes MAX_K partials: the unused ones stand in as the first, never read)
                po = [t.data_ptr() for t in outputs]
                pl = [t.data_ptr() for t in lses]
                stream = stream_of(index)
                for fn, before, after, _, rest in calls:
                    fn(*before, stream, *after, *po, *po[:1] * pad, *pl, *pl[:1] * pad, out.data_ptr(),
                       lse_out.data_ptr(), *rest)
                return out, lse_out
        bound = state["bound"]
        if bound is None:
            outputs, lses, out, lse_out = bind_first(outputs, lses, out, lse_out)
            bound = state["bound"]
        else:
            outputs, lses = prepared(outputs, lses, bound[0])
            out = new_output(shape, out_dtype, device) if out is None else out
            lse_out = new_output(lse_shape, lse_dtype, device) if lse_out is None else lse_out
        _, grid, static, meta = bound
        args = (*outputs, *[outputs[0]] * pad, *lses, *[lses[0]] * pad, out, lse_out, *static)
        if state["compiled"] and not interpreted:  # (no fast path, or a launch hook is active)
            merge_kernel[(grid,)](*args, **meta)
            return out, lse_out
        with lock:  # a first launch compiles: one thread at a time (every interpreted launch)
            if interpreted:
                with interpreter_quiet():
                    merge_kernel[(grid,)](*args, **meta)
                return out, lse_out
            compiled = merge_kernel[(grid,)](*args, **meta)
            state["compiled"] = True
        if FAST_LAUNCH and compiled is not None and hasattr(compiled, "packed_metadata"):
            tails = _constexpr_tails(merge_kernel, len(args), [meta])
            if tails is not None:
                from triton.runtime.driver import driver

                state["fast"] = fast_state([compiled], tails, grid, out.device.index, driver.active.get_current_stream,
                                           static, values=())
                if native_launch.LAUNCHER == "native":
                    fn, state["native_reason"] = native_merge(compiled, k, out, grid, static)
                    # (the CompiledKernel kept alive: the native launcher holds only its function)
                    state["native"] = None if fn is None else (fn, compiled)
        return out, lse_out

    def run(outputs, lses, out, lse_out):
        with guard(device):  # (Triton launches on the current device)
            return launch(outputs, lses, out, lse_out)

    run = launch if guard is None else run
    run.state = state  # (tests and benchmarks/hit_path_cpu.py stand a recorder in for Triton's launcher)
    return run


def native_merge(compiled, k: int, out: torch.Tensor, grid: int, static: tuple):
    """(launcher, reason) of `launcher.native_for` for a compiled `merge_kernel` of K = k,
    called as `f(*outputs, *lses, out, lse_out)`: partial i is argument i, its lse argument
    k + i, the unused partials and lses stand in as the first ones (never read, K being a
    constexpr); `static` the kernel's integer arguments in its order (`_row_args`)."""
    from .launcher import native_for
    from .plan import runtime_params

    pointers = {f"o{i}": i if i < k else 0 for i in range(MAX_K)}
    pointers.update({f"l{i}": k + (i if i < k else 0) for i in range(MAX_K)})
    pointers.update(out_ptr=2 * k, lse_ptr=2 * k + 1)
    ints = dict(zip(runtime_params(merge_kernel)[len(pointers):], static))
    return native_for([compiled], out, grid, pointers, ints, {}, [True] * (2 * k + 2))


def _merge_group(outputs, lses, lead, out_dtype, lse_dtype, acc, plan_for, out=None, lse_out=None):
    shape = tuple(outputs[0].shape)
    if len({t.dtype for t in outputs}) > 1:
        outputs = [t.to(acc) for t in outputs]
    if len({t.dtype for t in lses}) > 1:
        lses = [t.to(acc) for t in lses]
    if _shared_strides(outputs, lead) is None:
        outputs = [t.contiguous() for t in outputs]
    if _shared_strides(lses, lead) is None:
        lses = [t.contiguous() for t in lses]
    out = new_output(shape, out_dtype, outputs[0].device) if out is None else out
    lse_out = new_output(shape[:-1], lse_dtype, outputs[0].device) if lse_out is None else lse_out
    k = len(outputs)
    static = _row_args(outputs, lses, out, lse_out, lead)
    plan = plan_for(k, static[0], static[1])
    pad_o = outputs + [outputs[0]] * (MAX_K - k)
    pad_l = lses + [lses[0]] * (MAX_K - k)
    options = {} if plan.num_warps is None else dict(num_warps=plan.num_warps)
    merge_kernel[(max(1, plan.grid),)](*pad_o, *pad_l, out, lse_out, *static, K=k, ACC_FP64=acc == torch.float64,
                                       BLOCK_R=plan.block_r, BLOCK_D=plan.block_d,
                                       WIDE=_wide(outputs[0], lses[0], out, lse_out, rows=static[0] + plan.block_r),
                                       **options)
    return out, lse_out


def _wide(*tensors, rows: int) -> bool:
    """Whether merge_kernel needs 64-bit offsets: a tensor's furthest element (every partial
    shares the first's strides, every lse the first lse's) or the row count pass 2**31 - 1."""
    reach = max(sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()) if n) for t in tensors)
    return max(reach, rows) > INT32_MAX


def _row_args(outputs, lses, out, lse_out, lead: int) -> tuple:
    """`merge_kernel`'s integer arguments, in its order, for operands whose row dims collapse
    into two strides. Rows are numbered in the operands' own order (vLLM's [heads, tokens]
    lses included): a tile's rows are then adjacent in the partials, and with lses read a float
    per row (sectors shared through L2) that beat numbering one head's tokens together at every
    shape measured (NVIDIA H100, CUDA graphs: K = 2, 8192 x 32 x 256 0.99 of copy against
    0.95; K = 8, 1024 x 32 x 64 0.79 against 0.76; `benchmarks/pieces_probe.py --parts order`)."""
    y_st, z_st = _two_row_dims(out, lead), _two_row_dims(lse_out, lead)
    if y_st is None or z_st is None:
        raise ValueError("merge_states: the output tensors' row dims do not collapse into two strides")
    shape = out.shape
    return (math.prod(shape[:-1]), shape[-1], shape[lead - 1] if lead else 1, *_two_row_dims(outputs[0], lead),
            outputs[0].stride(-1), *_two_row_dims(lses[0], lead), *y_st, out.stride(-1), *z_st)


__all__ = ["LsePlan", "MAX_K", "MergePlan", "launch_lse", "launch_merge", "lse_kernel", "lse_layout", "merge_kernel",
           "merge_launcher", "native_merge"]
