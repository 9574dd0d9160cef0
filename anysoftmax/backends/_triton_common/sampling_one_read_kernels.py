"""The small kernels around the sampler's one-read paths (`sampling_one_read.py`): the per-row
scale before the softmax or logsumexp kernel reads the logits once, and after it the rows that
scale cannot express (greedy rows, out-of-range temperatures) and `logprobs`' gather.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .sampling_kernels import id_logprobs

BIG_ID = tl.constexpr(2147483647)


@triton.jit
def _row_temperature(row, t_ptr, t_stride, temperature, ROW_T: tl.constexpr):
    """The row's temperature: from its tensor (`t_stride` 0: one value for every row) or the number."""
    t = temperature
    if ROW_T:
        t = tl.load(t_ptr + row * t_stride)
    return t


@triton.jit
def _row_max(x_row, vocab, TILE: tl.constexpr):
    """(max of the row's logits, the first index holding it, how many hold it), TILE at a time."""
    m = tl.full((), float("-inf"), tl.float32)
    first = tl.full((), BIG_ID, tl.int32)
    ties = tl.full((), 0, tl.int32)
    for start in range(0, vocab, TILE):
        cols = start + tl.arange(0, TILE)
        live = cols < vocab
        x = tl.load(x_row + cols, mask=live, other=float("-inf")).to(tl.float32)
        tm = tl.max(x)
        at = live & (x == tm)
        t_first = tl.min(tl.where(at, cols, BIG_ID))
        t_ties = tl.sum(at.to(tl.int32))
        higher = tm > m
        ties = tl.where(higher, t_ties, tl.where(tm == m, ties + t_ties, ties))
        first = tl.where(higher, t_first, first)
        m = tl.maximum(m, tm)
    return m, first, ties


@triton.jit
def row_scale_kernel(t_ptr, s_ptr, n_rows, t_stride, BLOCK: tl.constexpr):
    """s[row] = 1 / temperature (1 where it is 0 or out of range), correctly rounded (`div_rn`,
    as the scan computes it: the same z bit for bit)."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = rows < n_rows
    t = tl.load(t_ptr + rows * t_stride, mask=live, other=1.0)
    ok = (t > 0.0) & (t < float("inf"))
    s = tl.where(ok, tl.math.div_rn(1.0, tl.where(ok, t, 1.0)), 1.0)
    tl.store(s_ptr + rows, s, mask=live)


@triton.jit
def probs_fixup_kernel(x_ptr, y_ptr, t_ptr, n_rows, vocab, xs, ys, t_stride, TILE: tl.constexpr):
    """Rewrite the greedy rows of y (one-hot on the first argmax; NaN when the row holds a NaN
    or +inf, or only -inf) and the rows with an out-of-range temperature (NaN). Another row
    costs one load of its temperature: the logits are read again only for greedy rows."""
    for r in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row = tl.cast(r, tl.int32)  # (the interpreter's loop gives Python ints)
        t = tl.load(t_ptr + row * t_stride)
        bad_t = ((t >= 0.0) & (t < float("inf"))) == 0
        if (t == 0.0) | bad_t:
            x_row = x_ptr + row.to(tl.int64) * xs
            y_row = y_ptr + row.to(tl.int64) * ys
            m, first, _ = _row_max(x_row, vocab, TILE)
            # (the max of a row holding a NaN is NaN or ignores it, by target: the NaN check is its own)
            nan_or_inf = tl.full((), 0, tl.int32)
            for start in range(0, vocab, TILE):
                cols = start + tl.arange(0, TILE)
                x = tl.load(x_row + cols, mask=cols < vocab, other=0.0).to(tl.float32)
                nan_or_inf = tl.maximum(nan_or_inf, tl.max(((x != x) | (x == float("inf"))).to(tl.int32)))
            invalid = bad_t | (nan_or_inf != 0) | (m == float("-inf"))
            for start in range(0, vocab, TILE):
                cols = start + tl.arange(0, TILE)
                y = tl.where(invalid, float("nan"), tl.where(cols == first, 1.0, 0.0))
                tl.store(y_row + cols, y, mask=cols < vocab)


@triton.jit
def logprobs_gather_kernel(x_ptr, lse_ptr, s_ptr, t_ptr, ids_ptr, out_ptr, n_rows, vocab, xs, n_ids, t_stride,
                           temperature, scale, ROW_T: tl.constexpr, TILE: tl.constexpr, ID_BLOCK: tl.constexpr):
    """out[row, j] = z_id - lse at each row's ids (z = logits * s, the scale the logsumexp kernel
    applied); the greedy limit (-log n on the n tied maxima, -inf elsewhere) on temperature-0
    rows; NaN on invalid rows (an lse not finite, an out-of-range temperature or id)."""
    for r in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row = tl.cast(r, tl.int32)
        t = _row_temperature(row, t_ptr, t_stride, temperature, ROW_T)
        s = scale
        if ROW_T:
            s = tl.load(s_ptr + row)
        greedy = t == 0.0
        lse = tl.load(lse_ptr + row)
        # A row's lse is finite exactly when its softmax is defined (no NaN or +inf z, one finite z).
        invalid = (((t >= 0.0) & (t < float("inf"))) == 0) | (lse != lse) | (tl.abs(lse) == float("inf"))
        x_row = x_ptr + row.to(tl.int64) * xs
        m = tl.full((), 0.0, tl.float32)
        ties = tl.full((), 1, tl.int32)
        if greedy & (invalid == 0):
            m, _, ties = _row_max(x_row, vocab, TILE)
        # (a greedy row's scale is 1: z is the logits, as its max m)
        id_logprobs(x_row, ids_ptr, out_ptr, row.to(tl.int64) * n_ids, n_ids, vocab, s, lse, greedy, m,
                    -tl.log(ties.to(tl.float32)), invalid, ID_BLOCK)
