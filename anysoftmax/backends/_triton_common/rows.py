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
def _softmax_along(x, AXIS: tl.constexpr, LOG: tl.constexpr, ACC_FP64: tl.constexpr):
    """Softmax (log_softmax) of a tile held on chip, reduced along AXIS: rows of the tile
    kernel (AXIS=1), columns of the column kernel (AXIS=0)."""
    z = x - tl.expand_dims(tl.max(x, axis=AXIS), AXIS)
    e = _exp(z, ACC_FP64)
    s = tl.expand_dims(tl.sum(e, axis=AXIS), AXIS)
    if LOG:
        return z - tl.log(s)
    else:
        return e * (1.0 / s)


@triton.jit
def softmax_tile_kernel(
    x_ptr, y_ptr, n_rows, n_cols,
    S1, S2, xs0, xs1, xs2, xsn, ys0, ys1, ys2, ysn,
    LOG: tl.constexpr, ACC_FP64: tl.constexpr, WIDE_COLS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr, FLAT_ROWS: tl.constexpr = False,
):
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    cols = tl.arange(0, BLOCK_N)
    if WIDE_COLS:
        cols = cols.to(tl.int64)
    n_blocks = tl.cdiv(n_rows, BLOCK_M)
    for blk in tl.range(tl.program_id(0), n_blocks, tl.num_programs(0), num_stages=NUM_STAGES):
        rows = tl.cast(blk, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        if FLAT_ROWS:
            # One row dimension (S0 = S1 = 1): offsets `rows * stride`, which triton-ascend's
            # front end lowers to one bounded 2-D load; the div/mod form below it lowers to
            # per-row loads of the full tile width, reading past the tensor (ascend.md).
            x_off = rows * xs2
            y_off = rows * ys2
        else:
            x_off = _row_offsets(rows, S1, S2, xs0, xs1, xs2)
            y_off = _row_offsets(rows, S1, S2, ys0, ys1, ys2)
        mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
        x_ptrs = x_ptr + x_off[:, None] + cols[None, :] * xsn
        x = tl.load(x_ptrs, mask=mask, other=float("-inf")).to(acc_ty)
        y = _softmax_along(x, 1, LOG, ACC_FP64)
        y_ptrs = y_ptr + y_off[:, None] + cols[None, :] * ysn
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)


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


@triton.jit
def _merge_chunk_stats(ms, ss, valid):
    """(max to subtract, sum) of a row from its chunks' maxima `ms` and sums of exp(x - max)
    `ss` along axis 0 (one entry per chunk; a second axis holds the column kernel's inner
    positions); `valid` masks the padding chunks."""
    m_sub = _finite_or_zero(tl.max(ms, axis=0))
    total = tl.sum(tl.where(valid, ss * tl.exp(ms - m_sub), 0.0), axis=0)
    return m_sub, total


@triton.jit
def _normalise_chunk(x, e, m_raw, m_chunk, m_sub, total, LOG: tl.constexpr, REUSE_EXP: tl.constexpr,
                     ACC_FP64: tl.constexpr):
    """A chunk's output from the row statistics (m_sub, total). With REUSE_EXP the chunk's own
    exp(x - m_chunk) `e` is rescaled instead of taking a second exp per element (the
    special-function unit, not memory, limits 16-bit rows otherwise); a chunk of only -inf
    contributes 0 (NaN when the whole row is -inf: 0/0). Statistics broadcast over x's
    leading axis (the column kernel's reduction steps)."""
    if LOG:
        return (x - m_sub) - tl.log(total)
    elif REUSE_EXP:
        return e * (tl.where(m_raw == float("-inf"), 0.0, _exp(m_chunk - m_sub, ACC_FP64)) / total)
    else:
        return _exp(x - m_sub, ACC_FP64) * (1.0 / total)


@triton.jit
def _row_arrive(count_ptr, row):
    """Announce this program's chunk of `row`; returns how many chunks have arrived."""
    return tl.atomic_add(count_ptr + 2 * row, 1, sem="acq_rel", scope="gpu") + 1


@triton.jit
def _row_wait(count_ptr, row, arrived, n_chunks):
    """Spin until every chunk of `row` has arrived (the statistics they wrote are visible)."""
    while arrived < n_chunks:
        arrived = tl.atomic_add(count_ptr + 2 * row, 0, sem="acquire", scope="gpu")


@triton.jit
def _row_depart(count_ptr, row, n_chunks):
    """Leave the row's barrier; the last program out resets both counters to zero, so the
    counter buffer is reused by the next launch on this stream without a memset kernel."""
    departed = tl.atomic_add(count_ptr + 2 * row + 1, 1, sem="acq_rel", scope="gpu") + 1
    if departed == n_chunks:
        tl.atomic_xchg(count_ptr + 2 * row, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(count_ptr + 2 * row + 1, 0, sem="relaxed", scope="gpu")


@triton.jit
def softmax_split_kernel(
    x_ptr, y_ptr, stats_ptr, count_ptr, n_rows, n_cols, n_chunks,
    S1, S2, xs0, xs1, xs2, xsn, ys0, ys1, ys2, ysn,
    LOG: tl.constexpr, ACC_FP64: tl.constexpr, WIDE_COLS: tl.constexpr,
    CHUNK: tl.constexpr, G_POW2: tl.constexpr, PHASE: tl.constexpr, PREFETCH: tl.constexpr,
):
    """A row split across `n_chunks` programs, each holding one CHUNK-wide piece on chip.

    PHASE 0 (cooperative, one launch): each program computes its chunk's (max, sum), publishes
    it to `stats`, bumps the row's counter and waits until all chunks of the row arrived, then
    normalises the chunk it still holds in registers: one read and one write per element.
    The launcher guarantees co-residency: the grid is a multiple of n_chunks and no larger than
    the programs the GPU holds at once, and work items are ordered row-major, so all chunks of
    a row are in flight together. PHASE 1 / PHASE 2 split the same work into two launches
    (statistics, then normalisation re-reading the input) for the interpreter, where programs
    run one after another and a barrier would never open.
    PREFETCH loads the next item's chunk before waiting at the barrier, so its memory latency
    overlaps the wait and the stores of the current one (at twice the registers).
    """
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    offs = tl.arange(0, CHUNK)
    if WIDE_COLS:
        offs = offs.to(tl.int64)
    n_items = n_rows * n_chunks
    nprog = tl.num_programs(0)
    if PREFETCH:
        x, row, chunk, cols = _load_chunk(x_ptr, tl.program_id(0), n_items, n_chunks, n_cols, offs,
                                          S1, S2, xs0, xs1, xs2, xsn, CHUNK, acc_ty)
    for item in tl.range(tl.program_id(0), n_items, nprog):
        if not PREFETCH:
            row, chunk, cols = _chunk_at(item, n_chunks, offs, CHUNK)
            x = _chunk_values(x_ptr, item, n_items, n_cols, row, cols, S1, S2, xs0, xs1, xs2, xsn, acc_ty)
        stats_row = stats_ptr + row * (2 * n_chunks)
        if PHASE != 2:
            m_raw = tl.max(x, axis=0)
            m_chunk = _finite_or_zero(m_raw)
            e = _exp(x - m_chunk, ACC_FP64)
            tl.store(stats_row + 2 * chunk, m_raw)
            tl.store(stats_row + 2 * chunk + 1, tl.sum(e, axis=0))
        if PHASE == 0:
            arrived = _row_arrive(count_ptr, row)
        if PREFETCH:
            x_next, row_next, chunk_next, cols_next = _load_chunk(
                x_ptr, item + nprog, n_items, n_chunks, n_cols, offs, S1, S2, xs0, xs1, xs2, xsn, CHUNK, acc_ty)
        if PHASE == 0:
            _row_wait(count_ptr, row, arrived, n_chunks)
        if PHASE != 1:
            g = tl.arange(0, G_POW2)
            # .cg: read through L2, never a stale L1 line written by another SM before the barrier.
            ms = tl.load(stats_row + 2 * g, mask=g < n_chunks, other=float("-inf"), cache_modifier=".cg")
            ss = tl.load(stats_row + 2 * g + 1, mask=g < n_chunks, other=0.0, cache_modifier=".cg")
            m_sub, total = _merge_chunk_stats(ms, ss, g < n_chunks)
            if PHASE == 0:
                _row_depart(count_ptr, row, n_chunks)
                y = _normalise_chunk(x, e, m_raw, m_chunk, m_sub, total, LOG, True, ACC_FP64)
            else:  # (no chunk statistics of its own in this phase: x stands in for them, unused)
                y = _normalise_chunk(x, x, x, x, m_sub, total, LOG, False, ACC_FP64)
            tl.store(y_ptr + _row_offsets(row, S1, S2, ys0, ys1, ys2) + cols * ysn,
                     y.to(y_ptr.dtype.element_ty), mask=cols < n_cols)
        if PREFETCH:
            x, row, chunk, cols = x_next, row_next, chunk_next, cols_next


@triton.jit
def _load_chunk(x_ptr, item, n_items, n_chunks, n_cols, offs, S1, S2, xs0, xs1, xs2, xsn,
                CHUNK: tl.constexpr, acc_ty: tl.constexpr):
    """Work item `item` of the split kernel: its row, chunk index, columns and loaded values
    (all -inf past the last item)."""
    row, chunk, cols = _chunk_at(item, n_chunks, offs, CHUNK)
    x = _chunk_values(x_ptr, item, n_items, n_cols, row, cols, S1, S2, xs0, xs1, xs2, xsn, acc_ty)
    return x, row, chunk, cols


@triton.jit
def _chunk_at(item, n_chunks, offs, CHUNK: tl.constexpr):
    """(row, chunk index, columns) of work item `item`. Kept apart from the load: torch.compile's
    analysis of which arguments a kernel writes follows a store's address back through helper
    calls, and an address computed inside a call that also takes `x_ptr` marks `x` as written
    (graph inputs that look mutated keep a model out of CUDA graphs)."""
    item64 = tl.cast(item, tl.int64)
    row = item64 // n_chunks
    chunk = item64 % n_chunks
    return row, chunk, chunk * CHUNK + offs


@triton.jit
def _chunk_values(x_ptr, item, n_items, n_cols, row, cols, S1, S2, xs0, xs1, xs2, xsn, acc_ty: tl.constexpr):
    item64 = tl.cast(item, tl.int64)
    return tl.load(x_ptr + _row_offsets(row, S1, S2, xs0, xs1, xs2) + cols * xsn,
                   mask=cols < tl.where(item64 < n_items, n_cols, 0), other=float("-inf")).to(acc_ty)

