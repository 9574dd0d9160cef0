"""The Triton sampler on a CUDA GPU: the kit's whole sampler section (the interpreter runs all but
the checks that draw thousands of rows: test_sampling_kernels.py) and the automatic choice's
mechanism."""

from __future__ import annotations

import functools

import pytest
import torch

from anysoftmax import sampling
from anysoftmax.core import registry
from anysoftmax.core.backend import Backend
from anysoftmax.backends._triton_common import sampling as sampler_kernels
from anysoftmax.testing.sampling import check_sampler

pytestmark = pytest.mark.gpu


class _Marker(Backend):
    name, devices, priority = "runner-calls-marker", ("cpu",), -1


def test_the_whole_kit_sampler_section_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none visible: torch.cuda.is_available() is False)")
    report = check_sampler(functools.partial(sampling.sample, backend="triton"),
                           functools.partial(sampling.probs, backend="triton"),
                           functools.partial(sampling.logprobs, backend="triton"), device="cuda", name="triton")
    assert report.ok  # (check_sampler raises with the report's text when a check fails)


def test_backend_none_runs_the_triton_sampler_on_cuda(monkeypatch):
    """The automatic choice: the Triton sampler for CUDA logits, the torch sampler for what it refuses."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none visible: torch.cuda.is_available() is False)")
    calls = []
    real = sampler_kernels.runner

    def runner(op, *args, **kwargs):
        run = real(op, *args, **kwargs)
        return lambda *a: calls.append(1) or run(*a)
    monkeypatch.setattr(sampler_kernels, "runner", runner)
    # (a new registry generation: the API makes every request's runner afresh, through the spy)
    registry.register(_Marker())
    registry.unregister(_Marker.name)
    x = torch.randn(4, 1000, device="cuda")
    assert torch.equal(sampling.sample(x, top_k=5, seed=2), sampling.sample(x, top_k=5, seed=2, backend="torch"))
    assert calls == [1]
    assert sampling.sample(x.double(), seed=2).shape == (4,) and calls == [1]  # float64: the torch sampler
