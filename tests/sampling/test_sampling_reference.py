"""`anysoftmax.sampling.reference`: the float64 reference against the definitions written out
literally (plain Python, one token at a time) on small rows full of ties, the draw's
properties (shards, greedy, the kept set), and property tests with hypothesis."""

from __future__ import annotations

import math
import os

import pytest
import torch

from anysoftmax.sampling import rng
from anysoftmax.sampling.reference import (distribution, draw, reference_distribution, reference_draw,
                                           reference_kept, reference_logprobs, reference_probs)
from anysoftmax.sampling.spec import SamplingSpec

hypothesis = pytest.importorskip("hypothesis", reason="needs the hypothesis package")
from hypothesis import given, settings, strategies as st  # noqa: E402

SEED = int(os.environ.get("ANYSOFTMAX_TEST_SEED", "0"))


def literal_kept(logits: list[float], temperature: float, top_k: int, top_p: float, min_p: float) -> list[bool]:
    """docs/sampling.md's steps, token by token, in Python floats."""
    n = len(logits)
    if temperature == 0:
        best = max(logits)
        first = logits.index(best)
        return [i == first for i in range(n)]
    z = [v / temperature for v in logits]
    kth = sorted(z, reverse=True)[(top_k if 0 < top_k < n else n) - 1]
    in_k = [zi >= kth for zi in z]
    m = max(z)
    mass = sum(math.exp(zi - m) for zi, k in zip(z, in_k) if k)
    q = [math.exp(zi - m) / mass if k else 0.0 for zi, k in zip(z, in_k)]
    in_p = [top_p >= 1 or sum(qj for qj in q if qj > qi) < top_p for qi in q]
    in_m = [math.exp(zi - m) >= min_p for zi in z]
    return [a and b and c and zi > -math.inf for a, b, c, zi in zip(in_k, in_p, in_m, z)]


# Integer logits: ties everywhere (the hard part); temperature keeps them ties.
rows_strategy = st.lists(st.integers(-4, 4), min_size=1, max_size=9)
keywords = st.fixed_dictionaries(dict(
    temperature=st.sampled_from([0.0, 0.5, 1.0, 2.0]), top_k=st.integers(0, 10),
    top_p=st.sampled_from([0.05, 0.3, 0.5, 0.75, 0.9, 0.999, 1.0]), min_p=st.sampled_from([0.0, 0.1, 0.4, 1.0])))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(logits=rows_strategy, kw=keywords)
def test_kept_set_is_the_literal_definition(logits, kw):
    x = torch.tensor([logits], dtype=torch.float32)
    spec = SamplingSpec.from_request("probs", x, **kw)
    want = literal_kept([float(v) for v in logits], **kw)
    assert reference_kept(x, spec)[0].tolist() == want
    p = reference_probs(x, spec)[0]
    assert math.isclose(float(p.sum()), 1.0, rel_tol=1e-12) and bool(((p > 0) == torch.tensor(want)).all())
    # the float32 formula (the torch sampler) decides the same on these exact ties
    assert distribution(x, spec, torch.float32).kept[0].tolist() == want


@settings(max_examples=100, deadline=None, derandomize=True)
@given(logits=rows_strategy, kw=keywords, tighter=st.sampled_from(["top_k", "top_p", "min_p"]))
def test_tighter_filters_keep_subsets(logits, kw, tighter):
    x = torch.tensor([logits], dtype=torch.float32)
    loose = reference_kept(x, SamplingSpec.from_request("probs", x, **kw))[0]
    tight_kw = dict(kw)
    tight_kw[tighter] = {"top_k": max(1, kw["top_k"] - 1) if kw["top_k"] else 3, "top_p": kw["top_p"] / 2,
                         "min_p": min(1.0, kw["min_p"] + 0.3)}[tighter]
    tight = reference_kept(x, SamplingSpec.from_request("probs", x, **tight_kw))[0]
    assert bool((tight <= loose).all()) and bool(tight.any()), "the argmax always stays"


def test_draws_are_the_same_sharded():
    """The keys are elementwise in the global token index: each shard's winner and key, merged
    by the largest key (lowest id among equal keys), is the unsharded draw, bit for bit."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(300, 97, generator=g) * 2
    spec = SamplingSpec.from_request("sample", x, temperature=0.8, top_k=40, top_p=0.9,
                                     seed=torch.randint(-2**63, 2**63 - 1, (300,), generator=g), offset=17)
    dist = reference_distribution(x, spec)
    words = rng.row_words(spec)
    whole, whole_key = rng.exponential_race(dist.z, dist.kept, words)
    bounds = [0, 13, 13, 50, 97]  # uneven, one shard empty
    parts = [rng.exponential_race(dist.z[:, a:b], dist.kept[:, a:b], words, vocab_start=a)
             for a, b in zip(bounds, bounds[1:]) if b > a]
    keys = torch.stack([k for _, k in parts], -1)
    ids = torch.stack([i for i, _ in parts], -1)
    best = keys.max(-1, keepdim=True).values
    merged = torch.where(keys == best, ids, torch.iinfo(torch.int64).max).min(-1).values
    assert torch.equal(merged, whole) and torch.equal(best[:, 0], whole_key)


def test_reference_draw_matches_the_float32_draw_almost_everywhere():
    """The definition in float64 and in float32 (the torch sampler) agree but at near-ties."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(3000, 64, generator=g) * 2
    spec = SamplingSpec.from_request("sample", x, temperature=0.9, top_p=0.95, seed=SEED)
    words = rng.row_words(spec)
    ids64, lp64 = reference_draw(x, spec, words)
    ids32, lp32 = draw(distribution(x, spec, torch.float32), words)
    # a near-tie changes the id; a token at the top-p boundary within float32 rounding changes
    # the kept mass (and so the log-probability): rare either way
    close = (lp32.double() - lp64).abs() <= 2e-5 + 1e-5 * lp64.abs()
    assert int(((ids64 != ids32) | ~close).sum()) <= 3


def test_draw_frequencies_follow_the_distribution():
    """The exponential race over 200000 rows of one distribution: every token within 5 sigma."""
    x = torch.tensor([[2.0, 1.0, 1.0, 0.0, -1.0, -math.inf, 0.5]])
    spec1 = SamplingSpec.from_request("sample", x, top_p=0.95)
    p = reference_probs(x, spec1)[0]
    n = 200_000
    xs = x.expand(n, -1)
    spec = SamplingSpec.from_request("sample", xs, top_p=0.95, seed=SEED)
    ids, _ = draw(distribution(xs, spec, torch.float32), rng.row_words(spec))
    counts = torch.bincount(ids, minlength=7).double()
    sigma = (n * p * (1 - p)).sqrt().clamp_min(1e-9)
    assert bool(((counts - n * p).abs() <= 5 * sigma).all()), (counts / n, p)
    assert counts[p == 0].sum() == 0


def test_logprobs_reference_and_the_greedy_limit():
    x = torch.tensor([[1.0, 3.0, 3.0, -math.inf], [0.5, 0.2, 0.1, 0.0]])
    lp = reference_logprobs(x, SamplingSpec.from_request("logprobs", x, temperature=torch.tensor([0.0, 0.5])))
    assert lp[0].tolist() == [-math.inf, -math.log(2), -math.log(2), -math.inf]
    torch.testing.assert_close(lp[1], torch.log_softmax(x[1].double() / 0.5, -1))
    # approaching the limit: a tiny temperature gives (nearly) the same numbers
    tiny = reference_logprobs(x[:1], SamplingSpec.from_request("logprobs", x[:1], temperature=1e-3))
    torch.testing.assert_close(tiny[0, 1:3], lp[0, 1:3])
