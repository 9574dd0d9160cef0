"""`triton_ascend` suite (b): the CUDA cross-check. The NPU launch (the fixed 32 programs,
UB-sized tiles) on a CUDA GPU through the opt-in switch $ANYSOFTMAX_ASCEND_ON_CUDA=1, larger
shapes included (tests/conftest.py skips `gpu` tests where no CUDA GPU is visible)."""

from __future__ import annotations

import functools

import pytest
import torch

import anysoftmax
import anysoftmax.sampling as sampling
from anysoftmax import BackendUnavailableError, UnsupportedRequestError
from anysoftmax.backends.triton_ascend import npu, settings
from anysoftmax.testing.cases import CASES, randn
from anysoftmax.testing.sampling import check_sampler
from helpers import check, params
from helpers.ascend import LOGS, NAME, SUBBLOCK_CASES, SUBBLOCK_UB, check_or_refused, plan_for, tile_of


@pytest.fixture
def cuda_crosscheck(monkeypatch):
    monkeypatch.setenv(npu.ENV_ON_CUDA, "1")


@pytest.mark.gpu
@LOGS
@pytest.mark.parametrize("case,dtype", params(CASES))
def test_cuda_crosscheck_conformance(cuda_crosscheck, case, dtype, log, gen):
    check_or_refused(case, case.make(gen, dtype).cuda(), log)


@pytest.mark.gpu
@LOGS
@pytest.mark.parametrize("case,dtype", params(SUBBLOCK_CASES))
def test_cuda_crosscheck_subblock_path(cuda_crosscheck, case, dtype, log, gen):
    x = case.make(gen, dtype).cuda()
    with settings.override(ub_bytes=SUBBLOCK_UB):
        if dtype != torch.float64:
            assert tile_of(plan_for(x, case.dim, case.out_dtype)) == ("online", 1, 16)
        check_or_refused(case, x, log)


LARGE = [
    ((1823, 781), 1, torch.float32, "tile"),
    ((1823, 781), 1, torch.float16, "tile"),
    ((1823, 781), 0, torch.bfloat16, "tile"),
    ((4, 65536), 1, torch.float32, "online"),
    ((4, 65536), 1, torch.bfloat16, "online"),
    ((8192, 8192), 0, torch.float32, "online"),
    ((8192, 8192), 1, torch.bfloat16, "online"),
    ((65536, 64), 1, torch.float16, "tile"),
]


@pytest.mark.gpu
@LOGS
@pytest.mark.parametrize("shape,dim,dtype,kind", LARGE,
                         ids=[f"{s[0]}x{s[1]}-dim{d}-{str(t)[6:]}" for s, d, t, _ in LARGE])
def test_cuda_crosscheck_large(cuda_crosscheck, shape, dim, dtype, kind, log, gen):
    x = randn(shape)(gen, dtype).cuda()
    plan = plan_for(x, dim)
    n_rows = x.numel() // shape[dim]
    assert plan.kind == kind and plan.launch_options() == {}
    assert plan.grid == min(32, -(-n_rows // plan.block_m))  # the seed's fixed 32 programs
    check(x, dim, backend=NAME, log=log)


@pytest.mark.gpu
def test_cuda_needs_the_crosscheck_switch(monkeypatch):
    monkeypatch.delenv(npu.ENV_ON_CUDA, raising=False)
    with pytest.raises((BackendUnavailableError, UnsupportedRequestError), match=npu.ENV_ON_CUDA):
        anysoftmax.softmax(torch.randn(3, 8, device="cuda"), 1, backend=NAME)


@pytest.mark.gpu
def test_the_whole_kit_sampler_section_in_the_cuda_crosscheck(monkeypatch):
    """The sampler on its NPU plan (the kit's whole sampler section) on CUDA tensors."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none visible: torch.cuda.is_available() is False)")
    monkeypatch.setenv(npu.ENV_ON_CUDA, "1")
    sample, probs, logprobs = (functools.partial(f, backend=NAME) for f in (sampling.sample, sampling.probs,
                                                                            sampling.logprobs))
    report = check_sampler(sample, probs, logprobs, device="cuda", name=NAME)
    assert report.ok  # (check_sampler raises with the report's text when a check fails)
