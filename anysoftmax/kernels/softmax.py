"""The one softmax algorithm, as Triton kernels shared by the `triton` (CUDA/HIP) and
`triton_ascend` (NPU) backends. Backends differ only in how they size the grid and the tiles.

Both kernels are persistent: a fixed number of programs walks the rows with a grid-stride
loop, so the launch is sized by the hardware (occupancy on GPUs, core count on NPUs) rather
than by the problem. Rows are addressed through `core.layout.RowLayout`: up to three
(size, stride) row dimensions plus a column stride, which reads transposed, sliced and
expanded inputs in place.

* `softmax_tile_kernel`: a whole row fits in one tile; BLOCK_M rows are processed per step
  (several short rows per program keep 16-byte accesses busy when N is small). One read, one
  write per element.
* `softmax_online_kernel`: rows longer than a tile. Pass 1 walks the row in BLOCK_N-wide
  sub-blocks keeping a running max and a rescaled running sum per lane (the online normalizer
  of Milakov & Gimelshein, 2018); pass 2 re-reads the row and writes the result. This is also
  the NPU's sub-block path, where BLOCK_N is bounded by the on-chip unified buffer.

Numerics: accumulation in fp32 (fp64 for fp64 outputs); exp(z) = exp2(z * log2(e)) in fp32 (one
multiply folded into the ex2 instruction's input); -inf - -inf is kept out of the running
rescale factors so a sub-block of -inf entries does not poison a row, while an all -inf row
still ends as 0/0 = NaN, as torch gives it.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _row_offsets(rows, S1, S2, st0, st1, st2):
    """Element offsets of `rows` (int64) through three (size, stride) row dimensions."""
    i2 = rows % S2
    rest = rows // S2
    i1 = rest % S1
    i0 = rest // S1
    return i0 * st0 + i1 * st1 + i2 * st2


@triton.jit
def _exp(z, ACC_FP64: tl.constexpr):
    if ACC_FP64:
        return tl.exp(z)
    else:
        return tl.exp2(z * 1.4426950408889634)


@triton.jit
def _finite_or_zero(m):
    # A running max of -inf (nothing but -inf seen yet) is replaced by 0 when subtracted, so
    # exp(-inf - m) is 0 instead of exp(NaN).
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def softmax_tile_kernel(
    x_ptr, y_ptr, n_rows, n_cols,
    S1, S2, xs0, xs1, xs2, xsn, ys0, ys1, ys2, ysn,
    LOG: tl.constexpr, ACC_FP64: tl.constexpr, WIDE_COLS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    cols = tl.arange(0, BLOCK_N)
    if WIDE_COLS:
        cols = cols.to(tl.int64)
    col_mask = cols < n_cols
    n_blocks = tl.cdiv(n_rows, BLOCK_M)
    for blk in tl.range(tl.program_id(0), n_blocks, tl.num_programs(0), num_stages=NUM_STAGES):
        rows = tl.cast(blk, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        x_off = _row_offsets(rows, S1, S2, xs0, xs1, xs2)
        x = tl.load(x_ptr + x_off[:, None] + cols[None, :] * xsn, mask=mask, other=float("-inf")).to(acc_ty)
        z = x - tl.max(x, axis=1)[:, None]
        e = _exp(z, ACC_FP64)
        s = tl.sum(e, axis=1)
        if LOG:
            y = z - tl.log(s)[:, None]
        else:
            y = e * (1.0 / s)[:, None]
        y_off = _row_offsets(rows, S1, S2, ys0, ys1, ys2)
        tl.store(y_ptr + y_off[:, None] + cols[None, :] * ysn, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_online_kernel(
    x_ptr, y_ptr, n_rows, n_cols,
    S1, S2, xs0, xs1, xs2, xsn, ys0, ys1, ys2, ysn,
    LOG: tl.constexpr, ACC_FP64: tl.constexpr, WIDE_COLS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    cols0 = tl.arange(0, BLOCK_N)
    if WIDE_COLS:
        cols0 = cols0.to(tl.int64)
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)
        x_row = x_ptr + _row_offsets(row64, S1, S2, xs0, xs1, xs2)
        y_row = y_ptr + _row_offsets(row64, S1, S2, ys0, ys1, ys2)
        # Pass 1: per-lane running max m and sum s of exp(x - m).
        m = tl.full([BLOCK_N], float("-inf"), acc_ty)
        s = tl.zeros([BLOCK_N], acc_ty)
        for start in tl.range(0, n_cols, BLOCK_N):
            cols = start + cols0
            x = tl.load(x_row + cols * xsn, mask=cols < n_cols, other=float("-inf")).to(acc_ty)
            m_new = tl.maximum(m, x)
            m_sub = _finite_or_zero(m_new)
            s = s * _exp(m - m_sub, ACC_FP64) + _exp(x - m_sub, ACC_FP64)
            m = m_new
        row_max = tl.max(m, axis=0)
        m_sub = _finite_or_zero(row_max)
        total = tl.sum(s * _exp(m - m_sub, ACC_FP64), axis=0)
        # log_softmax subtracts m and log(sum) separately: folding them into one shift would
        # round m + log(sum) at the magnitude of m and lose the small outputs' precision.
        log_total = tl.log(total)
        inv = 1.0 / total
        # Pass 2: normalise.
        for start in tl.range(0, n_cols, BLOCK_N):
            cols = start + cols0
            cmask = cols < n_cols
            x = tl.load(x_row + cols * xsn, mask=cmask, other=float("-inf")).to(acc_ty)
            if LOG:
                y = (x - m_sub) - log_total
            else:
                y = _exp(x - m_sub, ACC_FP64) * inv
            tl.store(y_row + cols * ysn, y.to(y_ptr.dtype.element_ty), mask=cmask)
