"""The Triton sampler's per-call host path: a later call of a request reuses the launchers bound
for it and passes only its values. What that reuse could get wrong: logits at another address
alignment or row stride, a keyword switching between a number and a tensor, `seed` None after a
given seed. Each later call must bind anew where the kernels' specialisation differs, and give
what the torch sampler gives (the same seeded draws, probabilities within float32 tolerances)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from anysoftmax.backends._triton_common import sampling as triton_sampling
from anysoftmax.sampling import torch_sampler
from anysoftmax.sampling.spec import SamplingSpec
from helpers import runnable_backends

pytestmark = pytest.mark.skipif("triton" not in runnable_backends("cpu"),
                                reason="triton does not run on CPU here: TRITON_INTERPRET is not set")

ROWS, VOCAB = 3, 300
PLAN = triton_sampling.SamplingPlan(chunk=128, slots=32, grid=3, num_warps=4, tile=64)
GRIDS = itertools.count(40)  # (a plan per test: its requests are bound there, not found bound by another)


def _counting_bind(made: list):
    """`bind_kernel` recording each request's binding: its scan's (the select is bound beside it)."""
    real = triton_sampling.bind_kernel

    def bind(*args, **kwargs):
        if args[0].kernel.__name__ == "scan_kernel":
            made.append(args[0].kernel.__name__)
        return real(*args, **kwargs)
    return bind


def _same_draw(x: torch.Tensor, plan, **kw):
    spec = SamplingSpec.from_request("sample", x, **kw)
    got_ids, got_lp = triton_sampling.sample(spec, x, True, plan=plan)
    want_ids, want_lp = torch_sampler.sample(spec, x, True)
    torch.testing.assert_close(got_ids, want_ids, rtol=0, atol=0)
    torch.testing.assert_close(got_lp, want_lp.float(), rtol=2e-5, atol=1e-5)
    return got_ids


def test_logits_at_another_alignment_or_row_stride_bind_anew(gen, monkeypatch):
    made: list = []
    monkeypatch.setattr(triton_sampling, "bind_kernel", _counting_bind(made))
    plan = dataclasses.replace(PLAN, grid=next(GRIDS))
    wide = torch.randn(ROWS, VOCAB + 5, generator=gen) * 3
    kw = dict(temperature=0.9, top_k=20, seed=5, offset=2)
    aligned = wide[:, :VOCAB]  # row stride VOCAB + 5
    _same_draw(aligned, plan, **kw)
    assert len(made) == 1
    _same_draw(aligned.clone(), plan, **kw)  # another address, aligned alike, another row stride
    assert len(made) == 2
    _same_draw(wide[:, :VOCAB].clone(), plan, **kw)  # the same request again: no bind
    assert len(made) == 2
    shifted = wide[:, 1:]  # 4 bytes past a 16-byte boundary, the first request's row stride
    assert shifted.data_ptr() % 16 and shifted.stride(0) == aligned.stride(0)
    _same_draw(shifted, plan, **kw)
    assert len(made) == 3


def test_keywords_switching_between_numbers_and_tensors_bind_per_form(gen, monkeypatch):
    made: list = []
    monkeypatch.setattr(triton_sampling, "bind_kernel", _counting_bind(made))
    plan = dataclasses.replace(PLAN, grid=next(GRIDS))
    x = torch.randn(ROWS, VOCAB, generator=gen) * 3
    rows = dict(temperature=torch.rand(ROWS, generator=gen) + 0.5, top_k=torch.tensor([0, 7, 40]),
                top_p=torch.full((ROWS,), 0.8), min_p=torch.full((ROWS,), 0.02), offset=torch.arange(ROWS) + 3)
    numbers = dict(temperature=0.7, top_k=7, top_p=0.8, min_p=0.02, offset=3)
    forms = [numbers, rows, numbers, rows, {**numbers, "top_k": rows["top_k"]}, {**rows, "temperature": 0.7}]
    for kw in forms:
        _same_draw(x, plan, seed=9, **kw)
    assert len(made) == 4  # the third and fourth calls find their forms bound


def test_no_seed_after_a_given_seed(gen):
    """Without a seed each call draws one from torch's generator (a device tensor, not the
    number a seeded request of the same logits passes): the draws are those seeds' draws."""
    plan = dataclasses.replace(PLAN, grid=next(GRIDS))
    x = torch.randn(ROWS, VOCAB, generator=gen) * 3
    seeded = _same_draw(x, plan, temperature=1.5, seed=123)
    spec = SamplingSpec.from_request("sample", x, temperature=1.5)
    torch.manual_seed(77)
    drawn = [triton_sampling.sample(spec, x, plan=plan) for _ in range(2)]
    torch.manual_seed(77)
    seeds = [torch.randint(0, 2**63 - 1, (), dtype=torch.int64) for _ in range(2)]
    for ids, seed in zip(drawn, seeds):
        torch.testing.assert_close(ids, _same_draw(x, plan, temperature=1.5, seed=seed), rtol=0, atol=0)
    torch.testing.assert_close(_same_draw(x, plan, temperature=1.5, seed=123), seeded, rtol=0, atol=0)


def test_a_seed_read_off_the_generator_on_the_host_is_a_given_seed(gen, monkeypatch):
    """Where the device's generator hands its seed over on the host (CUDA, outside a graph
    capture), the call passes it as a number: the same launchers, the draws of that int seed,
    and back to a device-drawn seed (a tensor) when the host cannot give one."""
    plan = dataclasses.replace(PLAN, grid=next(GRIDS))
    x = torch.randn(ROWS, VOCAB, generator=gen) * 3
    spec = SamplingSpec.from_request("sample", x, temperature=1.5, top_k=40)
    for host_seed in (2**62 + 3, 9, None):
        monkeypatch.setattr(triton_sampling, "generator_seed", lambda device: host_seed)
        torch.manual_seed(77)
        ids = triton_sampling.sample(spec, x, plan=plan)
        torch.manual_seed(77)
        seed = host_seed if host_seed is not None else torch.randint(0, 2**63 - 1, (), dtype=torch.int64)
        torch.testing.assert_close(ids, _same_draw(x, plan, temperature=1.5, top_k=40, seed=seed), rtol=0, atol=0)


def test_outputs_have_the_batch_shape_and_are_fresh(gen):
    plan = dataclasses.replace(PLAN, grid=next(GRIDS))
    x = torch.randn(2, 2, VOCAB, generator=gen) * 3
    spec = SamplingSpec.from_request("sample", x, temperature=0.8, seed=4)
    a_ids, a_lp = triton_sampling.sample(spec, x, True, plan=plan)
    b_ids, b_lp = triton_sampling.sample(spec, x, True, plan=plan)
    assert a_ids.shape == a_lp.shape == (2, 2) and a_ids.is_contiguous()
    assert a_ids.data_ptr() != b_ids.data_ptr() and a_lp.data_ptr() != b_lp.data_ptr()
    torch.testing.assert_close(a_ids, torch_sampler.sample(spec, x), rtol=0, atol=0)
    probs_spec = SamplingSpec.from_request("probs", x, temperature=0.8, top_k=9)
    y = triton_sampling.probs(probs_spec, x, plan=plan)
    assert y.shape == x.shape and y.is_contiguous()
    torch.testing.assert_close(y, torch_sampler.probs(probs_spec, x).float(), rtol=2e-5, atol=1e-6)
