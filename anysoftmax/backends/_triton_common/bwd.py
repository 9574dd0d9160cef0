"""Backward of softmax, log_softmax and their fused family: softmax dz = y * (dy - sum(y * dy)),
log_softmax dz = dy - exp(y) * sum(dy); fused: sums over kept positions only (excluded ones and
empty rows get 0), dx = dz * (1 - tanh^2) (softcap, tanh from x) * scale, the sinks' gradient
-p_s * sum per row. A work item is BLOCK_M rows x CHUNK columns: one chunk a row (SINGLE) sums on
chip, longer rows meet in `stats` as in the forward split kernel (`rows.row_meet_sum`). y, dy, dx
(and x) share one row layout; a mask has its own; causal rows read their kept prefix (dx 0 past it)."""

import triton
import triton.language as tl

from .fused import col_limit, exp_acc, kept_by_mask, pair, tanh, whole_vectors
from .rows import row_arrive, row_depart, row_leave, row_meet_sum, row_offsets, row_reset, row_wait


@triton.jit
def _partial(y, dy, LOG: tl.constexpr):
    if LOG:
        return tl.sum(dy, axis=1)
    else:
        return tl.sum(y * dy, axis=1)


@triton.jit
def _item_at(item, n_rows, n_cols, n_chunks, SQ, Q_DIV, C_OFF, S1, S2, s0, s1, s2, sn,
             BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, CAUSAL_VEC: tl.constexpr, MASK: tl.constexpr,
             CAUSAL: tl.constexpr, VEC: tl.constexpr):
    """Where work item `item` lies: (rows, chunk, cols, row_ok, mask: in the tensor, loads: read,
    live: the kept prefix, off: offsets of y, dy, dx and x); no pointer goes in (`rows.chunk_at`)."""
    item64 = tl.cast(item, tl.int64)
    rows = (item64 // n_chunks) * BLOCK_M + tl.arange(0, BLOCK_M)
    chunk = item64 % n_chunks
    lanes = tl.arange(0, CHUNK)
    if MASK == 1:
        # (one register layout for y and the uint8 mask, as in the forward tile kernel)
        lanes = tl.max_contiguous(lanes, VEC)
    cols = chunk * CHUNK + lanes.to(tl.int64)
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < n_cols)[None, :]
    loads = mask
    live = mask
    if CAUSAL:
        lim = col_limit(rows, n_cols, SQ, Q_DIV, C_OFF, CAUSAL)
        live = row_ok[:, None] & (cols[None, :] < lim[:, None])
        # (whole vectors of CAUSAL_VEC elements, the exact prefix applied after the load)
        loads = row_ok[:, None] & whole_vectors(cols[None, :], lim[:, None], n_cols,
                                                CAUSAL_VEC if CAUSAL_VEC > 0 else VEC)
    off = row_offsets(rows, S1, S2, s0, s1, s2)[:, None] + cols[None, :] * sn
    return rows, chunk, cols, row_ok, mask, loads, live, off


@triton.jit
def _item_loads(y_ptr, dy_ptr, item, n_rows, n_cols, n_chunks, SQ, Q_DIV, C_OFF, S1, S2, s0, s1, s2, sn,
                BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, CAUSAL_VEC: tl.constexpr, MASK: tl.constexpr,
                CAUSAL: tl.constexpr, VEC: tl.constexpr):
    """(y, dy) of item `item` (0 outside it), the loads alone: issued ahead (PREFETCH)."""
    _, _, _, _, _, loads, _, off = _item_at(item, n_rows, n_cols, n_chunks, SQ, Q_DIV, C_OFF, S1, S2, s0, s1, s2, sn,
                                            BLOCK_M, CHUNK, CAUSAL_VEC, MASK, CAUSAL, VEC)
    return tl.load(y_ptr + off, mask=loads, other=0.0), tl.load(dy_ptr + off, mask=loads, other=0.0)


@triton.jit
def _item_loads_staged(y_ptr, dy_ptr, item, n_cols, n_chunks, SQ, Q_DIV, C_OFF, S1, S2, s0, s1, s2, sn,
                       CHUNK: tl.constexpr, CAUSAL_VEC: tl.constexpr, CAUSAL: tl.constexpr, VEC: tl.constexpr):
    """`_item_loads` of a split row for the pipelined loop: address and mask from scalars and lanes alone."""
    item64 = tl.cast(item, tl.int64)
    row = item64 // n_chunks
    start = (item64 % n_chunks) * CHUNK
    bound = n_cols
    if CAUSAL:
        per_load: tl.constexpr = CAUSAL_VEC if CAUSAL_VEC > 0 else VEC
        bound = tl.minimum(tl.cdiv(col_limit(row, n_cols, SQ, Q_DIV, C_OFF, CAUSAL), per_load) * per_load, n_cols)
    lanes = tl.arange(0, CHUNK)[None, :]
    off = (row_offsets(row, S1, S2, s0, s1, s2) + start * sn) + lanes * sn
    ok = lanes < bound - start
    return tl.load(y_ptr + off, mask=ok, other=0.0), tl.load(dy_ptr + off, mask=ok, other=0.0)


@triton.jit
def softmax_bwd_kernel(
    y_ptr, dy_ptr, dx_ptr, x_ptr, m_ptr, p_ptr, ds_ptr, stats_ptr, count_ptr, n_rows, n_cols, n_chunks,
    S1, S2, s0, s1, s2, sn, ms0, ms1, ms2, msn, ps0, ps1, ps2, SQ, Q_DIV, C_OFF, scale_hi, scale_lo, cap_hi, cap_lo,
    LOG: tl.constexpr, ACC_FP64: tl.constexpr, SINGLE: tl.constexpr,
    BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, G_POW2: tl.constexpr, PHASE: tl.constexpr, CAUSAL_VEC: tl.constexpr,
    PREFETCH: tl.constexpr, RELAXED_DEPART: tl.constexpr, STAGES: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_CAP: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_SINK: tl.constexpr, PRECISE: tl.constexpr,
):
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    VEC: tl.constexpr = 128 // y_ptr.dtype.element_ty.primitive_bitwidth
    BARRIER: tl.constexpr = PHASE == 0 and not SINGLE
    PIPELINED: tl.constexpr = STAGES > 1 and BARRIER
    AHEAD: tl.constexpr = PREFETCH and BARRIER and not PIPELINED
    LATE_DEPART: tl.constexpr = RELAXED_DEPART and BARRIER
    n_row_blocks = tl.cdiv(n_rows, BLOCK_M)
    n_items = n_row_blocks * n_chunks
    nprog = tl.num_programs(0)
    if AHEAD:
        y_next, dy_next = _item_loads(y_ptr, dy_ptr, tl.program_id(0), n_rows, n_cols, n_chunks, SQ, Q_DIV, C_OFF,
                                      S1, S2, s0, s1, s2, sn, BLOCK_M, CHUNK, CAUSAL_VEC, MASK, CAUSAL, VEC)
    if PIPELINED:
        # The item whose y and dy the loop loads, counted apart from `item` (`rows._chunk_x_staged`).
        loaded = tl.program_id(0)
    # (None: the loop as Triton plans it by default, which is how the other forms compile)
    LOOP_STAGES: tl.constexpr = STAGES if PIPELINED else None
    for item in tl.range(tl.program_id(0), n_items, nprog, num_stages=LOOP_STAGES):
        rows, chunk, cols, row_ok, mask, loads, live, off = _item_at(item, n_rows, n_cols, n_chunks, SQ, Q_DIV, C_OFF,
                                                                     S1, S2, s0, s1, s2, sn, BLOCK_M, CHUNK,
                                                                     CAUSAL_VEC, MASK, CAUSAL, VEC)
        if AHEAD:
            y_raw, dy_raw = y_next, dy_next
        elif PIPELINED:
            y_raw, dy_raw = _item_loads_staged(y_ptr, dy_ptr, loaded, n_cols, n_chunks, SQ, Q_DIV, C_OFF, S1, S2, s0,
                                               s1, s2, sn, CHUNK, CAUSAL_VEC, CAUSAL, VEC)
            loaded += nprog
        else:
            y_raw, dy_raw = _item_loads(y_ptr, dy_ptr, item, n_rows, n_cols, n_chunks, SQ, Q_DIV, C_OFF, S1, S2, s0,
                                        s1, s2, sn, BLOCK_M, CHUNK, CAUSAL_VEC, MASK, CAUSAL, VEC)
        y = y_raw.to(acc_ty)
        dy = dy_raw.to(acc_ty)
        keep = live
        if MASK == 1:
            m_ptrs = m_ptr + row_offsets(rows, S1, S2, ms0, ms1, ms2)[:, None] + cols[None, :] * msn
            keep = kept_by_mask(m_ptrs, live)
        if MASK == 1 or CAUSAL:
            # Excluded outputs are constants: their gradient goes nowhere (an empty row's
            # y may be NaN under empty_rows="nan"; its gradient is still 0).
            dy = tl.where(keep, dy, 0.0)
            y = tl.where(keep, y, 0.0 if not LOG else float("-inf"))
        if SINGLE:
            total = _partial(y, dy, LOG)
        else:
            stats = stats_ptr + rows * n_chunks
            if PHASE != 2:
                tl.store(stats + chunk, _partial(y, dy, LOG), mask=row_ok)
            if PIPELINED:
                # BLOCK_M is 1 on this path, and the item's row exists (row_ok)
                row = (tl.cast(item, tl.int64) // n_chunks) * BLOCK_M
                row_sum = row_meet_sum(count_ptr, row, n_chunks, stats_ptr + row * n_chunks, G_POW2)
                total = tl.zeros([BLOCK_M], acc_ty) + row_sum
                if LATE_DEPART:
                    departed = row_leave(count_ptr, row)
                else:
                    row_depart(count_ptr, row, n_chunks)
            elif PHASE == 0:
                # BLOCK_M is 1 on this path: the row's barrier, as in the forward split kernel.
                row = (tl.cast(item, tl.int64) // n_chunks) * BLOCK_M
                arrived = row_arrive(count_ptr, row)
                if AHEAD:
                    # (after the arrival: its release would otherwise wait for these loads)
                    y_next, dy_next = _item_loads(y_ptr, dy_ptr, item + nprog, n_rows, n_cols, n_chunks, SQ, Q_DIV,
                                                  C_OFF, S1, S2, s0, s1, s2, sn, BLOCK_M, CHUNK, CAUSAL_VEC, MASK,
                                                  CAUSAL, VEC)
                row_wait(count_ptr, row, arrived, n_chunks)
            if not PIPELINED:
                g = tl.arange(0, G_POW2)
                part = tl.load(stats[:, None] + g[None, :], mask=row_ok[:, None] & (g < n_chunks)[None, :],
                               other=0.0, cache_modifier=".cg")
                total = tl.sum(part, axis=1)
                if LATE_DEPART:
                    departed = row_leave(count_ptr, row)
                elif PHASE == 0:
                    row_depart(count_ptr, row, n_chunks)
        if PHASE != 1:
            if LOG:
                dx = dy - exp_acc(y, ACC_FP64) * total[:, None]
            else:
                dx = y * (dy - total[:, None])
            if HAS_CAP:
                scale = 1.0
                if HAS_SCALE:
                    scale = pair(scale_hi, scale_lo, ACC_FP64)
                cap = pair(cap_hi, cap_lo, ACC_FP64)
                x = tl.load(x_ptr + off, mask=loads, other=0.0).to(acc_ty)
                t = tanh(x * scale * (1.0 / cap), PRECISE, ACC_FP64)
                dx = dx * (1.0 - t * t)
            if HAS_SCALE:
                dx = dx * pair(scale_hi, scale_lo, ACC_FP64)
            if MASK == 1 or CAUSAL:
                # After softcap's factor: an excluded x may be NaN or inf, and 0 * (1 - tanh^2)
                # of it is NaN; excluded positions get 0 whatever they hold.
                dx = tl.where(keep, dx, 0.0)
            tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            if HAS_SINK:
                # ds = -p_s * sum(y dy) (log: -p_s * sum(dy)); p_s is 0 in an empty row.
                first = row_ok & ((rows * 0 + chunk) == 0)
                p_off = row_offsets(rows, S1, S2, ps0, ps1, ps2)  # (ds is laid out as p_sink)
                p = tl.load(p_ptr + p_off, mask=first, other=0.0).to(acc_ty)
                tl.store(ds_ptr + p_off, (-p * total).to(ds_ptr.dtype.element_ty), mask=first)
        if LATE_DEPART:
            row_reset(count_ptr, row, departed, n_chunks)
