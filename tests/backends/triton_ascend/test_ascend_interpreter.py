"""`triton_ascend` suite (a): its NPU plans (the NPU grid, UB-sized tiles) run the shared kernels
through the Triton interpreter on CPU tensors: the sub-block path (the UB budget lowered so that
it triggers on small rows), every element written, the persistent grid, settings errors. Every
shipped case at the default settings runs in the conformance kit (tests/testing). Needs
TRITON_INTERPRET=1 before anysoftmax is imported (tests/conftest.py sets it without a GPU)."""

from __future__ import annotations

import pytest
import torch

import anysoftmax
from anysoftmax import SoftmaxSpec, UnsupportedRequestError
from anysoftmax.backends._triton_common.launcher import bind
from anysoftmax.backends.triton_ascend import settings
from anysoftmax.testing.compare import compare
from anysoftmax.core.layout import allocate_rows
from anysoftmax.testing.cases import randn, with_specials
from helpers import check, params
from helpers.ascend import (BACKEND, LOGS, NAME, SUBBLOCK_CASES, SUBBLOCK_UB, check_or_refused, needs_interpreter,
                            plan_for, tile_of)


@needs_interpreter
@LOGS
@pytest.mark.parametrize("case,dtype", params(SUBBLOCK_CASES))
def test_interpreter_subblock_path(case, dtype, log, gen):
    x = case.make(gen, dtype)
    with settings.override(ub_bytes=SUBBLOCK_UB):
        if dtype != torch.float64:
            assert tile_of(plan_for(x, case.dim, case.out_dtype)) == ("online", 1, 16)
        check_or_refused(case, x, log)


@needs_interpreter
@pytest.mark.parametrize("ub_bytes", [None, SUBBLOCK_UB], ids=["tile", "subblock"])
def test_interpreter_writes_every_element(ub_bytes, gen):
    """Launch into a NaN-filled output: any element the kernel leaves unwritten stays NaN."""
    x = randn((45, 7))(gen, torch.float32).t()
    spec = SoftmaxSpec.from_tensor(x, 1)
    with settings.override(**({"ub_bytes": ub_bytes} if ub_bytes else {})):
        xr, y, layout = allocate_rows(x, spec)
        y.fill_(float("nan"))
        bind(BACKEND.plan(xr, layout, spec), layout, spec.log, y.dtype)((xr, y, None, None, None, None))
    assert not torch.isnan(y).any()
    result = compare(y, x, spec)
    assert result.ok, result.detail


@needs_interpreter
def test_interpreter_fixed_grid_walks_rows(monkeypatch, gen):
    """A grid smaller than the rows: every program walks several rows (the persistent loop)."""
    x = with_specials((9, 30))(gen, torch.float32)
    assert plan_for(x, 1).grid == 9  # the default 32 programs, capped at the 9 rows
    monkeypatch.setenv(settings.ENV_GRID, "2")
    assert plan_for(x, 1).grid == 2
    check(x, 1, backend=NAME, log=False)
    with settings.override(ub_bytes=SUBBLOCK_UB):
        plan = plan_for(x, 1)
        assert (*tile_of(plan), plan.grid) == ("online", 1, 16, 2)
        check(x, 1, backend=NAME, log=True)


@needs_interpreter
def test_interpreter_profile_grid_is_vector_cores(monkeypatch, gen):
    monkeypatch.setenv(settings.ENV_PROFILE, "910B3")
    x = randn((100, 8))(gen, torch.float32)
    plan = plan_for(x, 1)
    # no `multibuffer` off the NPU (stock Triton rejects it); causal prefixes under their exact bound
    assert plan.grid == 40 and plan.launch_options() == {} and plan.options == {"causal_vec": 1}
    check(x, 1, backend=NAME, log=False)


@needs_interpreter
@pytest.mark.parametrize("env,value,match", [
    (settings.ENV_GRID, "0", "ANYSOFTMAX_ASCEND_GRID"),
    (settings.ENV_GRID, "-4", "ANYSOFTMAX_ASCEND_GRID"),
    (settings.ENV_GRID, "many", "ANYSOFTMAX_ASCEND_GRID"),
    (settings.ENV_UB_BYTES, "16", "at least one vector"),
    (settings.ENV_PROFILE, "910C", "not a device profile"),
])
def test_interpreter_bad_settings_fail_before_launch(monkeypatch, env, value, match):
    monkeypatch.setenv(env, value)
    with pytest.raises(ValueError, match=match):
        anysoftmax.softmax(torch.randn(3, 8), 1, backend=NAME)


@needs_interpreter
def test_interpreter_refuses_fp64(gen):
    x = randn((3, 8))(gen, torch.float64)
    with pytest.raises(UnsupportedRequestError, match="float64 is not supported.*NPU"):
        anysoftmax.softmax(x, 1, backend=NAME)
    with pytest.raises(UnsupportedRequestError, match="float64"):
        anysoftmax.softmax(x.float(), 1, dtype=torch.float64, backend=NAME)
    # A narrowing dtype= is a host-side cast first: the kernel then sees fp32.
    check(x, 1, backend=NAME, log=False, dtype=torch.float32)


@needs_interpreter
def test_interpreter_available_and_explicit_only():
    assert BACKEND.is_available() is None
    # Never the automatic choice for CPU tensors: it serves `npu` only.
    assert BACKEND.devices == ("npu",)
    assert anysoftmax.core.select(SoftmaxSpec.from_tensor(torch.randn(2, 3), 1)).name != NAME
