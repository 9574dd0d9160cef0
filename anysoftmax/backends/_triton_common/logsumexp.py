"""logsumexp's own kernel (`triton`'s column plans, `triton_ascend`) and its launcher on the backend's
`LsePlan`: persistent over BLOCK_M rows read once in BLOCK_N sub-blocks; long rows among few cut
into CHUNKS pieces on different programs, their lses reduced on the host."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...core.layout import cdiv, output_maker
from ...core.lse_merge import row_shape
from ...core.spec import SoftmaxSpec
from ...core.variant import Operands
from .fused import close_lse, col_limit, exp_acc, lse_rescale, lse_sub, prologue, row_scale
from .launcher import Binding, bind_kernel
from .plan import PLAIN_SCALARS, VALUE_NAMES, Fusion, scalars
from .rows import row_offsets
from .softmax_launchers import logical_rows, mask_operand, row_scale_operand, sinks_operand


@triton.jit
def lse_kernel(
    x_ptr, o_ptr, m_ptr, s_ptr, r_ptr, n_rows, n_cols, chunk_cols,
    S1, S2, xs0, xs1, xs2, xsn, ms0, ms1, ms2, msn, ss0, ss1, ss2, SQ, Q_DIV, C_OFF,
    scale_hi, scale_lo, cap_hi, cap_lo,
    ACC_FP64: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_CAP: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_SINK: tl.constexpr, PRECISE: tl.constexpr, HAS_ROW_SCALE: tl.constexpr,
):
    """o[row * CHUNKS + c] = log(sum of exp(z) over chunk c's kept columns) (+ the sink in chunk
    0). HAS_ROW_SCALE: each row's scale read at its sink offset (`r_ptr`)."""
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    cols0 = tl.arange(0, BLOCK_N)
    n_work = tl.cdiv(n_rows, BLOCK_M) * CHUNKS
    for w in tl.range(tl.program_id(0), n_work, tl.num_programs(0)):
        blk = w // CHUNKS
        c = w % CHUNKS
        rows = tl.cast(blk, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < n_rows
        x_off = row_offsets(rows, S1, S2, xs0, xs1, xs2)
        m_off = row_offsets(rows, S1, S2, ms0, ms1, ms2)
        lim = col_limit(rows, n_cols, SQ, Q_DIV, C_OFF, CAUSAL)
        scale = scale_hi
        if HAS_ROW_SCALE:
            scale = row_scale(r_ptr, row_offsets(rows, S1, S2, ss0, ss1, ss2), row_ok, acc_ty)[:, None]
        lo = c * chunk_cols
        hi = tl.minimum(lim, lo + chunk_cols)
        # Per row: running max m and sum s of exp(z - lse_sub(m)), rescaled once per sub-block
        # (one exp per element; the row kernels' per-lane form costs two: H100's exp limit).
        m = tl.full([BLOCK_M], float("-inf"), acc_ty)
        s = tl.zeros([BLOCK_M], acc_ty)
        for start in tl.range(lo, lo + chunk_cols, BLOCK_N):
            cols = start + cols0
            if CAUSAL:
                live = row_ok[:, None] & (cols[None, :] < hi[:, None])
            else:
                live = row_ok[:, None] & (cols[None, :] < hi)
            x = tl.load(x_ptr + x_off[:, None] + cols[None, :] * xsn, mask=live, other=float("-inf")).to(acc_ty)
            z, _ = prologue(x, live, m_ptr + m_off[:, None] + cols[None, :] * msn, scale, scale_lo, cap_hi,
                            cap_lo, HAS_SCALE, HAS_CAP, MASK, ACC_FP64, PRECISE)
            m_new = tl.maximum(m, tl.max(z, axis=1))
            s = lse_rescale(s, m, m_new, ACC_FP64) + tl.sum(exp_acc(z - lse_sub(m_new)[:, None], ACC_FP64), axis=1)
            m = m_new
        if HAS_SINK:  # the sink joins chunk 0 of its row
            sink = tl.load(s_ptr + row_offsets(rows, S1, S2, ss0, ss1, ss2), mask=row_ok, other=0.0).to(acc_ty)
            sink = tl.where(c == 0, sink, float("-inf"))
            m_new = tl.maximum(m, sink)
            s = lse_rescale(s, m, m_new, ACC_FP64) + exp_acc(sink - lse_sub(m_new), ACC_FP64)
            s = tl.where(sink != sink, float("nan"), s)  # (max may drop a NaN: the sum keeps it)
            m = m_new
        tl.store(o_ptr + rows * CHUNKS + c, close_lse(m, s).to(o_ptr.dtype.element_ty), mask=row_ok)


@dataclass(frozen=True)
class LsePlan:
    """Tiles and grid of one logsumexp launch (the backend's choice)."""

    block_m: int
    block_n: int
    chunks: int
    grid: int
    num_warps: int | None = None


def launcher(x: torch.Tensor, spec: SoftmaxSpec, plan_for, guard=None, shape: tuple | None = None):
    """`f(x, operands) -> lse` (accumulation dtype; keepdim, or `shape`) bound to requests like
    `spec` through `lse_kernel`, on `plan_for(n_rows, n_cols) -> LsePlan`; `guard`: `bind_kernel`'s."""
    v = spec.variant
    per_row = v.sinks is not None or v.row_scale is not None  # (a row scale: read at the sinks' offsets)
    copy, layout, operand_args = logical_rows(spec.shape, tuple(x.stride()), spec.dim,
                                              None if v.mask is None else v.mask.strides, per_row)
    n_rows, n_cols = layout.n_rows, layout.n_cols
    plan = plan_for(n_rows, n_cols)
    chunk_cols = cdiv(cdiv(n_cols, max(1, plan.chunks)), plan.block_n) * plan.block_n  # whole sub-blocks
    chunks = cdiv(n_cols, chunk_cols)
    _, s1, s2 = layout.row_sizes
    fusion = Fusion.of(spec)
    sq, q_div, c_off = fusion.causal_args(layout)
    ints = dict(n_rows=n_rows, n_cols=n_cols, chunk_cols=chunk_cols, S1=s1, S2=s2,
                **dict(zip(("xs0", "xs1", "xs2"), layout.in_row_strides)), xsn=layout.in_col_stride,
                **operand_args, SQ=sq, Q_DIV=q_div, C_OFF=c_off)
    meta = dict(ACC_FP64=spec.acc_dtype == torch.float64, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, CHUNKS=chunks,
                **fusion.constexprs(spec.out_dtype, backward=True), HAS_ROW_SCALE=fusion.has_row_scale)
    if plan.num_warps is not None:
        meta["num_warps"] = plan.num_warps
    # (an absent mask or row scale is stood in for by x, absent sinks by the result: never read)
    launch = bind_kernel(Binding(lse_kernel, max(1, plan.grid), ("x_ptr", "o_ptr", "m_ptr", "s_ptr", "r_ptr"),
                                 lambda a: (a[0], a[1], a[0] if a[2] is None else a[2], a[1] if a[3] is None else a[3],
                                            a[0] if a[4] is None else a[4]),
                                 ints, (meta,), VALUE_NAMES, PLAIN_SCALARS), device=spec.device, guard=guard)
    # Rows in logical order, as the result's: one chunk a row writes the result itself.
    shape = row_shape(spec.shape, spec.dim) if shape is None else shape
    new_partials = output_maker(shape if chunks == 1 else (n_rows * chunks,), spec.acc_dtype, spec.device)
    plain_values = v.scale is None and v.softcap is None and v.row_scale is None

    def run(x: torch.Tensor, operands: Operands) -> torch.Tensor:
        if copy:
            x = x.contiguous()
        out = new_partials()
        launch((x, out, mask_operand(operands.mask, spec, copy), sinks_operand(operands.sinks, spec),
                row_scale_operand(operands, spec)),
               PLAIN_SCALARS if plain_values else scalars(operands.scale, operands.softcap))
        if chunks > 1:
            return torch.logsumexp(out.view(n_rows, chunks), 1).view(shape)
        return out

    return run
