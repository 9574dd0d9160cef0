"""Tests of the `triton_ascend` backend (Ascend NPUs through triton-ascend).

No Ascend hardware is available to this project, so the backend is verified three ways:

(a) Its plans (the NPU grid, UB-sized tiles) run the shared kernels through the Triton
    interpreter on CPU tensors over the conformance cases (tests/cases.py), the sub-block path
    included: the UB budget is lowered so that it triggers on small rows. Needs
    TRITON_INTERPRET=1 before anysoftmax is imported (tests/conftest.py sets it without a GPU).
(b) `gpu`: the same kernels with the same fixed 32-program launch on a CUDA GPU, through the
    opt-in cross-check mode ($ANYSOFTMAX_ASCEND_ON_CUDA=1), larger shapes included.
(c) Unit tests of the grid/UB arithmetic, the settings and the host glue, on any machine,
    against the packages really installed (torch_npu, CANN and triton-ascend are absent here).
(d) On a machine with an Ascend NPU (never run by this project: none was available), the same
    cases on `npu` tensors, compiled by triton-ascend.

Every result is compared with the one float64 reference (`anysoftmax.core.compare`) on fresh
random data (the `gen` fixture; ANYSOFTMAX_TEST_SEED replays a failure).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import re

import pytest
import torch
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import anysoftmax
from anysoftmax import BackendUnavailableError, SoftmaxSpec, UnsupportedRequestError
from anysoftmax.backends.triton_ascend import TritonAscendBackend, install, npu, planning, settings
from anysoftmax.core import compare
from anysoftmax.core.layout import allocate_rows
from anysoftmax.backends._triton_common.interpreter import interpreting
from anysoftmax.backends._triton_common.launcher import bind
from anysoftmax.backends._triton_common.plan import KernelPlan, OnlinePlan, TilePlan
from anysoftmax.testing.cases import CASES, LONG_ROW_CASES, Case, randn, with_specials
from helpers import as_backend_sees_it, check, params

BACKEND = anysoftmax.register(TritonAscendBackend())
NAME = BACKEND.name

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
# The interpreter runs programs one after another (~3 s for the seed's 1823x781 in one dtype):
# the seed shapes run there in fp32 only; every dtype runs at full size on the GPU (b).
INTERPRETER_CASES = [replace(c, dtypes=(torch.float32,)) if c.name.startswith("seed-") else c for c in CASES]
LOGS = pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])


def plan_for(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> KernelPlan:
    """The plan `run` would launch for this request."""
    xr, _, layout, spec = as_backend_sees_it(x, dim, dtype)
    return BACKEND.plan(xr, layout, spec)


def tile_of(plan: KernelPlan) -> tuple:
    return plan.kind, plan.block_m, plan.block_n


def check_or_refused(case: Case, x: torch.Tensor, log: bool) -> None:
    """Conformance, or for a float64 output the refusal this backend promises."""
    spec = SoftmaxSpec.from_tensor(x, case.dim, case.out_dtype)
    if spec.out_dtype == torch.float64:
        assert re.search("float64 is not supported.*NPU", BACKEND.supports(spec) or "")
    # `check` runs the case, or for a declared refusal asserts the UnsupportedRequestError.
    check(x, case.dim, backend=NAME, log=log, dtype=case.out_dtype)


# ---------------------------------------------------------------------------------------------
# (a) The Triton interpreter on CPU tensors
# ---------------------------------------------------------------------------------------------

@needs_interpreter
@LOGS
@pytest.mark.parametrize("case,dtype", params(INTERPRETER_CASES))
def test_interpreter_conformance(case, dtype, log, gen):
    check_or_refused(case, case.make(gen, dtype), log)


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
        bind(BACKEND.plan(xr, layout, spec), layout, spec.log, y.dtype)((xr, y, None, None, None))
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
    assert plan.grid == 40 and plan.options == {}  # no `multibuffer` off the NPU
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


# ---------------------------------------------------------------------------------------------
# (b) CUDA cross-check: the NPU launch (fixed 32 programs, UB-sized tiles) on a GPU
#     (tests/conftest.py skips `gpu` tests where no CUDA GPU is visible)
# ---------------------------------------------------------------------------------------------

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
    assert plan.kind == kind and plan.options == {}
    assert plan.grid == min(32, -(-n_rows // plan.block_m))  # the seed's fixed 32 programs
    check(x, dim, backend=NAME, log=log)


@pytest.mark.gpu
def test_cuda_needs_the_crosscheck_switch(monkeypatch):
    monkeypatch.delenv(npu.ENV_ON_CUDA, raising=False)
    with pytest.raises((BackendUnavailableError, UnsupportedRequestError), match=npu.ENV_ON_CUDA):
        anysoftmax.softmax(torch.randn(3, 8, device="cuda"), 1, backend=NAME)


# ---------------------------------------------------------------------------------------------
# (d) A real Ascend NPU (skipped here, with the reason: what is missing)
# ---------------------------------------------------------------------------------------------

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
    assert plan.grid == 32 and plan.options == {"multibuffer": True}
    monkeypatch.setenv(settings.ENV_GRID, "vector_cores")
    assert plan_for(x, 1).grid == npu.vector_cores(npu.device_index(x.device))
    check(x, 1, backend=NAME, log=False)
    assert anysoftmax.core.select(SoftmaxSpec.from_tensor(x, 1)).name == NAME


# ---------------------------------------------------------------------------------------------
# (c) Grid and UB arithmetic, settings, host glue: no device needed
# ---------------------------------------------------------------------------------------------

def defaults(**changes) -> settings.Settings:
    """The real tuning table (no profile, no environment) with `changes` applied."""
    return settings.resolve(settings.load_tuning("triton_ascend"), changes, {}, settings.load_profiles())


def plan_rows(n_rows, n_cols, programs=32, in_bytes=4, out_bytes=4, s=None):
    return planning.plan_rows(n_rows, n_cols, programs, in_bytes, out_bytes, 4, s or defaults())


def test_tuning_table_defaults():
    s = defaults()
    assert (s.grid, s.ub_bytes, s.multibuffer, s.vector_bytes) == (32, 192 * 1024, True, 32)
    assert planning.tile_budget(s) == 96 * 1024
    assert planning.tile_budget(defaults(multibuffer=False)) == 192 * 1024


def test_plan_seed_shape_fp32():
    # 1823x781 fp32: 24 bytes per tile element (4 in + 4 out + 4 fp32 copies) in 96 KB: 4096
    # elements, so 4 rows of 1024 per step, 456 steps over the seed's 32 programs.
    assert plan_rows(1823, 781) == TilePlan(4, 1024, 32)


def test_plan_long_rows_take_subblocks():
    # 65536 fp32 columns do not fit: 2048-column sub-blocks (32 bytes each element, 96 KB).
    assert plan_rows(4, 65536) == OnlinePlan(1, 2048, 4)
    # fp16: a 4096-element tile of 20-byte elements fits 96 KB; 8192 columns do not.
    assert plan_rows(10, 4096, in_bytes=2, out_bytes=2).kind == "tile"
    assert plan_rows(10, 8192, in_bytes=2, out_bytes=2) == OnlinePlan(1, 2048, 10)
    # Without multibuffer the whole 192 KB holds 8192 fp32 columns in one tile.
    assert plan_rows(10, 8192, s=defaults(multibuffer=False)).kind == "tile"


def test_plan_narrowest_tile_is_one_vector():
    assert plan_rows(3, 1).block_n == 8  # 32 bytes of fp32
    assert plan_rows(3, 1, in_bytes=2, out_bytes=2).block_n == 16  # 32 bytes of fp16/bf16
    assert plan_rows(3, 1, in_bytes=2, out_bytes=4).block_n == 16  # the narrowest dtype decides


def test_plan_keeps_every_program_busy():
    # 64 short rows over 32 programs: 2 rows per step, not the 512 the UB would hold.
    assert plan_rows(64, 8) == TilePlan(2, 8, 32)
    assert plan_rows(5, 100).grid == 5  # never more programs than rows


def test_grid_limits():
    assert planning.grid_size(32, 10**9) == 32
    assert planning.grid_size(10**6, 10**9) == planning.MAX_PROGRAMS == 65535
    assert planning.grid_size(32, 3) == 3
    assert plan_rows(10**6, 8, programs=10**5).grid == 65535
    for bad in (0, -1):
        with pytest.raises(ValueError, match="grid"):
            planning.grid_size(bad, 10)


def test_plan_budget_below_one_vector():
    # 256 bytes halved by multibuffer: 128 bytes hold 4 fp16 online elements (28 bytes each),
    # fewer than one 32-byte vector (16 elements).
    with pytest.raises(ValueError, match=r"ub_bytes=256 .* allowed: ub_bytes >= 896"):
        plan_rows(4, 100, in_bytes=2, out_bytes=2, s=defaults(ub_bytes=256))
    assert plan_rows(4, 100, in_bytes=2, out_bytes=2, s=defaults(ub_bytes=896)).block_n == 16


@hsettings(max_examples=200, deadline=None)
@given(n_rows=st.integers(1, 10**7), n_cols=st.integers(1, 10**7), programs=st.integers(1, 10**5),
       dtypes=st.sampled_from([(2, 2), (4, 4), (2, 4), (4, 2)]), ub_bytes=st.integers(32, 2**20),
       multibuffer=st.booleans())
def test_plan_invariants(n_rows, n_cols, programs, dtypes, ub_bytes, multibuffer):
    s = defaults(ub_bytes=ub_bytes, multibuffer=multibuffer)
    in_b, out_b = dtypes
    budget, narrowest = planning.tile_budget(s), planning.min_block_n(s, in_b, out_b)
    online_bytes = planning.element_bytes(in_b, out_b, 4, s.online_acc_copies)
    try:
        plan = planning.plan_rows(n_rows, n_cols, programs, in_b, out_b, 4, s)
    except ValueError:
        assert budget // online_bytes < narrowest  # only when not even one vector fits
        return
    assert plan.block_n >= narrowest and plan.block_n & (plan.block_n - 1) == 0
    if plan.kind == "tile":
        assert plan.block_n >= n_cols
        assert plan.block_m * plan.block_n * planning.element_bytes(in_b, out_b, 4, s.tile_acc_copies) <= budget
    else:
        assert plan.block_m == 1 and plan.block_n < n_cols and plan.block_n * online_bytes <= budget
    n_work = -(-n_rows // plan.block_m)
    assert 1 <= plan.grid <= min(programs, 65535, n_work)


def test_settings_precedence():
    table = settings.load_tuning("triton_ascend")
    profiles = settings.load_profiles()
    assert settings.resolve(table, {}, {}, profiles).grid == 32
    via_profile = settings.resolve(table, {"profile": "910B1"}, {}, profiles)
    assert (via_profile.grid, via_profile.ub_bytes) == ("vector_cores", 196608)
    assert planning.resolve_programs(via_profile) == 48
    assert planning.resolve_programs(via_profile, device_vector_cores=40) == 40  # a live NPU wins
    s = settings.resolve(table, {"profile": "910B1", "grid": 8, "ub_bytes": 4096},
                         {settings.ENV_GRID: "12", settings.ENV_UB_BYTES: "2048"}, profiles)
    assert (s.grid, s.ub_bytes) == (12, 2048)
    assert s.source("grid") == "$ANYSOFTMAX_ASCEND_GRID"
    assert settings.resolve(table, {}, {settings.ENV_GRID: "vector_cores", settings.ENV_PROFILE: "910B4"},
                            profiles).profile["vector_cores"] == 40


@pytest.mark.parametrize("changes,match", [
    ({"grid": 0}, r"grid=0 from override\(grid=...\) is not allowed; allowed: a positive integer"),
    ({"grid": -2}, "grid=-2"),
    ({"grid": True}, "grid=True"),
    ({"ub_bytes": 31}, r"ub_bytes=31 .* at least one vector"),
    ({"vector_bytes": 24}, "power of two"),
    ({"multibuffer": "yes"}, "true or false"),
    ({"acc_copies": {"tile": 0, "online": 6}}, "acc_copies"),
    ({"profile": "910C"}, "910B1, 910B2, 910B3, 910B4"),
])
def test_settings_errors_name_setting_and_allowed_values(changes, match):
    with pytest.raises(ValueError, match=match):
        defaults(**changes)


def test_env_errors_name_the_variable(monkeypatch):
    monkeypatch.setenv(settings.ENV_GRID, "0")
    with pytest.raises(ValueError, match=r"grid=0 from \$ANYSOFTMAX_ASCEND_GRID"):
        settings.current()
    monkeypatch.setenv(settings.ENV_GRID, "7")
    monkeypatch.setenv(settings.ENV_UB_BYTES, "8")
    with pytest.raises(ValueError, match=r"ub_bytes=8 from \$ANYSOFTMAX_ASCEND_UB_BYTES"):
        settings.current()


def test_vector_cores_grid_needs_npu_or_profile():
    with pytest.raises(ValueError, match="needs a live NPU or a device profile"):
        planning.resolve_programs(defaults(grid="vector_cores"))


def test_override_rejects_unknown_keys():
    with pytest.raises(KeyError, match="ub_size"):
        with settings.override(ub_size=1):
            pass


def test_device_profiles():
    profiles = settings.load_profiles()
    assert set(profiles) == {"910B1", "910B2", "910B3", "910B4"}
    for name, p in profiles.items():
        assert p["vector_cores"] == 2 * p["ai_cores"], name  # as triton-ascend reports them
        assert p["ub_bytes"] == 192 * 1024 and p["chip"] == f"Ascend{name}"
    assert [profiles[n]["vector_cores"] for n in sorted(profiles)] == [48, 48, 40, 40]


@pytest.fixture
def fresh_probe():
    npu.missing_reason.cache_clear()
    yield
    npu.missing_reason.cache_clear()


@no_torch_npu
def test_unavailable_reason_names_what_is_missing(fresh_probe, monkeypatch):
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    reason = npu.missing_reason()
    assert "torch_npu is not installed" in reason
    assert "CANN not found" in reason and "ASCEND_HOME_PATH" in reason
    assert "docs/ascend.md" in reason
    if importlib.util.find_spec("triton.backends.ascend") is None:
        assert "triton-ascend is not installed" in reason
    assert "torch_npu" not in sys.modules  # probed, never imported


@no_torch_npu
def test_unavailable_without_interpreter_names_what_is_missing():
    """A fresh process without TRITON_INTERPRET, the cross-check switch or the Ascend stack:
    listed as unavailable with the reason, an explicit choice fails with it, and torch_npu is
    never imported."""
    code = textwrap.dedent("""
        import sys, torch, anysoftmax
        from anysoftmax.backends.triton_ascend import TritonAscendBackend
        anysoftmax.register(TritonAscendBackend())
        status = {b.name: b for b in anysoftmax.list_backends()}["triton_ascend"]
        print("AVAILABLE", status.available)
        print("REASON", status.reason)
        try:
            anysoftmax.softmax(torch.randn(2, 3), 1, backend="triton_ascend")
        except anysoftmax.BackendUnavailableError as exc:
            print("ERROR", exc)
        print("TORCH_NPU_IMPORTED", "torch_npu" in sys.modules)
    """)
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", npu.ENV_ON_CUDA, "ASCEND_HOME_PATH")}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines())
    assert lines["AVAILABLE"] == "False"
    for words in ("torch_npu is not installed", "CANN not found", "docs/ascend.md", "TRITON_INTERPRET=1",
                  "ANYSOFTMAX_ASCEND_ON_CUDA=1"):
        assert words in lines["REASON"], lines["REASON"]
    assert "backend 'triton_ascend' (requested explicitly) is not available: " in lines["ERROR"]
    assert lines["TORCH_NPU_IMPORTED"] == "False"


def test_crosscheck_switch(monkeypatch):
    for value, on in (("1", True), ("0", False), ("", False), ("yes", False)):
        monkeypatch.setenv(npu.ENV_ON_CUDA, value)
        assert npu.crosscheck_on_cuda() is on


def spec_on(device: str, dtype=torch.float32) -> SoftmaxSpec:
    # torch.device("cuda") is a plain descriptor: no GPU is needed to describe a CUDA request.
    return SoftmaxSpec(shape=(2, 3), strides=(3, 1), in_dtype=dtype, dim=1, out_dtype=dtype, log=False,
                       device=torch.device(device))


def test_supports(monkeypatch):
    monkeypatch.delenv(npu.ENV_ON_CUDA, raising=False)
    assert "ANYSOFTMAX_ASCEND_ON_CUDA=1" in BACKEND.supports(spec_on("cuda"))
    monkeypatch.setenv(npu.ENV_ON_CUDA, "1")
    assert BACKEND.supports(spec_on("cuda")) is None
    assert "float64" in BACKEND.supports(spec_on("cuda", torch.float64))
    assert "not supported" in BACKEND.supports(spec_on("meta"))
    cpu = BACKEND.supports(spec_on("cpu"))
    if interpreting():
        assert cpu is None
    else:
        assert "TRITON_INTERPRET=1" in cpu


def test_device_guard_on_cpu_is_a_no_op():
    with npu.device_guard(torch.device("cpu")):
        pass
    assert "torch_npu" not in sys.modules


# --- which distribution provides `triton` (install.py; pure functions of the metadata) ------------


def test_triton_owner_check_accepts_triton_ascend_alone():
    assert install.owner_problem(["triton_ascend"], {"triton-ascend": "3.2.0"}) is None


@pytest.mark.parametrize("owners,words", [
    (["triton"], ["triton-ascend is not installed", "triton 3.6.0"]),
    (["triton", "triton-ascend"], ["both triton-ascend 3.2.0 and triton 3.6.0", "overwrote"]),
    ([], ["no installed distribution provides"]),
])
def test_triton_owner_check_names_the_problem_and_the_fix(owners, words):
    reason = install.owner_problem(owners, {"triton": "3.6.0", "triton-ascend": "3.2.0"})
    for w in words:
        assert w in reason, reason
    assert "pip uninstall -y triton triton-ascend" in reason and "triton-ascend==3.2.0" in reason
    assert "--no-deps -e ." in reason


def test_triton_owner_check_reads_this_environment(monkeypatch):
    """On this (stock Triton) machine the live check reports stock Triton by name, and reads
    the owners from importlib.metadata (mocked here to the repaired state)."""
    if importlib.util.find_spec("triton.backends.ascend") is None:
        assert "triton-ascend is not installed (the `triton` package comes from triton " in install.triton_problem()
    monkeypatch.setattr(install.importlib.metadata, "packages_distributions", lambda: {"triton": ["triton_ascend"]})
    assert install.triton_owners() == ["triton-ascend"]
    assert install.triton_problem() is None


def test_version_note_only_for_untested_versions():
    assert install.version_note({"triton-ascend": "3.2.0", "torch-npu": "2.7.1"}) is None
    assert install.version_note({"triton-ascend": "3.2.0"}) is None
    note = install.version_note({"triton-ascend": "3.3.0", "torch-npu": "2.7.1.post2"})
    assert "triton-ascend 3.3.0 (tested: 3.2.0)" in note and "torch-npu 2.7.1.post2 (tested: 2.7.1)" in note


# --- unified-buffer overflow at compile time: halve the tile, retry, remember (ub_retry.py) -------

from anysoftmax.backends.triton_ascend import backend as backend_module  # noqa: E402
from anysoftmax.backends.triton_ascend import ub_retry  # noqa: E402

OVERFLOW_TEXT = "error: ub overflow, requires {} bits while 1572864 bits available"


def overflow_above(limit_elems: int, calls: list):
    """An injected compile step: overflows (as bishengir-compile reports it) for tiles larger
    than `limit_elems` elements, recording every plan it is asked to compile."""
    def attempt(plan: KernelPlan) -> None:
        calls.append(tile_of(plan))
        if plan.block_m * plan.block_n > limit_elems:
            raise RuntimeError(OVERFLOW_TEXT.format(plan.block_m * plan.block_n * 96))
    return attempt


def test_overflow_message_is_recognised():
    assert ub_retry.overflow_in(RuntimeError(OVERFLOW_TEXT.format(2000000))) == (2000000, 1572864)
    err = subprocess.CalledProcessError(1, ["bishengir-compile"], stderr=OVERFLOW_TEXT.format(7).encode())
    assert ub_retry.overflow_in(err) == (7, 1572864)
    assert ub_retry.overflow_in(RuntimeError("some other compile error")) is None


def test_fit_plan_halves_until_it_compiles():
    s = defaults()
    calls: list = []

    def plan_at(h):
        return planning.plan_rows(1823, 781, 32, 4, 4, 4, replace(s, ub_bytes=s.ub_bytes >> h))

    plan, halvings = ub_retry.fit_plan(plan_at, overflow_above(1024, calls))
    assert tile_of(plan) == ("tile", 1, 1024) and halvings >= 1
    assert calls[0] == ("tile", 4, 1024) and calls[-1] == ("tile", 1, 1024)
    assert len(calls) == len(set(calls)), "an unchanged plan was compiled twice"
    # Rows longer than what fits fall through to narrower online sub-blocks.
    calls.clear()
    plan, _ = ub_retry.fit_plan(plan_at, overflow_above(256, calls))
    assert tile_of(plan) == ("online", 1, 256)


def test_fit_plan_gives_up_with_the_compiler_numbers():
    s = defaults()
    with pytest.raises(ub_retry.UBOverflowError, match=r"requires \d+ bits while 1572864 bits available.*allowed"):
        ub_retry.fit_plan(lambda h: planning.plan_rows(4, 781, 32, 4, 4, 4, replace(s, ub_bytes=s.ub_bytes >> h)),
                          overflow_above(0, []))


def test_fit_plan_does_not_retry_other_errors():
    def attempt(plan):
        raise RuntimeError("MLIRCompilationError: something else")

    with pytest.raises(RuntimeError, match="something else"):
        ub_retry.fit_plan(lambda h: TilePlan(1, 16, 1), attempt)


@needs_interpreter
def test_backend_retries_overflow_and_remembers_the_shape_class(monkeypatch, gen):
    """Through `run`: an injected overflow for tiles above 64 elements (at the first launch of
    a plan, where the NPU compiles); the result is still right, the halvings are remembered,
    and a later request of the same class (other row count) compiles its first plan directly."""
    compiled: list = []
    real = backend_module.bind

    def bind_that_overflows(plan, layout, log, out_dtype):
        run = real(plan, layout, log, out_dtype)

        def go(x, y):
            compiled.append(tile_of(plan))
            if plan.block_m * plan.block_n > 64:
                raise RuntimeError(OVERFLOW_TEXT.format(plan.block_m * plan.block_n * 96))
            run(x, y)
        return go

    monkeypatch.setattr(backend_module, "bind", bind_that_overflows)
    monkeypatch.setattr(backend_module, "compile_may_overflow", lambda device: True)  # as on an NPU
    monkeypatch.setattr(backend_module, "_halvings", ub_retry.Halvings())
    for rows in (300, 301):
        x = randn((rows, 50))(gen, torch.float32)
        spec = SoftmaxSpec.from_tensor(x, 1)
        compiled.clear()
        y = BACKEND.run(x, spec)
        result = compare(y, x, spec)
        assert result.ok, result.detail
        assert compiled[-1] == ("tile", 1, 64)
        if rows == 300:
            assert compiled[0][1] * compiled[0][2] > 64 and len(compiled) > 1
        else:
            assert compiled == [("tile", 1, 64)], "the remembered halvings were not used"
