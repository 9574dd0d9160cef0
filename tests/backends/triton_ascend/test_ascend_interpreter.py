"""`triton_ascend` suite (a): its NPU plans (the NPU grid, UB-sized tiles) run the shared kernels
through the Triton interpreter on CPU tensors: the sub-block path (the UB budget lowered so that
it triggers on small rows), every element written, the persistent grid, settings errors; the
sampler on its NPU plan (the kit's sampler section; every scatter and gather addressing only its
launch's tensors, masked lanes included: what triton-ascend's discrete accesses touch). Every
shipped case at the default settings runs in the conformance kit (tests/testing). Needs
TRITON_INTERPRET=1 before anysoftmax is imported (tests/conftest.py sets it without a GPU)."""

from __future__ import annotations

import functools

import pytest
import torch

import anysoftmax
import anysoftmax.sampling as sampling
from anysoftmax import SoftmaxSpec, UnsupportedRequestError
from anysoftmax.backends._triton_common import sampling as triton_sampling
from anysoftmax.backends._triton_common.launcher import bind
from anysoftmax.backends.triton_ascend import settings
from anysoftmax.testing.compare import compare
from anysoftmax.core.layout import allocate_rows
from anysoftmax.sampling.spec import SamplingSpec
from anysoftmax.testing.kit import run_checks
from anysoftmax.testing.cases import randn, with_specials
from helpers import check, params
from helpers.ascend import (BACKEND, LOGS, NAME, SUBBLOCK_CASES, SUBBLOCK_UB, check_or_refused, needs_interpreter,
                            plan_for, tile_of)
from helpers.discrete import watch_discrete_accesses
from helpers.sampler_kit import interpreter_checks


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


# ---- the sampler: the shared Triton sampler on the backend's plan (`sampling_plan`)

ascend_sample = functools.partial(sampling.sample, backend=NAME)
ascend_probs = functools.partial(sampling.probs, backend=NAME)
ascend_logprobs = functools.partial(sampling.logprobs, backend=NAME)


@needs_interpreter
def test_the_kit_sampler_section_through_the_interpreter(seed):
    """Every kit check but those drawing thousands of rows (the whole section: the GPU test below)
    and the rows of 20000 (minutes through the interpreter on this plan; that GPU test runs
    them, and the multi-chunk rows and general path here come from the tests around it)."""
    checks = [c for c in interpreter_checks(ascend_sample, ascend_probs, ascend_logprobs)
              if "vocabulary-rows" not in c.name]
    report = run_checks(checks, NAME, "cpu", seed)
    assert not report.failed and not report.skipped, report.text()
    assert len(report.passed) == len(checks) > 40


@needs_interpreter
def test_what_it_refuses_is_named():
    """float64 logits (the NPU has no fp64 exp) and a top_n above half the plan's slots."""
    x = torch.randn(2, 300)
    with pytest.raises(UnsupportedRequestError, match="float64 is not supported: the NPU's vector unit"):
        ascend_sample(x.double(), seed=1)
    k_cap = BACKEND.sampling_plan(SamplingSpec.from_request("logprobs", x)).k_cap
    ids = torch.zeros(2, 1, dtype=torch.int64)
    with pytest.raises(UnsupportedRequestError, match=f"top_n {k_cap + 1} exceeds the {k_cap} candidates"):
        ascend_logprobs(x, ids, top_n=k_cap + 1)
    assert ascend_logprobs(x, ids, top_n=k_cap)[2].shape == (2, k_cap)


def _requests(gen):
    """Requests through every launch of the Ascend plan: multi-chunk rows (a small UB), each
    path of the select, ties past a chunk's slots, ids outside the vocabulary."""
    x = torch.randn(5, 700, generator=gen) * 3
    x[1, :] = 0.25  # ties everywhere: candidates past the slots, the general path
    x[2, 100:300] = float("-inf")
    ids = torch.randint(-5, 900, (5, 9), generator=gen)
    return x, ids


@needs_interpreter
@pytest.mark.parametrize("backend", ["triton", NAME])
def test_discrete_accesses_stay_inside_the_launch_tensors(backend, monkeypatch, gen):
    """Every lane of every scatter and gather (masked-off lanes too) addresses a tensor of its
    launch: triton-ascend lowers them to discrete accesses that touch every lane. The triton
    backend runs the same kernels on a small plan (the runs pre-pass included)."""
    x, ids = _requests(gen)
    t = torch.rand(5, generator=gen) + 0.3
    with watch_discrete_accesses(monkeypatch) as bad, settings.override(ub_bytes=8192):
        if backend == "triton":
            plans = [triton_sampling.SamplingPlan(chunk=128, slots=32, grid=3, num_warps=4, tile=64),
                     triton_sampling.SamplingPlan(chunk=128, slots=32, grid=3, num_warps=4, tile=64, runs=True, run=8)]
            for plan in plans:
                rows = torch.cat([x] * 4)  # (the runs pre-pass serves top-k rows of 16 or more)
                for kw in (dict(top_k=3), dict(top_p=0.8, min_p=0.02), dict(top_k=40, top_p=0.9)):
                    spec = SamplingSpec.from_request("sample", rows, **kw, seed=3)
                    triton_sampling.sample(spec, rows, plan=plan)
                    triton_sampling.probs(SamplingSpec.from_request("probs", rows, **kw), rows, plan=plan)
                spec = SamplingSpec.from_request("logprobs", x, temperature=t)
                triton_sampling.logprobs(spec, x, ids.clamp(0, 699), top_n=8, plan=plan)
                _gather_out_of_range(x, ids, plan)
        else:
            for kw in (dict(top_k=3), dict(top_p=0.8, min_p=0.02), dict(top_k=40, top_p=0.9), {}):
                sampling.sample(x, **kw, seed=3, backend=NAME)
                sampling.probs(x, **kw, temperature=t, backend=NAME)
            sampling.logprobs(x, ids.clamp(0, 699), temperature=t, top_n=8, backend=NAME)
            sampling.logprobs(x, ids.clamp(0, 699), temperature=0.7, backend=NAME)
            _gather_out_of_range(x, ids, BACKEND.sampling_plan(SamplingSpec.from_request("logprobs", x)))
    assert not bad, "\n".join(bad[:10])


def _gather_out_of_range(x, ids, plan):
    """logprobs' gather at ids outside [0, vocab) (NaN there): accelerator ids are not checked on the host."""
    spec = SamplingSpec.from_request("logprobs", x, temperature=0.8)
    out = triton_sampling.logprobs(spec, x, ids, plan=plan)
    outside = (ids < 0) | (ids >= x.shape[-1])
    assert bool(outside.any()) and bool(out[outside].isnan().all()) and not bool(out[~outside].isnan().any())
