"""The conformance kit's sampler section: prove a sampler computes what `anysoftmax.sampling`
defines (docs/sampling.md), against the float64 reference (`anysoftmax.sampling.reference`).

    from anysoftmax.testing.sampling import check_sampler
    report = check_sampler(my_sample, probs_fn=my_probs, logprobs_fn=my_logprobs, device="cuda")

`sample_fn(logits, *, temperature, top_k, top_p, min_p, seed, offset, return_logprobs)`,
`probs_fn(logits, *, temperature, top_k, top_p, min_p)` and
`logprobs_fn(logits, ids, *, temperature, top_n)` have the signatures of
`anysoftmax.sampling.sample`, `probs` and `logprobs` (without `backend`); the kit passes only
the keywords a case sets. `probs_fn` and `logprobs_fn` may be None: their checks are skipped.

The checks (each named; a failure names its case):

* **kept set and probabilities** of deliberate cases, compared exactly: ties at the k-th value
  (all kept), a tie group straddling the top-p boundary (kept whole), a top-p boundary met
  exactly (``mass strictly above == top_p``: dropped), top-p on the top-k *renormalised*
  distribution, min_p ties, greedy rows (lowest index among tied maxima), invalid rows (NaN,
  +inf, all -inf: NaN probabilities, id -1); and of random cases (per-row tensors, batch dims,
  bfloat16 and float16 logits; 16 rows of 20000 whose largest values crowd the first or the last
  blocks, sit one per block, tie across blocks), where a token whose decision is within float32 rounding of its
  boundary in the reference may go either way (that row's values are then not compared).
  Values within ``PROB_ATOL + PROB_RTOL * p``; every drawn id in the kept set, its returned
  log-probability within ``LOGPROB_ATOL + LOGPROB_RTOL * |ref|``.
* **chi-square** goodness of fit of `CHI2_DRAWS` seeded draws against the reference
  distribution: one int seed over identical rows, one seed per row, offsets 0..7 over eight
  calls, no seed, and per-row keywords over two interleaved distributions. Each rejects at
  p < `SIGNIFICANCE` (1e-4). Their data and seeds come from the fixed `CHI2_SEED`, not the
  kit's seed, so a sampler's verdict is the same on every run (a correct sampler would fail one
  of the five with probability <= 5e-4 over the choice of that seed).
  Power: with n = 8000 draws and about 10 degrees of freedom, a sampler whose distribution q
  has ``n * sum((q - p)**2 / p) >= 60`` (e.g. 3 % of the mass moved between two tokens of
  p = 0.2) fails with probability >= 0.99 (noncentral chi-square, critical value 35.6);
  each planted bug of the kit's own tests is tens of times that or fails deterministically.
* **the definition**: on 2000 rows, the drawn ids equal the draw the Philox definition gives
  (`anysoftmax.sampling.rng`, evaluated in float64) in >= `AGREEMENT` of rows (near-ties may
  differ), with an int seed and with per-row seeds and offsets across the 64-bit range.
* **determinism and position**: the same seed and offset give the same ids; another offset or
  seed changes them; rows of one int seed draw independently; a per-row seed gives a request
  the same draw wherever it sits in the batch (permuted, alone, in a sub-batch).
* **no seed**: two calls draw differently, ``torch.manual_seed`` reproduces a call (the
  caller's generator state is restored afterwards).
* **logprobs** (with top_n, the greedy limit, exact ties lower id first) against
  ``log_softmax`` in float64; **bad input**: ValueError/TypeError naming the argument (per-row
  values are checked on the CPU; on an accelerator, out-of-range values give NaN rows and id -1).
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..sampling.reference import (Distribution, mass_strictly_above, reference_distribution, reference_draw,
                                  reference_logprobs)
from ..sampling.rng import row_words
from ..sampling.spec import SamplingSpec
from .kit import Check, KitReport, run_checks

SIGNIFICANCE = 1e-4
CHI2_DRAWS = 8000
# The chi-square checks' data and seeds, whatever the kit's seed: a sampler's verdict is the same
# on every run (with a random seed a correct sampler would fail one run in about 2000).
CHI2_SEED = 47
AGREEMENT = 0.999
# float32 probabilities: z = logits / t rounds (|z - max z| <= ~50 in the cases: 50 * 6e-8
# relative through exp), the sums add log2(V) roundings; 2e-5 leaves a 4x margin.
PROB_ATOL, PROB_RTOL = 1e-6, 2e-5
LOGPROB_ATOL, LOGPROB_RTOL = 2e-5, 1e-5
# A reference decision this close to its boundary may go either way in float32 arithmetic.
NEAR_Z, NEAR_MASS, NEAR_RATIO = 1e-6, 1e-4, 2e-5
LN2_F32 = float(torch.tensor(math.log(2.0), dtype=torch.float32))  # exp(-LN2_F32) rounds to 0.5 in float32
NEG = -math.inf
LONG_ROW = 20000  # logits a row of the long-rows logprobs check: longer than the kernels' chunks (4096-16384)


@dataclass(frozen=True)
class FilterCase:
    """Logits and keywords (`make(gen)` -> (float32 CPU logits, keywords with CPU tensors));
    `exact`: boundaries built deliberately, so the kept set must match exactly."""

    name: str
    make: Callable[[torch.Generator], tuple[torch.Tensor, dict]] = field(repr=False)
    exact: bool = True
    dtypes: tuple[torch.dtype, ...] = (torch.float32,)


def _pad(rows: list[list[float]], vocab: int, fill: float) -> torch.Tensor:
    return torch.tensor([r + [fill] * (vocab - len(r)) for r in rows], dtype=torch.float32)


def _topk_ties(gen):
    x = _pad([[5, 3, 3, 3, 1, 0, -1], [2, 2, 1, 0], [4, 3.5, 3, 2, 1], [1] * 12], 12, -2.0)
    return x, dict(top_k=torch.tensor([2, 1, 3, 5]), temperature=torch.tensor([1.0, 0.5, 2.0, 1.0]))


def _topp_tie_group(gen):
    x = _pad([[2, 1, 1, 1, 0, 0, -1, -1, -2, -3], [1, 1, 1, 0, -1], [3, 2, 2, 0]], 10, -3.0)
    p = torch.softmax(x.double(), -1)
    # Row 0: the three tokens at 1 straddle top_p = p(2) + p(1) / 2 (a sort that splits ties
    # keeps one); row 1: a tied maximum, kept whole; row 2: a tie group wholly below the cut.
    top_p = torch.tensor([float(p[0, 0] + p[0, 1] / 2), 0.1, float(p[2, 0] / 2)])
    return x, dict(top_p=top_p)


def _topp_exact_boundary(gen):
    # Weights 1, 1/2, 1/2 (exp(-LN2_F32) rounds to 0.5 in float32; the true value is a hair
    # below, so float64 agrees): the mass strictly above the two halves is exactly 0.5.
    half = -LN2_F32
    x = torch.tensor([[0, half, half, NEG, NEG, NEG, NEG, NEG],
                      [NEG, half, NEG, 0, NEG, half, NEG, NEG],
                      [0, half, half, NEG, NEG, NEG, NEG, NEG],
                      [0, half, half, -1, -2, -3, -4, -5]], dtype=torch.float32)
    return x, dict(top_p=torch.tensor([0.5, 0.5, 0.5 + 2**-10, 0.5]), top_k=torch.tensor([0, 0, 0, 3]))


def _topp_after_topk(gen):
    x = _pad([[1, 0.5], [1, 0.5], [1, 0.5]], 20, 0.0)
    # top_k = 2 leaves q = (0.62, 0.38): top_p = 0.6 drops the second token there, but keeps
    # it on the un-renormalised distribution (mass above 0.12).
    return x, dict(top_k=torch.tensor([2, 2, 0]), top_p=torch.tensor([0.6, 0.7, 0.6]))


def _minp_ties(gen):
    x = _pad([[2, 2, 1, 0], [3, 1, 1, 0.5], [0.5, 0.25, 0.0]], 9, -1.0)
    return x, dict(min_p=torch.tensor([1.0, 0.1, 0.0]))


def _greedy(gen):
    x = _pad([[1, 3, 3, 2], [0, NEG, 5, 5], [2, 1, 0.5], [0, 1, 2, 3], [7, 7, 7, 7]], 6, -1.0)
    # temperature 0 (greedy; the filters cannot remove the argmax) beside sampled rows
    return x, dict(temperature=torch.tensor([0.0, 0.0, 0.8, 0.0, 0.0]), top_k=torch.tensor([1, 0, 2, 2, 3]),
                   top_p=torch.tensor([0.1, 1.0, 0.9, 0.5, 1.0]), min_p=torch.tensor([0.9, 0.0, 0.0, 0.2, 0.0]))


def _specials(gen):
    x = _pad([[0, math.nan, 1], [math.inf, 0, 1], [NEG] * 7, [0, NEG, 1, NEG, 2], [1, 2, 3]], 7, NEG)
    x[4, 3:] = -1.0
    return x, dict(temperature=torch.tensor([1.0, 1.0, 1.0, 0.7, 0.0]))


def _randn(gen, shape, scale=3.0):
    return torch.randn(shape, generator=gen) * scale


def _plain(gen):
    return _randn(gen, (6, 8)), {}


def _temperature(gen):
    return _randn(gen, (4, 100)), dict(temperature=0.7, top_k=None)


def _mixed(gen):
    return _randn(gen, (8, 1000)), dict(
        temperature=torch.tensor([0.5, 0.75, 1.0, 1.25, 1.5, 0.9, 1.1, 0.6]),
        top_k=torch.tensor([0, 1, 5, 50, 999, 1000, 2000, 20]),
        top_p=torch.tensor([1.0, 0.9, 0.5, 0.3, 1.0, 0.95, 0.8, 0.01]),
        min_p=torch.tensor([0.0, 0.05, 0.0, 0.1, 0.2, 0.0, 0.01, 0.5]))


def _batch_dims(gen):
    return _randn(gen, (2, 3, 50)), dict(
        temperature=torch.tensor([[0.8, 1.0, 1.2], [0.0, 0.9, 1.0]]), top_k=torch.tensor([0, 10, 3, 7, 50, 1]),
        top_p=torch.tensor([[[0.9], [1.0], [0.6]], [[0.7], [0.99], [0.5]]]), min_p=0.05)


def _numbers(gen):
    return _randn(gen, (5, 300)), dict(temperature=1.3, top_k=40, top_p=0.8, min_p=0.02)


def _vocabulary_rows(gen):
    """16 rows of 20000 (not a multiple of any power of two above 32): a sampler that bounds the
    k-th value by block maxima, or cuts rows into chunks, meets the largest values crowded into
    the first or the last (partial) blocks, spread one per block, tied across block boundaries,
    and rows mostly -inf."""
    rows, vocab = 16, 20000
    x = _randn(gen, (rows, vocab))
    x[4] = x[4].sort(descending=True).values
    x[5] = x[5].sort().values
    x[6] = -5.0
    x[6, 13::64] = torch.rand(x[6, 13::64].shape, generator=gen)
    x[7] = (x[7] * 0.5).round()
    x[8, : vocab // 2] = NEG
    x[9, -40:] += 8.0
    top_k = torch.tensor([50, 1, 64, 20, 50, 50, 8, 30, 10, 5, 0, 100, 3, 64, 65, 40])
    top_p = torch.tensor([0.9, 1.0, 0.95, 0.5, 0.9, 0.9, 1.0, 0.8, 0.99, 1.0, 0.9, 0.7, 1.0, 0.6, 1.0, 0.9])
    min_p = torch.tensor([0.05, 0.0, 0.0, 0.1, 0.0, 0.02, 0.0, 0.0, 0.05, 0.0, 0.0, 0.01, 0.0, 0.0, 0.2, 0.0])
    return x, dict(temperature=torch.rand(rows, generator=gen) + 0.5, top_k=top_k, top_p=top_p, min_p=min_p)


FILTER_CASES = (
    FilterCase("topk-ties-at-kth", _topk_ties),
    FilterCase("topp-tie-group-straddles", _topp_tie_group),
    FilterCase("topp-boundary-exact", _topp_exact_boundary),
    FilterCase("topp-after-topk-renormalised", _topp_after_topk),
    FilterCase("minp-ties", _minp_ties),
    FilterCase("greedy-rows", _greedy),
    FilterCase("invalid-rows", _specials),
    FilterCase("plain-v8", _plain, exact=False),
    FilterCase("temperature-v100", _temperature, exact=False),
    FilterCase("per-row-mixed-v1000", _mixed, exact=False,
               dtypes=(torch.float32, torch.bfloat16, torch.float16)),
    FilterCase("batch-dims-v50", _batch_dims, exact=False),
    FilterCase("numbers-v300", _numbers, exact=False),
    FilterCase("vocabulary-rows-v20000", _vocabulary_rows, exact=False, dtypes=(torch.float32, torch.bfloat16)),
)


# ---- helpers ----------------------------------------------------------------------------------

def _gen(seed: int, name: str) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}/{name}".encode()))


def _on(device: str, kwargs: dict) -> dict:
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}


def _spec(logits: torch.Tensor, kwargs: dict, op: str = "sample") -> SamplingSpec:
    keys = ("temperature",) if op == "logprobs" else ("temperature", "top_k", "top_p", "min_p", "seed", "offset")
    return SamplingSpec.from_request(op, logits.cpu(), **{k: (v.cpu() if isinstance(v, torch.Tensor) else v)
                                                          for k, v in kwargs.items() if k in keys})


def _ambiguous(dist: Distribution, spec: SamplingSpec) -> torch.Tensor:
    """[rows, V] bool: tokens whose reference decision lies within float32 rounding of a
    boundary (the k-th z, the top_p mass, the min_p ratio); exact ties are decided, not ambiguous."""
    z = dist.z
    vocab = z.shape[-1]
    z_sorted, order = z.sort(dim=-1, descending=True, stable=True)
    k = spec.column("top_k", z.device)
    k = torch.where((k <= 0) | (k >= vocab), vocab, k)
    kth = z_sorted.gather(-1, k - 1)
    near = ((z - kth).abs() <= NEAR_Z * kth.abs().clamp_min(1)) & (z != kth)
    keep_k = z >= kth
    w = torch.exp(z - z_sorted[:, :1])
    q = torch.where(keep_k, w, 0)
    q = q / q.sum(-1, keepdim=True)
    above = torch.empty_like(q).scatter_(-1, order, mass_strictly_above(q.gather(-1, order)))
    top_p = spec.column("top_p", z.device, z.dtype)
    near |= keep_k & ((above - top_p).abs() <= NEAR_MASS) & (top_p < 1)
    min_p = spec.column("min_p", z.device, z.dtype)
    near |= ((w - min_p).abs() <= NEAR_RATIO * min_p) & (min_p > 0)
    return near & ~dist.greedy & ~dist.invalid


def _rows_named(mask: torch.Tensor) -> str:
    rows = [int(r) for r in torch.arange(mask.numel())[mask.reshape(-1).cpu()][:5]]
    return f"rows {rows}" + (" ..." if int(mask.sum()) > 5 else "")


def _check_probs(case: FilterCase, got: torch.Tensor, logits: torch.Tensor, dist: Distribution,
                 spec: SamplingSpec) -> None:
    shape = tuple(logits.shape)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32 and tuple(got.shape) == shape, \
        f"probs: expected float32 of shape {list(shape)}, got {getattr(got, 'dtype', type(got))} " \
        f"{list(getattr(got, 'shape', []))}"
    got = got.detach().cpu().double().reshape(spec.rows, spec.vocab)
    invalid = dist.invalid[:, 0]
    nan_rows = torch.isnan(got).all(-1)
    assert torch.equal(nan_rows, invalid), \
        f"invalid rows (NaN, +inf, all -inf) must be all NaN and only those: expected NaN on " \
        f"{_rows_named(invalid)}, got {_rows_named(nan_rows)}"
    valid = ~invalid
    assert not bool(torch.isnan(got[valid]).any()), f"NaN in valid rows: {_rows_named(torch.isnan(got).any(-1))}"
    kept = got > 0
    free = _ambiguous(dist, spec) if not case.exact else torch.zeros_like(kept)
    wrong = (kept != dist.kept) & ~free & valid[:, None]
    if bool(wrong.any()):
        r = int(wrong.any(-1).nonzero()[0, 0])
        extra = (kept[r] & ~dist.kept[r]).nonzero()[:, 0].tolist()
        missing = (dist.kept[r] & ~kept[r]).nonzero()[:, 0].tolist()
        expected = dist.kept[r].nonzero()[:, 0].tolist()[:12]
        raise AssertionError(f"kept set differs from the reference on row {r}: kept tokens {extra[:8]} the reference "
                             f"drops, dropped tokens {missing[:8]} it keeps (expected {expected})")
    same_set = valid & ((kept == dist.kept) | ~valid[:, None]).all(-1)
    err = (got - dist.probs).abs() - (PROB_ATOL + PROB_RTOL * dist.probs.abs())
    bad = (err > 0) & same_set[:, None]
    if bool(bad.any()):
        r, i = (int(v) for v in bad.nonzero()[0])
        raise AssertionError(f"probability of token {i} on row {r}: got {float(got[r, i]):.9g}, reference "
                             f"{float(dist.probs[r, i]):.9g} (tolerance {PROB_ATOL} + {PROB_RTOL} * p)")


def _close_logprob(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    both_inf = torch.isinf(got) & torch.isinf(ref) & (torch.sign(got) == torch.sign(ref))
    return both_inf | ((got - ref).abs() <= LOGPROB_ATOL + LOGPROB_RTOL * ref.abs())


def _check_draws(case: FilterCase, ids, lp, logits: torch.Tensor, dist: Distribution, spec: SamplingSpec) -> None:
    batch = tuple(logits.shape[:-1])
    for what, t, dtype in (("ids", ids, torch.int64), ("log-probabilities", lp, torch.float32)):
        assert isinstance(t, torch.Tensor) and t.dtype == dtype and tuple(t.shape) == batch, \
            f"sample: {what} must be {dtype} of shape {list(batch)}, got {getattr(t, 'dtype', type(t))} " \
            f"{list(getattr(t, 'shape', []))}"
    ids, lp = ids.cpu().reshape(-1), lp.cpu().double().reshape(-1)
    invalid = dist.invalid[:, 0]
    assert bool((ids[invalid] == -1).all()), f"invalid rows must draw id -1, got {ids[invalid].tolist()}"
    assert bool(torch.isnan(lp[invalid]).all()), "invalid rows must give a NaN log-probability"
    valid = ~invalid
    assert bool(((ids[valid] >= 0) & (ids[valid] < spec.vocab)).all()), f"ids out of [0, V): {ids.tolist()}"
    rows = torch.arange(spec.rows)[valid]
    picked = ids[valid]
    in_kept = dist.kept[rows, picked]
    # A near-boundary token may flip either way: it may be drawn, and it changes its row's
    # normalisation (that row's log-probability is not compared).
    free = _ambiguous(dist, spec) if not case.exact else torch.zeros_like(dist.kept)
    in_kept |= free[rows, picked]
    if not bool(in_kept.all()):
        r = int(rows[~in_kept][0])
        raise AssertionError(f"row {r} drew token {int(ids[r])}, outside the kept set "
                             f"{dist.kept[r].nonzero()[:, 0].tolist()[:12]}")
    greedy = dist.greedy[:, 0] & valid
    want = dist.z.argmax(-1)
    assert torch.equal(ids[greedy], want[greedy]), \
        f"greedy rows (temperature 0) must draw the argmax, lowest index among ties: expected " \
        f"{want[greedy].tolist()}, got {ids[greedy].tolist()}"
    ref_lp = torch.log(dist.probs[rows, picked])
    ok = _close_logprob(lp[valid], ref_lp) | free[rows].any(-1)
    if not bool(ok.all()):
        j = int((~ok).nonzero()[0, 0])
        raise AssertionError(f"return_logprobs on row {int(rows[j])}: got {float(lp[valid][j]):.9g}, the drawn "
                             f"token's reference log-probability is {float(ref_lp[j]):.9g}")


def _filter_check(case: FilterCase, dtype, sample_fn, probs_fn, device: str, which: str):
    def run(seed: int) -> str | None:
        x, kwargs = case.make(_gen(seed, case.name))
        logits = x.to(dtype).to(device)
        kwargs = _on(device, kwargs)
        spec = _spec(logits, kwargs)
        dist = reference_distribution(logits, spec)
        if which == "probs":
            _check_probs(case, probs_fn(logits, **kwargs), logits, dist, spec)
        else:
            seed_value = zlib.crc32(f"{seed}/{case.name}/draw".encode())
            out = sample_fn(logits, **kwargs, seed=seed_value, return_logprobs=True)
            assert isinstance(out, tuple) and len(out) == 2, \
                "sample(..., return_logprobs=True) must return (ids, logprobs)"
            _check_draws(case, out[0], out[1], logits, dist, spec)
        return None
    return run


# ---- chi-square ---------------------------------------------------------------------------------

def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int, float]:
    """Pearson's statistic of `counts` (per token) against `probs` (float64), bins with an
    expected count below 5 pooled into one: (statistic, degrees of freedom, p-value). A count
    on a token of probability 0 is an AssertionError (no fit can excuse it)."""
    n = float(counts.sum())
    impossible = (counts > 0) & (probs <= 0)
    if bool(impossible.any()):
        raise AssertionError(f"drew tokens of probability 0 (outside the kept set): "
                             f"{impossible.nonzero()[:, 0].tolist()[:8]}")
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big].double(), counts[~big].double().sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = int(obs.numel()) - 1
    if df <= 0:
        return stat, df, 1.0
    p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                      torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, df, p


def _chi2_row(gen) -> tuple[torch.Tensor, dict]:
    return torch.randn(1, 24, generator=gen) * 1.5, dict(temperature=0.8, top_k=16, top_p=0.95, min_p=0.01)


def _counts(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    ids = ids.cpu().reshape(-1)
    assert bool(((ids >= 0) & (ids < vocab)).all()), f"ids out of [0, {vocab}): {ids[(ids < 0) | (ids >= vocab)][:5]}"
    return torch.bincount(ids, minlength=vocab)


def _assert_fit(counts: torch.Tensor, probs: torch.Tensor, what: str) -> None:
    stat, df, p = chi_square(counts, probs)
    if p < SIGNIFICANCE:
        worst = ((counts.double() - probs * counts.sum()).abs() / (probs * counts.sum()).clamp_min(1)).argmax()
        raise AssertionError(f"{what}: draws do not follow the reference distribution: chi-square {stat:.1f} on "
                             f"{df} degrees of freedom, p = {p:.2e} < {SIGNIFICANCE} (token {int(worst)}: drawn "
                             f"{int(counts[worst])} times, expected {float(probs[worst] * counts.sum()):.1f})")


def _chi2_check(mode: str, sample_fn, device: str):
    def run(kit_seed: int) -> str | None:
        seed = CHI2_SEED  # (not the kit's seed: see CHI2_SEED)
        gen = _gen(seed, f"chi2/{mode}")
        row, kwargs = _chi2_row(gen)
        vocab, n = row.shape[-1], CHI2_DRAWS
        if mode == "per-row-keywords":
            other = torch.randn(1, vocab, generator=gen) * 1.5
            x = torch.cat([row, other]).repeat(n // 2, 1)
            pairs = dict(temperature=[0.6, 1.4], top_k=[5, 0], top_p=[1.0, 0.8], min_p=[0.0, 0.05])
            kwargs = {k: torch.tensor(v).repeat(n // 2) for k, v in pairs.items()}
            ids = sample_fn(x.to(device), **_on(device, kwargs), seed=int(torch.randint(2**62, (), generator=gen)))
            ids = ids.cpu()
            probs = reference_distribution(x[:2], _spec(x[:2], {k: v[:2] for k, v in kwargs.items()})).probs
            stats = [chi_square(_counts(ids[j::2], vocab), probs[j]) for j in range(2)]
            stat, df = sum(s[0] for s in stats), sum(s[1] for s in stats)
            p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                              torch.tensor(stat / 2, dtype=torch.float64)))
            if p < SIGNIFICANCE:
                raise AssertionError(f"per-row keywords: draws of two interleaved distributions do not follow them: "
                                     f"chi-square {stat:.1f} on {df} degrees of freedom, p = {p:.2e}")
            return None
        probs = reference_distribution(row, _spec(row, kwargs)).probs[0]
        x = row.repeat(n, 1).to(device)
        seed_int = int(torch.randint(-2**63, 2**63 - 1, (), generator=gen))
        if mode == "int-seed":
            ids = sample_fn(x, **kwargs, seed=seed_int)
        elif mode == "per-row-seeds":
            seeds = torch.randint(-2**63, 2**63 - 1, (n,), generator=gen)
            ids = sample_fn(x, **kwargs, seed=seeds.to(device), offset=3)
        elif mode == "offsets":
            step = n // 8
            ids = torch.cat([sample_fn(x[:step], **kwargs, seed=seed_int, offset=k).cpu() for k in range(8)])
        else:  # no seed
            with _forked_rng(device):
                torch.manual_seed(seed)
                ids = sample_fn(x, **kwargs)
        _assert_fit(_counts(ids, vocab), probs, mode)
        return None
    return run


def _forked_rng(device: str):
    """torch's generators of the CPU and of `device`, restored on exit (the kit's manual_seed
    calls leave the caller's state as it was)."""
    d = torch.device(device)
    if d.type == "cpu":
        return torch.random.fork_rng(devices=[])
    index = d.index if d.index is not None else getattr(torch, d.type).current_device()
    return torch.random.fork_rng(devices=[index], device_type=d.type)


# ---- the definition, determinism, position, advancing --------------------------------------------

def _definition_check(mode: str, sample_fn, device: str):
    def run(seed: int) -> str | None:
        gen = _gen(seed, f"definition/{mode}")
        shape, vocab = (4, 500), 64
        rows = math.prod(shape)
        x = torch.randn(*shape, vocab, generator=gen) * 2
        pick = lambda values: torch.tensor(values)[torch.randint(len(values), shape, generator=gen)]  # noqa: E731
        kwargs = dict(temperature=pick([0.0, 0.5, 0.8, 1.0, 1.3]), top_k=pick([0, 5, 20, 64]),
                      top_p=pick([1.0, 0.9, 0.7]), min_p=pick([0.0, 0.0, 0.05]))
        if mode == "int-seed":
            kwargs.update(seed=int(torch.randint(-2**63, 2**63 - 1, (), generator=gen)), offset=2**33 + 5)
        else:
            kwargs.update(seed=torch.randint(-2**63, 2**63 - 1, shape, generator=gen),
                          offset=torch.randint(0, 2**40, shape, generator=gen))
        spec = _spec(x, kwargs)
        want, _ = reference_draw(x, spec, row_words(spec))
        got = sample_fn(x.to(device), **_on(device, kwargs)).cpu()
        agree = float((got == want).double().mean())
        if agree < AGREEMENT:
            r = int((got != want).reshape(-1).nonzero()[0, 0])
            raise AssertionError(f"draws follow the Philox definition in {agree:.1%} of {rows} rows (needs "
                                 f">= {AGREEMENT:.1%}): row {r} drew {int(got.reshape(-1)[r])}, the definition "
                                 f"gives {int(want.reshape(-1)[r])}")
        return None
    return run


def _near_uniform(gen, rows=64, vocab=100) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=gen) * 0.1


def _share_equal(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.cpu() == b.cpu()).double().mean())


# Two draws from a near-uniform 100-token row agree with probability ~1/100: more than a quarter
# of 64 rows agreeing means the randomness did not change.
MAX_SHARED = 0.25


def _determinism_check(what: str, sample_fn, device: str):
    def run(seed: int) -> str | None:
        gen = _gen(seed, f"determinism/{what}")
        x = _near_uniform(gen).to(device)
        s = int(torch.randint(2**62, (), generator=gen))
        seeds = torch.randint(-2**63, 2**63 - 1, (64,), generator=gen).to(device)
        offsets = torch.randint(0, 2**40, (64,), generator=gen).to(device)
        if what == "same seed and offset, same ids":
            for kw in (dict(seed=s, offset=7), dict(seed=seeds, offset=offsets)):
                a, b = sample_fn(x, **kw), sample_fn(x, **kw)
                assert torch.equal(a.cpu(), b.cpu()), f"two calls with {sorted(kw)} gave different ids"
        elif what == "another offset changes the draw":
            for a, b in ((sample_fn(x, seed=s, offset=0), sample_fn(x, seed=s, offset=1)),
                         (sample_fn(x, seed=seeds, offset=offsets), sample_fn(x, seed=seeds, offset=offsets + 1))):
                shared = _share_equal(a, b)
                assert shared <= MAX_SHARED, f"offsets k and k+1 gave the same id on {shared:.0%} of 64 rows " \
                                             f"(~1% expected): the offset does not enter the draw"
        elif what == "a keyword as a tensor, then as the same number, same ids":
            # A kernel's launch bound to read a keyword operand must not serve the call that
            # passes the number (its operand absent), nor the other way round.
            per_row = dict(temperature=torch.full((64,), 0.8, device=device), top_k=torch.full((64,), 20,
                                                                                                device=device))
            x = _near_uniform(gen, vocab=97).to(device)  # (a shape no other check calls with)
            ids = [sample_fn(x, seed=s, **kw).cpu() for kw in (per_row, dict(temperature=0.8, top_k=20), per_row)]
            for other in ids[1:]:
                shared = _share_equal(ids[0], other)
                assert shared >= 63 / 64, f"temperature and top_k as per-row tensors and as numbers of the same " \
                                          f"values drew the same id on only {shared:.0%} of 64 rows"
        elif what == "one form on new logits, each call its own draw":
            # What a sampler keeps between calls of one form (a workspace, statistics, bound
            # launches) must never carry one call's logits into the next.
            xa = _near_uniform(gen, vocab=89).to(device)  # (a shape no other check calls with)
            xb = (torch.randn(64, 89, generator=gen) * 4).to(device)
            kw = dict(seed=seeds, offset=offsets, top_k=20)
            first, other, again = (sample_fn(v, **kw).cpu() for v in (xa, xb, xa))
            assert torch.equal(first, again), "the same logits drawn again after other logits of the same shape " \
                                              "gave other ids"
            alone = sample_fn(xb[:17], seed=seeds[:17], offset=offsets[:17], top_k=20).cpu()
            shared = _share_equal(other[:17], alone)
            assert shared >= 16 / 17, f"rows drawn after a call on other logits of the same shape agree with the " \
                                      f"same rows drawn alone on only {shared:.0%} of 17 (per-row seeds)"
        elif what == "another seed changes the draw":
            shared = _share_equal(sample_fn(x, seed=s), sample_fn(x, seed=s + 1))
            assert shared <= MAX_SHARED, f"seeds s and s+1 gave the same id on {shared:.0%} of 64 rows"
        else:  # rows of one int seed draw independently
            same = x[:1].expand(64, -1).contiguous()
            ids = sample_fn(same, seed=s).cpu()
            top = float(torch.bincount(ids, minlength=x.shape[-1]).max()) / 64
            assert top <= MAX_SHARED, f"64 identical rows with one int seed drew the same id {top:.0%} of the time " \
                                      f"(~1% expected): rows reuse one random number"
        return None
    return run


def _position_check(sample_fn, device: str):
    def run(seed: int) -> str | None:
        gen = _gen(seed, "position")
        rows = 32
        x = torch.randn(rows, 50, generator=gen) * 2
        kw = dict(seed=torch.randint(-2**63, 2**63 - 1, (rows,), generator=gen),
                  offset=torch.randint(0, 2**40, (rows,), generator=gen),
                  temperature=torch.rand(rows, generator=gen) + 0.5, top_p=torch.rand(rows, generator=gen) * 0.5 + 0.5)
        ids = sample_fn(x.to(device), **_on(device, kw)).cpu()
        perm = torch.randperm(rows, generator=gen)
        moved = sample_fn(x[perm].to(device), **_on(device, {k: v[perm] for k, v in kw.items()})).cpu()
        assert torch.equal(moved, ids[perm]), "a per-row seed must give a row the same draw wherever it sits: " \
            f"permuted rows drew {moved[:8].tolist()}, expected {ids[perm][:8].tolist()}"
        for part in (slice(5, 9), slice(17, 18)):
            sub = sample_fn(x[part].to(device), **_on(device, {k: v[part] for k, v in kw.items()})).cpu()
            assert torch.equal(sub, ids[part]), f"rows {part.start}..{part.stop - 1} alone drew {sub.tolist()}, " \
                                                f"in the batch {ids[part].tolist()}"
        return None
    return run


def _advancing_check(sample_fn, device: str):
    def run(seed: int) -> str | None:
        x = _near_uniform(_gen(seed, "advancing")).to(device)
        with _forked_rng(device):
            torch.manual_seed(seed)
            a, b = sample_fn(x).cpu(), sample_fn(x).cpu()
            torch.manual_seed(seed)
            c = sample_fn(x).cpu()
        assert torch.equal(a, c), "without a seed, torch.manual_seed must reproduce a draw (the default generator " \
                                  "of the device supplies the randomness)"
        shared = _share_equal(a, b)
        assert shared <= MAX_SHARED, f"two calls without a seed gave the same id on {shared:.0%} of 64 rows: the " \
                                     f"generator does not advance"
        return None
    return run


def _graph_advancing_check(sample_fn, device: str):
    """On CUDA: a captured call without a seed draws anew at each replay, as torch's own random
    ops do in a CUDA graph (a seed read on the host at capture would be frozen into the graph)."""
    def run(seed: int) -> str | None:
        x = _near_uniform(_gen(seed, "graph-advancing")).to(device)
        with _forked_rng(device):
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                sample_fn(x)  # (warm-up off the capture: compiles, binds)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = sample_fn(x)
            replays = []
            for _ in range(2):
                graph.replay()
                replays.append(out.cpu())
        shared = _share_equal(*replays)
        assert shared <= MAX_SHARED, f"two replays of a captured call without a seed gave the same id on " \
                                     f"{shared:.0%} of 64 rows: the draw does not advance per replay"
        return None
    return run


# ---- logprobs ---------------------------------------------------------------------------------

def _logprobs_check(what: str, logprobs_fn, device: str):
    def run(seed: int) -> str | None:
        gen = _gen(seed, f"logprobs/{what}")
        if what == "batch-dims-top-n-0":
            x = torch.randn(2, 3, 40, generator=gen) * 2
            ids = torch.randint(0, 40, (2, 3, 2), generator=gen)
            kwargs, top_n = dict(temperature=torch.tensor([[0.5, 1.0, 2.0], [1.0, 0.0, 0.7]])), 0
        elif what == "long-rows-top-n-0":  # (rows a kernel splits: each part's logsumexp must join the row's)
            vocab = LONG_ROW
            x = torch.randn(4, vocab, generator=gen) * 3
            x[1, vocab - 9] = math.nan  # an invalid row, its NaN far from the start
            x[2, :vocab // 2] = -math.inf  # a row whose first half holds nothing
            x[3, [1, vocab - 1]] = 40.0  # tied maxima of a greedy row at both ends
            ids = torch.randint(0, vocab, (4, 3), generator=gen)
            ids[:, 0] = torch.tensor([vocab - 1, 0, vocab // 2 - 1, vocab - 1])
            kwargs, top_n = dict(temperature=torch.tensor([0.8, 1.0, 1.3, 0.0])), 0
        else:
            x = torch.randn(6, 200, generator=gen) * 3
            x[3, :] = -1.0  # exact ties: the top ids come lower id first
            x[3, [150, 7, 99]] = 2.0
            x[4, 10] = math.nan  # an invalid row
            x[5, [3, 8]] = 30.0  # tied maxima on a greedy row (randn * 3 stays far below)
            ids = torch.randint(0, 200, (6, 4), generator=gen)
            kwargs, top_n = dict(temperature=torch.tensor([1.0, 0.5, 1.7, 1.0, 1.0, 0.0])), 5
        spec = _spec(x, kwargs, "logprobs")
        ref = reference_logprobs(x, spec).reshape(-1, x.shape[-1])
        out = logprobs_fn(x.to(device), ids.to(device), **_on(device, kwargs), **({"top_n": top_n} if top_n else {}))
        got = out[0] if top_n else out
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float32 and got.shape == ids.shape, \
            f"logprobs must be float32 of the ids' shape {list(ids.shape)}, got {getattr(got, 'dtype', None)} " \
            f"{list(getattr(got, 'shape', []))}"
        flat_ids = ids.reshape(-1, ids.shape[-1])
        want = ref.gather(-1, flat_ids)
        got = got.cpu().double().reshape(want.shape)
        nan = torch.isnan(want)
        ok = (torch.isnan(got) == nan) & (nan | _close_logprob(got, want))
        if not bool(ok.all()):
            r, j = (int(v) for v in (~ok).nonzero()[0])
            raise AssertionError(f"log-probability of id {int(flat_ids[r, j])} on row {r}: got {float(got[r, j]):.9g}, "
                                 f"reference {float(want[r, j]):.9g}")
        if not top_n:
            return None
        assert isinstance(out, tuple) and len(out) == 3, "logprobs(..., top_n > 0) must return (logprobs, values, ids)"
        values, top_ids = out[1].cpu().double(), out[2].cpu()
        assert values.shape == (6, top_n) and top_ids.shape == (6, top_n) and top_ids.dtype == torch.int64, \
            f"top-n values and int64 ids of shape [6, {top_n}] expected, got {list(values.shape)}, " \
            f"{list(top_ids.shape)} {top_ids.dtype}"
        valid = ~torch.isnan(ref).any(-1)
        assert bool(torch.isnan(values[~valid]).all()), "top-n values of an invalid row must be NaN"
        ref_top = ref[valid].sort(dim=-1, descending=True, stable=True)
        same = _close_logprob(values[valid], ref_top.values[:, :top_n])
        assert bool(same.all()), f"top-n values {values[valid][~same.all(-1)][0].tolist()} differ from the reference " \
                                 f"{ref_top.values[:, :top_n][~same.all(-1)][0].tolist()}"
        at_ids = ref[valid].gather(-1, top_ids[valid].clamp(0, x.shape[-1] - 1))
        assert bool(_close_logprob(values[valid], at_ids).all()), "top-n ids do not hold the top-n values"
        assert top_ids[3, :3].tolist() == [7, 99, 150], \
            f"exact ties must list the lower id first: got {top_ids[3, :3].tolist()}, expected [7, 99, 150]"
        halves = torch.full((2,), -math.log(2), dtype=torch.float64)
        assert top_ids[5, :2].tolist() == [3, 8] and torch.allclose(values[5, :2], halves), \
            f"temperature 0: the two tied maxima get log(1/2) each, lower id first; got ids " \
            f"{top_ids[5, :2].tolist()}, values {values[5, :2].tolist()}"
        return None
    return run


# ---- bad input --------------------------------------------------------------------------------

def _bad_inputs(device: str):
    """(name, which function, call(fn) that must raise, exception type, word its message names)."""
    def x(rows=3, vocab=5):
        return torch.randn(rows, vocab, device=device)

    def on(t):
        return t.to(device)

    def s(**kw):
        return lambda fn: fn(x(), **kw)

    out = [
        ("negative temperature", "sample", s(temperature=-0.5), ValueError, "temperature"),
        ("top_p 0", "sample", s(top_p=0.0), ValueError, "top_p"),
        ("top_p above 1", "sample", s(top_p=1.5), ValueError, "top_p"),
        ("min_p negative", "sample", s(min_p=-0.1), ValueError, "min_p"),
        ("min_p above 1", "sample", s(min_p=1.1), ValueError, "min_p"),
        ("negative top_k", "sample", s(top_k=-1), ValueError, "top_k"),
        ("bool temperature", "sample", s(temperature=True), TypeError, "temperature"),
        ("bool top_k", "sample", s(top_k=True), TypeError, "top_k"),
        ("float top_k", "sample", s(top_k=2.5), TypeError, "top_k"),
        ("integer logits", "sample", lambda fn: fn(torch.arange(6, device=device).reshape(2, 3), seed=1), TypeError,
         "logits"),
        ("probs: negative temperature", "probs", s(temperature=-1.0), ValueError, "temperature"),
        ("probs: integer logits", "probs", lambda fn: fn(torch.ones(2, 3, dtype=torch.int32, device=device)),
         TypeError, "logits"),
        ("logprobs: ids of the wrong shape", "logprobs",
         lambda fn: fn(x(), torch.zeros(4, 2, dtype=torch.int64, device=device)), ValueError, "ids"),
        ("logprobs: negative top_n", "logprobs",
         lambda fn: fn(x(), torch.zeros(3, 2, dtype=torch.int64, device=device), top_n=-1), ValueError, "top_n"),
        ("logprobs: negative temperature", "logprobs",
         lambda fn: fn(x(), torch.zeros(3, 1, dtype=torch.int64, device=device), temperature=-2.0), ValueError,
         "temperature"),
    ]
    for name, bad in (("temperature", torch.ones(4)), ("top_k", torch.ones(4, dtype=torch.int64)),
                      ("top_p", torch.ones(2)), ("min_p", torch.zeros(4)), ("seed", torch.ones(4, dtype=torch.int64)),
                      ("offset", torch.ones(2, dtype=torch.int64))):
        out.append((f"{name} tensor of the wrong length", "sample", s(**{name: on(bad)}), ValueError, name))
    if torch.device(device).type == "cpu":  # values of per-row tensors are read on the CPU only
        out += [("negative value in a temperature tensor", "sample", s(temperature=torch.tensor([1.0, -1.0, 1.0])),
                 ValueError, "temperature"),
                ("0 in a top_p tensor", "sample", s(top_p=torch.tensor([0.5, 0.0, 1.0])), ValueError, "top_p")]
    return out


def _bad_input_check(call, fn, exc_type, word: str):
    def run(seed: int) -> str | None:
        try:
            call(fn)
        except exc_type as exc:
            if word not in str(exc):
                raise AssertionError(f"{type(exc).__name__} does not name {word!r}: {exc}") from None
            return None
        except Exception as exc:
            raise AssertionError(f"expected {exc_type.__name__} naming {word!r}, got {type(exc).__name__}: {exc}") \
                from None
        raise AssertionError(f"accepted without an error (expected {exc_type.__name__} naming {word!r})")
    return run


def _device_values_check(sample_fn, probs_fn, device: str):
    """Out-of-range per-row values on an accelerator: not read on the host, so the row is invalid."""
    def run(seed: int) -> str | None:
        x = torch.randn(3, 7, device=device)
        t = torch.tensor([1.0, -1.0, 1.0], device=device)
        ids = sample_fn(x, temperature=t, seed=1).cpu()
        assert ids[1] == -1 and bool((ids[[0, 2]] >= 0).all()), f"a negative per-row temperature on {device} must " \
                                                                  f"give id -1 on its row only, got {ids.tolist()}"
        if probs_fn is not None:
            p = probs_fn(x, top_p=torch.tensor([0.5, 0.9, 1.5], device=device)).cpu()
            assert bool(torch.isnan(p[2]).all()) and not bool(torch.isnan(p[:2]).any()), \
                "top_p 1.5 in a per-row tensor on an accelerator must give a NaN row (only that row)"
        return None
    return run


# ---- the section ---------------------------------------------------------------------------------

KINDS_THAT_DRAW = ("probs", "sample", "chi-square", "definition", "determinism", "position", "advancing", "logprobs")


def sampler_checks(sample_fn, probs_fn=None, logprobs_fn=None, *, device: str = "cpu") -> list[Check]:
    """Every check of the sampler section for these functions on `device` (see the module)."""
    checks = []
    for case in FILTER_CASES:
        for dtype in case.dtypes:
            label = f"{case.name} {str(dtype).removeprefix('torch.')}"
            if probs_fn is not None:
                checks.append(Check(f"probs {label}", "probs", _filter_check(case, dtype, sample_fn, probs_fn, device,
                                                                              "probs")))
            checks.append(Check(f"sample {label}", "sample", _filter_check(case, dtype, sample_fn, probs_fn, device,
                                                                            "sample")))
    for mode in ("int-seed", "per-row-seeds", "offsets", "no-seed", "per-row-keywords"):
        checks.append(Check(f"chi-square {mode}", "chi-square", _chi2_check(mode, sample_fn, device)))
    for mode in ("int-seed", "per-row-seeds"):
        checks.append(Check(f"definition {mode}", "definition", _definition_check(mode, sample_fn, device)))
    for what in ("same seed and offset, same ids", "a keyword as a tensor, then as the same number, same ids",
                 "one form on new logits, each call its own draw",
                 "another offset changes the draw", "another seed changes the draw",
                 "rows of one int seed draw independently"):
        checks.append(Check(f"determinism {what}", "determinism", _determinism_check(what, sample_fn, device)))
    checks.append(Check("position: a per-row seed draws the same anywhere in the batch", "position",
                        _position_check(sample_fn, device)))
    checks.append(Check("advancing without a seed", "advancing", _advancing_check(sample_fn, device)))
    if torch.device(device).type == "cuda":
        checks.append(Check("advancing without a seed, replayed in a CUDA graph", "advancing",
                            _graph_advancing_check(sample_fn, device)))
    if logprobs_fn is not None:
        for what in ("top-n-ties-greedy-invalid", "batch-dims-top-n-0", "long-rows-top-n-0"):
            checks.append(Check(f"logprobs {what}", "logprobs", _logprobs_check(what, logprobs_fn, device)))
    fns = {"sample": sample_fn, "probs": probs_fn, "logprobs": logprobs_fn}
    for name, which, call, exc, word in _bad_inputs(device):
        if fns[which] is not None:
            checks.append(Check(f"bad-input {name}", "bad-input", _bad_input_check(call, fns[which], exc, word)))
    if torch.device(device).type != "cpu":
        checks.append(Check("bad-input per-row values on the device give invalid rows", "bad-input",
                            _device_values_check(sample_fn, probs_fn, device)))
    return checks


class SamplerReport(KitReport):
    """`KitReport` of the sampler section (its replay line names `check_sampler`)."""

    def text(self) -> str:
        lines = [line for line in super().text().splitlines() if not line.startswith("replay:")]
        if self.failed:
            lines.append(f"replay: check_sampler(..., seed={self.seed})")
        return "\n".join(lines)


def check_sampler(sample_fn, probs_fn=None, logprobs_fn=None, *, device: str = "cpu", seed: int | None = None,
                  name: str | None = None) -> SamplerReport:
    """Run the sampler section on these functions (signatures of `anysoftmax.sampling`'s
    `sample`, `probs`, `logprobs` without `backend`) with inputs on `device`, and return the
    report; raise `AssertionError` with its text when a check failed. `seed` picks the data and
    the seeds passed (default: random; the report prints it, the same seed replays it)."""
    seed = random.SystemRandom().randrange(2**31) if seed is None else int(seed)
    checks = sampler_checks(sample_fn, probs_fn, logprobs_fn, device=device)
    label = name or getattr(sample_fn, "__qualname__", repr(sample_fn))
    report = run_checks(checks, label, device, seed)
    report = SamplerReport(**{f: getattr(report, f) for f in ("backend", "device", "seed", "passed", "skipped",
                                                              "failed", "computed", "fuzz")})
    kinds = {c.name: c.kind for c in checks}
    report.computed = sum(kinds[n] in KINDS_THAT_DRAW for n in report.passed)
    if not report.ok:
        raise AssertionError(report.text())
    return report
