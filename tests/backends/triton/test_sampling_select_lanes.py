"""Where a top-k bound is served (`sampling_kernels._select_sample`, `sampling.wide_top_k`): on a
plan of 256 candidate slots a chunk, a row whose k fits 64 lanes is ranked on 64, a larger one
on 128; a top-k number past the fused plan's candidates takes the two-launch plan, as does every
per-row top_k tensor. Through the
interpreter, top-k bounds on either side of 64 and at the slots' cap of 128, with and without
top-p and min-p: every row takes the candidates' path, and the draws, log-probabilities and
kept sets are the torch backend's (the float64-quality reference)."""

from __future__ import annotations

import pytest
import torch

import anysoftmax.sampling as sampling
from anysoftmax.backends._triton_common import sampling as triton_sampling
from anysoftmax.sampling.spec import SamplingSpec
from helpers import runnable_backends

pytestmark = pytest.mark.skipif("triton" not in runnable_backends("cpu"),
                                reason="triton does not run on CPU here: TRITON_INTERPRET is not set")

# Rows of 1500 in three chunks of 512 with 256 slots each: 128 lanes, 64 for k <= 64.
WIDE = triton_sampling.SamplingPlan(chunk=512, slots=256, grid=4, num_warps=4, tile=256)


@pytest.mark.parametrize("filters", [{}, dict(top_p=0.99, min_p=0.001)])
@pytest.mark.parametrize("top_k", [20, 64, 65, 100, 128])
def test_both_lane_widths_draw_and_keep_as_the_reference(top_k, filters, gen):
    rows, vocab = 5, 1500
    x = torch.randn(rows, vocab, generator=gen)  # flat enough that the top-k bound binds
    x[4] = torch.round(x[4] * 4)  # few distinct values: ties at the k-th logit
    kw = dict(temperature=torch.rand(rows, generator=gen) + 0.5, top_k=top_k, **filters)
    spec = SamplingSpec.from_request("sample", x, **kw, seed=7, offset=2)
    assert triton_sampling.row_paths(spec, x, plan=WIDE) == ["candidates"] * rows
    ids, lp = triton_sampling.sample(spec, x, True, plan=WIDE)
    want, want_lp = sampling.sample(x, **kw, seed=7, offset=2, return_logprobs=True, backend="torch")
    assert torch.equal(ids, want), (ids, want)
    torch.testing.assert_close(lp, want_lp, atol=1e-5, rtol=1e-5)
    pspec = SamplingSpec.from_request("probs", x, **kw)
    got = triton_sampling.probs(pspec, x, plan=WIDE)
    ref = sampling.probs(x, **kw, backend="torch")
    assert torch.equal(got > 0, ref > 0)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)


def test_a_top_k_past_the_fused_plans_candidates_takes_the_two_launch_plan(gen):
    # One row of 70000: the fused plan keeps 128 slots a chunk (top-k <= 64 served), the
    # two-launch plan 256 (<= 128); a top-k number between, or a per-row tensor (its values not
    # seen on the host), takes the latter, not the general path.
    x = torch.randn(1, 70000, generator=gen)
    assert triton_sampling.wide_top_k(1, 70000, x.device) == (64, 128)
    for top_k in (50, 100, torch.tensor([100])):
        kw = dict(temperature=0.9, top_k=top_k, top_p=0.95)
        spec = SamplingSpec.from_request("sample", x, **kw, seed=3)
        assert triton_sampling.row_paths(spec, x) == ["candidates"], top_k
        got = sampling.sample(x, **kw, seed=3, return_logprobs=True, backend="triton")
        want = sampling.sample(x, **kw, seed=3, return_logprobs=True, backend="torch")
        assert torch.equal(got[0], want[0]), top_k
        torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)
