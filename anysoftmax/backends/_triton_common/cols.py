"""Softmax over a dim that is not the innermost one, read in coalesced tiles.

A tensor reduced over dim d is viewed as (outer, N, inner): N = size of d, `inner` = the
contiguous elements after it (stride 1 in input and output). The row kernels would read each
reduction "row" with stride `inner`, one element per memory sector; here a tile is
BLOCK_N reduction steps x BLOCK_I adjacent inner positions, so every access covers BLOCK_I
contiguous elements (256 bytes at BLOCK_I = 64 fp32) and the reduction runs down axis 0.
No transpose copy is made.

* `softmax_cols_kernel`: the whole reduction (N <= BLOCK_N) fits in one tile.
* `softmax_cols_split_kernel`: N cut into CHUNK-step pieces held by different programs, with
  per-position partial (max, sum) meeting in `stats`: the row split kernel's scheme
  (`softmax.softmax_split_kernel`), transposed. PHASE 0 is cooperative (one launch, one read
  and one write per element, co-resident grid); PHASE 1 / 2 are the two-launch form.

Numerics are those of the row kernels (fp32 accumulation, exp2 with log2(e) folded in, -inf
kept out of the rescale factors).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .rows import (_exp, _finite_or_zero, _merge_chunk_stats, _normalise_chunk, _row_arrive, _row_depart,
                      _row_wait, _softmax_along)


@triton.jit
def _tile_offsets(o, k, inner, so, sn, WIDE: tl.constexpr):
    """Offsets of reduction steps `k` x inner positions `inner` of outer index `o`."""
    if WIDE:
        k = k.to(tl.int64)
    return tl.cast(o, tl.int64) * so + k[:, None] * sn + inner[None, :]


@triton.jit
def softmax_cols_kernel(
    x_ptr, y_ptr, n_outer, n_red, n_inner, xso, xsn, yso, ysn,
    LOG: tl.constexpr, ACC_FP64: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_I: tl.constexpr,
):
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    k = tl.arange(0, BLOCK_N)
    i0 = tl.arange(0, BLOCK_I)
    n_iblk = tl.cdiv(n_inner, BLOCK_I)
    for item in tl.range(tl.program_id(0), n_outer * n_iblk, tl.num_programs(0)):
        o = item // n_iblk
        inner = (item % n_iblk) * BLOCK_I + i0
        mask = (k < n_red)[:, None] & (inner < n_inner)[None, :]
        x = tl.load(x_ptr + _tile_offsets(o, k, inner, xso, xsn, WIDE), mask=mask,
                    other=float("-inf")).to(acc_ty)
        y = _softmax_along(x, 0, LOG, ACC_FP64)
        tl.store(y_ptr + _tile_offsets(o, k, inner, yso, ysn, WIDE), y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_cols_split_kernel(
    x_ptr, y_ptr, stats_ptr, count_ptr, n_outer, n_red, n_inner, n_chunks, xso, xsn, yso, ysn,
    LOG: tl.constexpr, ACC_FP64: tl.constexpr, WIDE: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_I: tl.constexpr, G_POW2: tl.constexpr, PHASE: tl.constexpr,
):
    """Work item = (group of BLOCK_I inner positions of one outer index, chunk of N).
    stats holds, per group, n_chunks x (max[BLOCK_I], sum[BLOCK_I])."""
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
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
        x = tl.load(x_ptr + _tile_offsets(o, k, inner, xso, xsn, WIDE), mask=mask,
                    other=float("-inf")).to(acc_ty)
        stats = stats_ptr + tl.cast(group, tl.int64) * (2 * n_chunks * BLOCK_I)
        if PHASE != 2:
            m_raw = tl.max(x, axis=0)
            m_chunk = _finite_or_zero(m_raw)
            e = _exp(x - m_chunk[None, :], ACC_FP64)
            tl.store(stats + (2 * chunk) * BLOCK_I + i0, m_raw)
            tl.store(stats + (2 * chunk + 1) * BLOCK_I + i0, tl.sum(e, axis=0))
        if PHASE == 0:
            _row_wait(count_ptr, group, _row_arrive(count_ptr, group), n_chunks)
        if PHASE != 1:
            # .cg: through L2, never a stale L1 line of another SM's statistics.
            gm = (g < n_chunks)[:, None]
            st = stats + (2 * g)[:, None] * BLOCK_I + i0[None, :]
            ms = tl.load(st, mask=gm, other=float("-inf"), cache_modifier=".cg")
            ss = tl.load(st + BLOCK_I, mask=gm, other=0.0, cache_modifier=".cg")
            m_sub, total = _merge_chunk_stats(ms, ss, gm)
            if PHASE == 0:
                _row_depart(count_ptr, group, n_chunks)
                y = _normalise_chunk(x, e, m_raw, m_chunk, m_sub, total, LOG, True, ACC_FP64)
            else:  # (no chunk statistics of its own in this phase: x stands in for them, unused)
                y = _normalise_chunk(x, x, x, x, m_sub, total, LOG, False, ACC_FP64)
            tl.store(y_ptr + _tile_offsets(o, k, inner, yso, ysn, WIDE), y.to(y_ptr.dtype.element_ty), mask=mask)
