"""Shared by the `triton_ascend` test suites (tests/backends/triton_ascend/): the backend as
registered, the lowered unified-buffer budget that sends small rows down the sub-block path,
the plan a request gets, and a check that turns the promised float64 refusal into a skip."""

from __future__ import annotations

import importlib.util
import re

import pytest
import torch

import anysoftmax
from anysoftmax import SoftmaxSpec
from anysoftmax.backends._triton_common.interpreter import interpreting
from anysoftmax.backends._triton_common.plan import KernelPlan
from anysoftmax.backends.triton_ascend import npu
from anysoftmax.testing.cases import LONG_ROW_CASES, Case, randn

from . import as_backend_sees_it, check

NAME = "triton_ascend"
BACKEND = anysoftmax.get_backend(NAME)  # the registered instance (never a second one)

needs_interpreter = pytest.mark.skipif(
    not interpreting(),
    reason="needs the Triton interpreter: TRITON_INTERPRET=1 before anysoftmax is imported "
           "(tests/conftest.py sets it when no GPU is present)")
needs_npu = pytest.mark.skipif(
    npu.missing_reason() is not None or interpreting(),
    reason=f"no Ascend NPU: {npu.missing_reason() or 'TRITON_INTERPRET is set (unset it to compile for the NPU)'}")
no_torch_npu = pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None,
                                  reason="torch_npu is installed here: this checks the reason given without it")

# A lowered UB budget: multibuffer halves it to 512 bytes, which holds 16-element sub-blocks
# for every dtype, so rows longer than 16 take the sub-block (online) kernel.
SUBBLOCK_UB = 1024
SUBBLOCK_CASES = LONG_ROW_CASES + [
    Case("long-3d-dim1", randn((2, 60, 3)), 1),  # a middle dim: strided columns, two row dims
    Case("long-dtype-fp16-to-fp32", randn((4, 90)), 1, out_dtype=torch.float32, dtypes=(torch.float16,)),
]
LOGS = pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])


def plan_for(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> KernelPlan:
    """The plan `run` would launch for this request."""
    xr, _, layout, spec = as_backend_sees_it(x, dim, dtype)
    return BACKEND.plan(xr, layout, spec)


def tile_of(plan: KernelPlan) -> tuple:
    return plan.kind, plan.block_m, plan.block_n


def check_or_refused(case: Case, x: torch.Tensor, log: bool) -> None:
    """Conformance; a float64 output must be the refusal this backend promises, and is then a
    skip (nothing was computed)."""
    refusal = check(x, case.dim, backend=NAME, log=log, dtype=case.out_dtype)
    if refusal is not None:
        spec = SoftmaxSpec.from_tensor(x, case.dim, case.out_dtype)
        assert spec.out_dtype == torch.float64 and re.search("float64 is not supported.*NPU", refusal), refusal
        pytest.skip(f"declared refusal: {refusal}")
