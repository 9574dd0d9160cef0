"""The kernels of the sampler's one-read paths (`sampling_one_read.py`): the per-row scale before
the softmax or logsumexp kernel reads the logits once, and after it the rows that scale cannot
express (greedy rows, out-of-range temperatures) and `logprobs`' gather; `logprobs_kernel`, the
logsumexp and the gather in one launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .fused import close_lse, lse_sub, tile_lse
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
def _row_scale(t):
    """1 / t correctly rounded (`div_rn`, as the scan computes it: the same z bit for bit); 1 where
    t is 0 or out of range."""
    ok = (t > 0.0) & (t < float("inf"))
    return tl.where(ok, tl.math.div_rn(1.0, tl.where(ok, t, 1.0)), 1.0)


@triton.jit
def row_scale_kernel(t_ptr, s_ptr, n_rows, t_stride, BLOCK: tl.constexpr):
    """s[row] = `_row_scale` of the row's temperature."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = rows < n_rows
    tl.store(s_ptr + rows, _row_scale(tl.load(t_ptr + rows * t_stride, mask=live, other=1.0)), mask=live)


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
def _row_logprobs(row, x_row, ids_ptr, out_ptr, n_ids, vocab, t, s, lse, TILE: tl.constexpr,
                  ID_BLOCK: tl.constexpr):
    """A row's out[row, j] = z_id - lse at its ids (z = logits * s); the greedy limit (-log n on
    the n tied maxima, -inf elsewhere) where t is 0; NaN on an invalid row (an lse not finite,
    an out-of-range temperature) and at out-of-range ids."""
    greedy = t == 0.0
    # A row's lse is finite exactly when its softmax is defined (no NaN or +inf z, one finite z).
    invalid = (((t >= 0.0) & (t < float("inf"))) == 0) | (lse != lse) | (tl.abs(lse) == float("inf"))
    m = tl.full((), 0.0, tl.float32)
    ties = tl.full((), 1, tl.int32)
    if greedy & (invalid == 0):
        m, _, ties = _row_max(x_row, vocab, TILE)
    # (a greedy row's scale is 1: z is the logits, as its max m)
    id_logprobs(x_row, ids_ptr, out_ptr, row.to(tl.int64) * n_ids, n_ids, vocab, s, lse, greedy, m,
                -tl.log(ties.to(tl.float32)), invalid, ID_BLOCK)


@triton.jit
def logprobs_gather_kernel(x_ptr, lse_ptr, s_ptr, t_ptr, ids_ptr, out_ptr, n_rows, vocab, xs, n_ids, t_stride,
                           temperature, scale, ROW_T: tl.constexpr, TILE: tl.constexpr, ID_BLOCK: tl.constexpr):
    """`_row_logprobs` of every row after the logsumexp kernel: `lse` its result, `s` the scale
    it applied (`row_scale_kernel`'s where the temperature is a tensor, else `scale`)."""
    for r in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row = tl.cast(r, tl.int32)
        t = _row_temperature(row, t_ptr, t_stride, temperature, ROW_T)
        s = scale
        if ROW_T:
            s = tl.load(s_ptr + row)
        _row_logprobs(row, x_ptr + row.to(tl.int64) * xs, ids_ptr, out_ptr, n_ids, vocab, t, s, tl.load(lse_ptr + row),
                      TILE, ID_BLOCK)


@triton.jit
def logprobs_kernel(x_ptr, t_ptr, ids_ptr, out_ptr, stats_ptr, count_ptr, n_rows, vocab, xs, n_ids, t_stride,
                    n_chunks, temperature, scale, ROW_T: tl.constexpr, CHUNK: tl.constexpr, G_P2: tl.constexpr,
                    TILE: tl.constexpr, ID_BLOCK: tl.constexpr):
    """`logprobs` of ids in one launch: each work item (row, chunk) stores the lse of its chunk
    of z = logits * s (s = 1 / temperature, `_row_scale`, or `scale`) in `stats`; the program
    storing a row's last chunk combines the row's and runs `_row_logprobs`. No program waits for
    another; `count_ptr` holds one arrival count per row, zero between launches (the last
    arrival resets it)."""
    offs = tl.arange(0, CHUNK)
    for item in tl.range(tl.program_id(0), n_rows * n_chunks, tl.num_programs(0)):
        row = item // n_chunks
        t = _row_temperature(row, t_ptr, t_stride, temperature, ROW_T)
        s = scale
        if ROW_T:
            s = _row_scale(t)
        x_row = x_ptr + row.to(tl.int64) * xs
        cols = (item - row * n_chunks) * CHUNK + offs
        x = tl.load(x_row + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        # s > 0: max(x * s) is max(x) * s (rounding is monotone), and the -inf past the row's end
        # stays -inf. exp(x * s - m) as exp2 of one FMA an element (the scale and log2(e) folded).
        m = tl.max(x) * s
        c = s * 1.4426950408889634
        e = tl.exp2(x * c - lse_sub(m) * 1.4426950408889634)
        # (a scalar store and the arrival: the same thread, so its release orders the store; the
        # last arrival's acquire, then a bar.sync, orders every thread's reads of the others')
        tl.store(stats_ptr + item, close_lse(m, tl.sum(e)))
        if tl.atomic_add(count_ptr + row, 1, sem="acq_rel", scope="gpu") + 1 == n_chunks:
            tl.atomic_xchg(count_ptr + row, 0, sem="relaxed", scope="gpu")
            tl.debug_barrier()
            g = tl.arange(0, G_P2)
            ls = tl.load(stats_ptr + row * n_chunks + g, mask=g < n_chunks, other=float("-inf"), cache_modifier=".cg")
            _row_logprobs(row, x_row, ids_ptr, out_ptr, n_ids, vocab, t, s, tile_lse(ls, 0.0, 0, False, False), TILE,
                          ID_BLOCK)
