"""logsumexp's own kernel, shared by `triton` and `triton_ascend`: `lse_kernel` and its bound
launcher. The backends size the tiles and the grid (`LsePlan`); the triton backend serves row
plans from the softmax's row kernels instead (`lse_rows.py`) and this kernel the rest.

`lse_kernel` is persistent over blocks of BLOCK_M rows; each row is read once in BLOCK_N-wide
sub-blocks with the row kernels' fused prologue (`fused.prologue`, causal prefixes) and online
normalizer (a running max and rescaled sum per lane), closed with the sink. A row may be cut
into CHUNKS pieces held by different programs (long rows, few rows: the grid would otherwise
idle): each piece writes its own (lse) state and the host reduces the few states per row
(`torch.logsumexp` over CHUNKS floats a row, a negligible read).

Numerics: accumulation in fp32 (fp64 for fp64); the row max is kept out of exp when it is
+-inf (`_sub`) so empty rows end as log(0) = -inf; a NaN reaches the result through the sums
(`tl.maximum` may drop it on the GPU: fmax), and a +inf row is +inf where inf - inf would make
it NaN (as `torch.logsumexp`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...core.layout import RowLayout, cdiv, contiguous_strides, output_maker, row_operand_strides
from ...core.pieces import row_shape
from ...core.spec import SoftmaxSpec
from ...core.variant import BOTTOM_RIGHT, CAUSAL_NONE, MASK_BOOL, MASK_NONE, Operands
from .fused import col_limit, exp_acc, prologue
from .launcher import Binding, bind_kernel
from .plan import PLAIN_SCALARS, VALUE_NAMES, scalars
from .rows import _row_offsets
from .softmax_launchers import mask_operand, sinks_operand


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


def lse_layout(x: torch.Tensor, spec: SoftmaxSpec) -> tuple[bool, RowLayout]:
    """(copy, layout): x's rows with the mask's and the sinks' strides (the sinks copied to one
    value per row, `sinks_operand`); `copy`: x and the mask are read as contiguous copies, their
    own strides leaving more row dims than the kernel takes."""
    v = spec.variant
    ops = [v.mask.strides] if v.mask is not None else []
    if v.sinks is not None:
        ops.append(row_operand_strides(spec.shape, spec.dim))
    out_strides = contiguous_strides(spec.shape)  # unused by the kernel: only x and the operands chain
    layout = RowLayout.from_strides(spec.shape, tuple(x.stride()), out_strides, spec.dim, tuple(ops))
    if layout is not None:
        return False, layout
    if v.mask is not None:
        ops[0] = out_strides
    return True, RowLayout.from_strides(spec.shape, out_strides, out_strides, spec.dim, tuple(ops))


def launcher(x: torch.Tensor, spec: SoftmaxSpec, plan_for, guard=None):
    """`f(x, operands) -> lse` (keepdim, accumulation dtype) bound to requests like `spec` (x's
    strides as this x's), through `lse_kernel` with the tiles and grid of `plan_for(n_rows,
    n_cols) -> LsePlan`. `guard`: the device guard (`launcher.bind_kernel`)."""
    v = spec.variant
    copy, layout = lse_layout(x, spec)
    n_rows, n_cols = layout.n_rows, layout.n_cols
    plan = plan_for(n_rows, n_cols)
    chunk_cols = cdiv(cdiv(n_cols, max(1, plan.chunks)), plan.block_n) * plan.block_n  # whole sub-blocks
    chunks = cdiv(n_cols, chunk_cols)
    (m_rows, m_col), k = ((layout.op_row_strides[0], layout.op_col_strides[0]), 1) if v.mask is not None else \
        (((0, 0, 0), 0), 0)
    s_rows = layout.op_row_strides[k] if v.sinks is not None else (0, 0, 0)
    _, s1, s2 = layout.row_sizes
    causal = v.causal != CAUSAL_NONE
    ints = dict(n_rows=n_rows, n_cols=n_cols, chunk_cols=chunk_cols, S1=s1, S2=s2,
                **dict(zip(("xs0", "xs1", "xs2"), layout.in_row_strides)), xsn=layout.in_col_stride,
                **dict(zip(("ms0", "ms1", "ms2"), m_rows)), msn=m_col, **dict(zip(("ss0", "ss1", "ss2"), s_rows)),
                SQ=spec.shape[-2] if causal else 1, Q_DIV=layout.inner_div if causal else 1,
                C_OFF=spec.shape[-1] - spec.shape[-2] if v.causal == BOTTOM_RIGHT else 0)
    meta = dict(ACC_FP64=spec.acc_dtype == torch.float64, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, CHUNKS=chunks,
                HAS_SCALE=v.scale is not None, HAS_CAP=v.softcap is not None,
                MASK=0 if v.mask_kind == MASK_NONE else (1 if v.mask_kind == MASK_BOOL else 2), CAUSAL=causal,
                HAS_SINK=v.sinks is not None, PRECISE=spec.in_dtype in (torch.float32, torch.float64))
    if plan.num_warps is not None:
        meta["num_warps"] = plan.num_warps
    # (an absent mask is stood in for by x, absent sinks by the result: never read)
    launch = bind_kernel(Binding(lse_kernel, max(1, plan.grid), ("x_ptr", "o_ptr", "m_ptr", "s_ptr"),
                                 lambda a: (a[0], a[1], a[0] if a[2] is None else a[2], a[1] if a[3] is None else a[3]),
                                 ints, (meta,), VALUE_NAMES, PLAIN_SCALARS), device=spec.device, guard=guard)
    shape, new_partials = row_shape(spec.shape, spec.dim), output_maker((n_rows * chunks,), spec.acc_dtype, spec.device)
    plain_values = v.scale is None and v.softcap is None

    def run(x: torch.Tensor, operands: Operands) -> torch.Tensor:
        if copy:
            x = x.contiguous()
        out = new_partials()
        launch((x, out, mask_operand(operands.mask, spec, copy), sinks_operand(operands.sinks, spec)),
               PLAIN_SCALARS if plain_values else scalars(operands.scale, operands.softcap))
        if chunks > 1:
            out = torch.logsumexp(out.view(n_rows, chunks), 1)
        # Rows are numbered over x's row dims in logical order (outer to inner), as the result's.
        return out.view(shape)

    return run


__all__ = ["LsePlan", "launcher", "lse_kernel", "lse_layout"]
