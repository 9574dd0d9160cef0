"""The Triton kernels compile for NVIDIA H100 (sm_90) and AMD MI300X (gfx942) on any machine.

What this proves: every kernel the `triton` backend plans for the shapes of
`compile_targets.CASES` (tile, tile log_softmax, online, cooperative split, cols, cooperative
cols_split, backward tile and cooperative backward split; float32 and bfloat16) compiles ahead
of time for Hopper and for CDNA3, with the specialization a real launch gives it; the register
counts are the real ones, read out of the binaries (cuobjdump on the cubin, `.vgpr_count` of
the amdgcn code object, accumulation VGPRs included), within the hardware's limits; fed into
the project's occupancy model they give at least one resident program per SM/CU, and for the
cooperative kernels enough resident programs on a whole H100 (132 SMs) / MI300X (304 CUs) for
every chunk of a row to be in flight at once, which their barrier needs.

What it does not prove: nothing runs. No kernel executes on an AMD (or NVIDIA) GPU here, so
neither results nor speed nor the absence of hangs are checked; the occupancy numbers are the
model's, not measured residency (the JSON also carries a hardware-rule estimate for comparison).

The compilation runs in a subprocess (tests/backends/triton/compile_targets.py) because this suite sets
TRITON_INTERPRET=1, under which the kernels are not compilable JITFunctions.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from compile_targets import CASES, DEVICES, DTYPES, REG_LIMIT, STAGED_CASES, missing_backend, run_script

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).resolve().parent / "compile_targets.py"
CHECKED = ("sm_90", "gfx942")
SMS = {"sm_90": 132, "gfx942": 304}  # H100 SXM, MI300X


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    targets = [t for t in CHECKED if missing_backend(t) is None]
    if not targets:
        pytest.skip("; ".join(missing_backend(t) for t in CHECKED))
    return run_script(SCRIPT, ["--targets", ",".join(targets)], ROOT, tmp_path_factory.mktemp("triton_cache"))


def _kernels(report: dict, target: str) -> list[dict]:
    reason = missing_backend(target)
    if reason:
        pytest.skip(reason)
    return [k for k in report["kernels"] if k["target"] == target]


def _name(k: dict) -> str:
    return f"{k['case']}/{k['dtype']} ({k['kernel']}, phase {k['phase']})"


@pytest.mark.parametrize("target", CHECKED)
def test_every_planned_kernel_compiles(report, target):
    kernels = _kernels(report, target)
    errors = [e for e in report["errors"] if e["target"] == target]
    assert not errors, "failed to plan or compile:\n" + "\n".join(
        f"  {e['case']}/{e['dtype']} [{e['stage']}]: {e['error']}\n{e.get('traceback', '')}" for e in errors)
    done = {(k["case"], k["dtype"]) for k in kernels}
    wanted = {(case[0], d) for case in CASES for d in DTYPES}
    assert wanted <= done, f"not compiled for {target}: {sorted(wanted - done)}"
    # The shapes reach the kernel kinds they are meant to (the planner is the backend's).
    expected = {case[0]: case[6] for case in CASES}
    wrong = [f"{_name(k)}: planned {k['kind']}, meant {expected[k['case']]}" for k in kernels
             if k["kind"] != expected[k["case"]]]
    assert not wrong, "\n".join(wrong)
    assert all(k["specialization"] == "jit-binder" for k in kernels), \
        "compiled without the JIT's launch specialization (Triton internals changed?)"


@pytest.mark.parametrize("target", CHECKED)
def test_register_counts_are_real_and_within_limits(report, target):
    kernels = _kernels(report, target)
    assert kernels
    bad = [f"{_name(k)}: {k['n_regs']} registers" for k in kernels if not 0 < k["n_regs"] <= REG_LIMIT[target]]
    assert not bad, f"register counts outside (0, {REG_LIMIT[target]}]:\n" + "\n".join(bad)
    assert all(k["compiled_num_warps"] == k["num_warps"] for k in kernels)


@pytest.mark.parametrize("target", CHECKED)
def test_occupancy_model_gives_resident_programs(report, target):
    kernels = _kernels(report, target)
    assert kernels
    assert all(k["device"].startswith(("NVIDIA H100", "AMD Instinct MI300X")) for k in kernels)
    bad = [f"{_name(k)}: {k['programs_per_sm']}" for k in kernels if k["programs_per_sm"] < 1]
    assert not bad, "programs per SM < 1:\n" + "\n".join(bad)


@pytest.mark.parametrize("target", CHECKED)
def test_cooperative_kernels_fit_on_the_whole_gpu(report, target):
    kernels = [k for k in _kernels(report, target) if k["cooperative"]]
    assert {k["case"] for k in kernels} >= {"split", "cols_split", "bwd_split"}, \
        "the table no longer plans cooperative split kernels: nothing to check"
    short = [f"{_name(k)}: {k['programs_per_sm']} x {SMS[target]} SMs < {k['chunks']} chunks" for k in kernels
             if k["programs_per_sm"] * SMS[target] < k["chunks"]]
    assert not short, f"a row's chunks cannot all be resident on {DEVICES[target].name}:\n" + "\n".join(short)


@pytest.mark.parametrize("target", CHECKED)
def test_occupancy_model_never_overcounts_the_hardware(report, target):
    # The cooperative kernels launch as many programs as the model says are resident; one more
    # than the hardware holds leaves barrier waiters with no partner. Compared with the
    # hardware's own allocation rules (register granules, compiler's waves per SIMD on CDNA).
    over = [f"{_name(k)}: model {k['programs_per_sm']} > hardware {k['hardware_programs_per_sm']}"
            for k in _kernels(report, target)
            if k["hardware_programs_per_sm"] and k["programs_per_sm"] > k["hardware_programs_per_sm"]]
    assert not over, "occupancy model claims more resident programs than fit:\n" + "\n".join(over)


TRITON_DTYPES = {"float32": "f32", "bfloat16": "bf16"}
# The pipeline depth each staged case asks for (its direction's key).
STAGES_OF = {case[0]: case[5].get("bwd_split_stages" if case[4] else "split_stages") for case in CASES
             if case[0] in STAGED_CASES}


def test_pipelined_split_copies_ahead_only_what_no_program_writes(report):
    """sm_90, the split kernels' pipelined item loop (STAGES 2 and 3): Triton's pipeliner copies
    the next items' chunks into shared memory with cp.async, and nothing else: every async copy
    is a chunk of x (y and dy backward) or, fused, of the bool mask or the row's sink (inputs
    no program writes), none is issued in the barrier's call, and every load of the chunks'
    statistics (.cg: written by other programs before they arrive) stays in that call, after
    the wait, as an ordinary load; the call touches no shared memory. The kernels without the
    form are not pipelined at all."""
    kernels = [k for k in _kernels(report, "sm_90") if k["kind"] == "split" and k["phase"] == 0]
    staged = [k for k in kernels if k["case"] in STAGED_CASES]
    assert {(k["case"], k["dtype"]) for k in staged} == {(c, d) for c in STAGED_CASES for d in DTYPES}
    for k in staged:
        name = _name(k)
        assert k["stages"] == STAGES_OF[k["case"]] and k["cp_async"] > 0, \
            f"{name}: not pipelined ({k['cp_async']} cp.async)"
        chunk = f"[1,{k['block_n']}]" if k["backward"] else f"[{k['block_n']}]"
        allowed = {TRITON_DTYPES[k["dtype"]] + chunk}
        if k["case"].startswith("fused"):  # the bool mask's chunk and the row's sink (float32), inputs too
            allowed |= {"i8" + chunk, "f32[1]"}
        assert set(k["async_copies"]) <= allowed and k["async_copies"], f"{name}: copied ahead {k['async_copies']}"
        assert k["async_copies_in_calls"] == 0, f"{name}: async copies inside the barrier's call"
        # Triton before 3.9 puts a called function's shared memory at offset 0, over the buffers
        # the copies in flight land in (triton-lang/triton#11267): the call must use none.
        assert k["calls_shared"] == 0, f"{name}: the barrier's call touches shared memory"
        assert k["cg_loads"] == 0 and k["ptx_cg_loads"] == 0, f"{name}: statistics read outside the barrier's call"
        assert k["cg_loads_in_calls"] >= 1, f"{name}: no statistics read in the barrier's call"
        # (STAGES - 1) chunks in flight per input: x, or y and dy
        tensors = 2 if k["backward"] else 1
        assert k["shared"] >= (k["stages"] - 1) * tensors * k["block_n"] * (4 if k["dtype"] == "float32" else 2), name
    plain = [k for k in kernels if k["case"] not in STAGED_CASES]
    assert plain and all(k["stages"] == 1 and k["cp_async"] == 0 and not k["async_copies"] for k in plain), \
        [_name(k) for k in plain if k["cp_async"]]


def test_pipelined_split_is_sized_by_its_shared_memory(report):
    """The pipelined kernels' shared memory bounds their programs per SM in the occupancy model
    as on the hardware (the SM's 228 KiB for all its programs, 1 KiB reserved per program), so
    the cooperative grid (whole rows of programs, at most SMs x programs per SM) stays resident."""
    staged = [k for k in _kernels(report, "sm_90") if k["case"] in STAGED_CASES and k["phase"] == 0]
    assert staged
    for k in staged:
        by_shared = 233472 // (k["shared"] + 1024)
        assert k["programs_per_sm"] <= by_shared, f"{_name(k)}: {k['programs_per_sm']} > {by_shared} by shared memory"
        assert k["programs_per_sm"] == k["hardware_programs_per_sm"], _name(k)
        assert k["programs_per_sm"] * SMS["sm_90"] >= k["chunks"], _name(k)


def test_amd_plans_keep_the_loop_unpipelined(report):
    """gfx942: the plans drop STAGES (the backend's draft_plan says why): the same kernel as
    without the form, no LDS beyond the reductions'."""
    kernels = _kernels(report, "gfx942")
    staged = [k for k in kernels if k["case"] in STAGED_CASES]
    assert staged and all(k["stages"] == 1 for k in staged)
    plain = {(k["dtype"], k["phase"]): k for k in kernels if k["case"] == "split"}
    for k in (k for k in staged if k["case"] == "split_stages"):
        assert (k["n_regs"], k["shared"]) == (plain[k["dtype"], k["phase"]]["n_regs"],
                                            plain[k["dtype"], k["phase"]]["shared"]), _name(k)
