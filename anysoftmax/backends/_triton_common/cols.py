"""Softmax over a dim that is not the innermost, viewed as (outer, N, inner), in tiles of BLOCK_N
reduction steps x BLOCK_I adjacent inner positions (coalesced, no transpose) reduced down axis 0:
the whole reduction in one tile, or the row split kernel's scheme transposed (`softmax_cols_split_kernel`)."""

from __future__ import annotations

import triton
import triton.language as tl

from .fused import (close_tile, col_limit, empty_fill, exp_acc, finite_or_zero, merge_stats, prologue, row_scale,
                    sink_share)
from .rows import normalise_chunk, row_arrive, row_depart, row_wait


@triton.jit
def _tile_offsets(o, k, inner, so, sn, si, WIDE: tl.constexpr):
    """Offsets of steps `k` x inner positions `inner` of outer index `o` (inner stride `si`)."""
    if WIDE:
        k = k.to(tl.int64)
    return tl.cast(o, tl.int64) * so + k[:, None] * sn + inner[None, :] * si


@triton.jit
def _column_logits(x_ptr, m_ptr, o, k, inner, n_red, n_inner, xso, xsn, mso, msn, msi, SQ, C_OFF,
                   scale_hi, scale_lo, cap_hi, cap_lo, acc_ty: tl.constexpr, WIDE: tl.constexpr,
                   HAS_SCALE: tl.constexpr, HAS_CAP: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
                   ACC_FP64: tl.constexpr, PRECISE: tl.constexpr):
    """(z, keep, live, mask pointers) of a tile after the prologue; under causal, inner position i
    of outer index o is row o * n_inner + i, whose kept prefix bounds the steps read."""
    if CAUSAL:
        lim = col_limit(tl.cast(o, tl.int64) * n_inner + inner, n_red, SQ, 1, C_OFF, CAUSAL)
        live = (k[:, None] < lim[None, :]) & (inner < n_inner)[None, :]
    else:
        live = (k < n_red)[:, None] & (inner < n_inner)[None, :]
    x = tl.load(x_ptr + _tile_offsets(o, k, inner, xso, xsn, 1, WIDE), mask=live, other=float("-inf")).to(acc_ty)
    m_ptrs = m_ptr + _tile_offsets(o, k, inner, mso, msn, msi, WIDE)
    z, keep = prologue(x, live, m_ptrs, scale_hi, scale_lo, cap_hi, cap_lo, HAS_SCALE, HAS_CAP, MASK, ACC_FP64,
                       PRECISE)
    return z, keep, live, m_ptrs


@triton.jit
def softmax_cols_kernel(
    x_ptr, y_ptr, m_ptr, s_ptr, p_ptr, r_ptr, n_outer, n_red, n_inner, xso, xsn, yso, ysn,
    mso, msn, msi, sso, ssi, SQ, C_OFF, scale_hi, scale_lo, cap_hi, cap_lo,
    LOG: tl.constexpr, ACC_FP64: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_I: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_CAP: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_SINK: tl.constexpr, HAS_EMPTY: tl.constexpr, EMPTY: tl.constexpr, PRECISE: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
):
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    k = tl.arange(0, BLOCK_N)
    i0 = tl.arange(0, BLOCK_I)
    n_iblk = tl.cdiv(n_inner, BLOCK_I)
    for item in tl.range(tl.program_id(0), n_outer * n_iblk, tl.num_programs(0)):
        o = item // n_iblk
        inner = (item % n_iblk) * BLOCK_I + i0
        mask = (k < n_red)[:, None] & (inner < n_inner)[None, :]
        scale = scale_hi
        if HAS_ROW_SCALE:
            scale = row_scale(r_ptr, tl.cast(o, tl.int64) * sso + inner * ssi, inner < n_inner, acc_ty)[None, :]
        z, _, live, m_ptrs = _column_logits(x_ptr, m_ptr, o, k, inner, n_red, n_inner, xso, xsn, mso, msn, msi,
                                            SQ, C_OFF, scale, scale_lo, cap_hi, cap_lo, acc_ty, WIDE, HAS_SCALE,
                                            HAS_CAP, MASK, CAUSAL, ACC_FP64, PRECISE)
        sink = 0.0
        if HAS_SINK:
            sink = tl.load(s_ptr + tl.cast(o, tl.int64) * sso + inner * ssi, mask=inner < n_inner,
                           other=0.0).to(acc_ty)
        lim = col_limit(tl.cast(o, tl.int64) * n_inner + inner, n_red, SQ, 1, C_OFF, CAUSAL)
        y, p = close_tile(z, live, m_ptrs, sink, n_red, lim, 0, LOG, ACC_FP64, HAS_SINK, MASK, CAUSAL, EMPTY)
        tl.store(y_ptr + _tile_offsets(o, k, inner, yso, ysn, 1, WIDE), y.to(y_ptr.dtype.element_ty), mask=mask)
        if HAS_SINK:
            tl.store(p_ptr + tl.cast(o, tl.int64) * n_inner + inner, p.to(p_ptr.dtype.element_ty),
                     mask=inner < n_inner)


@triton.jit
def softmax_cols_split_kernel(
    x_ptr, y_ptr, m_ptr, s_ptr, p_ptr, r_ptr, stats_ptr, count_ptr, n_outer, n_red, n_inner, n_chunks, xso, xsn,
    yso, ysn,
    mso, msn, msi, sso, ssi, SQ, C_OFF, scale_hi, scale_lo, cap_hi, cap_lo,
    LOG: tl.constexpr, ACC_FP64: tl.constexpr, WIDE: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_I: tl.constexpr, G_POW2: tl.constexpr, PHASE: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_CAP: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_SINK: tl.constexpr, HAS_EMPTY: tl.constexpr, EMPTY: tl.constexpr, PRECISE: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
):
    """Work item = (BLOCK_I inner positions of one outer index, chunk of N); stats: per group n_chunks x
    (max[BLOCK_I], sum[BLOCK_I][, kept[BLOCK_I]])."""
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    NSTAT: tl.constexpr = 3 if MASK == 1 else 2
    k0 = tl.arange(0, CHUNK)
    i0 = tl.arange(0, BLOCK_I)
    g = tl.arange(0, G_POW2)
    n_iblk = tl.cdiv(n_inner, BLOCK_I)
    for item in tl.range(tl.program_id(0), n_outer * n_iblk * n_chunks, tl.num_programs(0)):
        group = item // n_chunks
        chunk = item % n_chunks
        o = group // n_iblk
        inner = (group % n_iblk) * BLOCK_I + i0
        k = chunk * CHUNK + k0
        mask = (k < n_red)[:, None] & (inner < n_inner)[None, :]
        scale = scale_hi
        if HAS_ROW_SCALE:
            scale = row_scale(r_ptr, tl.cast(o, tl.int64) * sso + inner * ssi, inner < n_inner, acc_ty)[None, :]
        z, keep, _, _ = _column_logits(x_ptr, m_ptr, o, k, inner, n_red, n_inner, xso, xsn, mso, msn, msi, SQ,
                                       C_OFF, scale, scale_lo, cap_hi, cap_lo, acc_ty, WIDE, HAS_SCALE, HAS_CAP,
                                       MASK, CAUSAL, ACC_FP64, PRECISE)
        stats = stats_ptr + tl.cast(group, tl.int64) * (NSTAT * n_chunks * BLOCK_I)
        if PHASE != 2:
            m_raw = tl.max(z, axis=0)
            m_chunk = finite_or_zero(m_raw)
            e = exp_acc(z - m_chunk[None, :], ACC_FP64)
            tl.store(stats + (NSTAT * chunk) * BLOCK_I + i0, m_raw)
            tl.store(stats + (NSTAT * chunk + 1) * BLOCK_I + i0, tl.sum(e, axis=0))
            if NSTAT == 3:
                tl.store(stats + (NSTAT * chunk + 2) * BLOCK_I + i0, tl.sum(keep.to(acc_ty), axis=0))
        if PHASE == 0:
            row_wait(count_ptr, group, row_arrive(count_ptr, group), n_chunks)
        if PHASE != 1:
            # .cg: through L2, never a stale L1 line of another SM's statistics.
            gm = (g < n_chunks)[:, None]
            st = stats + (NSTAT * g)[:, None] * BLOCK_I + i0[None, :]
            ms = tl.load(st, mask=gm, other=float("-inf"), cache_modifier=".cg")
            ss = tl.load(st + BLOCK_I, mask=gm, other=0.0, cache_modifier=".cg")
            sink = 0.0
            if HAS_SINK:
                sink = tl.load(s_ptr + tl.cast(o, tl.int64) * sso + inner * ssi, mask=inner < n_inner,
                               other=0.0).to(acc_ty)
            m_sub, total = merge_stats(ms, ss, gm, sink, HAS_SINK, ACC_FP64)
            empty = inner < 0
            if MASK == 1:
                kept = tl.load(st + 2 * BLOCK_I, mask=gm, other=0.0, cache_modifier=".cg")
                empty = tl.sum(kept, axis=0) == 0
            elif CAUSAL:
                empty = col_limit(tl.cast(o, tl.int64) * n_inner + inner, n_red, SQ, 1, C_OFF, CAUSAL) == 0
            if PHASE == 0:
                row_depart(count_ptr, group, n_chunks)
                y = normalise_chunk(z, e, m_raw, m_chunk, m_sub, total, LOG, True, ACC_FP64)
            else:  # (no chunk statistics of its own in this phase: z stands in for them, unused)
                y = normalise_chunk(z, z, z, z, m_sub, total, LOG, False, ACC_FP64)
            if HAS_EMPTY:
                y = tl.where(empty[None, :], empty_fill(y, n_red, LOG, EMPTY), y)
            tl.store(y_ptr + _tile_offsets(o, k, inner, yso, ysn, 1, WIDE), y.to(y_ptr.dtype.element_ty), mask=mask)
            if HAS_SINK:
                tl.store(p_ptr + tl.cast(o, tl.int64) * n_inner + inner,
                         sink_share(sink, m_sub, total, empty, ACC_FP64).to(p_ptr.dtype.element_ty),
                         mask=(inner < n_inner) & ((inner * 0 + chunk) == 0))
