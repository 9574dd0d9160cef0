"""The Triton sampler on a CUDA GPU: the kit's whole sampler section (the interpreter runs all but
the checks that draw thousands of rows: test_sampling_kernels.py) and the automatic choice's
mechanism."""

from __future__ import annotations

import functools

import pytest
import torch

from anysoftmax import sampling
from anysoftmax.testing.sampling import check_sampler
from helpers.spies import sampler_runs

pytestmark = pytest.mark.gpu


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
    calls = sampler_runs(monkeypatch)
    x = torch.randn(4, 1000, device="cuda")
    assert torch.equal(sampling.sample(x, top_k=5, seed=2), sampling.sample(x, top_k=5, seed=2, backend="torch"))
    assert calls == ["sample"]
    assert sampling.sample(x.double(), seed=2).shape == (4,) and calls == ["sample"]  # float64: the torch sampler
