"""The sampler's Triton kernels (`anysoftmax.sampling` on CUDA, HIP and Ascend NPUs): `scan_kernel` (each
chunk's statistics, candidates and race winner), `select_kernel` (each row's kept set and draw),
`scan_select_kernel` (both in one launch, for a few rows) and `probs_kernel` (`probs`' second
pass). Plans and launchers: `sampling.py`; the algorithm and its numerics: docs/sampling.md
("How the Triton sampler works").

Every masked load or store whose offsets are data-dependent (a scatter or gather) gives its
masked-off lanes an in-range offset too (`tl.where(mask, offset, 0)`): triton-ascend lowers such
an access to a discrete one that touches every lane's address, masked or not.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .fused import exp_f32

try:  # (CUDA's grid dependency control, Triton >= 3.4; triton-ascend's Triton has none: its plans never set PDL)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:
    gdc_launch_dependents = gdc_wait = None
DEPENDENT_LAUNCH = gdc_wait is not None  # (whether a plan may set `pdl`)

# Chunk state words (int32; floats stored as their bits), per (row, chunk).
NS = tl.constexpr(16)
F_MAX = tl.constexpr(0)  # chunk max of z
F_SUM = tl.constexpr(1)  # sum of exp(z - chunk max)
F_REST = tl.constexpr(2)  # the same sum over the finite z it did not write as candidates
F_THR = tl.constexpr(3)  # candidate threshold t (-inf: every finite z written)
F_BEST = tl.constexpr(4)  # plain race: best key
F_BEST_Z = tl.constexpr(5)  # plain race: z of the winner
I_WRITTEN = tl.constexpr(6)  # candidates written (<= C_SLOT)
I_TOTAL = tl.constexpr(7)  # finite z >= t (> C_SLOT: some ties at t not written)
I_ARGMAX = tl.constexpr(8)  # global index of the chunk's first max
I_TIES = tl.constexpr(9)  # z equal to the chunk's max (greedy rows; 0 on others)
I_BEST_ID = tl.constexpr(10)  # plain race: global index of the winner
I_BAD = tl.constexpr(11)  # a NaN or +inf z
I_FINITE = tl.constexpr(12)  # finite z

# Row result words (`res_off`): the kept set's key threshold, lse of the kept set, the id, the
# status, the path the select took (PATH_*: what the tests check every one of).
NR = tl.constexpr(8)
ST_DRAWN = tl.constexpr(0)
ST_GREEDY = tl.constexpr(1)
ST_INVALID = tl.constexpr(2)
ST_UNDECIDED = tl.constexpr(3)  # (a select without the logits: the row needs the general path)
PATH_NONE = tl.constexpr(0)  # greedy, invalid
PATH_RACE = tl.constexpr(1)  # no filter: the chunks' race winners
PATH_CANDIDATES = tl.constexpr(2)
PATH_GENERAL = tl.constexpr(3)

# Keyword flags (a per-call integer): bit 2i = keyword i comes from its tensor, bit 2i+1 = one
# value per row (else a 0-dim tensor); i = temperature, top_k, top_p, min_p, seed, offset.
FL_T = tl.constexpr(0)
FL_K = tl.constexpr(2)
FL_P = tl.constexpr(4)
FL_MP = tl.constexpr(6)
FL_SEED = tl.constexpr(8)
FL_OFF = tl.constexpr(10)

OP_SAMPLE = tl.constexpr(0)
OP_LOGPROBS = tl.constexpr(2)

KEY_NONE = tl.constexpr(-2147483648)  # a key threshold that keeps every finite z
KEY_NEG_INF = tl.constexpr(-2139095041)  # key(-inf): below every finite z's key
BIG_ID = tl.constexpr(2147483647)
NEG_INF_BITS = tl.constexpr(-8388608)  # 0xff800000
TWO_POW_M32 = tl.constexpr(2.3283064365386963e-10)
U_MAX = tl.constexpr(0.99999994039535522)  # 1 - 2**-24: rng.py's clamp of float32 u


# ---- small helpers ------------------------------------------------------------------------------

@triton.jit
def _key(z):
    """The order-preserving int32 key of float32 z: key(a) < key(b) iff a < b (-0.0 as +0.0)."""
    bits = z.to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return tl.where(z == 0.0, 0, key)


@triton.jit
def _ldf(ptr, mask):
    return tl.load(ptr, mask=mask, other=NEG_INF_BITS, cache_modifier=".cg").to(tl.float32, bitcast=True)


@triton.jit
def _ldi(ptr, mask):
    return tl.load(ptr, mask=mask, other=0, cache_modifier=".cg")


@triton.jit
def _stf(ptr, value):
    tl.store(ptr, value.to(tl.float32).to(tl.int32, bitcast=True))


@triton.jit
def _sum2(x):
    return tl.sum(tl.sum(x, 1), 0)


@triton.jit
def _min2(x):
    return tl.min(tl.min(x, 1), 0)


@triton.jit
def _count2(mask):
    return tl.sum(tl.sum(mask.to(tl.int32), 1), 0)


@triton.jit
def _reciprocal(t):
    """1 / t correctly rounded (z = x * (1/t) is then within an ulp or so of x / t), on a block
    of two that no canonicalisation folds back to a scalar: triton-ascend 3.2's linalg conversion
    aborts on a scalar precise division."""
    return tl.max(tl.math.div_rn(tl.full([2], 1.0, tl.float32), tl.arange(0, 2) * 0.0 + t), 0)


@triton.jit
def _keywords(row, vocab_total, t_ptr, k_ptr, p_ptr, mp_ptr, top_k, flags, temperature, top_p, min_p):
    """(inv_t, greedy, k, p, mp, bad) of `row`: 1 / temperature (1 on greedy rows), temperature
    0, the top-k bound in effect (0: off), top_p, min_p, and whether a per-row value is out of
    range (only possible for accelerator tensors, whose values the host does not read)."""
    t = temperature
    if ((flags >> FL_T) & 1) != 0:
        t = tl.load(t_ptr + row * ((flags >> (FL_T + 1)) & 1))
    k = top_k.to(tl.int64)
    if ((flags >> FL_K) & 1) != 0:
        k = tl.load(k_ptr + row * ((flags >> (FL_K + 1)) & 1))
    p = top_p
    if ((flags >> FL_P) & 1) != 0:
        p = tl.load(p_ptr + row * ((flags >> (FL_P + 1)) & 1))
    mp = min_p
    if ((flags >> FL_MP) & 1) != 0:
        mp = tl.load(mp_ptr + row * ((flags >> (FL_MP + 1)) & 1))
    ok = (t >= 0.0) & (t < float("inf")) & (k >= 0) & (p > 0.0) & (p <= 1.0) & (mp >= 0.0) & (mp <= 1.0)
    greedy = t == 0.0
    inv_t = tl.where(greedy | (ok == 0), 1.0, _reciprocal(tl.where(t > 0.0, t, 1.0)))
    k_on = tl.where((k > 0) & (k < vocab_total), k, 0).to(tl.int32)
    return inv_t, greedy, k_on, p, mp, ok == 0


@triton.jit
def _temperature(row, t_ptr, flags, temperature):
    """(inv_t, greedy, bad) of `row`: `_keywords` for the temperature alone."""
    t = temperature
    if ((flags >> FL_T) & 1) != 0:
        t = tl.load(t_ptr + row * ((flags >> (FL_T + 1)) & 1))
    ok = (t >= 0.0) & (t < float("inf"))
    greedy = t == 0.0
    inv_t = tl.where(greedy | (ok == 0), 1.0, _reciprocal(tl.where(t > 0.0, t, 1.0)))
    return inv_t, greedy, ok == 0


@triton.jit
def _row_words(row, seed_ptr, off_ptr, seed_lo, seed_hi, off_lo, off_hi, flags):
    """(seed as int64, stream, offset low word, offset high word) of `row` (rng.py)."""
    seed = (seed_hi.to(tl.int64) << 32) | (seed_lo.to(tl.int64) & 0xFFFFFFFF)
    per_row_seed = ((flags >> (FL_SEED + 1)) & 1) != 0
    if ((flags >> FL_SEED) & 1) != 0:
        seed = tl.load(seed_ptr + row * ((flags >> (FL_SEED + 1)) & 1))
    lo = off_lo
    hi = off_hi
    if ((flags >> FL_OFF) & 1) != 0:
        off = tl.load(off_ptr + row * ((flags >> (FL_OFF + 1)) & 1))
        lo = (off & 0xFFFFFFFF).to(tl.int32)
        hi = ((off >> 32) & 0xFFFFFFFF).to(tl.int32)
    stream = tl.where(per_row_seed, 0, row)
    return seed, stream, lo, hi


@triton.jit
def _exponential(r):
    """rng.py's E = -log1p(-u), u = min((float32(r) + 1/2) * 2**-32, 1 - 2**-24), for uint32 r.
    Below u = 1/4 from 2 atanh(u / (2 - u)) (a short odd series: the race's winners have tiny E,
    which -log(1 - u) would lose to the rounding of 1 - u); above, -log(1 - u), where log's
    argument is at most 3/4 (|log| >= 0.28: its absolute error is a small relative one)."""
    u = tl.minimum((r.to(tl.float32) + 0.5) * TWO_POW_M32, U_MAX)
    s = u / (2.0 - u)
    s2 = s * s
    series = 2.0 * s * (1.0 + s2 * (0.3333333333333333 + s2 * (0.2 + s2 * (0.14285714285714285
                                                                           + s2 * 0.1111111111111111))))
    return tl.where(u <= 0.25, series, -tl.log(1.0 - u))


@triton.jit
def _philox_blocks(blocks, seed, stream, off_lo, off_hi):
    """The four uint32 words of Philox4x32-10 for counters (blocks, stream, off_lo, off_hi),
    keyed by the seed: the bits of global ids 4 * blocks + 0..3 (rng.py)."""
    c0 = blocks.to(tl.uint32, bitcast=True)
    zero = c0 * 0
    return tl.philox(seed, c0, zero + stream.to(tl.uint32, bitcast=True), zero + off_lo.to(tl.uint32, bitcast=True),
                     zero + off_hi.to(tl.uint32, bitcast=True))


@triton.jit
def _pick_word(word, r0, r1, r2, r3):
    """Word `word` (0..3) of Philox blocks' outputs, elementwise (broadcast together)."""
    return tl.where(word == 0, r0, tl.where(word == 1, r1, tl.where(word == 2, r2, r3)))


@triton.jit
def _keys_of_bits(z, r):
    """The race keys z - log E of tokens with bits r, -inf where z is -inf."""
    return tl.where(z > float("-inf"), z - tl.log(_exponential(r)), float("-inf"))


@triton.jit
def _race_keys(z, ids, seed, stream, off_lo, off_hi):
    """The race keys of tokens with scattered global indices `ids` (int32, >= 0): one Philox
    per token, its word ids & 3 (candidates and kept sets are few; `_race_run` serves a run
    of ids with one per four)."""
    r0, r1, r2, r3 = _philox_blocks(ids >> 2, seed, stream, off_lo, off_hi)
    return _keys_of_bits(z, _pick_word(ids & 3, r0, r1, r2, r3))


@triton.jit
def _race_step(best, best_id, best_z, keys, ids, z, ok):
    """The race's running winner (key, id, z) after a tile of `keys` of tokens `ids` (lanes
    where `ok`): the largest key, the lowest id among equal keys."""
    tb = tl.max(keys)
    ti = tl.min(tl.where((keys == tb) & ok, ids, BIG_ID))
    tz = tl.max(tl.where((ids == ti) & ok, z, float("-inf")))
    better = (tb > best) | ((tb == best) & (ti < best_id))
    return tl.where(better, tb, best), tl.where(better, ti, best_id), tl.where(better, tz, best_z)


# ---- pass 1: one chunk ----------------------------------------------------------------------------

@triton.jit
def _chunk_threshold(z, n_fin, m_c, need, CAP: tl.constexpr):
    """(t, total): a threshold with total = count(z >= t, finite) >= min(need, n_fin), and
    <= CAP unless ties at one value forbid it (then total > CAP and every z > t numbers fewer
    than `need`). t = -inf when every finite z fits. Bisection on the values held in
    registers (`_narrow`, z as a 2-D block): each step is one compare-and-count over the chunk."""
    need = tl.minimum(need, n_fin)
    t = tl.full((), float("-inf"), tl.float32)
    total = n_fin
    if n_fin > CAP:
        fin = z > float("-inf")
        t, total = _narrow(z, fin, need, tl.min(tl.where(fin, z, float("inf"))), m_c, CAP)
    return t, total


@triton.jit
def _group_bound(z, need, CHUNK: tl.constexpr, NG: tl.constexpr):
    """A lower bound of the chunk's `need`-th largest z (need <= NG), z held as [NG runs, run
    length]: the need-th largest of the runs' maxima (need runs hold a z at least that large);
    the need-th largest of NG values by an outer comparison (rank = how many are strictly
    larger), not by a search over the chunk."""
    gm = tl.max(z, 1)
    rank = tl.sum((gm[None, :] > gm[:, None]).to(tl.int32), 1)
    return tl.min(tl.where(rank < need, gm, float("inf")))


@triton.jit
def _candidate_threshold(z, n_fin, m_c, need, CAP: tl.constexpr, CHUNK: tl.constexpr, NG: tl.constexpr):
    """`_chunk_threshold`'s (t, total), first from `_group_bound` (a few operations per
    element); the bisection only when the bound lets more than CAP values through (ties, or
    the chunk's largest values crowded into few groups)."""
    need = tl.minimum(need, n_fin)
    t = tl.full((), float("-inf"), tl.float32)
    total = n_fin
    if n_fin > CAP:
        bound = tl.full((), float("-inf"), tl.float32)
        if need <= NG // 2:
            bound = _group_bound(z, need, CHUNK, NG)
        c = tl.sum(((z >= bound) & (z > float("-inf"))).to(tl.int32))
        if (bound > float("-inf")) & (c <= CAP):
            t = bound
            total = c
        else:
            t, total = _chunk_threshold(z, n_fin, m_c, need, CAP)
    return t, total


@triton.jit
def _write_candidates(z, cols, x_row, lo, vocab, vocab_start, inv_t, t, total, cz_ptr, ci_ptr, CAP: tl.constexpr,
                      CHUNK: tl.constexpr, SUB: tl.constexpr):
    """Write (z, global index) of the chunk's finite z >= t (in index order); past CAP, the
    z > t first, then the lowest-index ties at t. Returns how many were written. The usual
    case (at most CAP) scatters straight from the chunk's registers (`z`, `cols`: [runs,
    run length], row-major): each element's position is its run's offset (a scan over the
    runs' counts) plus its rank within the run (a scan inside a thread's registers), cheaper
    than one scan over the whole chunk (NVIDIA H200: the scan kernel 602 -> 434 us at 512 rows
    of 128256 bf16 logits). Past CAP, SUB elements at a time, re-read from L1/L2 and scaled
    as the chunk was (the same z bit for bit), in two ordered sweeps."""
    n = total * 0
    if total <= CAP:
        sel = ((z > float("-inf")) & (z >= t)).to(tl.int32)
        per = tl.sum(sel, 1)
        pos = tl.where(sel != 0, (tl.cumsum(per, 0) - per)[:, None] + tl.cumsum(sel, 1) - 1, 0)
        tl.store(cz_ptr + pos, z.to(tl.int32, bitcast=True), mask=sel != 0)
        tl.store(ci_ptr + pos, vocab_start + cols, mask=sel != 0)
        n = total
    else:
        for s0 in range(0, CHUNK, SUB):
            sc = lo + s0 + tl.arange(0, SUB)
            zs = tl.load(x_row + sc, mask=sc < vocab, other=float("-inf")).to(tl.float32) * inv_t
            sel = (zs > float("-inf")) & (zs > t)
            pos = tl.where(sel, n + tl.cumsum(sel.to(tl.int32), 0) - 1, 0)
            tl.store(cz_ptr + pos, zs.to(tl.int32, bitcast=True), mask=sel)
            tl.store(ci_ptr + pos, vocab_start + sc, mask=sel)
            n += tl.sum(sel.to(tl.int32))
        for s0 in range(0, CHUNK, SUB):
            sc = lo + s0 + tl.arange(0, SUB)
            zs = tl.load(x_row + sc, mask=sc < vocab, other=float("-inf")).to(tl.float32) * inv_t
            tie = zs == t
            pos = n + tl.cumsum(tie.to(tl.int32), 0) - 1
            sel = tie & (pos < CAP)
            pos = tl.where(sel, pos, 0)
            tl.store(cz_ptr + pos, zs.to(tl.int32, bitcast=True), mask=sel)
            tl.store(ci_ptr + pos, vocab_start + sc, mask=sel)
            n += tl.sum(tie.to(tl.int32))
        n = n * 0 + CAP
    return n


@triton.jit
def _race_run(x_row, first, lo, hi, vocab_start, inv_t, seed, stream, off_lo, off_hi, bk, bi, bz,
              SUB: tl.constexpr):
    """The lanes' running race winners (`bk`, `bi`, `bz`: key, global id, z per lane of a
    [SUB / 4, 4] tile) after the SUB tokens from local column `first` (vocab_start + first a
    multiple of 4), those in [lo, hi) taking part: a row per Philox block, one call per row,
    its four words broadcast along the row (a thread's row, when the load gives it four
    consecutive tokens), word j at column j. Elementwise: no reduction per tile."""
    blocks = tl.arange(0, SUB // 4)
    word = tl.arange(0, 4)[None, :]
    cols = first + 4 * blocks[:, None] + word
    ok = (cols >= lo) & (cols < hi)
    z = tl.load(x_row + cols, mask=ok, other=float("-inf")).to(tl.float32) * inv_t
    r0, r1, r2, r3 = _philox_blocks(((vocab_start + first) >> 2) + blocks, seed, stream, off_lo, off_hi)
    keys = tl.where(ok, _keys_of_bits(z, _pick_word(word, r0[:, None], r1[:, None], r2[:, None], r3[:, None])),
                    float("-inf"))
    ids = vocab_start + cols
    # (a lane sees its tokens in increasing id: strictly larger keys win, so equal keys keep the lower id)
    better = keys > bk
    return tl.where(better, keys, bk), tl.where(better, ids, bi), tl.where(better, z, bz)


@triton.jit
def _chunk_race(x_row, lo, vocab, vocab_start, inv_t, seed, stream, off_lo, off_hi, CHUNK: tl.constexpr,
                SUB: tl.constexpr):
    """The race over the chunk's tokens (a plain draw): (best key, its global id, its z), the
    lowest id among equal keys. A tile at a time, re-read (from L2: the chunk was just
    loaded), so the generator's state for a few tokens per thread is live, not for the chunk;
    each lane keeps its own winner and one reduction at the end picks the chunk's (a
    reduction per tile made the race latency-bound: NVIDIA H200, 512 rows of 128256 tokens).
    Tiles start at global ids that are multiples of 4 (one Philox per four tokens): on a
    shard whose vocab_start is not one, up to 3 tokens before the chunk (masked off), and one
    more tile takes the chunk's last tokens; those tiles' loads are not aligned (a shard
    size that is a multiple of 4 avoids them)."""
    # Tiles of 2 SUB tokens: SUB / 2 blocks, one per thread at the widest plan (SUB = 1024
    # tokens, 16 warps); SUB / 4 blocks would leave half the threads computing the other
    # half's Philox again (a layout gives every thread at least one element).
    RACE_SUB: tl.constexpr = CHUNK if CHUNK < 2 * SUB else 2 * SUB
    bk = tl.full((RACE_SUB // 4, 4), float("-inf"), tl.float32)
    bi = tl.full((RACE_SUB // 4, 4), BIG_ID, tl.int32)
    bz = tl.full((RACE_SUB // 4, 4), float("-inf"), tl.float32)
    skew = (vocab_start + lo) & 3
    if skew == 0:  # (bounds the compiler knows aligned: vector loads)
        for s0 in range(0, CHUNK, RACE_SUB):
            bk, bi, bz = _race_run(x_row, lo + s0, 0, vocab, vocab_start, inv_t, seed, stream, off_lo, off_hi,
                                   bk, bi, bz, RACE_SUB)
    else:
        hi = tl.minimum(lo + CHUNK, vocab)
        for s0 in range(0, CHUNK + RACE_SUB, RACE_SUB):
            bk, bi, bz = _race_run(x_row, lo - skew + s0, lo, hi, vocab_start, inv_t, seed, stream, off_lo, off_hi,
                                   bk, bi, bz, RACE_SUB)
    return _race_step(tl.full((), float("-inf"), tl.float32), tl.full((), BIG_ID, tl.int32),
                      tl.full((), float("-inf"), tl.float32), bk, bi, bz, bk > float("-inf"))


@triton.jit
def _scan_chunk(x_ptr, ws_ptr, row, c, inv_t, greedy, k_on, p, mp, kw_bad, seed, stream, off_lo, off_hi,
                vocab, xs, vocab_start, n_chunks, state_off, cz_off, ci_off, top_n,
                OP: tl.constexpr, CHUNK: tl.constexpr, C_SLOT: tl.constexpr, SUB: tl.constexpr):
    """Pass 1 on chunk `c` of `row`: its state words and candidates (see the module), all from
    the chunk's z held in registers: the candidates' scatter, the greedy argmax and the plain
    race read nothing again (NVIDIA H200: re-reading the chunk in tiles from L2 cost 20-27 %
    of the scan, each tile's load a dependent round trip)."""
    # The chunk as [NG runs, run length] (row-major): the runs' maxima bound the candidates'
    # threshold and their counts place the candidates, with no reshape of the block.
    NG: tl.constexpr = CHUNK if CHUNK < 128 else 128
    x_row = x_ptr + row.to(tl.int64) * xs
    lo = c * CHUNK
    cols = lo + (tl.arange(0, NG)[:, None] * (CHUNK // NG) + tl.arange(0, CHUNK // NG)[None, :])
    z = tl.load(x_row + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32) * inv_t
    m_c = tl.max(z)  # (a bad row's statistics are never used)
    m_sub = tl.where(m_c > float("-inf"), tl.where(m_c < float("inf"), m_c, 0.0), 0.0)
    s_c = tl.sum(exp_f32(z - m_sub))
    # A NaN z makes the sum NaN (whether the max kept it, as the interpreter's does, or skipped
    # it, as a GPU's max does); a +inf z makes the max +inf: no test of each z for either.
    bad = ((s_c != s_c) | (m_c == float("inf"))).to(tl.int32)
    n_fin = tl.sum((z > float("-inf")).to(tl.int32))
    item = row.to(tl.int64) * n_chunks + c
    st = ws_ptr + state_off + item * NS
    _stf(st + F_MAX, m_c)
    _stf(st + F_SUM, s_c)
    ties = n_fin * 0
    if greedy & (m_c > float("-inf")):  # (only a greedy row's log-probabilities use the ties)
        ties = tl.sum((z == m_c).to(tl.int32))
    tl.store(st + I_TIES, ties)
    tl.store(st + I_BAD, bad)
    tl.store(st + I_FINITE, n_fin)
    if OP != OP_LOGPROBS:
        if greedy:
            tl.store(st + I_ARGMAX, tl.min(tl.where(z == m_c, vocab_start + cols, BIG_ID)))
    # The row's mode: how many candidates it needs (0: none).
    filtered = (k_on > 0) | (p < 1.0) | (mp > 0.0)
    if OP == OP_LOGPROBS:
        need = top_n
    else:
        need = tl.where(greedy | (kw_bad != 0) | (bad != 0), 0,
                        tl.where((k_on > 0) & (k_on <= C_SLOT // 2), k_on, tl.where(filtered, C_SLOT // 2, 0)))
    t = tl.full((), float("-inf"), tl.float32)
    total = n_fin * 0
    written = n_fin * 0
    rest = tl.full((), 0.0, tl.float32)
    if need > 0:
        t, total = _candidate_threshold(z, n_fin, m_c, need, C_SLOT, CHUNK, NG)
        if OP != OP_LOGPROBS:
            if k_on == 0:  # (the select's check that top-p / min-p decide)
                rest = tl.sum(tl.where((z > float("-inf")) & (z < t), exp_f32(z - m_sub), 0.0))
        written = _write_candidates(z, cols, x_row, lo, vocab, vocab_start, inv_t, t, total,
                                    ws_ptr + cz_off + item * C_SLOT, ws_ptr + ci_off + item * C_SLOT, C_SLOT, CHUNK, SUB)
    _stf(st + F_REST, rest)
    _stf(st + F_THR, t)
    tl.store(st + I_WRITTEN, written)
    tl.store(st + I_TOTAL, total)
    if OP == OP_SAMPLE:
        if (need == 0) & (greedy == 0) & (filtered == 0) & (kw_bad == 0) & (bad == 0):
            best, best_id, best_z = _chunk_race(x_row, lo, vocab, vocab_start, inv_t, seed, stream, off_lo, off_hi,
                                                CHUNK, SUB)
            _stf(st + F_BEST, best)
            _stf(st + F_BEST_Z, best_z)
            tl.store(st + I_BEST_ID, best_id)


# ---- the runs pre-pass: a row's top-k candidates from its runs' maxima -------------------------------
#
# Two launches that replace the scan's per-chunk threshold search for top-k rows (and `logprobs`'
# top-n): `runs_kernel` streams the row once and keeps, per run of RUN elements, the max of z, the
# sum of exp(z - that max) and the finite count (reductions inside a warp, none across the
# program: it runs at the speed of a read); `collect_kernel`, one row a program, finds from the
# runs' maxima a threshold t0 <= the row's need-th largest z, re-reads the few runs whose max
# reaches t0, and writes every chunk's state and candidates exactly as the scan would with t0 as
# the threshold of every chunk. Rows it cannot serve (greedy, a NaN or +inf, too many runs or a
# chunk's candidates past its slots) are left to the scan, which skips the rows it served.

RUN_CAP = tl.constexpr(128)  # runs `collect_kernel` re-reads at most (RUN_CAP x RUN elements)


@triton.jit
def _after_previous_launch(PDL: tl.constexpr):
    """With PDL (a launch with programmatic dependent launch, CUDA sm_90+): wait until the launch
    before this one on the stream has finished and its writes are visible, before any load, then
    let the next launch's programs start (they wait here in turn). A program of the next launch
    is placed only once every program of this one has started, so the wait never holds a
    multiprocessor that a program it waits for still needs."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _runs_block(x_ptr, ws_ptr, t_ptr, k_ptr, p_ptr, mp_ptr, row, b, vocab, xs, vocab_total, n_chunks, run_off, top_k,
                flags, temperature, top_p, min_p, CHUNK: tl.constexpr, BLOCK: tl.constexpr, RUN: tl.constexpr):
    """Block `b` of `row` (BLOCK elements): each of its runs' max z, sum and finite count."""
    R: tl.constexpr = BLOCK // RUN
    inv_t, _, _, _, _, _ = _keywords(row, vocab_total, t_ptr, k_ptr, p_ptr, mp_ptr, top_k, flags, temperature,
                                     top_p, min_p)
    cols = b * BLOCK + tl.arange(0, R)[:, None] * RUN + tl.arange(0, RUN)[None, :]
    z = tl.load(x_ptr + row.to(tl.int64) * xs + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32) * inv_t
    mr = tl.max(z, 1)
    m_sub = tl.where(mr > float("-inf"), tl.where(mr < float("inf"), mr, 0.0), 0.0)
    sr = tl.sum(exp_f32(z - m_sub[:, None]), 1)
    fr = tl.sum((z > float("-inf")).to(tl.int32), 1)
    n_run = n_chunks * (CHUNK // RUN)
    tab = ws_ptr + run_off + row.to(tl.int64) * (3 * n_run + RUN_CAP) + b * R + tl.arange(0, R)
    tl.store(tab, mr.to(tl.int32, bitcast=True))
    tl.store(tab + n_run, sr.to(tl.int32, bitcast=True))
    tl.store(tab + 2 * n_run, fr)


@triton.jit(do_not_specialize=["top_k", "seed_lo", "seed_hi", "off_lo", "off_hi", "flags"])
def runs_kernel(
    x_ptr, ws_ptr, count_ptr, t_ptr, k_ptr, p_ptr, mp_ptr,
    n_rows, vocab, xs, vocab_total, n_chunks, run_off, left_off, served_off,
    top_k, seed_lo, seed_hi, off_lo, off_hi, flags,
    temperature, top_p, min_p,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, RUN: tl.constexpr, PDL: tl.constexpr, OVERLAP: tl.constexpr,
):
    """Per run of RUN elements of each row: (max z, sum of exp(z - max z), finite count), BLOCK
    elements a program (grid: rows x chunks x CHUNK / BLOCK). OVERLAP: persistent over the
    blocks, row-major, each row's stored blocks counted at `count_ptr` (`collect_kernel` with
    OVERLAP reads a row as soon as its count is full, while this launch goes on)."""
    per_row = n_chunks * (CHUNK // BLOCK)
    if OVERLAP:
        if PDL:
            gdc_wait()
        if tl.program_id(0) == 0:
            # The collect's row lists start empty: zeroed before this program's first block (row
            # 0), whose count's release publishes them (the collect acquires row 0 first).
            tl.store(ws_ptr + left_off, 0)
            tl.store(ws_ptr + served_off, 0)
        if PDL:
            gdc_launch_dependents()  # (the collect's programs may start: every program here has)
        for blk in tl.range(tl.program_id(0), n_rows * per_row, tl.num_programs(0)):
            row = tl.cast(blk // per_row, tl.int32)
            _runs_block(x_ptr, ws_ptr, t_ptr, k_ptr, p_ptr, mp_ptr, row, blk % per_row, vocab, xs, vocab_total,
                        n_chunks, run_off, top_k, flags, temperature, top_p, min_p, CHUNK, BLOCK, RUN)
            # Every thread's stores of the block precede the count (bar.sync), which releases them.
            tl.debug_barrier()
            tl.atomic_add(count_ptr + row, 1, sem="release", scope="gpu")
    else:
        _after_previous_launch(PDL)
        row = tl.program_id(0) // per_row
        _runs_block(x_ptr, ws_ptr, t_ptr, k_ptr, p_ptr, mp_ptr, row, tl.program_id(0) % per_row, vocab, xs,
                    vocab_total, n_chunks, run_off, top_k, flags, temperature, top_p, min_p, CHUNK, BLOCK, RUN)
        if tl.program_id(0) == 0:  # (the collect that follows counts the rows it lists here)
            tl.store(ws_ptr + left_off, 0)
            tl.store(ws_ptr + served_off, 0)


@triton.jit
def _wait_for_row(count_ptr, row, row_blocks, PDL: tl.constexpr, SPINS: tl.constexpr):
    """Until every runs block of `row` is stored: its count at `count_ptr` reaches `row_blocks`
    (acquired, then a bar.sync: every thread's reads follow); after SPINS reads of it, until the
    runs launch has finished (PDL's wait: its programs wait for nothing, so neither wait can hang)."""
    seen = tl.atomic_add(count_ptr + row, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < row_blocks) & (spins < SPINS):
        seen = tl.atomic_add(count_ptr + row, 0, sem="acquire", scope="gpu")
        spins += 1
    if PDL:
        if seen < row_blocks:
            gdc_wait()
    tl.debug_barrier()


@triton.jit
def _served_states(st, m, s, t0, written, n_fin, mask):
    """The state words of a chunk the collect served (`st`: their address, or a block of them):
    max `m`, sum `s`, threshold `t0`, every finite z >= t0 `written`, no rest (a top-k row's
    select reads none), ties or bad values."""
    zero = written * 0
    tl.store(st + F_MAX, (zero.to(tl.float32) + m).to(tl.int32, bitcast=True), mask=mask)
    tl.store(st + F_SUM, (zero.to(tl.float32) + s).to(tl.int32, bitcast=True), mask=mask)
    tl.store(st + F_REST, zero, mask=mask)  # (the bits of +0.0)
    tl.store(st + F_THR, (zero.to(tl.float32) + t0).to(tl.int32, bitcast=True), mask=mask)
    tl.store(st + I_WRITTEN, written, mask=mask)
    tl.store(st + I_TOTAL, written, mask=mask)
    tl.store(st + I_TIES, zero, mask=mask)
    tl.store(st + I_BAD, zero, mask=mask)
    tl.store(st + I_FINITE, n_fin, mask=mask)


@triton.jit
def _collect_row(x_row, ws_ptr, row, inv_t, need, vocab, vocab_start, n_chunks, state_off, cz_off, ci_off, run_off,
                 CHUNK: tl.constexpr, C_SLOT: tl.constexpr, G_P2: tl.constexpr, RUN: tl.constexpr,
                 COMPACT: tl.constexpr):
    """`collect_kernel` on one row: 1 when it wrote the row's chunk states and candidates (COMPACT:
    the row as one chunk of C_SLOT slots, its state the row's)."""
    RPC: tl.constexpr = CHUNK // RUN
    n_run = n_chunks * RPC
    g = tl.arange(0, G_P2)
    okg = g < n_chunks
    idx = tl.where(okg, g, 0)[:, None] * RPC + tl.arange(0, RPC)[None, :]
    okr = okg[:, None] & (idx >= 0)
    tab = ws_ptr + run_off + row.to(tl.int64) * (3 * n_run + RUN_CAP)
    mr = tl.load(tab + idx, mask=okr, other=NEG_INF_BITS, cache_modifier=".cg").to(tl.float32, bitcast=True)
    sr = tl.load(tab + n_run + idx, mask=okr, other=0, cache_modifier=".cg").to(tl.float32, bitcast=True)
    fr = tl.load(tab + 2 * n_run + idx, mask=okr, other=0, cache_modifier=".cg")
    m_c = tl.max(mr, 1)
    m_sub = tl.where(m_c > float("-inf"), tl.where(m_c < float("inf"), m_c, 0.0), 0.0)
    # (a run's sum is relative to its own max: rescaled to the chunk's; NaN stays NaN)
    s_c = tl.sum(sr * exp_f32(mr - m_sub[:, None]), 1)
    bad_c = (s_c != s_c) | (m_c == float("inf"))
    n_fin_c = tl.sum(fr, 1)
    n_fin = tl.sum(n_fin_c)
    served = n_fin * 0
    if (tl.max(bad_c.to(tl.int32)) == 0) & (n_fin > 0):
        need = tl.minimum(need, n_fin)
        # t0: the need-th largest of RPC group maxima (group j: run j of every chunk), so that at
        # least `need` runs, hence `need` z, reach it; the runs whose max reaches t0 hold every z >= t0.
        # (by rank: the least group max with fewer than `need` larger ones, as a descending sort's
        # need-th value; one outer comparison instead of the sort's chain of exchange stages)
        gm = tl.max(mr, 0)
        above = tl.sum((gm[None, :] > gm[:, None]).to(tl.int32), 1)
        t0 = tl.min(tl.where(above < need, gm, float("inf")))
        cand = (mr >= t0) & (mr > float("-inf"))
        n_cand = _count2(cand)
        if n_cand <= RUN_CAP:
            per = tl.sum(cand.to(tl.int32), 1)
            at = (tl.cumsum(per, 0) - per)[:, None] + tl.cumsum(cand.to(tl.int32), 1) - 1
            scr = tab + 3 * n_run
            tl.debug_barrier()
            tl.store(scr + tl.where(cand, at, 0), idx, mask=cand)
            tl.debug_barrier()  # (every thread's stores visible to the reads that follow)
            q = tl.arange(0, RUN_CAP)
            live = q < n_cand
            run = tl.load(scr + q, mask=live, other=0, cache_modifier=".cg")
            cols = run[:, None] * RUN + tl.arange(0, RUN)[None, :]
            in_row = live[:, None] & (cols < vocab)
            z = tl.load(x_row + tl.where(in_row, cols, 0), mask=in_row, other=float("-inf")).to(tl.float32) * inv_t
            sel = live[:, None] & (z >= t0) & (z > float("-inf"))
            cnt = tl.sum(sel.to(tl.int32), 1)
            ch = run // RPC
            tot = tl.sum(tl.where(ch[None, :] == g[:, None], cnt[None, :], 0), 1)
            total = tl.sum(tot)
            if COMPACT:
                if total <= C_SLOT:
                    pos = (tl.cumsum(cnt, 0) - cnt)[:, None] + tl.cumsum(sel.to(tl.int32), 1) - 1
                    dst = row.to(tl.int64) * C_SLOT + tl.where(sel, pos, 0)
                    tl.store(ws_ptr + cz_off + dst, z.to(tl.int32, bitcast=True), mask=sel)
                    tl.store(ws_ptr + ci_off + dst, vocab_start + cols, mask=sel)
                    # (the row's max and mass as `_row_merge` makes them of chunk states)
                    m = tl.max(m_c)
                    m_row = tl.where((m > float("-inf")) & (m < float("inf")), m, 0.0)
                    mass = tl.sum(tl.where(m_c > float("-inf"), s_c * exp_f32(m_c - m_row), 0.0))
                    _served_states(ws_ptr + state_off + row.to(tl.int64) * NS, m, mass, t0, total, n_fin, True)
                    served = served * 0 + 1
            elif tl.max(tot) <= C_SLOT:
                # each candidate's slot: its rank among its chunk's candidates (runs in index order)
                first = tl.cumsum(tot, 0) - tot
                earlier = tl.sum(tl.where(ch[:, None] == g[None, :], first[None, :], 0), 1)
                pos = (tl.cumsum(cnt, 0) - cnt - earlier)[:, None] + tl.cumsum(sel.to(tl.int32), 1) - 1
                dst = tl.where(sel, (row.to(tl.int64) * n_chunks + ch)[:, None] * C_SLOT + pos, 0)
                tl.store(ws_ptr + cz_off + dst, z.to(tl.int32, bitcast=True), mask=sel)
                tl.store(ws_ptr + ci_off + dst, vocab_start + cols, mask=sel)
                _served_states(ws_ptr + state_off + (row.to(tl.int64) * n_chunks + tl.where(okg, g, 0)) * NS, m_c, s_c,
                               t0, tot, n_fin_c, okg)
                served = served * 0 + 1
    return served


@triton.jit(do_not_specialize=["top_k", "seed_lo", "seed_hi", "off_lo", "off_hi", "flags"])
def collect_kernel(
    x_ptr, ws_ptr, count_ptr, t_ptr, k_ptr, p_ptr, mp_ptr,
    n_rows, vocab, xs, vocab_start, vocab_total, n_chunks, state_off, cz_off, ci_off, run_off, left_off,
    served_off, top_n, row_blocks,
    top_k, seed_lo, seed_hi, off_lo, off_hi, flags,
    temperature, top_p, min_p,
    OP: tl.constexpr, CHUNK: tl.constexpr, C_SLOT: tl.constexpr, G_P2: tl.constexpr, RUN: tl.constexpr,
    COMPACT: tl.constexpr, PDL: tl.constexpr, OVERLAP: tl.constexpr, SPINS: tl.constexpr,
):
    """Each row's chunk states and candidates from its runs (see above), persistent over rows;
    the rows it does not serve are listed for the scan (`left_off`: their count, then the rows,
    in no particular order); COMPACT: the rows served as one chunk each (`_collect_row`), listed
    alike at `served_off`. OVERLAP: started while `runs_kernel` (with OVERLAP) goes on, each row
    read once its `row_blocks` blocks are counted at `count_ptr` (`scan_kernel` zeroes them)."""
    if OVERLAP:
        _wait_for_row(count_ptr, 0, row_blocks, PDL, SPINS)  # (the row lists' zeroing: see runs_kernel)
    else:
        _after_previous_launch(PDL)
    for r in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row = tl.cast(r, tl.int32)
        if OVERLAP:
            _wait_for_row(count_ptr, row, row_blocks, PDL, SPINS)
        inv_t, greedy, k_on, p, mp, kw_bad = _keywords(row, vocab_total, t_ptr, k_ptr, p_ptr, mp_ptr, top_k, flags,
                                                       temperature, top_p, min_p)
        if OP == OP_LOGPROBS:
            need = top_n + row * 0
        else:
            need = tl.where(k_on <= C_SLOT // 2, k_on, 0)
        served = row * 0
        if (need > 0) & (need <= CHUNK // RUN // 2) & (greedy == 0) & (kw_bad == 0):
            served = _collect_row(x_ptr + row.to(tl.int64) * xs, ws_ptr, row, inv_t, need, vocab, vocab_start,
                                  n_chunks, state_off, cz_off, ci_off, run_off, CHUNK, C_SLOT, G_P2, RUN, COMPACT)
        if served == 0:
            at = tl.atomic_add(ws_ptr + left_off, 1)
            tl.store(ws_ptr + left_off + 1 + at, row)
        elif COMPACT:
            at = tl.atomic_add(ws_ptr + served_off, 1)
            tl.store(ws_ptr + served_off + 1 + at, row)
    if OVERLAP:
        if PDL:
            gdc_wait()  # (this launch ends after the runs launch: the scan's wait covers both)
            gdc_launch_dependents()


# ---- the select: searches over the candidates -------------------------------------------------------

@triton.jit
def _kth_key(kz, valid, k, lo, hi):
    """The largest key T with count(valid & kz >= T) >= k, given int64 bounds with
    count(>= lo) >= k > count(>= hi). Bisection on integer keys; it stops as soon as no key lies
    strictly between the bounds (then T = lo, a key that is present)."""
    done = tl.full((), 0, tl.int32)
    while (hi - lo > 1) & (done == 0):
        mid = (lo + (hi - lo) // 2).to(tl.int32)
        if _count2(valid & (kz > lo.to(tl.int32)) & (kz < hi.to(tl.int32))) == 0:
            done = done * 0 + 1
        elif _count2(valid & (kz >= mid)) >= k:
            lo = mid.to(tl.int64)
        else:
            hi = mid.to(tl.int64)
    return lo.to(tl.int32)


@triton.jit
def _mass_cut(kz, w, valid, target, lo, hi):
    """The smallest key h whose mass strictly above, sum(w over valid & kz > h - 1 ... ), is below
    `target`: given int64 bounds with mass(kz > lo) >= target > mass(kz > hi), the first key
    kept by top-p (keep i when the mass strictly more probable than i is < top_p). Stops when no
    key lies strictly between the bounds (then h = hi)."""
    done = tl.full((), 0, tl.int32)
    while (hi - lo > 1) & (done == 0):
        inside = _count2(valid & (kz > lo.to(tl.int32)) & (kz < hi.to(tl.int32)))
        if inside == 0:
            done = done * 0 + 1
        else:
            mid = (lo + (hi - lo) // 2).to(tl.int32)
            if _sum2(tl.where(valid & (kz > mid), w, 0.0)) < target:
                hi = mid.to(tl.int64)
            else:
                lo = mid.to(tl.int64)
    return hi.to(tl.int32)


@triton.jit
def _narrow(cz, valid, need, lo, hi, cap):
    """(t, n): a value t with need <= n = count(valid & cz >= t) <= cap (a 2-D block), by
    bisection on the values between lo (count >= need) and hi (the largest value, count >= 1);
    each step is one count. Where ties at one value forbid it, t is the largest value tried
    with n = count(>= t) > cap (every value above it numbers fewer than `need`)."""
    n = _count2(valid & (cz >= lo))
    t = lo
    if n > cap:
        c_hi = _count2(valid & (cz >= hi))
        if c_hi >= need:  # the max's ties alone
            t = hi
            n = c_hi
        else:
            done = tl.full((), 0, tl.int32)
            steps = tl.full((), 0, tl.int32)
            while (done == 0) & (steps < 80):
                mid = lo * 0.5 + hi * 0.5
                if (mid <= lo) | (mid >= hi):
                    done = done * 0 + 1  # adjacent floats: the ties at lo exceed cap
                else:
                    c = _count2(valid & (cz >= mid))
                    if c < need:
                        hi = mid
                    elif c > cap:
                        lo = mid
                        n = c
                    else:
                        t = mid
                        n = c
                        done = done * 0 + 2
                steps += 1
            if done != 2:
                t = lo
    return t, n


@triton.jit
def _lanes(cz, ci, sel, n, ws_ptr, scr_off, row, C_SLOT: tl.constexpr, G_P2: tl.constexpr, KM: tl.constexpr):
    """The n <= KM selected candidates (z, id) compacted through the row's scratch into KM
    lanes, and which lanes hold one."""
    scr_z = ws_ptr + scr_off + row.to(tl.int64) * (2 * G_P2 * C_SLOT)
    scr_i = scr_z + G_P2 * C_SLOT
    _compact(cz, ci, sel, scr_z, scr_i)
    r = tl.arange(0, KM)
    live = r < n
    zq = tl.load(scr_z + r, mask=live, other=NEG_INF_BITS, cache_modifier=".cg").to(tl.float32, bitcast=True)
    iq = tl.load(scr_i + r, mask=live, other=BIG_ID, cache_modifier=".cg")
    return zq, iq, live


@triton.jit
def _select_top(row, cz, sel, n, gs_ptr, g, n_chunks, shard_stride, ci_off, ws_ptr, scr_off, m, k, p, mp, seed,
                stream, off_lo, off_hi, OP: tl.constexpr, C_SLOT: tl.constexpr, G_P2: tl.constexpr,
                KM: tl.constexpr):
    """The kept set of a top-k row from the n <= KM candidates `sel` (they hold the row's k
    largest z, ties included), compacted into KM lanes: the k-th largest by rank (how many are
    strictly larger: an outer comparison), top-p by the mass strictly above each (another),
    min-p, then the race. Returns (h: the smallest kept key, lse of the kept set, the drawn
    id, its z); the id is BIG_ID unless OP is OP_SAMPLE."""
    ci = _candidate_ids(gs_ptr, g, row, n_chunks, shard_stride, ci_off, sel, C_SLOT)
    zq, iq, live = _lanes(cz, ci, sel, n, ws_ptr, scr_off, row, C_SLOT, G_P2, KM)
    greater = live[None, :] & (zq[None, :] > zq[:, None])  # [i, j]: z_j > z_i
    rank = tl.sum(greater.to(tl.int32), 1)
    kth = tl.min(tl.where(live & (rank < k), zq, float("inf")))
    keep = live & (zq >= kth)
    # (the same exp of z - row max as the chunk sums and `_select_sample`'s weights)
    w = tl.where(keep, exp_f32(zq - m), 0.0)
    if p < 1.0:
        above = tl.sum(tl.where(greater, w[None, :], 0.0), 1)
        keep = keep & (above < p * tl.sum(w))
    if mp > 0.0:
        keep = keep & (w >= mp)
    lse = m + tl.log(tl.sum(tl.where(keep, w, 0.0)))
    h = tl.min(tl.where(keep, _key(zq), BIG_ID))
    best_id = tl.full((), BIG_ID, tl.int32)
    best_z = tl.full((), float("-inf"), tl.float32)
    if OP == OP_SAMPLE:
        keys = tl.where(keep, _race_keys(zq, iq, seed, stream, off_lo, off_hi), float("-inf"))
        _, best_id, best_z = _race_step(tl.full((), float("-inf"), tl.float32), best_id, best_z, keys, iq, zq, keep)
    return h, lse, best_id, best_z


@triton.jit
def _race_compacted(scr_z, scr_i, n, seed, stream, off_lo, off_hi, TILE: tl.constexpr):
    """(best key, its id, its z) of the race over the `n` (z, id) pairs at scr_z / scr_i; the
    lowest id among equal keys."""
    best = tl.full((), float("-inf"), tl.float32)
    best_id = tl.full((), BIG_ID, tl.int32)
    best_z = tl.full((), float("-inf"), tl.float32)
    for t0 in range(0, n, TILE):
        q = t0 + tl.arange(0, TILE)
        ok = q < n
        zq = tl.load(scr_z + q, mask=ok, other=NEG_INF_BITS, cache_modifier=".cg").to(tl.float32, bitcast=True)
        iq = tl.load(scr_i + q, mask=ok, other=BIG_ID, cache_modifier=".cg")
        keys = tl.where(ok, _race_keys(zq, iq, seed, stream, off_lo, off_hi), float("-inf"))
        best, best_id, best_z = _race_step(best, best_id, best_z, keys, iq, zq, ok)
    return best, best_id, best_z


@triton.jit
def _compact(cz, ci, sel, scr_z, scr_i):
    """Write the selected entries of the [G, C] candidate block, chunk-major, to scr_z / scr_i
    (the last step before they are read back by other threads of the program); returns how many."""
    per_g = tl.sum(sel.to(tl.int32), 1)
    base = tl.cumsum(per_g, 0) - per_g
    pos = tl.where(sel, base[:, None] + tl.cumsum(sel.to(tl.int32), 1) - 1, 0)
    tl.debug_barrier()
    tl.store(scr_z + pos, cz.to(tl.int32, bitcast=True), mask=sel)
    tl.store(scr_i + pos, ci, mask=sel)
    tl.debug_barrier()  # (every thread's stores visible to the reads that follow)
    return tl.sum(per_g, 0)


# ---- the general path: the whole row, read from memory ---------------------------------------------
#
# A multi-way search: each read of the row evaluates CUTS cut points t_j at once (how many finite z
# have key >= t_j and their mass), so the key interval holding the cut narrows CUTS + 1-fold a
# read instead of 2-fold. The first read puts its cut points in z over [m - WINDOW, m] (where the
# cuts of ordinary rows lie), the following ones evenly between the keys bounding the cut. The
# search ends when one key or one element separates the bounds: then the kept set is exact.

CUTS = tl.constexpr(16)  # cut points a read evaluates: per element CUTS compares and masked adds
WINDOW = tl.constexpr(32.0)  # z below the row max the first read's cut points span


@triton.jit
def _row_z(x_row, start, inv_t, vocab, TILE: tl.constexpr):
    cols = start + tl.arange(0, TILE)
    x = tl.load(x_row + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
    return cols, x * inv_t


@triton.jit
def _row_cuts(x_row, inv_t, vocab, m, floor, t, lo, hi, TILE: tl.constexpr):
    """One read of the row, over its finite z with key >= floor: for each cut point t_j
    ([CUTS] int32 keys) the count and the sum of exp(z - m) of key >= t_j, and the smallest and
    largest key in [lo, hi) (BIG_ID and KEY_NONE where none). Every column's sum takes the same
    order, so both are non-increasing in t_j (float addition of non-negative terms is monotone)."""
    n = tl.zeros((CUTS,), tl.int32)
    s = tl.zeros((CUTS,), tl.float32)
    k_min = tl.full((), BIG_ID, tl.int32)
    k_max = tl.full((), KEY_NONE, tl.int32)
    for start in tl.range(0, vocab, TILE):
        cols, z = _row_z(x_row, start, inv_t, vocab, TILE)
        k = _key(z)
        fin = (z > float("-inf")) & (k >= floor)
        w = tl.where(fin, exp_f32(z - m), 0.0)
        between = fin & (k >= lo) & (k < hi)
        k_min = tl.minimum(k_min, tl.min(tl.where(between, k, BIG_ID)))
        k_max = tl.maximum(k_max, tl.max(tl.where(between, k, KEY_NONE)))
        ge = fin[:, None] & (k[:, None] >= t[None, :])
        n += tl.sum(ge.to(tl.int32), 0)
        s += tl.sum(tl.where(ge, w[:, None], 0.0), 0)
    return n, s, k_min, k_max


@triton.jit
def _row_search(x_row, inv_t, vocab, m, floor, k, target, lo, hi, n_lo, s_lo, TILE: tl.constexpr):
    """The cut of a top-k (k > 0) or of top-p (k == 0) over the row's finite z with key >=
    floor: (h, count and mass of key >= h); the kept set is {key >= h}. With N(t), S(t) the
    count and mass of key >= t, P(t) is N(t) >= k (top-k) or S(t) >= target (top-p); given
    int64 keys with P(lo) (count n_lo, mass s_lo) and not P(hi), each read narrows [lo, hi)
    keeping that, to the bucket between two cut points, and to the keys present in it (N and
    S do not change between keys no z has), until hi = lo + 1 or at most one element (top-k:
    exactly k) has key >= lo and < hi: then h = lo. top-k: the k-th largest key, ties
    included. top-p: keep i when the mass strictly above it is < target; S(hi) < target <=
    S(lo) with one key in between is that cut."""
    j = tl.arange(0, CUTS)
    n_hi = tl.full((), 0, tl.int32)
    first = tl.full((), 1, tl.int32)
    while (hi - lo > 1) & (n_lo - n_hi > 1) & (n_lo != k):
        if first != 0:
            # (over [m - WINDOW, m], quadratic: denser near m, where the cuts of sharp rows lie)
            d = 1.0 - j.to(tl.float32) / CUTS
            t = _key(m - WINDOW * d * d)
            first = first * 0
        else:
            t = (lo + ((j + 1).to(tl.int64) * (hi - lo)) // (CUTS + 1)).to(tl.int32)
        n, s, k_min, k_max = _row_cuts(x_row, inv_t, vocab, m, floor, t, lo.to(tl.int32), hi.to(tl.int32), TILE)
        t64 = t.to(tl.int64)
        inner = (t64 > lo) & (t64 < hi)
        holds = tl.where(k > 0, n >= k, s >= target)
        yes = inner & holds
        no = inner & (holds == 0)
        if tl.max(yes.to(tl.int32)) > 0:
            lo = tl.max(tl.where(yes, t64, lo))
            n_lo = tl.min(tl.where(yes, n, BIG_ID))
            s_lo = tl.min(tl.where(yes, s, float("inf")))
        if tl.max(no.to(tl.int32)) > 0:
            hi = tl.min(tl.where(no, t64, hi))
            n_hi = tl.max(tl.where(no, n, 0))
        if (k_min < hi) & (k_max >= lo):  # (the old bounds held no z below k_min, none above k_max)
            lo = tl.maximum(lo, k_min.to(tl.int64))
            hi = tl.minimum(hi, k_max.to(tl.int64) + 1)
    return lo.to(tl.int32), n_lo, s_lo


@triton.jit
def _row_min_p(x_row, inv_t, vocab, m, mp, TILE: tl.constexpr):
    """One read: (the smallest key of a finite z with exp(z - m) >= mp, the count and mass of
    those z). exp is monotone, so they are the z with key >= that key."""
    h = tl.full((), BIG_ID, tl.int32)
    n = tl.full((), 0, tl.int32)
    s = tl.full((), 0.0, tl.float32)
    for start in tl.range(0, vocab, TILE):
        cols, z = _row_z(x_row, start, inv_t, vocab, TILE)
        w = exp_f32(z - m)
        kept = (z > float("-inf")) & (w >= mp)
        h = tl.minimum(h, tl.min(tl.where(kept, _key(z), BIG_ID)))
        n += tl.sum(kept.to(tl.int32))
        s += tl.sum(tl.where(kept, w, 0.0))
    return h, n, s


@triton.jit
def _row_race(x_row, inv_t, vocab, vocab_start, h, seed, stream, off_lo, off_hi, TILE: tl.constexpr):
    """The race over the row's finite z with key >= h: (key, id, z). Tiles with nothing kept
    skip the random numbers."""
    best = tl.full((), float("-inf"), tl.float32)
    best_id = tl.full((), BIG_ID, tl.int32)
    best_z = tl.full((), float("-inf"), tl.float32)
    for start in range(0, vocab, TILE):
        cols, z = _row_z(x_row, start, inv_t, vocab, TILE)
        kept = (z > float("-inf")) & (_key(z) >= h)
        if tl.max(kept.to(tl.int32)) > 0:
            ids = vocab_start + cols
            keys = tl.where(kept, _race_keys(z, ids, seed, stream, off_lo, off_hi), float("-inf"))
            best, best_id, best_z = _race_step(best, best_id, best_z, keys, ids, z, kept)
    return best, best_id, best_z


@triton.jit
def _general_cut(x_row, inv_t, vocab, m, mass, n_fin, k_on, p, mp, TILE: tl.constexpr):
    """(h, mass of the kept set {key >= h}) of a row from the whole row, exact: min-p's cut in
    one read, top-k's k-th key and top-p's cut over its survivors each by `_row_search` (a few
    reads; skipped where min-p's cut decides); h the largest of the three (the intersection of
    their sets)."""
    h_m = tl.full((), KEY_NONE, tl.int32)
    n_m = n_fin
    mass_m = mass
    if mp > 0.0:
        h_m, n_m, mass_m = _row_min_p(x_row, inv_t, vocab, m, mp, TILE)
    h_k = tl.full((), KEY_NONE, tl.int32)
    n_k = n_fin
    mass_k = mass
    top = _key(m).to(tl.int64) + 1  # (no finite z has a key this large)
    # (without top-p, a top-k keeping every z min-p keeps changes nothing)
    if (k_on > 0) & (n_fin > k_on) & ((p < 1.0) | (n_m > k_on)):
        h_k, n_k, mass_k = _row_search(x_row, inv_t, vocab, m, KEY_NONE, k_on, mass * 0.0,
                                       tl.full((), KEY_NEG_INF, tl.int64), top, n_fin, mass, TILE)
    h = tl.maximum(h_k, h_m)
    kept_mass = tl.where(h_m > h_k, mass_m, mass_k)
    if p < 1.0:
        # top-p on the top-k-renormalised distribution (its mass; the survivors its floor). Where
        # min-p's cut lies above the top-k's, top-p's lies below it (min-p decides) or the search
        # starts there.
        target = p * mass_k
        lo = tl.maximum(h_k, KEY_NEG_INF).to(tl.int64) - 1
        n_lo = n_k
        s_lo = mass_k
        search = (h_m <= h_k) | (mass_m >= target)
        if h_m > h_k:
            lo = h_m.to(tl.int64)
            n_lo = n_m
            s_lo = mass_m
        if search:
            h_p, _, mass_p = _row_search(x_row, inv_t, vocab, m, h_k, k_on * 0, target, lo, top, n_lo, s_lo, TILE)
            if h_p > h:
                h = h_p
                kept_mass = mass_p
    return h, kept_mass


@triton.jit
def id_logprobs(x_row, ids_ptr, out_ptr, row_ids, n_ids, vocab, scale, lse, greedy, m, greedy_lp, invalid,
                BLOCK: tl.constexpr):
    """log_softmax(z) at the row's n_ids ids (z = logits * scale) into out_ptr + row_ids: z - lse,
    or on a greedy row (scale 1) `greedy_lp` where z is the max m and -inf elsewhere; NaN on
    an invalid row and at ids outside [0, vocab)."""
    for j0 in range(0, n_ids, BLOCK):
        j = j0 + tl.arange(0, BLOCK)
        jok = j < n_ids
        idv = tl.load(ids_ptr + row_ids + j, mask=jok, other=0)
        inr = jok & (idv >= 0) & (idv < vocab)
        z = tl.load(x_row + tl.where(inr, idv, 0), mask=inr, other=0.0).to(tl.float32) * scale
        lp = tl.where(greedy, tl.where(z == m, greedy_lp, float("-inf")), z - lse)
        tl.store(out_ptr + row_ids + j, tl.where(inr & (invalid == 0), lp, float("nan")), mask=jok)


# ---- the select of a row ----------------------------------------------------------------------------

@triton.jit
def _row_merge(gs_ptr, row, n_chunks, n_groups, shard_stride, state_off, G_P2: tl.constexpr):
    """(the row's chunks [G_P2], those past `n_groups` as chunk 0: in-range addresses for masked
    lanes, which `_candidates` and `_candidate_ids` keep contiguous along the slots; which are
    real; chunk-state addresses of `row` across shards as word offsets; the row's max, mass of
    exp(z - max) and bad flag)."""
    g = tl.arange(0, G_P2)
    ok = g < n_groups
    gi = tl.where(ok, g, 0)
    item = row.to(tl.int64) * n_chunks + gi % n_chunks
    base = (gi // n_chunks).to(tl.int64) * shard_stride + item * NS + state_off
    ms = _ldf(gs_ptr + base + F_MAX, ok)
    m = tl.max(ms)
    m_sub = tl.where((m > float("-inf")) & (m < float("inf")), m, 0.0)
    ss = tl.where(ok, _ldf(gs_ptr + base + F_SUM, ok), 0.0)
    mass = tl.sum(tl.where(ms > float("-inf"), ss * exp_f32(ms - m_sub), 0.0))
    bad = tl.max(_ldi(gs_ptr + base + I_BAD, ok))
    return gi, ok, base, ms, m, mass, bad


@triton.jit
def _candidate_offsets(g, row, n_chunks, shard_stride, C_SLOT: tl.constexpr):
    s = tl.arange(0, C_SLOT)
    item = row.to(tl.int64) * n_chunks + g % n_chunks
    return ((g // n_chunks).to(tl.int64) * shard_stride + item * C_SLOT)[:, None] + s[None, :]


@triton.jit
def _candidates(gs_ptr, g, ok, row, n_chunks, shard_stride, cz_off, written, C_SLOT: tl.constexpr):
    """The row's candidates' z as a [G_P2, C_SLOT] block, and which entries hold one."""
    valid = ok[:, None] & (tl.arange(0, C_SLOT)[None, :] < written[:, None])
    offs = _candidate_offsets(g, row, n_chunks, shard_stride, C_SLOT)
    cz = tl.load(gs_ptr + cz_off + offs, mask=valid, other=NEG_INF_BITS, cache_modifier=".cg")
    return cz.to(tl.float32, bitcast=True), valid


@triton.jit
def _candidate_ids(gs_ptr, g, row, n_chunks, shard_stride, ci_off, valid, C_SLOT: tl.constexpr):
    """The candidates' global ids, loaded where needed (not held through the searches: registers)."""
    offs = _candidate_offsets(g, row, n_chunks, shard_stride, C_SLOT)
    return tl.load(gs_ptr + ci_off + offs, mask=valid, other=BIG_ID, cache_modifier=".cg")


@triton.jit
def _select_sample(row, x_ptr, gs_ptr, ws_ptr, out_i_ptr, out_f_ptr, t_ptr, k_ptr, p_ptr, mp_ptr, seed_ptr, off_ptr,
                   undecided_ptr, vocab, xs, vocab_start, vocab_total, n_chunks, n_groups, shard_stride, state_off,
                   cz_off, ci_off, scr_off, res_off, top_k, seed_lo, seed_hi, off_lo, off_hi, flags, temperature,
                   top_p, min_p,
                   OP: tl.constexpr, HAS_X: tl.constexpr, C_SLOT: tl.constexpr, G_P2: tl.constexpr,
                   TILE: tl.constexpr):
    """`sample` / `probs` of one row from its chunk states: the id and its log-probability
    (sample), and the row result (key threshold h, lse of the kept set, id, status) pass 2 reads."""
    KM: tl.constexpr = C_SLOT if C_SLOT < 256 else C_SLOT // 2  # lanes of `_select_top`
    KH: tl.constexpr = KM // 2 if KM >= 128 else KM
    inv_t, greedy, k_on, p, mp, kw_bad = _keywords(row, vocab_total, t_ptr, k_ptr, p_ptr, mp_ptr, top_k, flags,
                                                   temperature, top_p, min_p)
    g, ok, base, ms, m, mass, bad = _row_merge(gs_ptr, row, n_chunks, n_groups, shard_stride, state_off, G_P2)
    lse_row = m + tl.log(mass)
    invalid = kw_bad | (bad != 0) | (m == float("-inf"))
    filtered = (k_on > 0) | (p < 1.0) | (mp > 0.0)
    status = tl.where(invalid, ST_INVALID, tl.where(greedy, ST_GREEDY, ST_DRAWN)).to(tl.int32)
    h = tl.full((), KEY_NONE, tl.int32)
    lse = lse_row
    # (greedy rows: the first max, the lowest global index among the row's maxima)
    out_id = tl.min(tl.where(ok & (ms == m), _ldi(gs_ptr + base + I_ARGMAX, ok), BIG_ID))
    lp = tl.full((), 0.0, tl.float32)
    path = tl.full((), PATH_NONE, tl.int32)
    if status == ST_DRAWN:
        path = tl.where(filtered, PATH_CANDIDATES, PATH_RACE).to(tl.int32)
        if filtered == 0:
            if OP == OP_SAMPLE:  # the chunks' race winners: the largest key, the lowest id among equal keys
                bk = tl.where(ok, _ldf(gs_ptr + base + F_BEST, ok), float("-inf"))
                bi = _ldi(gs_ptr + base + I_BEST_ID, ok)
                best = tl.max(bk)
                out_id = tl.min(tl.where(ok & (bk == best), bi, BIG_ID))
                bz = tl.max(tl.where(ok & (bk == best) & (bi == out_id), _ldf(gs_ptr + base + F_BEST_Z, ok),
                                     float("-inf")))
                lp = bz - lse_row
        else:
            written = _ldi(gs_ptr + base + I_WRITTEN, ok)
            total = _ldi(gs_ptr + base + I_TOTAL, ok)
            n_fin = tl.sum(_ldi(gs_ptr + base + I_FINITE, ok))
            thr = tl.where(ok, _ldf(gs_ptr + base + F_THR, ok), float("-inf"))
            cz, valid = _candidates(gs_ptr, g, ok, row, n_chunks, shard_stride, cz_off, written, C_SLOT)
            t_star = tl.max(thr)  # every finite z >= t_star of the row is a candidate
            overflow = tl.max((total > C_SLOT).to(tl.int32)) != 0
            # A top-k row: its top k (ties included) are among the candidates; a few bisection
            # steps on them find the KM or fewer largest, which decide everything (`_select_top`).
            # Where the top k fit half the lanes, the bisection aims there: the outer comparisons
            # of `_select_top`, most of the select's time on 128 lanes, then cost a quarter.
            n_top = tl.full((), KM + 1, tl.int32)
            t_top = t_star
            if (k_on > 0) & (k_on <= C_SLOT // 2) & (overflow == 0):
                z_lo = tl.maximum(t_star, _min2(tl.where(valid, cz, float("inf"))))
                t_top, n_top = _narrow(cz, valid, tl.minimum(k_on, n_fin), z_lo, m, tl.where(k_on <= KH, KH, KM))
            if n_top <= KM:
                seed, stream, olo, ohi = _row_words(row, seed_ptr, off_ptr, seed_lo, seed_hi, off_lo, off_hi, flags)
                top, k = valid & (cz >= t_top), tl.minimum(k_on, n_fin)
                if n_top <= KH:
                    h, lse, out_id, bz = _select_top(row, cz, top, n_top, gs_ptr, g, n_chunks, shard_stride, ci_off,
                                                     ws_ptr, scr_off, m, k, p, mp, seed, stream, olo, ohi, OP, C_SLOT,
                                                     G_P2, KH)
                else:
                    h, lse, out_id, bz = _select_top(row, cz, top, n_top, gs_ptr, g, n_chunks, shard_stride, ci_off,
                                                     ws_ptr, scr_off, m, k, p, mp, seed, stream, olo, ohi, OP, C_SLOT,
                                                     G_P2, KM)
                lp = bz - lse
            else:
                kz = _key(cz)
                w = tl.where(valid, exp_f32(cz - m), 0.0)
                complete = (t_star == float("-inf")) & (overflow == 0)
                top_k_mode = (k_on > 0) & (k_on <= C_SLOT // 2)
                decided = (overflow == 0) & (top_k_mode | complete | (k_on == 0))
                # top-k: the exact k-th key over the candidates (they hold the row's top k, ties included)
                h_k = tl.full((), KEY_NONE, tl.int32)
                h_floor = tl.where(complete, KEY_NONE, _key(t_star))
                mass_k = mass
                if decided & (k_on > 0):
                    if (complete == 0) | (n_fin > k_on):
                        h_k = _kth_key(kz, valid, k_on, tl.full((), KEY_NEG_INF, tl.int64), _key(m).to(tl.int64) + 1)
                    mass_k = _sum2(tl.where(kz >= h_k, w, 0.0))
                    h_floor = h_k
                elif decided:  # no top-k: the row's mass, the candidates' from their weights (consistent sums)
                    rest = tl.sum(tl.where(ok, _ldf(gs_ptr + base + F_REST, ok) * exp_f32(ms - m), 0.0))
                    mass_k = _sum2(w) + rest
                # top-p: the candidates with key >= h_floor have their exact mass above them; it decides
                # when they already hold top_p of the mass (with a top-k or every z a candidate, always)
                above_floor = valid & (kz >= h_floor)
                p_decides = decided & (p < 1.0) & (_sum2(tl.where(above_floor, w, 0.0)) >= p * mass_k)
                h_p = tl.full((), KEY_NONE, tl.int32)
                if p_decides:
                    h_p = _mass_cut(kz, w, above_floor, p * mass_k, tl.maximum(h_floor, KEY_NEG_INF).to(tl.int64) - 1,
                                    _key(m).to(tl.int64))
                # min-p decides when its cut lies above t_star (every z below it is dropped)
                mp_decides = decided & (mp > 0.0) & ((t_star == float("-inf")) | (exp_f32(t_star - m) < mp))
                h_m = tl.full((), KEY_NONE, tl.int32)
                if mp > 0.0:
                    h_m = _min2(tl.where(valid & (w >= mp), kz, BIG_ID))
                decided = decided & (top_k_mode | complete | p_decides | mp_decides)
                decided = decided & ((p >= 1.0) | p_decides | mp_decides)
                if decided:
                    h = tl.maximum(tl.maximum(h_k, h_p), h_m)
                    kept = valid & (kz >= h)
                    lse = m + tl.log(_sum2(tl.where(kept, w, 0.0)))
                    if OP == OP_SAMPLE:
                        seed, stream, olo, ohi = _row_words(row, seed_ptr, off_ptr, seed_lo, seed_hi, off_lo, off_hi,
                                                            flags)
                        scr_z = ws_ptr + scr_off + row.to(tl.int64) * (2 * G_P2 * C_SLOT)
                        ci = _candidate_ids(gs_ptr, g, row, n_chunks, shard_stride, ci_off, kept, C_SLOT)
                        n = _compact(cz, ci, kept, scr_z, scr_z + G_P2 * C_SLOT)
                        _, out_id, bz = _race_compacted(scr_z, scr_z + G_P2 * C_SLOT, n, seed, stream, olo, ohi, TILE)
                        lp = bz - lse
                else:
                    path = path * 0 + PATH_GENERAL
                    if HAS_X:
                        x_row = x_ptr + row.to(tl.int64) * xs
                        h, kept_mass = _general_cut(x_row, inv_t, vocab, m, mass, n_fin, k_on, p, mp, TILE)
                        lse = m + tl.log(kept_mass)
                        if OP == OP_SAMPLE:
                            seed, stream, olo, ohi = _row_words(row, seed_ptr, off_ptr, seed_lo, seed_hi, off_lo,
                                                                off_hi, flags)
                            _, out_id, bz = _row_race(x_row, inv_t, vocab, vocab_start, h, seed, stream, olo, ohi, TILE)
                            lp = bz - lse
                    else:
                        status = status * 0 + ST_UNDECIDED
    out_id = tl.where(status == ST_INVALID, -1, tl.where(status == ST_UNDECIDED, -2, out_id))
    lp = tl.where((status == ST_INVALID) | (status == ST_UNDECIDED), float("nan"), lp)
    lse = tl.where(status == ST_INVALID, float("nan"), lse)
    res = ws_ptr + res_off + row.to(tl.int64) * NR
    tl.store(res, h)
    _stf(res + 1, lse)
    tl.store(res + 2, out_id)
    tl.store(res + 3, status)
    tl.store(res + 4, path)
    if OP == OP_SAMPLE:
        tl.store(out_i_ptr + row, out_id.to(tl.int64))
        tl.store(out_f_ptr + row, lp)
    if not HAS_X:
        if status == ST_UNDECIDED:  # (the one word the host reads: every writer stores 1)
            tl.store(undecided_ptr, 1)


@triton.jit
def _select_logprobs(row, x_ptr, gs_ptr, ws_ptr, out_i_ptr, out_f_ptr, out_f2_ptr, ids_ptr, t_ptr,
                     vocab, xs, vocab_total, n_chunks, n_groups, shard_stride, state_off, cz_off, ci_off, scr_off,
                     n_ids, top_n, flags, temperature,
                     C_SLOT: tl.constexpr, G_P2: tl.constexpr, KP: tl.constexpr, TILE: tl.constexpr):
    """`logprobs` of one row: log_softmax(z) at its ids, and the top-n values and ids (by
    value, the lower id first among ties; the greedy limit on temperature-0 rows)."""
    KM: tl.constexpr = C_SLOT if C_SLOT < 256 else C_SLOT // 2  # lanes of the top-n's ranking
    inv_t, greedy, kw_bad = _temperature(row, t_ptr, flags, temperature)
    g, ok, base, ms, m, mass, bad = _row_merge(gs_ptr, row, n_chunks, n_groups, shard_stride, state_off, G_P2)
    lse_row = m + tl.log(mass)
    invalid = kw_bad | (bad != 0) | (m == float("-inf"))
    n_ties = tl.sum(tl.where(ok & (ms == m), _ldi(gs_ptr + base + I_TIES, ok), 0))
    greedy_lp = -tl.log(n_ties.to(tl.float32))
    id_logprobs(x_ptr + row.to(tl.int64) * xs, ids_ptr, out_f_ptr, row.to(tl.int64) * n_ids, n_ids, vocab, inv_t,
                lse_row, greedy, m, greedy_lp, invalid, TILE)
    if top_n > 0:
        out_v = out_f2_ptr + row.to(tl.int64) * top_n
        out_t = out_i_ptr + row.to(tl.int64) * top_n
        r = tl.arange(0, KP)
        if invalid:
            tl.store(out_v + r, tl.full((KP,), float("nan"), tl.float32), mask=r < top_n)
            tl.store(out_t + r, tl.full((KP,), -1, tl.int64), mask=r < top_n)
        else:
            written = _ldi(gs_ptr + base + I_WRITTEN, ok)
            cz, valid = _candidates(gs_ptr, g, ok, row, n_chunks, shard_stride, cz_off, written, C_SLOT)
            n_fin = tl.sum(_ldi(gs_ptr + base + I_FINITE, ok))
            # The finite entries of the top-n (greedy: the tied maxima); the rest are -inf values,
            # listed by id (the lowest ids not among them).
            n_sel = tl.minimum(top_n, tl.where(greedy, n_ties, n_fin))
            # The KM or fewer largest candidates (they hold the top n), ranked below with ids
            # breaking ties; where ties forbid so few, exactly the top n: the n-th key, then ids.
            t_star = tl.max(tl.where(ok, _ldf(gs_ptr + base + F_THR, ok), float("-inf")))
            z_lo = tl.maximum(t_star, _min2(tl.where(valid, cz, float("inf"))))
            t_top, n_top = _narrow(cz, valid, n_sel, z_lo, m, KM)
            if n_top <= KM:
                sel = valid & (cz >= t_top)
                ci = _candidate_ids(gs_ptr, g, row, n_chunks, shard_stride, ci_off, sel, C_SLOT)
            else:
                kz = _key(cz)
                t_key = _kth_key(kz, valid, n_sel, tl.full((), KEY_NEG_INF, tl.int64), _key(m).to(tl.int64) + 1)
                n_gt = _count2(valid & (kz > t_key))
                eq = valid & (kz == t_key)
                ci = _candidate_ids(gs_ptr, g, row, n_chunks, shard_stride, ci_off, valid & (kz >= t_key), C_SLOT)
                i_cut = tl.full((), BIG_ID, tl.int32)
                if _count2(eq) > n_sel - n_gt:  # ties at the n-th value: the lowest ids among them
                    need = n_sel - n_gt
                    lo = tl.full((), -1, tl.int64)
                    hi = tl.full((), BIG_ID, tl.int64)
                    while hi - lo > 1:
                        mid = (lo + (hi - lo) // 2).to(tl.int32)
                        if _count2(eq & (ci <= mid)) >= need:
                            hi = mid.to(tl.int64)
                        else:
                            lo = mid.to(tl.int64)
                    i_cut = hi.to(tl.int32)
                sel = valid & ((kz > t_key) | (eq & (ci <= i_cut)))
                n_top = n_sel
            zq, iq, qok = _lanes(cz, ci, sel, n_top, ws_ptr, scr_off, row, C_SLOT, G_P2, KM)
            kq = _key(zq)
            before = (kq[None, :] > kq[:, None]) | ((kq[None, :] == kq[:, None]) & (iq[None, :] < iq[:, None]))
            rank = tl.sum((qok[None, :] & before).to(tl.int32), 1)
            listed = qok & (rank < n_sel)
            vals = tl.where(greedy, greedy_lp, zq - lse_row)
            at = tl.where(listed, rank, 0)
            tl.store(out_v + at, vals, mask=listed)
            tl.store(out_t + at, iq.to(tl.int64), mask=listed)
            if n_sel < top_n:
                # slot r >= n_sel: the (r - n_sel)-th smallest id not among the n_sel listed
                want = r - n_sel
                cand = want
                moved = tl.full((), 1, tl.int32)
                while moved != 0:
                    nxt = want + tl.sum((listed[None, :] & (iq[None, :] <= cand[:, None])).to(tl.int32), 1)
                    moved = tl.max((nxt != cand).to(tl.int32))
                    cand = nxt
                fill = (r >= n_sel) & (r < top_n)
                tl.store(out_v + r, tl.full((KP,), float("-inf"), tl.float32), mask=fill)
                tl.store(out_t + r, cand.to(tl.int64), mask=fill)


# ---- kernels ------------------------------------------------------------------------------------------

@triton.jit(do_not_specialize=["top_k", "seed_lo", "seed_hi", "off_lo", "off_hi", "flags"])
def scan_kernel(
    x_ptr, ws_ptr, count_ptr, t_ptr, k_ptr, p_ptr, mp_ptr, seed_ptr, off_ptr,
    n_rows, vocab, xs, vocab_start, vocab_total, n_chunks, state_off, cz_off, ci_off, left_off, top_n,
    top_k, seed_lo, seed_hi, off_lo, off_hi, flags,
    temperature, top_p, min_p,
    OP: tl.constexpr, CHUNK: tl.constexpr, C_SLOT: tl.constexpr, TILE: tl.constexpr, RUNS: tl.constexpr,
    PDL: tl.constexpr, OVERLAP: tl.constexpr,
):
    """Pass 1 over (row, chunk) work items, row-major: each chunk's state and candidates
    (RUNS: only the rows `collect_kernel` listed; OVERLAP: the runs' row counts at `count_ptr`
    zeroed, every reader of them finished)."""
    _after_previous_launch(PDL)
    if OVERLAP:
        for r in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
            tl.store(count_ptr + r, 0)
    SUB: tl.constexpr = CHUNK if CHUNK < TILE else TILE
    n_items = n_rows * n_chunks
    if RUNS:
        n_items = tl.load(ws_ptr + left_off) * n_chunks
    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        row = item // n_chunks
        if RUNS:
            row = tl.load(ws_ptr + left_off + 1 + row)
        c = item % n_chunks
        _scan_item(x_ptr, ws_ptr, t_ptr, k_ptr, p_ptr, mp_ptr, seed_ptr, off_ptr, row, c, vocab, xs, vocab_start,
                   vocab_total, n_chunks, state_off, cz_off, ci_off, top_n, top_k, seed_lo, seed_hi, off_lo, off_hi,
                   flags, temperature, top_p, min_p, OP, CHUNK, C_SLOT, SUB)


@triton.jit
def _scan_item(x_ptr, ws_ptr, t_ptr, k_ptr, p_ptr, mp_ptr, seed_ptr, off_ptr, row, c, vocab, xs, vocab_start,
               vocab_total, n_chunks, state_off, cz_off, ci_off, top_n, top_k, seed_lo, seed_hi, off_lo, off_hi, flags,
               temperature, top_p, min_p, OP: tl.constexpr, CHUNK: tl.constexpr, C_SLOT: tl.constexpr,
               SUB: tl.constexpr):
    """`_scan_chunk` of (row, chunk c) with the row's keywords and random words."""
    inv_t, greedy, k_on, p, mp, kw_bad = _keywords(row, vocab_total, t_ptr, k_ptr, p_ptr, mp_ptr, top_k, flags,
                                                   temperature, top_p, min_p)
    seed = tl.full((), 0, tl.int64)
    stream = row * 0
    olo = row * 0
    ohi = row * 0
    if OP == OP_SAMPLE:
        seed, stream, olo, ohi = _row_words(row, seed_ptr, off_ptr, seed_lo, seed_hi, off_lo, off_hi, flags)
    _scan_chunk(x_ptr, ws_ptr, row, c, inv_t, greedy, k_on, p, mp, kw_bad, seed, stream, olo, ohi,
                vocab, xs, vocab_start, n_chunks, state_off, cz_off, ci_off, top_n, OP, CHUNK, C_SLOT, SUB)


@triton.jit(do_not_specialize=["top_k", "seed_lo", "seed_hi", "off_lo", "off_hi", "flags"])
def select_kernel(
    x_ptr, gs_ptr, ws_ptr, out_i_ptr, out_f_ptr, out_f2_ptr, ids_ptr, t_ptr, k_ptr, p_ptr, mp_ptr, seed_ptr, off_ptr,
    undecided_ptr,
    n_rows, vocab, xs, vocab_start, vocab_total, n_chunks, n_groups, shard_stride, state_off, cz_off, ci_off,
    scr_off, res_off, rows_off, n_ids, top_n,
    top_k, seed_lo, seed_hi, off_lo, off_hi, flags,
    temperature, top_p, min_p,
    OP: tl.constexpr, HAS_X: tl.constexpr, C_SLOT: tl.constexpr, G_P2: tl.constexpr, KP: tl.constexpr,
    TILE: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr,
):
    """The select of every row, persistent over rows. `gs_ptr`: the chunk states and candidates
    ([shards] blocks `shard_stride` words apart, `n_groups` = shards x n_chunks chunks per row);
    `ws_ptr`: this launch's scratch and row results. Without the logits (HAS_X False: a sharded
    vocabulary), rows the candidates cannot decide get status ST_UNDECIDED and id -2, and the
    word at `undecided_ptr` is set to 1. ROWS: only the rows listed at `rows_off` in `ws_ptr`
    (their count, then the rows)."""
    _after_previous_launch(PDL)
    n = n_rows
    if ROWS:
        n = tl.load(ws_ptr + rows_off)
    for r in tl.range(tl.program_id(0), n, tl.num_programs(0)):
        row = tl.cast(r, tl.int32)  # (the interpreter's loop gives Python ints)
        if ROWS:
            row = tl.load(ws_ptr + rows_off + 1 + row)
        if OP == OP_LOGPROBS:
            _select_logprobs(row, x_ptr, gs_ptr, ws_ptr, out_i_ptr, out_f_ptr, out_f2_ptr, ids_ptr, t_ptr,
                             vocab, xs, vocab_total, n_chunks, n_groups, shard_stride, state_off, cz_off, ci_off,
                             scr_off, n_ids, top_n, flags, temperature, C_SLOT, G_P2, KP, TILE)
        else:
            _select_sample(row, x_ptr, gs_ptr, ws_ptr, out_i_ptr, out_f_ptr, t_ptr, k_ptr, p_ptr, mp_ptr, seed_ptr,
                           off_ptr, undecided_ptr, vocab, xs, vocab_start, vocab_total, n_chunks, n_groups,
                           shard_stride, state_off, cz_off, ci_off, scr_off, res_off, top_k, seed_lo, seed_hi, off_lo,
                           off_hi, flags, temperature, top_p, min_p, OP, HAS_X, C_SLOT, G_P2, TILE)


@triton.jit(do_not_specialize=["top_k", "seed_lo", "seed_hi", "off_lo", "off_hi", "flags"])
def scan_select_kernel(
    x_ptr, ws_ptr, count_ptr, out_i_ptr, out_f_ptr, out_f2_ptr, ids_ptr, t_ptr, k_ptr, p_ptr, mp_ptr, seed_ptr,
    off_ptr,
    n_rows, vocab, xs, vocab_start, vocab_total, n_chunks, state_off, cz_off, ci_off, scr_off, res_off, n_ids, top_n,
    top_k, seed_lo, seed_hi, off_lo, off_hi, flags,
    temperature, top_p, min_p,
    OP: tl.constexpr, CHUNK: tl.constexpr, C_SLOT: tl.constexpr, G_P2: tl.constexpr, KP: tl.constexpr,
    TILE: tl.constexpr, PDL: tl.constexpr,
):
    """`scan_kernel` then `select_kernel` in one launch (a few rows: the second launch's host
    cost would be most of a call's): the program that stores a row's last chunk selects the row.
    No program waits for another; `count_ptr` holds one arrival count per row, zero between
    launches (the selecting program resets it)."""
    _after_previous_launch(PDL)
    SUB: tl.constexpr = CHUNK if CHUNK < TILE else TILE
    for item in tl.range(tl.program_id(0), n_rows * n_chunks, tl.num_programs(0)):
        row = item // n_chunks
        _scan_item(x_ptr, ws_ptr, t_ptr, k_ptr, p_ptr, mp_ptr, seed_ptr, off_ptr, row, item % n_chunks, vocab, xs,
                   vocab_start, vocab_total, n_chunks, state_off, cz_off, ci_off, top_n, top_k, seed_lo, seed_hi,
                   off_lo, off_hi, flags, temperature, top_p, min_p, OP, CHUNK, C_SLOT, SUB)
        # Every thread's stores of the chunk precede the arrival (bar.sync), which releases
        # them; the last arrival's acquire, then a bar.sync, orders every thread's reads of the
        # other chunks after their stores.
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + row, 1, sem="acq_rel", scope="gpu") + 1
        if arrived == n_chunks:
            tl.atomic_xchg(count_ptr + row, 0, sem="relaxed", scope="gpu")
            tl.debug_barrier()
            if OP == OP_LOGPROBS:
                _select_logprobs(row, x_ptr, ws_ptr, ws_ptr, out_i_ptr, out_f_ptr, out_f2_ptr, ids_ptr, t_ptr,
                                 vocab, xs, vocab_total, n_chunks, n_chunks, 0, state_off, cz_off, ci_off, scr_off,
                                 n_ids, top_n, flags, temperature, C_SLOT, G_P2, KP, TILE)
            else:
                _select_sample(row, x_ptr, ws_ptr, ws_ptr, out_i_ptr, out_f_ptr, t_ptr, k_ptr, p_ptr, mp_ptr,
                               seed_ptr, off_ptr, count_ptr, vocab, xs, vocab_start, vocab_total, n_chunks, n_chunks,
                               0, state_off, cz_off, ci_off, scr_off, res_off, top_k, seed_lo, seed_hi, off_lo,
                               off_hi, flags, temperature, top_p, min_p, OP, True, C_SLOT, G_P2, TILE)


@triton.jit(do_not_specialize=["flags"])
def probs_kernel(
    x_ptr, ws_ptr, y_ptr, t_ptr,
    n_rows, vocab, xs, ys, n_chunks, res_off,
    flags,
    temperature,
    CHUNK: tl.constexpr, PDL: tl.constexpr,
):
    """Pass 2 of `probs`: y = exp(z - lse of the kept set) where key(z) >= h, else 0; one-hot on
    greedy rows; NaN on invalid ones."""
    _after_previous_launch(PDL)
    n_items = n_rows * n_chunks
    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        row = item // n_chunks
        c = item % n_chunks
        inv_t, _, _ = _temperature(row, t_ptr, flags, temperature)
        res = ws_ptr + res_off + row.to(tl.int64) * NR
        h = tl.load(res)
        lse = tl.load(res + 1).to(tl.float32, bitcast=True)
        gid = tl.load(res + 2)
        status = tl.load(res + 3)
        cols = c * CHUNK + tl.arange(0, CHUNK)
        live = cols < vocab
        z = tl.load(x_ptr + row.to(tl.int64) * xs + cols, mask=live, other=float("-inf")).to(tl.float32) * inv_t
        kept = (z > float("-inf")) & (_key(z) >= h)
        y = tl.where(kept, exp_f32(z - lse), 0.0)
        y = tl.where(status == ST_GREEDY, tl.where(cols == gid, 1.0, 0.0), y)
        y = tl.where((status == ST_INVALID) | (status == ST_UNDECIDED), float("nan"), y)
        tl.store(y_ptr + row.to(tl.int64) * ys + cols, y, mask=live)
