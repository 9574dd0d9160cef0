"""A row sharded across GPUs, normalised with one read of each shard: the split kernel's barrier extended
to other ranks through the mailbox (`anysoftmax.distributed.mailbox`; docs/kernels.md, "sharded split").
A word's epoch parity picks the mailbox half: a rank is at most one call ahead."""

from __future__ import annotations

import triton
import triton.language as tl

from .fused import exp_acc, finite_or_zero, merge_stats, prologue, tile_lse
from .rows import (chunk_at, chunk_logits, chunk_x, normalise_chunk, row_arrive, row_depart, row_offsets,
                   row_wait)

LOW32 = tl.constexpr(0xFFFFFFFF)  # the float32 bits of a word


@triton.jit
def _local_lse(stats_row, n_chunks, G_POW2: tl.constexpr):
    """This rank's lse of a row from its chunks' (max, sum) at `stats_row` (through L2: others wrote them)."""
    g = tl.arange(0, G_POW2)
    ms = tl.load(stats_row + 2 * g, mask=g < n_chunks, other=float("-inf"), cache_modifier=".cg")
    ss = tl.load(stats_row + 2 * g + 1, mask=g < n_chunks, other=0.0, cache_modifier=".cg")
    m_sub, total = merge_stats(ms, ss, g < n_chunks, 0.0, False, False)
    return ms, ss, m_sub + tl.log(total)  # (-inf for a row with nothing kept: log 0)


@triton.jit
def _publish(peers_ptr, slot, lse, epoch, ranks, others, go):
    """Write this rank's `lse` of a row, tagged with `epoch`, into slot `slot` of every other
    rank's mailbox (where `go`): one relaxed system-scope exchange per peer (single-copy atomic)."""
    bits = lse.to(tl.int32, bitcast=True).to(tl.int64) & LOW32
    word = (tl.cast(epoch, tl.int64) << 32) | bits
    base = tl.load(peers_ptr + ranks, mask=others, other=0)
    dst = base.to(tl.pointer_type(tl.int64)) + slot
    tl.atomic_xchg(dst, word + tl.zeros_like(base), mask=others & go, sem="relaxed", scope="sys")


@triton.jit
def _gather_rest(words_ptr, slot_row, epoch, ranks, others, sink, HAS_SINK: tl.constexpr):
    """Spin until every other rank's word of the row (at words_ptr + slot_row + rank) carries
    `epoch`, then the log of everything outside this shard: the peers' lses and the sink."""
    w = tl.load(words_ptr + slot_row + ranks, mask=others, other=0, volatile=True)
    while tl.sum(tl.where(others & ((w >> 32) != epoch), 1, 0), axis=0) > 0:
        w = tl.load(words_ptr + slot_row + ranks, mask=others, other=0, volatile=True)
    peer = (w & LOW32).to(tl.int32).to(tl.float32, bitcast=True)
    peer = tl.where(others, peer, float("-inf"))
    return tile_lse(peer, sink, 0, HAS_SINK, False)


# The epoch and the mailbox half change every call: never specialised on (1 or a multiple of 16
# would compile another kernel, which a fast launch would not use).
@triton.jit(do_not_specialize=["epoch", "slot_base"])
def sharded_split_kernel(
    x_ptr, y_ptr, m_ptr, s_ptr, lse_ptr, stats_ptr, count_ptr, words_ptr, peers_ptr,
    n_rows, n_cols, n_chunks, rank, world, epoch, slot_base,
    S1, S2, xs0, xs1, xs2, xsn, ys0, ys1, ys2, ysn, ms0, ms1, ms2, msn, ss0, ss1, ss2,
    scale_hi, scale_lo, cap_hi, cap_lo,
    LOG: tl.constexpr, WIDE_COLS: tl.constexpr, CHUNK: tl.constexpr,
    G_POW2: tl.constexpr, W_POW2: tl.constexpr, PHASE: tl.constexpr, PREFETCH: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_CAP: tl.constexpr, MASK: tl.constexpr, HAS_SINK: tl.constexpr,
    WRITE_LSE: tl.constexpr, PRECISE: tl.constexpr,
):
    """This rank's shard of a row-sharded softmax in float32 (the words carry float32 lses), rows
    in logical order on every rank; MASK 0 or 2 (a bool mask's empty rows would need every rank's
    count); WRITE_LSE stores the row's global lse at lse_ptr + row (the sinks' gradient reads
    it). PREFETCH (PHASE 0): the next chunk's load in flight while the states cross NVLink."""
    acc_ty = tl.float32
    offs = tl.arange(0, CHUNK)
    if WIDE_COLS:
        offs = offs.to(tl.int64)
    ranks = tl.arange(0, W_POW2)
    others = (ranks < world) & (ranks != rank)
    n_items = n_rows * n_chunks
    nprog = tl.num_programs(0)
    if PREFETCH:
        x_next = chunk_x(x_ptr, tl.program_id(0), n_items, n_cols, n_chunks, offs, CHUNK, S1, S2, xs0, xs1, xs2,
                         xsn, 1, 1, 0, False)
    for item in tl.range(tl.program_id(0), n_items, nprog):
        row, chunk, cols = chunk_at(item, n_chunks, offs, CHUNK)
        stats_row = stats_ptr + row * (2 * n_chunks)
        slot_row = slot_base + row * world
        sink = 0.0
        if HAS_SINK:
            sink = tl.load(s_ptr + row_offsets(row, S1, S2, ss0, ss1, ss2)).to(acc_ty)
        if PHASE != 2:
            if PREFETCH:
                m_ptrs = m_ptr + row_offsets(row, S1, S2, ms0, ms1, ms2) + cols * msn
                z, _ = prologue(x_next.to(acc_ty), cols < n_cols, m_ptrs, scale_hi, scale_lo, cap_hi, cap_lo,
                                HAS_SCALE, HAS_CAP, MASK, False, PRECISE)
            else:
                z, _ = chunk_logits(x_ptr, m_ptr, item, n_items, n_cols, row, cols, S1, S2, xs0, xs1, xs2, xsn,
                                    ms0, ms1, ms2, msn, 1, 1, 0, scale_hi, scale_lo, cap_hi, cap_lo, acc_ty,
                                    HAS_SCALE, HAS_CAP, MASK, False, False, PRECISE)
            m_raw = tl.max(z, axis=0)
            m_chunk = finite_or_zero(m_raw)
            e = exp_acc(z - m_chunk, False)
            tl.store(stats_row + 2 * chunk, m_raw)
            tl.store(stats_row + 2 * chunk + 1, tl.sum(e, axis=0))
            arrived = row_arrive(count_ptr, row)
            if PREFETCH:
                x_next = chunk_x(x_ptr, item + nprog, n_items, n_cols, n_chunks, offs, CHUNK, S1, S2, xs0, xs1,
                                 xs2, xsn, 1, 1, 0, False)
        if PHASE == 1:
            # The row's last chunk to arrive publishes it and leaves the counter at zero;
            # nothing waits here, so no co-residency is needed.
            if arrived == n_chunks:
                tl.atomic_xchg(count_ptr + 2 * row, 0, sem="relaxed", scope="gpu")
                row_lse = _local_lse(stats_row, n_chunks, G_POW2)[2]
                _publish(peers_ptr, slot_row + rank, row_lse, epoch, ranks, others, ranks >= 0)
        else:
            if PHASE == 0:
                row_wait(count_ptr, row, arrived, n_chunks)
            ms, ss, lse = _local_lse(stats_row, n_chunks, G_POW2)
            if PHASE == 0:
                _publish(peers_ptr, slot_row + rank, lse, epoch, ranks, others, ranks * 0 + chunk == 0)
            rest = _gather_rest(words_ptr, slot_row, epoch, ranks, others, sink, HAS_SINK)
            g = tl.arange(0, G_POW2)
            m_sub, total = merge_stats(ms, ss, g < n_chunks, rest, True, False)
            if WRITE_LSE:
                tl.store(lse_ptr + row, (m_sub + tl.log(total)).to(lse_ptr.dtype.element_ty), mask=chunk == 0)
            if PHASE == 0:
                row_depart(count_ptr, row, n_chunks)
                y = normalise_chunk(z, e, m_raw, m_chunk, m_sub, total, LOG, True, False)
            else:  # (re-read: the chunk's own statistics are not kept between launches)
                z, _ = chunk_logits(x_ptr, m_ptr, item, n_items, n_cols, row, cols, S1, S2, xs0, xs1, xs2, xsn,
                                    ms0, ms1, ms2, msn, 1, 1, 0, scale_hi, scale_lo, cap_hi, cap_lo, acc_ty,
                                    HAS_SCALE, HAS_CAP, MASK, False, False, PRECISE)
                y = normalise_chunk(z, z, z, z, m_sub, total, LOG, False, False)
            tl.store(y_ptr + row_offsets(row, S1, S2, ys0, ys1, ys2) + cols * ysn,
                     y.to(y_ptr.dtype.element_ty), mask=cols < n_cols)
