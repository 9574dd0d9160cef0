"""Backward of softmax and log_softmax, shared by the Triton backends.

    softmax:      dx = y * (dy - sum(y * dy))
    log_softmax:  dx = dy - exp(y) * sum(dy)

A work item is a tile of BLOCK_M rows x CHUNK columns. With one chunk per row (SINGLE) the
row sum is taken on chip: one read of y and dy and one write of dx. Longer rows are cut into
chunks whose partial sums meet in `stats`, exactly as in the forward split kernel: PHASE 0
waits at a per-row barrier (cooperative, co-resident grid) keeping y and dy in registers;
PHASE 1 / PHASE 2 are the two-launch form for the interpreter. y, dy and dx share one row
layout (the launcher makes them contiguous alike).
"""

import triton
import triton.language as tl

from .rows import _row_arrive, _row_depart, _row_offsets, _row_wait


@triton.jit
def _partial(y, dy, LOG: tl.constexpr):
    if LOG:
        return tl.sum(dy, axis=1)
    else:
        return tl.sum(y * dy, axis=1)


@triton.jit
def softmax_bwd_kernel(
    y_ptr, dy_ptr, dx_ptr, stats_ptr, count_ptr, n_rows, n_cols, n_chunks,
    S1, S2, s0, s1, s2, sn,
    LOG: tl.constexpr, ACC_FP64: tl.constexpr, SINGLE: tl.constexpr,
    BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, G_POW2: tl.constexpr, PHASE: tl.constexpr,
):
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    n_row_blocks = tl.cdiv(n_rows, BLOCK_M)
    n_items = n_row_blocks * n_chunks
    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        item64 = tl.cast(item, tl.int64)
        rows = (item64 // n_chunks) * BLOCK_M + tl.arange(0, BLOCK_M)
        chunk = item64 % n_chunks
        cols = chunk * CHUNK + tl.arange(0, CHUNK).to(tl.int64)
        mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
        off = _row_offsets(rows, S1, S2, s0, s1, s2)[:, None] + cols[None, :] * sn
        y = tl.load(y_ptr + off, mask=mask, other=0.0).to(acc_ty)
        dy = tl.load(dy_ptr + off, mask=mask, other=0.0).to(acc_ty)
        if SINGLE:
            total = _partial(y, dy, LOG)
        else:
            stats = stats_ptr + rows * n_chunks
            if PHASE != 2:
                tl.store(stats + chunk, _partial(y, dy, LOG), mask=rows < n_rows)
            if PHASE == 0:
                # BLOCK_M is 1 on this path: the row's barrier, as in the forward split kernel.
                row = (item64 // n_chunks) * BLOCK_M
                _row_wait(count_ptr, row, _row_arrive(count_ptr, row), n_chunks)
            g = tl.arange(0, G_POW2)
            part = tl.load(stats[:, None] + g[None, :], mask=(rows < n_rows)[:, None] & (g < n_chunks)[None, :],
                           other=0.0, cache_modifier=".cg")
            total = tl.sum(part, axis=1)
            if PHASE == 0:
                _row_depart(count_ptr, row, n_chunks)
        if PHASE != 1:
            if LOG:
                dx = dy - tl.exp(y) * total[:, None]
            else:
                dx = y * (dy - total[:, None])
            tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=mask)
