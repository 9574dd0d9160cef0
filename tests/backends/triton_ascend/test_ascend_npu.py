"""`triton_ascend` suite (d): a real Ascend NPU, the shipped cases on `npu` tensors compiled by
triton-ascend. Never run by this project (no NPU was available): skipped here with what is
missing."""

from __future__ import annotations

import pytest
import torch

import anysoftmax
from anysoftmax import SoftmaxSpec
from anysoftmax.backends.triton_ascend import npu, settings
from anysoftmax.testing.cases import CASES, randn
from helpers import check, params
from helpers.ascend import LOGS, NAME, SUBBLOCK_CASES, SUBBLOCK_UB, check_or_refused, needs_npu, plan_for


@needs_npu
@LOGS
@pytest.mark.parametrize("case,dtype", params(CASES))
def test_npu_conformance(case, dtype, log, gen):
    check_or_refused(case, case.make(gen, dtype).to("npu"), log)


@needs_npu
@LOGS
@pytest.mark.parametrize("case,dtype", params(SUBBLOCK_CASES))
def test_npu_subblock_path(case, dtype, log, gen):
    x = case.make(gen, dtype).to("npu")
    with settings.override(ub_bytes=SUBBLOCK_UB):
        check_or_refused(case, x, log)


@needs_npu
def test_npu_launch_and_automatic_choice(monkeypatch, gen):
    x = randn((1823, 781))(gen, torch.float32).to("npu")
    plan = plan_for(x, 1)
    assert plan.grid == 32 and plan.launch_options() == {"multibuffer": True}
    monkeypatch.setenv(settings.ENV_GRID, "vector_cores")
    assert plan_for(x, 1).grid == npu.vector_cores(npu.device_index(x.device))
    check(x, 1, backend=NAME, log=False)
    assert anysoftmax.core.select(SoftmaxSpec.from_tensor(x, 1)).name == NAME
