"""`triton_ascend` suite (c): no device needed. The grid and unified-buffer arithmetic of the NPU
planner (with hypothesis), the settings and their precedence, the availability reasons, the
triton ownership check, and the UB-overflow halve-and-retry (an injected compiler failure)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from anysoftmax import SoftmaxSpec
from anysoftmax.backends._triton_common.interpreter import interpreting
from anysoftmax.backends._triton_common.plan import KernelPlan, OnlinePlan, TilePlan
from anysoftmax.backends.triton_ascend import install, npu, planning, sampling_plan, settings
from anysoftmax.sampling.spec import SamplingSpec
from anysoftmax.testing.compare import compare
from anysoftmax.testing.cases import randn
from helpers.ascend import BACKEND, needs_interpreter, no_torch_npu, tile_of


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
    assert "install in this order" in reason and "triton-ascend==3.2.0" in reason
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
    for words in ("torch_npu is not installed", "CANN not found", "install in this order", "TRITON_INTERPRET=1",
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


def test_merge_states_refuses_what_softmax_refuses(monkeypatch):
    from anysoftmax.core.lse_merge import MergeSpec

    monkeypatch.delenv(npu.ENV_ON_CUDA, raising=False)
    for device in ("cuda", "meta"):
        merge = MergeSpec(2, (3, 8), torch.float32, (torch.float32,) * 2, torch.device(device))
        assert BACKEND.supports_merge_states(merge) == BACKEND.supports(spec_on(device)), device


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


@pytest.mark.parametrize("vocab", [7, 300, 5000, 128256, 151936, 1 << 20])
@pytest.mark.parametrize("ub_bytes", [None, 16384])
def test_the_plan_keeps_its_blocks_in_the_unified_buffer(vocab, ub_bytes):
    with settings.override(**({} if ub_bytes is None else {"ub_bytes": ub_bytes})):
        spec = SamplingSpec.from_request("sample", torch.empty(64, vocab, device="meta"), top_k=5)
        plan = BACKEND.sampling_plan(spec)
        s = settings.current()
    budget = planning.tile_budget(s)
    assert plan.chunk * sampling_plan.SCAN_BYTES <= budget or plan.chunk == 16
    groups = plan.groups_pow2(vocab)
    assert groups * plan.slots <= sampling_plan.MAX_SELECT or plan.slots == sampling_plan.MIN_SLOTS
    assert sampling_plan.MIN_SLOTS <= plan.slots <= sampling_plan.MAX_SLOTS
    assert plan.tile * sampling_plan.TILE_BYTES <= budget or plan.tile == sampling_plan.MIN_TILE
    assert not plan.runs
    assert plan.grid == planning.grid_size(planning.resolve_programs(s), 64 * plan.chunks(vocab))
    assert BACKEND.sampling_plan(spec) is plan or ub_bytes is not None  # (memoised: launchers key by it)
