"""The fused family's steps (`core.variant`) as Triton helpers of every kernel kind: constexprs
decide which steps exist, their values are runtime arguments (a new temperature never recompiles).
HAS_SCALE / HAS_CAP: z = scale * x, then softcap * tanh(z / softcap), values as float32 (hi, lo)
pairs (~48 bits for fp64); HAS_ROW_SCALE: one scale per row (`row_scale`, at the sinks' offsets)
in place of hi. MASK: 0 none, 1 bool (uint8, nonzero = excluded), 2 additive. CAUSAL: keep column
j <= q + C_OFF, q = (row // Q_DIV) % SQ. HAS_SINK: one extra logit per row, its share written.
Rows with no kept column (bool mask, causal) get EMPTY's value (0 zero, 1 NaN, 2 uniform)."""

from __future__ import annotations

import triton
import triton.language as tl

from .interpreted_launch import interpreted, patch_each_launch_once


@triton.jit
def tanh(a, PRECISE: tl.constexpr, ACC_FP64: tl.constexpr):
    """tanh from one exponential: sign(a) * (1 - e) / (1 + e), e = exp(-2|a|). Near 0, 1 - e
    cancels (~2^-22 absolute), so PRECISE takes an odd Taylor polynomial for |a| < 0.3 (fp64:
    0.05). The fast (2-ulp) float32 division: the precise one made softcap instruction-bound."""
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
def row_scale(r_ptr, offsets, ok, acc_ty: tl.constexpr):
    """The row scales at `offsets` (where `ok`; 1 elsewhere) in the accumulation dtype."""
    return tl.load(r_ptr + offsets, mask=ok, other=1.0).to(acc_ty)


@triton.jit
def col_limit(rows, n_cols, SQ, Q_DIV, C_OFF, CAUSAL: tl.constexpr):
    """Columns a row reads: all, or the causal prefix clamp(q + C_OFF + 1, 0, n)."""
    if CAUSAL:
        # int32: a 64-bit compare per column costs twice the instructions.
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
    """A causal prefix's load mask widened to whole VEC-element vectors (a mask changing inside one
    loads element by element), never past the row; VEC 1: the exact prefix (triton-ascend's form)."""
    if VEC == 1:
        return cols < lim
    else:
        return ((cols // VEC) * VEC < lim) & (cols < n_cols)


@triton.jit
def prologue(x, live, m_ptrs, scale_hi, scale_lo, cap_hi, cap_lo,
             HAS_SCALE: tl.constexpr, HAS_CAP: tl.constexpr, MASK: tl.constexpr, ACC_FP64: tl.constexpr,
             PRECISE: tl.constexpr):
    """(z, keep) from `x` (-inf where not `live`): scale, softcap, mask, excluded positions -inf."""
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
    """A row max of -inf is subtracted as 0, so exp(-inf - m) is 0 instead of exp(NaN)."""
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def exp_f32(z):
    """exp of float32 as exp2 with log2(e) folded in: one MUFU.EX2 an element on NVIDIA, where
    `tl.exp` adds a range check and two multiplies for denormal results. Results below 2^-126
    are 0 instead of denormal; every other result has `tl.exp`'s bits."""
    return tl.exp2(z * 1.4426950408889634)


@triton.jit
def exp_acc(z, ACC_FP64: tl.constexpr):
    """exp in the accumulation precision (`exp_f32` for float32)."""
    if ACC_FP64:
        return tl.exp(z)
    else:
        return exp_f32(z)


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
    """Which rows of a tile have no kept column: an empty causal prefix, or with a bool mask a
    count from a second read of the mask, only in a tile where some row's max is -inf (holding
    the first read's flags costs registers; 16-bit rows cannot afford a third reduction)."""
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
    """(y, p_sink): softmax (log_softmax) of a tile on chip along AXIS (1: rows, 0: the column
    kernel's), the sink in the max and denominator, and the empty-row epilogue (`lim`: causal
    prefixes; `live`, `m_ptrs`: positions read, the bool mask's). p_sink only with HAS_SINK."""
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
    """(max to subtract, denominator) of a row from its pieces' maxima `ms` and sums `ss` along
    axis 0 (a split row's chunks, an online row's lanes); `valid` masks padding; the sink joins."""
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


# ---- logsumexp: softmax's row holding +inf is NaN, logsumexp's +inf: these subtract 0 for +-inf.


@triton.jit
def lse_sub(m):
    """The max subtracted before exp in a logsumexp: 0 where it is +-inf."""
    return tl.where((m == float("-inf")) | (m == float("inf")), 0.0, m)


@triton.jit
def lse_rescale(s, m_old, m_new, ACC_FP64: tl.constexpr):
    """s (a sum of exp(z - lse_sub(m_old))) re-based on m_new; 0 while nothing was summed
    (0 * inf), unless a NaN was (fmax may have hidden it from m)."""
    return tl.where((m_old == float("-inf")) & (s == s), 0.0, s * exp_acc(lse_sub(m_old) - lse_sub(m_new), ACC_FP64))


@triton.jit
def close_lse(m, s):
    """lse = lse_sub(m) + log(s): -inf for nothing kept, +inf for a +inf max, NaN kept."""
    lse = lse_sub(m) + tl.log(s)
    return tl.where((m == float("inf")) & (s == s), float("inf"), lse)


@triton.jit
def tile_lse(z, sink, AXIS: tl.constexpr, HAS_SINK: tl.constexpr, ACC_FP64: tl.constexpr):
    """logsumexp along AXIS of values on chip (1: a tile's rows, 0: chunk lses), sink joining."""
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


if interpreted(close_lse):
    patch_each_launch_once()
