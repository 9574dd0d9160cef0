"""The sampler's runs pre-pass on a CUDA GPU: the kit's whole sampler section with every request
planned with it (as through the interpreter in test_sampling_runs.py), and vocabulary-sized rows
under the default plan drawing what the scan alone draws."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from anysoftmax import sampling
from anysoftmax.backends._triton_common import sampling as triton_sampling
from anysoftmax.sampling import api as sampling_api
from anysoftmax.sampling.spec import SamplingSpec, check_ids
from anysoftmax.testing.sampling import check_sampler

pytestmark = pytest.mark.gpu

RUNS = triton_sampling.SamplingPlan(chunk=128, slots=32, grid=4, num_warps=4, tile=64, runs=True, run=8)
RUNS_WIDE = triton_sampling.SamplingPlan(chunk=2048, slots=64, grid=4, num_warps=4, tile=256, runs=True)


def _needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none visible: torch.cuda.is_available() is False)")


def test_the_whole_kit_sampler_section_with_the_runs_prepass_on_the_gpu(monkeypatch):
    _needs_cuda()
    sampling_api._requests.clear()
    triton_sampling._bound.clear()
    monkeypatch.setattr(triton_sampling, "plan_for",
                        lambda rows, vocab, device, programs=None, **_: RUNS if vocab <= 2048 else RUNS_WIDE)
    try:
        report = check_sampler(functools.partial(sampling.sample, backend="triton"),
                               functools.partial(sampling.probs, backend="triton"),
                               functools.partial(sampling.logprobs, backend="triton"), device="cuda", name="triton")
        assert report.ok
    finally:
        monkeypatch.undo()
        sampling_api._requests.clear()
        triton_sampling._bound.clear()


@pytest.mark.parametrize("run", [triton_sampling.LONG_RUN, triton_sampling.SHORT_RUN])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,vocab", [(64, 128256), (16, 262144), (40, 151936)])
def test_vocabulary_rows_draw_what_the_scan_alone_draws(rows, vocab, dtype, run):
    _needs_cuda()
    g = torch.Generator(device="cuda").manual_seed(rows + vocab)
    x = (torch.randn(rows, vocab, device="cuda", generator=g) * 3).to(dtype)
    x[1] = (x[1].float() * 0.5).round().to(dtype)  # ties at the k-th value
    x[2, ::3] = float("-inf")
    plan = dataclasses.replace(triton_sampling.plan_for(rows, vocab, x.device), run=run)
    assert plan.runs
    scan = dataclasses.replace(plan, runs=False)
    t = torch.rand(rows, device="cuda", generator=g) + 0.3
    t[3] = 0.0
    k = torch.randint(1, 64, (rows,), device="cuda", generator=g)
    k[4] = 100  # above what runs of 64 serve, within runs of 32
    k[5] = 200  # above what either serves
    kw = dict(temperature=t, top_k=k, top_p=torch.full((rows,), 0.9, device="cuda"), min_p=0.02)
    spec = SamplingSpec.from_request("sample", x, **kw, seed=torch.arange(rows, device="cuda"), offset=5)
    ids, lp = triton_sampling.sample(spec, x, True, plan=plan)
    want, want_lp = triton_sampling.sample(spec, x, True, plan=scan)
    assert torch.equal(ids, want)
    assert torch.allclose(lp, want_lp, atol=1e-5, rtol=1e-5)
    pspec = SamplingSpec.from_request("probs", x, **kw)
    got, ref = triton_sampling.probs(pspec, x, plan=plan), triton_sampling.probs(pspec, x, plan=scan)
    assert torch.equal(got > 0, ref > 0) and torch.allclose(got, ref, atol=1e-6, rtol=1e-5)
    lspec = SamplingSpec.from_request("logprobs", x, temperature=t)
    some = check_ids("logprobs", lspec, torch.randint(0, vocab, (rows, 2), device="cuda", generator=g))
    a = triton_sampling.logprobs(lspec, x, some, 20, plan=plan)
    b = triton_sampling.logprobs(lspec, x, some, 20, plan=scan)
    assert torch.equal(a[2], b[2]) and torch.allclose(a[1], b[1], atol=1e-5) and torch.allclose(a[0], b[0], atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [16, 32, 512])
def test_the_default_run_length_draws_what_the_scan_alone_draws(rows, dtype):
    """The API's own plan choice (runs of 32 or 64 by the bound and the rows:
    `short_runs_window`) for top-k numbers 50 and 100 and per-row tensors: the scan's draws."""
    _needs_cuda()
    vocab = 128256
    g = torch.Generator(device="cuda").manual_seed(rows)
    x = (torch.randn(rows, vocab, device="cuda", generator=g) * 3).to(dtype)
    scan = dataclasses.replace(triton_sampling.plan_for(rows, vocab, x.device), runs=False)
    t = torch.rand(rows, device="cuda", generator=g) + 0.3
    seeds = torch.randint(0, 2**62, (rows,), device="cuda", generator=g)
    for k in (50, 100, torch.full((rows,), 50, device="cuda"), torch.randint(1, 129, (rows,), device="cuda",
                                                                               generator=g)):
        kw = dict(temperature=t, top_k=k, top_p=0.9, min_p=0.05)
        spec = SamplingSpec.from_request("sample", x, **kw, seed=seeds, offset=3)
        ids, lp = triton_sampling.sample(spec, x, True)
        want, want_lp = triton_sampling.sample(spec, x, True, plan=scan)
        assert torch.equal(ids, want), k
        assert torch.allclose(lp, want_lp, atol=1e-5, rtol=1e-5), k
