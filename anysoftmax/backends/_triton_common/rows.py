"""The forward row kernels tile, online and split (docs/kernels.md; STATES_ONLY: their logsumexp form,
`lse_rows.py`). Accumulation in fp32 (fp64 for fp64 outputs); -inf - -inf is kept out of the rescale
factors (an all -inf row still ends as 0/0 = NaN, as torch gives it)."""

from __future__ import annotations

import triton
import triton.language as tl

from .fused import (close_lse, close_tile, col_limit, empty_fill, exp_acc, finite_or_zero, lanes_lse, lse_rescale,
                    lse_sub, merge_stats, prologue, row_scale, sink_share, tile_lse, whole_vectors)


@triton.jit
def row_offsets(rows, S1, S2, st0, st1, st2):
    """Element offsets of `rows` (int64) through three (size, stride) row dimensions."""
    i2 = rows % S2
    rest = rows // S2
    i1 = rest % S1
    i0 = rest // S1
    return i0 * st0 + i1 * st1 + i2 * st2


@triton.jit
def softmax_tile_kernel(
    x_ptr, y_ptr, m_ptr, s_ptr, p_ptr, r_ptr, n_rows, n_cols,
    S1, S2, xs0, xs1, xs2, xsn, ys0, ys1, ys2, ysn,
    ms0, ms1, ms2, msn, ss0, ss1, ss2, ps0, ps1, ps2, SQ, Q_DIV, C_OFF,
    scale_hi, scale_lo, cap_hi, cap_lo,
    LOG: tl.constexpr, ACC_FP64: tl.constexpr, WIDE_COLS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL_VEC: tl.constexpr,
    FLAT_ROWS: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_CAP: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_SINK: tl.constexpr, HAS_EMPTY: tl.constexpr, EMPTY: tl.constexpr, PRECISE: tl.constexpr,
    STATES_ONLY: tl.constexpr, HAS_ROW_SCALE: tl.constexpr,
):
    """STATES_ONLY: each row's logsumexp (`fused.tile_lse`) at its y offset instead (`lse_rows.py`)."""
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    # Elements per 16-byte vector of x.
    VEC: tl.constexpr = 128 // x_ptr.dtype.element_ty.primitive_bitwidth
    cols = tl.arange(0, BLOCK_N)
    if MASK == 1:
        # One register layout for x and the uint8 mask, else converted through shared memory (slower).
        cols = tl.max_contiguous(cols, VEC)
    if WIDE_COLS:
        cols = cols.to(tl.int64)
    n_blocks = tl.cdiv(n_rows, BLOCK_M)
    # No software pipelining: the programs resident on an SM already overlap their one load each.
    for blk in tl.range(tl.program_id(0), n_blocks, tl.num_programs(0), num_stages=1):
        rows = tl.cast(blk, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        if FLAT_ROWS:
            # One row dim: `rows * stride` lowers to one bounded 2-D load on triton-ascend; the
            # div/mod form to per-row loads of the full tile width, past the tensor (ascend.md).
            x_off = rows * xs2
            y_off = rows * ys2
            m_off = rows * ms2
            s_off = rows * ss2
            p_off = rows * ps2
        else:
            x_off = row_offsets(rows, S1, S2, xs0, xs1, xs2)
            y_off = row_offsets(rows, S1, S2, ys0, ys1, ys2)
            m_off = row_offsets(rows, S1, S2, ms0, ms1, ms2)
            s_off = row_offsets(rows, S1, S2, ss0, ss1, ss2)
            p_off = row_offsets(rows, S1, S2, ps0, ps1, ps2)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & (cols < n_cols)[None, :]
        lim = col_limit(rows, n_cols, SQ, Q_DIV, C_OFF, CAUSAL)
        if CAUSAL:
            live = row_ok[:, None] & (cols[None, :] < lim[:, None])
            # CAUSAL_VEC elements per load (the plan's choice, measured per element size; 0: 16 bytes)
            vectors = row_ok[:, None] & whole_vectors(cols[None, :], lim[:, None], n_cols,
                                                      CAUSAL_VEC if CAUSAL_VEC > 0 else VEC)
            x = tl.load(x_ptr + x_off[:, None] + cols[None, :] * xsn, mask=vectors, other=float("-inf"))
            x = tl.where(live, x.to(acc_ty), float("-inf"))
        else:
            live = mask
            x = tl.load(x_ptr + x_off[:, None] + cols[None, :] * xsn, mask=live, other=float("-inf")).to(acc_ty)
        m_ptrs = m_ptr + m_off[:, None] + cols[None, :] * msn
        scale = scale_hi
        if HAS_ROW_SCALE:
            scale = row_scale(r_ptr, s_off, row_ok, acc_ty)[:, None]
        z, _ = prologue(x, live, m_ptrs, scale, scale_lo, cap_hi, cap_lo, HAS_SCALE, HAS_CAP, MASK, ACC_FP64,
                        PRECISE)
        sink = 0.0
        if HAS_SINK:
            sink = tl.load(s_ptr + s_off, mask=row_ok, other=0.0).to(acc_ty)
        if STATES_ONLY:
            tl.store(y_ptr + y_off, tile_lse(z, sink, 1, HAS_SINK, ACC_FP64).to(y_ptr.dtype.element_ty), mask=row_ok)
        else:
            y, p = close_tile(z, live, m_ptrs, sink, n_cols, lim, 1, LOG, ACC_FP64, HAS_SINK, MASK, CAUSAL, EMPTY)
            tl.store(y_ptr + y_off[:, None] + cols[None, :] * ysn, y.to(y_ptr.dtype.element_ty), mask=mask)
            if HAS_SINK:
                tl.store(p_ptr + p_off, p.to(p_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def softmax_online_kernel(
    x_ptr, y_ptr, m_ptr, s_ptr, p_ptr, r_ptr, n_rows, n_cols,
    S1, S2, xs0, xs1, xs2, xsn, ys0, ys1, ys2, ysn,
    ms0, ms1, ms2, msn, ss0, ss1, ss2, ps0, ps1, ps2, SQ, Q_DIV, C_OFF,
    scale_hi, scale_lo, cap_hi, cap_lo,
    LOG: tl.constexpr, ACC_FP64: tl.constexpr, WIDE_COLS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_CAP: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_SINK: tl.constexpr, HAS_EMPTY: tl.constexpr, EMPTY: tl.constexpr, PRECISE: tl.constexpr,
    STATES_ONLY: tl.constexpr, HAS_ROW_SCALE: tl.constexpr,
):
    """STATES_ONLY: pass 1 only, the row's logsumexp written at y_ptr + the row's y offset
    (`lse_rows.py`); its lanes subtract 0 for a +inf max (`fused.lse_sub`), so +inf stays +inf."""
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    cols0 = tl.arange(0, BLOCK_N)
    if WIDE_COLS:
        cols0 = cols0.to(tl.int64)
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)
        x_row = x_ptr + row_offsets(row64, S1, S2, xs0, xs1, xs2)
        y_row = y_ptr + row_offsets(row64, S1, S2, ys0, ys1, ys2)
        m_row = m_ptr + row_offsets(row64, S1, S2, ms0, ms1, ms2)
        lim = col_limit(row64, n_cols, SQ, Q_DIV, C_OFF, CAUSAL)
        scale = scale_hi
        if HAS_ROW_SCALE:
            scale = row_scale(r_ptr, row_offsets(row64, S1, S2, ss0, ss1, ss2), True, acc_ty)
        # Pass 1: per-lane running max m and sum s of exp(z - m), over the columns read.
        m = tl.full([BLOCK_N], float("-inf"), acc_ty)
        s = tl.zeros([BLOCK_N], acc_ty)
        kept = tl.zeros([BLOCK_N], tl.int32)
        for start in tl.range(0, lim, BLOCK_N):
            cols = start + cols0
            live = cols < lim
            x = tl.load(x_row + cols * xsn, mask=live, other=float("-inf")).to(acc_ty)
            z, keep = prologue(x, live, m_row + cols * msn, scale, scale_lo, cap_hi, cap_lo,
                               HAS_SCALE, HAS_CAP, MASK, ACC_FP64, PRECISE)
            m_new = tl.maximum(m, z)
            if STATES_ONLY:
                s = lse_rescale(s, m, m_new, ACC_FP64) + exp_acc(z - lse_sub(m_new), ACC_FP64)
            else:
                m_sub = finite_or_zero(m_new)
                s = s * exp_acc(m - m_sub, ACC_FP64) + exp_acc(z - m_sub, ACC_FP64)
            m = m_new
            if HAS_EMPTY and not STATES_ONLY:
                kept += keep.to(tl.int32)
        sink = 0.0
        if HAS_SINK:
            # A one-element tile under a row bound: triton-ascend lowers it to a clamped copy
            # (tests/ascend_frontend), a scalar load to an element access.
            one = tl.arange(0, 1)
            sink = tl.max(tl.load(s_ptr + row_offsets(row64, S1, S2, ss0, ss1, ss2) + one, mask=row64 + one < n_rows,
                                  other=0.0).to(acc_ty), axis=0)
        if STATES_ONLY:
            tl.store(y_row, lanes_lse(m, s, sink, HAS_SINK, ACC_FP64).to(y_ptr.dtype.element_ty))
        else:
            m_sub, total = merge_stats(m, s, True, sink, HAS_SINK, ACC_FP64)
            empty = False
            if HAS_EMPTY:
                empty = tl.sum(kept, axis=0) == 0
            if HAS_SINK:
                tl.store(p_ptr + row_offsets(row64, S1, S2, ps0, ps1, ps2),
                         sink_share(sink, m_sub, total, empty, ACC_FP64).to(p_ptr.dtype.element_ty))
            # m and log(sum) subtracted apart: m + log(sum) would round at m's magnitude.
            log_total = tl.log(total)
            inv = 1.0 / total
            # Pass 2: normalise every column (those past a causal prefix are written too).
            for start in tl.range(0, n_cols, BLOCK_N):
                cols = start + cols0
                cmask = cols < n_cols
                live = cols < lim
                x = tl.load(x_row + cols * xsn, mask=live, other=float("-inf")).to(acc_ty)
                z, keep = prologue(x, live, m_row + cols * msn, scale, scale_lo, cap_hi, cap_lo,
                                   HAS_SCALE, HAS_CAP, MASK, ACC_FP64, PRECISE)
                if LOG:
                    y = (z - m_sub) - log_total
                else:
                    y = exp_acc(z - m_sub, ACC_FP64) * inv
                if HAS_EMPTY:
                    y = tl.where(empty, empty_fill(y, n_cols, LOG, EMPTY), y)
                tl.store(y_row + cols * ysn, y.to(y_ptr.dtype.element_ty), mask=cmask)


@triton.jit
def normalise_chunk(x, e, m_raw, m_chunk, m_sub, total, LOG: tl.constexpr, REUSE_EXP: tl.constexpr,
                     ACC_FP64: tl.constexpr):
    """A chunk's output from the row statistics (m_sub, total). REUSE_EXP rescales the chunk's own
    exp(x - m_chunk) `e` instead of a second exp per element (the special-function unit limits
    16-bit rows); a chunk of only -inf gives 0 (a whole -inf row NaN: 0/0). Statistics broadcast
    over x's leading axis (the column kernel's reduction steps)."""
    if LOG:
        return (x - m_sub) - tl.log(total)
    elif REUSE_EXP:
        return e * (tl.where(m_raw == float("-inf"), 0.0, exp_acc(m_chunk - m_sub, ACC_FP64)) / total)
    else:
        return exp_acc(x - m_sub, ACC_FP64) * (1.0 / total)


@triton.jit
def row_arrive(count_ptr, row):
    """Announce this program's chunk of `row`; returns how many chunks have arrived."""
    return tl.atomic_add(count_ptr + 2 * row, 1, sem="acq_rel", scope="gpu") + 1


@triton.jit
def row_wait(count_ptr, row, arrived, n_chunks):
    """Spin until every chunk of `row` has arrived (the statistics they wrote are visible)."""
    while arrived < n_chunks:
        arrived = tl.atomic_add(count_ptr + 2 * row, 0, sem="acquire", scope="gpu")


@triton.jit
def row_depart(count_ptr, row, n_chunks):
    """Leave the row's barrier; the last program out zeroes both counters (no memset)."""
    departed = tl.atomic_add(count_ptr + 2 * row + 1, 1, sem="acq_rel", scope="gpu") + 1
    if departed == n_chunks:
        tl.atomic_xchg(count_ptr + 2 * row, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(count_ptr + 2 * row + 1, 0, sem="relaxed", scope="gpu")


@triton.jit
def row_leave(count_ptr, row):
    """Leave the row's barrier relaxed (an acquire or release would wait for a prefetched load): safe,
    the wait saw every chunk arrive, and `row_reset` checks the count once the chunk is stored."""
    return tl.atomic_add(count_ptr + 2 * row + 1, 1, sem="relaxed", scope="gpu") + 1


@triton.jit
def row_reset(count_ptr, row, departed, n_chunks):
    """The last program out (`departed` == n_chunks) zeroes the row's counters (release: after the count)."""
    if departed == n_chunks:
        tl.atomic_xchg(count_ptr + 2 * row, 0, sem="release", scope="gpu")
        tl.atomic_xchg(count_ptr + 2 * row + 1, 0, sem="relaxed", scope="gpu")


@triton.jit
def _row_wait_polled(count_ptr, row, n_chunks):
    """Arrive at `row`'s barrier and wait for every chunk, crossing no value between threads
    through shared memory (`row_meet` says why): every thread polls the counter (volatile), then
    one thread's acquire and the block's bar.sync order the later reads, as in `row_wait`. The
    acquire is an `or` of 0: Triton drops an unused add of 0."""
    tl.atomic_add(count_ptr + 2 * row, 1, sem="acq_rel", scope="gpu")
    seen = tl.load(count_ptr + 2 * row, volatile=True)
    while seen < n_chunks:
        seen = tl.load(count_ptr + 2 * row, volatile=True)
    tl.atomic_or(count_ptr + 2 * row, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit(noinline=True)
def row_meet(count_ptr, row, n_chunks, stats_row, sink, G_POW2: tl.constexpr, NSTAT: tl.constexpr,
              HAS_SINK: tl.constexpr, ACC_FP64: tl.constexpr):
    """The pipelined loop's barrier (`softmax_split_kernel` STAGES): arrive, wait for the row's
    other chunks, read their statistics (NSTAT per chunk at `stats_row`) and merge them with
    the sink as `fused.merge_stats` does: (m_sub, total, kept columns (NSTAT 3, else 0))."""
    # Not inlined: the pipeliner steps over a call, so no statistics load moves above the wait.
    # No shared memory: Triton before 3.9 places a callee's at offset 0, over the caller's
    # pipelined buffers (triton-lang/triton#11267); so the wait polls (`_row_wait_polled`) and
    # the statistics are reduced GROUP at a time, a tensor one warp holds whole (shuffles).
    _row_wait_polled(count_ptr, row, n_chunks)
    GROUP: tl.constexpr = 32 if G_POW2 > 32 else G_POW2
    m = float("-inf")
    for base in tl.static_range(0, G_POW2, GROUP):
        g = base + tl.arange(0, GROUP)
        # .cg: read through L2, never a stale L1 line written by another SM before the barrier.
        m = tl.maximum(m, tl.max(tl.load(stats_row + NSTAT * g, mask=g < n_chunks, other=float("-inf"),
                                         cache_modifier=".cg"), axis=0))
    if HAS_SINK:
        m = tl.maximum(m, sink)
    m_sub = finite_or_zero(m)
    total = m_sub * 0.0
    kept = m_sub * 0.0
    for base in tl.static_range(0, G_POW2, GROUP):
        g = base + tl.arange(0, GROUP)
        ms = tl.load(stats_row + NSTAT * g, mask=g < n_chunks, other=float("-inf"), cache_modifier=".cg")
        ss = tl.load(stats_row + NSTAT * g + 1, mask=g < n_chunks, other=0.0, cache_modifier=".cg")
        total += tl.sum(tl.where(g < n_chunks, ss * exp_acc(ms - m_sub, ACC_FP64), 0.0), axis=0)
        if NSTAT == 3:
            kept += tl.sum(tl.load(stats_row + NSTAT * g + 2, mask=g < n_chunks, other=0.0, cache_modifier=".cg"),
                           axis=0)
    if HAS_SINK:
        total = total + exp_acc(sink - m_sub, ACC_FP64)
    return m_sub, total, kept


@triton.jit(noinline=True)
def row_meet_sum(count_ptr, row, n_chunks, stats_row, G_POW2: tl.constexpr):
    """`row_meet` of the backward's split rows: the sum of the row's partial sums at `stats_row`."""
    _row_wait_polled(count_ptr, row, n_chunks)
    GROUP: tl.constexpr = 32 if G_POW2 > 32 else G_POW2
    total = tl.load(stats_row) * 0.0
    for base in tl.static_range(0, G_POW2, GROUP):
        g = base + tl.arange(0, GROUP)
        total += tl.sum(tl.load(stats_row + g, mask=g < n_chunks, other=0.0, cache_modifier=".cg"), axis=0)
    return total


@triton.jit
def softmax_split_kernel(
    x_ptr, y_ptr, m_ptr, s_ptr, p_ptr, r_ptr, stats_ptr, count_ptr, n_rows, n_cols, n_chunks,
    S1, S2, xs0, xs1, xs2, xsn, ys0, ys1, ys2, ysn,
    ms0, ms1, ms2, msn, ss0, ss1, ss2, ps0, ps1, ps2, SQ, Q_DIV, C_OFF,
    scale_hi, scale_lo, cap_hi, cap_lo,
    LOG: tl.constexpr, ACC_FP64: tl.constexpr, WIDE_COLS: tl.constexpr,
    CHUNK: tl.constexpr, G_POW2: tl.constexpr, PHASE: tl.constexpr,
    PREFETCH: tl.constexpr, RELAXED_DEPART: tl.constexpr, HOLD_INPUT: tl.constexpr, STAGES: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_CAP: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_SINK: tl.constexpr, HAS_EMPTY: tl.constexpr, EMPTY: tl.constexpr, PRECISE: tl.constexpr,
    STATES_ONLY: tl.constexpr, HAS_ROW_SCALE: tl.constexpr,
):
    """A row split across `n_chunks` programs, each holding one CHUNK-wide piece on chip (docs/kernels.md):
    PHASE 0 one cooperative launch (items row-major) and its forms PREFETCH, RELAXED_DEPART, HOLD_INPUT
    and STAGES (never with PREFETCH); PHASE 1 / 2 the same as two launches. STATES_ONLY (PHASE 1 alone,
    `lse_rows.py`): each chunk's lse to stats[item], the row's last chunk combining them and the sink."""
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    # Per chunk: max, sum of exp(z - max), and (a bool mask) the count of kept columns.
    NSTAT: tl.constexpr = 3 if MASK == 1 else 2
    PIPELINED: tl.constexpr = STAGES > 1 and PHASE == 0
    AHEAD: tl.constexpr = PREFETCH and PHASE == 0 and not PIPELINED
    LATE_DEPART: tl.constexpr = RELAXED_DEPART and PHASE == 0
    HOLD: tl.constexpr = HOLD_INPUT and PHASE == 0
    offs = tl.arange(0, CHUNK)
    if WIDE_COLS:
        offs = offs.to(tl.int64)
    n_items = n_rows * n_chunks
    nprog = tl.num_programs(0)
    if AHEAD:
        x_next = chunk_x(x_ptr, tl.program_id(0), n_items, n_cols, n_chunks, offs, CHUNK, S1, S2, xs0, xs1, xs2,
                          xsn, SQ, Q_DIV, C_OFF, CAUSAL)
    if PIPELINED:
        # The item whose chunk the loop loads, counted apart from `item` (`_chunk_x_staged`).
        loaded = tl.program_id(0)
    # (None: the loop as Triton plans it by default, which is how the other forms compile)
    LOOP_STAGES: tl.constexpr = STAGES if PIPELINED else None
    for item in tl.range(tl.program_id(0), n_items, nprog, num_stages=LOOP_STAGES):
        row, chunk, cols = chunk_at(item, n_chunks, offs, CHUNK)
        if AHEAD:
            x_raw = x_next
        elif PIPELINED:
            x_raw = _chunk_x_staged(x_ptr, loaded, n_items, n_cols, n_chunks, offs, CHUNK, S1, S2, xs0, xs1, xs2, xsn,
                                    SQ, Q_DIV, C_OFF, CAUSAL)
            loaded += nprog
        else:
            x_raw = chunk_x(x_ptr, item, n_items, n_cols, n_chunks, offs, CHUNK, S1, S2, xs0, xs1, xs2, xsn, SQ,
                             Q_DIV, C_OFF, CAUSAL)
        live = cols < _chunk_limit(item, n_items, n_cols, row, SQ, Q_DIV, C_OFF, CAUSAL)
        if PIPELINED:
            x_raw = tl.where(live, x_raw, float("-inf"))
        m_ptrs = m_ptr + row_offsets(row, S1, S2, ms0, ms1, ms2) + cols * msn
        scale = scale_hi
        if HAS_ROW_SCALE:
            scale = row_scale(r_ptr, row_offsets(row, S1, S2, ss0, ss1, ss2), True, acc_ty)
        z, keep = prologue(x_raw.to(acc_ty), live, m_ptrs, scale, scale_lo, cap_hi, cap_lo, HAS_SCALE, HAS_CAP,
                           MASK, ACC_FP64, PRECISE)
        stats_row = stats_ptr + row * (NSTAT * n_chunks)
        if STATES_ONLY:  # (launched as PHASE 1: nothing below runs)
            m_raw = tl.max(z, axis=0)
            s_chunk = tl.sum(exp_acc(z - lse_sub(m_raw), ACC_FP64), axis=0)
            tl.store(stats_ptr + item, close_lse(m_raw, s_chunk))
            # The row's last chunk to arrive combines the chunk lses (nothing waits); its acquire
            # and .cg see the others' stores.
            if row_arrive(count_ptr, row) == n_chunks:
                tl.atomic_xchg(count_ptr + 2 * row, 0, sem="relaxed", scope="gpu")
                g = tl.arange(0, G_POW2)
                ls = tl.load(stats_ptr + row * n_chunks + g, mask=g < n_chunks, other=float("-inf"),
                             cache_modifier=".cg")
                sink = 0.0
                if HAS_SINK:
                    sink = tl.load(s_ptr + row_offsets(row, S1, S2, ss0, ss1, ss2)).to(acc_ty)
                tl.store(y_ptr + row_offsets(row, S1, S2, ys0, ys1, ys2),
                         tile_lse(ls, sink, 0, HAS_SINK, ACC_FP64).to(y_ptr.dtype.element_ty))
        elif PHASE != 2:
            m_raw = tl.max(z, axis=0)
            m_chunk = finite_or_zero(m_raw)
            e = exp_acc(z - m_chunk, ACC_FP64)
            tl.store(stats_row + NSTAT * chunk, m_raw)
            tl.store(stats_row + NSTAT * chunk + 1, tl.sum(e, axis=0))
            if NSTAT == 3:
                tl.store(stats_row + NSTAT * chunk + 2, tl.sum(keep.to(acc_ty), axis=0))
        if PHASE == 0 and not PIPELINED:
            arrived = row_arrive(count_ptr, row)
            if AHEAD:
                # After the arrival: its release would otherwise wait for this load.
                x_next = chunk_x(x_ptr, item + nprog, n_items, n_cols, n_chunks, offs, CHUNK, S1, S2, xs0, xs1,
                                  xs2, xsn, SQ, Q_DIV, C_OFF, CAUSAL)
            row_wait(count_ptr, row, arrived, n_chunks)
        if PIPELINED:
            sink = 0.0
            if HAS_SINK:
                sink = tl.load(s_ptr + row_offsets(row, S1, S2, ss0, ss1, ss2)).to(acc_ty)
            m_sub, total, kept = row_meet(count_ptr, row, n_chunks, stats_row, sink, G_POW2, NSTAT, HAS_SINK,
                                           ACC_FP64)
            empty = False
            if MASK == 1:
                empty = kept == 0
            elif CAUSAL:
                empty = col_limit(row, n_cols, SQ, Q_DIV, C_OFF, CAUSAL) == 0
            if LATE_DEPART:
                departed = row_leave(count_ptr, row)
            else:
                row_depart(count_ptr, row, n_chunks)
        elif PHASE != 1:
            g = tl.arange(0, G_POW2)
            # .cg: read through L2, never a stale L1 line written by another SM before the barrier.
            ms = tl.load(stats_row + NSTAT * g, mask=g < n_chunks, other=float("-inf"), cache_modifier=".cg")
            ss = tl.load(stats_row + NSTAT * g + 1, mask=g < n_chunks, other=0.0, cache_modifier=".cg")
            sink = 0.0
            if HAS_SINK:
                sink = tl.load(s_ptr + row_offsets(row, S1, S2, ss0, ss1, ss2)).to(acc_ty)
            m_sub, total = merge_stats(ms, ss, g < n_chunks, sink, HAS_SINK, ACC_FP64)
            empty = False
            if MASK == 1:
                kept = tl.load(stats_row + NSTAT * g + 2, mask=g < n_chunks, other=0.0, cache_modifier=".cg")
                empty = tl.sum(kept, axis=0) == 0
            elif CAUSAL:
                empty = col_limit(row, n_cols, SQ, Q_DIV, C_OFF, CAUSAL) == 0
            if LATE_DEPART:
                departed = row_leave(count_ptr, row)
            elif PHASE == 0:
                row_depart(count_ptr, row, n_chunks)
        if PHASE != 1:
            if HOLD:
                # z again from the chunk as loaded (the float32 copy was not kept across the wait)
                z, _ = prologue(_widen_again(x_raw).to(acc_ty), live, m_ptrs, scale, scale_lo, cap_hi, cap_lo,
                                HAS_SCALE, HAS_CAP, MASK, ACC_FP64, PRECISE)
                y = normalise_chunk(z, z, z, z, m_sub, total, LOG, False, ACC_FP64)
            elif PHASE == 0:
                y = normalise_chunk(z, e, m_raw, m_chunk, m_sub, total, LOG, True, ACC_FP64)
            else:  # (no chunk statistics of its own in this phase: z stands in for them, unused)
                y = normalise_chunk(z, z, z, z, m_sub, total, LOG, False, ACC_FP64)
            if HAS_EMPTY:
                y = tl.where(empty, empty_fill(y, n_cols, LOG, EMPTY), y)
            tl.store(y_ptr + row_offsets(row, S1, S2, ys0, ys1, ys2) + cols * ysn,
                     y.to(y_ptr.dtype.element_ty), mask=cols < n_cols)
            if HAS_SINK:
                tl.store(p_ptr + row_offsets(row, S1, S2, ps0, ps1, ps2),
                         sink_share(sink, m_sub, total, empty, ACC_FP64).to(p_ptr.dtype.element_ty),
                         mask=(row * 0 + chunk) == 0)
            if LATE_DEPART:
                row_reset(count_ptr, row, departed, n_chunks)


@triton.jit
def _widen_again(x):
    """x (16-bit) as float32 again after the barrier: bfloat16 by a bit shift, which the compiler cannot
    merge with the first conversion and keep live across the wait (HOLD_INPUT); float16's may be."""
    if x.dtype.is_bf16():
        return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def chunk_at(item, n_chunks, offs, CHUNK: tl.constexpr):
    """(row, chunk index, columns) of item `item`, apart from the load: torch.compile marks `x` written
    where a store's address is computed in a call taking `x_ptr` (keeping a model out of CUDA graphs)."""
    item64 = tl.cast(item, tl.int64)
    row = item64 // n_chunks
    chunk = item64 % n_chunks
    return row, chunk, chunk * CHUNK + offs


@triton.jit
def _chunk_limit(item, n_items, n_cols, row, SQ, Q_DIV, C_OFF, CAUSAL: tl.constexpr):
    """The columns of item `item`'s row read: all (or the causal prefix), none past the last item."""
    return tl.where(tl.cast(item, tl.int64) < n_items, col_limit(row, n_cols, SQ, Q_DIV, C_OFF, CAUSAL), 0)


@triton.jit
def _load_chunk(x_ptr, row, cols, live, S1, S2, xs0, xs1, xs2, xsn):
    """x at `cols` of `row` where `live`, -inf elsewhere, in x's dtype."""
    return tl.load(x_ptr + row_offsets(row, S1, S2, xs0, xs1, xs2) + cols * xsn, mask=live, other=float("-inf"))


@triton.jit
def chunk_x(x_ptr, item, n_items, n_cols, n_chunks, offs, CHUNK: tl.constexpr, S1, S2, xs0, xs1, xs2, xsn,
             SQ, Q_DIV, C_OFF, CAUSAL: tl.constexpr):
    """Work item `item`'s chunk of x in x's dtype (-inf outside the row or its causal prefix and
    past the last item): the load alone, so that it can be issued ahead (PREFETCH)."""
    row, _, cols = chunk_at(item, n_chunks, offs, CHUNK)
    live = cols < _chunk_limit(item, n_items, n_cols, row, SQ, Q_DIV, C_OFF, CAUSAL)
    return _load_chunk(x_ptr, row, cols, live, S1, S2, xs0, xs1, xs2, xsn)


@triton.jit
def _chunk_x_staged(x_ptr, item, n_items, n_cols, n_chunks, offs, CHUNK: tl.constexpr, S1, S2, xs0, xs1, xs2, xsn,
                    SQ, Q_DIV, C_OFF, CAUSAL: tl.constexpr):
    """`chunk_x` for the pipelined loop (STAGES), 0 where it gives -inf (the caller masks). The
    pipeliner carries every value this load shares with the item's later uses across the
    stages: so the address and mask come from scalars and `offs` alone (shared column indices
    or an -inf fill would cost a register per element and stage), from the loop's own item count
    (`loaded`: sharing `item`'s arithmetic cost ~40 registers per thread at 3 stages, sm_90)."""
    row, chunk, _ = chunk_at(item, n_chunks, offs, CHUNK)
    start = chunk * CHUNK
    lim = _chunk_limit(item, n_items, n_cols, row, SQ, Q_DIV, C_OFF, CAUSAL)
    if CAUSAL:
        # A causal prefix in whole 16-byte vectors (the caller cuts the exact prefix): a bound
        # inside a vector loads 16-bit elements one by one, too narrow for an async copy.
        per_load: tl.constexpr = 128 // x_ptr.dtype.element_ty.primitive_bitwidth
        lim = tl.minimum(tl.cdiv(lim, per_load) * per_load, n_cols)
    span = lim - start
    return tl.load(x_ptr + (row_offsets(row, S1, S2, xs0, xs1, xs2) + start * xsn) + offs * xsn, mask=offs < span,
                   other=0.0)


@triton.jit
def chunk_logits(x_ptr, m_ptr, item, n_items, n_cols, row, cols, S1, S2, xs0, xs1, xs2, xsn, ms0, ms1, ms2, msn,
                  SQ, Q_DIV, C_OFF, scale_hi, scale_lo, cap_hi, cap_lo, acc_ty: tl.constexpr,
                  HAS_SCALE: tl.constexpr, HAS_CAP: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
                  ACC_FP64: tl.constexpr, PRECISE: tl.constexpr):
    """(z, keep) of work item `item`'s chunk after the prologue (all -inf past the last item)."""
    live = cols < _chunk_limit(item, n_items, n_cols, row, SQ, Q_DIV, C_OFF, CAUSAL)
    x = _load_chunk(x_ptr, row, cols, live, S1, S2, xs0, xs1, xs2, xsn).to(acc_ty)
    return prologue(x, live, m_ptr + row_offsets(row, S1, S2, ms0, ms1, ms2) + cols * msn, scale_hi, scale_lo,
                    cap_hi, cap_lo, HAS_SCALE, HAS_CAP, MASK, ACC_FP64, PRECISE)
