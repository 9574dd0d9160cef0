"""The Triton sampler's candidate scan and select on top-k rows (`sampling_kernels.py`): the
chunk's threshold comes from the maxima of its runs and the row's kept set from at most KM
compacted candidates, without a search over the chunk (`_chunk_threshold`) or over the
candidates (`_kth_key`, `_mass_cut`) on ordinary logits; where ties or crowded runs defeat
that, those exact searches still decide, and every result is the reference's (the torch
sampler's ids, the float64 kept set and probabilities)."""

from __future__ import annotations

import pytest
import torch

import anysoftmax.sampling as sampling
from anysoftmax.backends._triton_common import sampling as triton_sampling
from anysoftmax.backends._triton_common import sampling_kernels
from anysoftmax.sampling.reference import reference_distribution
from anysoftmax.sampling.spec import SamplingSpec
from anysoftmax.testing.sampling import PROB_ATOL, PROB_RTOL
from helpers import runnable_backends

pytestmark = pytest.mark.skipif("triton" not in runnable_backends("cpu"),
                                reason="triton does not run on CPU here: TRITON_INTERPRET is not set")

SEARCHES = ("_chunk_threshold", "_kth_key", "_mass_cut")
# Runs of 8 in a chunk of 1024, 64 slots: a row sorted in decreasing order crowds the top 30
# into the first runs, past the slots (the bisection decides that chunk).
CROWDED = triton_sampling.SamplingPlan(chunk=1024, slots=64, grid=4, num_warps=4, tile=256)


@pytest.fixture
def searches(monkeypatch):
    """How often each search ran (the interpreter resolves a kernel's helpers when called)."""
    count = dict.fromkeys(SEARCHES, 0)
    for name in SEARCHES:
        real = getattr(sampling_kernels, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            count[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(sampling_kernels, name, spy)
    return count


def _check_probs(got, x, spec):
    ref = reference_distribution(x, spec).probs.reshape(x.shape)
    assert torch.equal(got > 0, ref > 0), "kept sets differ"
    err = (got.double() - ref).abs()
    assert bool((err <= PROB_ATOL + PROB_RTOL * ref).all()), f"max error {float(err.max()):.3g}"


def _keywords(rows: int, gen) -> dict:
    return dict(temperature=torch.rand(rows, generator=gen) + 0.5, top_k=torch.full((rows,), 50),
                top_p=torch.full((rows,), 0.9), min_p=torch.full((rows,), 0.05))


def test_top_k_rows_need_no_search_over_a_chunk_or_the_candidates(gen, searches):
    """sample and probs with top_k=50, top_p=0.9, min_p=0.05 and logprobs' top-20 on random
    logits over several chunks of the default plan."""
    rows, vocab = 3, 20000
    x = torch.randn(rows, vocab, generator=gen) * 3
    kw = _keywords(rows, gen)
    spec = SamplingSpec.from_request("probs", x, **kw)
    assert triton_sampling.row_paths(spec, x) == ["candidates"] * rows
    _check_probs(triton_sampling.probs(spec, x), x, spec)
    ids, lp = triton_sampling.sample(SamplingSpec.from_request("sample", x, **kw, seed=9, offset=2), x, True)
    want, want_lp = sampling.sample(x, **kw, seed=9, offset=2, return_logprobs=True, backend="torch")
    assert torch.equal(ids, want)
    torch.testing.assert_close(lp, want_lp, atol=2e-5, rtol=1e-5)
    lspec = SamplingSpec.from_request("logprobs", x, temperature=kw["temperature"])
    pick = torch.randint(0, vocab, (rows, 2), generator=gen)
    _, values, top_ids = triton_sampling.logprobs(lspec, x, pick, 20)
    _, want_v, want_i = sampling.logprobs(x, pick, temperature=kw["temperature"], top_n=20, backend="torch")
    assert torch.equal(top_ids, want_i)
    torch.testing.assert_close(values, want_v, atol=2e-5, rtol=1e-5)
    assert searches == dict.fromkeys(SEARCHES, 0), searches


def test_crowded_runs_and_ties_still_take_the_exact_searches(gen, searches):
    """Row 0 sorted in decreasing order (its top 30 fill the first runs: the run maxima let
    too many through, the chunk bisects); row 1 with 100 ties at its 3rd value (more than KM:
    the select's exact k-th key and id order decide); the same kept sets and draws."""
    rows, vocab = 2, 3000
    x = torch.randn(rows, vocab, generator=gen) * 3
    x[0] = x[0].sort(descending=True).values
    x[1, torch.randperm(vocab, generator=gen)[:100]] = 12.0
    x[1, [4, 9]] = torch.tensor([15.0, 14.0])
    kw = dict(temperature=torch.tensor([1.0, 1.0]), top_k=torch.tensor([30, 3]), top_p=torch.tensor([0.9, 1.0]))
    spec = SamplingSpec.from_request("probs", x, **kw)
    _check_probs(triton_sampling.probs(spec, x, plan=CROWDED), x, spec)
    got = triton_sampling.sample(SamplingSpec.from_request("sample", x, **kw, seed=4), x, plan=CROWDED)
    assert torch.equal(got, sampling.sample(x, **kw, seed=4, backend="torch"))
    lspec = SamplingSpec.from_request("logprobs", x)
    _, values, top_ids = triton_sampling.logprobs(lspec, x, torch.zeros(rows, 1, dtype=torch.int64), 20, plan=CROWDED)
    _, want_v, want_i = sampling.logprobs(x, torch.zeros(rows, 1, dtype=torch.int64), top_n=20, backend="torch")
    assert torch.equal(top_ids, want_i)
    torch.testing.assert_close(values, want_v, atol=2e-5, rtol=1e-5)
    assert searches["_chunk_threshold"] > 0 and searches["_kth_key"] > 0, searches
