"""The fused family's steps as Triton helpers, shared by every kernel kind (row tiles, online
rows, split rows, column tiles, the backward): one prologue after every load, the sink where
a row's statistics close, one empty-row epilogue. `core.variant` states the semantics; these
functions are that statement in Triton.

Which steps exist is decided by constexprs (a plain softmax compiles to the same code as
before: every step is behind a flag that is False); their values are runtime arguments, so a
new temperature never recompiles:

* HAS_SCALE / HAS_CAP: z = scale * x, then z = softcap * tanh(z / softcap). The values come
  as (hi, lo) float32 pairs (Triton passes float arguments as float32): hi + lo carries ~48
  bits, which float64 outputs need and float32 ones ignore.
* MASK: 0 none, 1 bool (read as uint8; nonzero = excluded), 2 additive (read in its dtype,
  added in the accumulation dtype).
* CAUSAL: keep column j of a row whose query index is q when j <= q + C_OFF (C_OFF = 0: top
  left; sk - sq: bottom right). q = (row // Q_DIV) % SQ: the query dim (the one before the
  last) is the innermost logical row dim, and Q_DIV the product of the row dims numbered
  faster than it (1 in logical order; the heads when a broadcast mask puts them fastest,
  `core.layout.RowLayout.inner_div`).
* HAS_SINK: one extra logit per row in the max and the denominator; its share p_s is written.
* A bool mask or causal: rows with no kept column get the policy's value (EMPTY: 0 zero,
  1 NaN, 2 uniform), decided by the kept prefix (causal) or the count of kept columns,
  never by values (HAS_EMPTY says so to the kernels whose loops count as they go).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tanh(a, PRECISE: tl.constexpr, ACC_FP64: tl.constexpr):
    """tanh from one exponential: sign(a) * (1 - e) / (1 + e), e = exp(-2|a|); +-inf give +-1,
    NaN stays NaN. Near 0, 1 - e cancels: its absolute error (~2^-22 with float32's ex2) is a
    relative error of tanh, which 16-bit outputs never see but float32 outputs would (softcap
    multiplies it back by the cap), so with PRECISE an odd Taylor polynomial takes |a| < 0.3
    (float64: < 0.05), where its first omitted term is below the precision. The float32
    quotient is the fast (2-ulp) division: the precise one costs a dozen instructions per
    element and turned softcap from memory- into instruction-bound."""
    ax = tl.abs(a)
    if ACC_FP64:
        e = tl.exp(-2.0 * ax)
        t = (1.0 - e) / (1.0 + e)
        small_limit = 0.05
    else:
        e = tl.exp2(ax * -2.8853900817779268)  # -2 * log2(e)
        t = tl.fdiv(1.0 - e, 1.0 + e)
        small_limit = 0.3
    if PRECISE:
        a2 = a * a
        small = ax * (1.0 + a2 * (-0.3333333333333333 + a2 * (0.13333333333333333 + a2 * (
            -0.05396825396825397 + a2 * (0.021869488536155203 + a2 * (-0.008863235529902197
                                                                      + a2 * 0.003592128036572481))))))
        t = tl.where(ax < small_limit, small, t)
    return tl.where(a < 0, -t, t)


@triton.jit
def pair(hi, lo, ACC_FP64: tl.constexpr):
    """A runtime value passed as float32 hi + lo, in the accumulation precision."""
    if ACC_FP64:
        return tl.cast(hi, tl.float64) + tl.cast(lo, tl.float64)
    else:
        return hi


@triton.jit
def col_limit(rows, n_cols, SQ, Q_DIV, C_OFF, CAUSAL: tl.constexpr):
    """Columns a row reads: all of them, or under causal the kept prefix min(n, q + C_OFF + 1)
    (at most n, at least 0: a row before the first kept key reads nothing), q being the row's
    query, (row // Q_DIV) % SQ (`core.layout.RowLayout.inner_div`)."""
    if CAUSAL:
        # int32: compared with every column index, and a 64-bit compare per element costs
        # twice the instructions (a row is shorter than 2^31 elements).
        q = ((rows // Q_DIV) % SQ).to(tl.int32)
        return tl.maximum(tl.minimum(q + C_OFF + 1, n_cols), 0)
    else:
        return n_cols


@triton.jit
def kept_by_mask(m_ptrs, live):
    """The positions of `live` a bool mask (read as uint8, nonzero = excluded) keeps."""
    return live & (tl.load(m_ptrs, mask=live, other=1) == 0)


@triton.jit
def whole_vectors(cols, lim, n_cols, VEC: tl.constexpr):
    """The load mask of a causal prefix widened to whole VEC-element vectors (16 bytes): a mask
    that changes inside a vector makes Triton load element by element (sm_90, bf16 rows of
    1024: 16 scalar loads per thread instead of 2 vector loads; 0.85 of copy instead of 0.98
    for the plain row). At most VEC - 1 elements past the prefix are read, never past the
    row; the caller still applies the exact prefix to what it loaded. VEC 1 is the exact
    prefix `cols < lim`, the form triton-ascend's front end lowers to a bounded copy (its
    plans ask for it: tests/ascend_frontend)."""
    if VEC == 1:
        return cols < lim
    else:
        return ((cols // VEC) * VEC < lim) & (cols < n_cols)


@triton.jit
def prologue(x, live, m_ptrs, scale_hi, scale_lo, cap_hi, cap_lo,
             HAS_SCALE: tl.constexpr, HAS_CAP: tl.constexpr, MASK: tl.constexpr, ACC_FP64: tl.constexpr,
             PRECISE: tl.constexpr):
    """(z, keep) from loaded values `x` (-inf where not `live`: outside the row or past the
    causal prefix): scale, softcap, the mask; excluded positions become -inf. `keep` counts
    the row's kept columns for the empty-row epilogue. PRECISE: float32/64 outputs (`tanh`)."""
    z = x
    keep = live
    if HAS_SCALE:
        z = z * pair(scale_hi, scale_lo, ACC_FP64)
    if HAS_CAP:
        cap = pair(cap_hi, cap_lo, ACC_FP64)
        z = cap * tanh(z * (1.0 / cap), PRECISE, ACC_FP64)
    if MASK == 1:
        keep = kept_by_mask(m_ptrs, live)
    if MASK == 2:
        z = z + tl.load(m_ptrs, mask=live, other=0.0).to(z.dtype)
    if (HAS_SCALE or HAS_CAP) or MASK != 0:
        # (scale < 0 or a softcap would turn the -inf padding into something else)
        z = tl.where(keep, z, float("-inf"))
    return z, keep


@triton.jit
def finite_or_zero(m):
    """A row max of -inf (nothing but -inf seen yet) is replaced by 0 when subtracted, so
    exp(-inf - m) is 0 instead of exp(NaN)."""
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def exp_acc(z, ACC_FP64: tl.constexpr):
    """exp in the accumulation precision: exp2 with log2(e) folded in for float32."""
    if ACC_FP64:
        return tl.exp(z)
    else:
        return tl.exp2(z * 1.4426950408889634)


@triton.jit
def empty_fill(like, n_cols, LOG: tl.constexpr, EMPTY: tl.constexpr):
    """The value of an empty row's elements (core.variant): 0 / -inf, NaN, or 1/N / -log N."""
    one = tl.full(like.shape, 1.0, like.dtype)
    if EMPTY == 1:
        return one * float("nan")
    elif EMPTY == 2:
        if LOG:
            return -tl.log(one * n_cols)
        else:
            return one / n_cols
    else:
        if LOG:
            return one * float("-inf")
        else:
            return one * 0.0


@triton.jit
def empty_rows_of(m, live, m_ptrs, lim, AXIS: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """Which rows of a tile have no kept column. Causal alone: those whose kept prefix is
    empty (no reduction). With a bool mask the kept columns are counted, but only in a tile
    where some row's max is -inf (a row with a kept finite value is not empty), and from a
    second read of the mask there: holding the first read's keep flags across the row
    reductions took 7 more registers per thread (bf16 [8,16,1024,1024] tile on sm_90: 58 vs
    51), and a row of 16-bit values cannot afford a third reduction either."""
    if MASK == 1:
        empty = m < m  # all False (NaN included), the shape of a row statistic
        if tl.sum((m == float("-inf")).to(tl.int32), axis=0) > 0:
            keep = kept_by_mask(m_ptrs, live)
            empty = tl.sum(keep.to(tl.int32), axis=AXIS) == 0
        return empty
    else:
        return lim == 0


@triton.jit
def close_tile(z, live, m_ptrs, sink, n_cols, lim, AXIS: tl.constexpr, LOG: tl.constexpr, ACC_FP64: tl.constexpr,
               HAS_SINK: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, EMPTY: tl.constexpr):
    """Softmax (log_softmax) of a tile held on chip, reduced along AXIS (1: rows of the tile
    kernel, 0: columns of the column kernel), with the sink in the max and the denominator and
    the empty-row epilogue (a bool mask or causal; `lim`: the causal prefixes; `live`: the
    positions read and `m_ptrs` the bool mask's, read again only in a tile with an empty row).
    Returns (y, p_sink); p_sink is meaningless without HAS_SINK."""
    m_raw = tl.max(z, axis=AXIS)
    m = m_raw
    if HAS_SINK:
        m = finite_or_zero(tl.maximum(m, sink))
    zc = z - tl.expand_dims(m, AXIS)
    e = exp_acc(zc, ACC_FP64)
    total = tl.sum(e, axis=AXIS)
    p = total
    if HAS_SINK:
        es = exp_acc(sink - m, ACC_FP64)
        total = total + es
        p = es / total
    if LOG:
        y = zc - tl.expand_dims(tl.log(total), AXIS)
    else:
        y = e * tl.expand_dims(1.0 / total, AXIS)
    if MASK == 1 or CAUSAL:
        empty = empty_rows_of(m_raw, live, m_ptrs, lim, AXIS, MASK, CAUSAL)
        y = tl.where(tl.expand_dims(empty, AXIS), empty_fill(y, n_cols, LOG, EMPTY), y)
        p = tl.where(empty, 0.0, p)
    return y, p


@triton.jit
def merge_stats(ms, ss, valid, sink, HAS_SINK: tl.constexpr, ACC_FP64: tl.constexpr):
    """(max to subtract, denominator) of a row from its pieces' maxima `ms` and sums of
    exp(x - max) `ss` along axis 0 (one entry per piece: chunks of a split row, lanes of an
    online row; a second axis holds the column kernel's inner positions); `valid` masks
    padding. The sink joins here, where the statistics close."""
    m = tl.max(ms, axis=0)
    if HAS_SINK:
        m = tl.maximum(m, sink)
    m_sub = finite_or_zero(m)
    total = tl.sum(tl.where(valid, ss * exp_acc(ms - m_sub, ACC_FP64), 0.0), axis=0)
    if HAS_SINK:
        total = total + exp_acc(sink - m_sub, ACC_FP64)
    return m_sub, total


@triton.jit
def sink_share(sink, m_sub, total, empty, ACC_FP64: tl.constexpr):
    """The sink's share of a row, exp(s - m) / denominator (0 for an empty row)."""
    return tl.where(empty, 0.0, exp_acc(sink - m_sub, ACC_FP64) / total)


# ---- logsumexp from the row kernels (STATES_ONLY: `lse_rows.py`) ----
# Softmax subtracts finite_or_zero(max), so a row holding +inf becomes inf - inf = NaN, which
# is softmax's answer; logsumexp's is +inf (`core.pieces`). These helpers subtract 0 for a
# max of either infinity instead: exp(+inf - 0) = +inf then carries the row to +inf.


@triton.jit
def lse_sub(m):
    """The max subtracted before exp in a logsumexp: 0 where it is +-inf."""
    return tl.where((m == float("-inf")) | (m == float("inf")), 0.0, m)


@triton.jit
def lse_rescale(s, m_old, m_new, ACC_FP64: tl.constexpr):
    """s (a sum of exp(z - lse_sub(m_old))) re-based on m_new; 0 while nothing was summed
    (guards 0 * inf when the new max is far below 0), unless a NaN was (fmax may have hidden
    it from m, the sum keeps it)."""
    return tl.where((m_old == float("-inf")) & (s == s), 0.0, s * exp_acc(lse_sub(m_old) - lse_sub(m_new), ACC_FP64))


@triton.jit
def close_lse(m, s):
    """lse = lse_sub(m) + log(s) from the row max m and s = sum of exp(z - lse_sub(m)): -inf
    for a row with nothing kept (s = 0), NaN when s holds one, +inf for a +inf max (s is +inf
    then too, unless a NaN joined it)."""
    lse = lse_sub(m) + tl.log(s)
    return tl.where((m == float("inf")) & (s == s), float("inf"), lse)


@triton.jit
def tile_lse(z, sink, AXIS: tl.constexpr, HAS_SINK: tl.constexpr, ACC_FP64: tl.constexpr):
    """The logsumexp along AXIS of values held on chip (1: each row of a tile; 0: one row's
    chunk lses, a -inf chunk weighing 0), the sink joining the max and the sum: one exp per
    element, as the softmax tile's."""
    m = tl.max(z, axis=AXIS)
    if HAS_SINK:
        m = tl.maximum(m, sink)
    m_sub = lse_sub(m)
    s = tl.sum(exp_acc(z - tl.expand_dims(m_sub, AXIS), ACC_FP64), axis=AXIS)
    if HAS_SINK:
        s = s + exp_acc(sink - m_sub, ACC_FP64)  # (a NaN sink that max dropped joins here)
    return close_lse(m, s)


@triton.jit
def lanes_lse(m, s, sink, HAS_SINK: tl.constexpr, ACC_FP64: tl.constexpr):
    """The logsumexp of one row from per-lane running (max m, sum s of exp(z - lse_sub(m)))."""
    mx = tl.max(m, axis=0)
    if HAS_SINK:
        mx = tl.maximum(mx, sink)
    total = tl.sum(lse_rescale(s, m, mx, ACC_FP64), axis=0)
    if HAS_SINK:
        total = total + exp_acc(sink - lse_sub(mx), ACC_FP64)
    return close_lse(mx, total)


if type(close_lse).__name__ == "InterpretedFunction":  # (defined for Triton's CPU interpreter)
    from .interpreted_launch import patch_each_launch_once

    patch_each_launch_once()
