"""The kit's whole sampler section against the Triton sampler on a CUDA GPU (the interpreter runs
all but the checks that draw thousands of rows: test_sampling_kernels.py)."""

from __future__ import annotations

import functools

import pytest
import torch

from anysoftmax import sampling
from anysoftmax.testing.sampling import check_sampler

pytestmark = pytest.mark.gpu


def test_the_whole_kit_sampler_section_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none visible: torch.cuda.is_available() is False)")
    report = check_sampler(functools.partial(sampling.sample, backend="triton"),
                           functools.partial(sampling.probs, backend="triton"),
                           functools.partial(sampling.logprobs, backend="triton"), device="cuda", name="triton")
    assert report.ok  # (check_sampler raises with the report's text when a check fails)
