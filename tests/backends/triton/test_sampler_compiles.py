"""The sampler's Triton kernels (`_triton_common/sampling_kernels.py`) compile for NVIDIA H100
(sm_90) and AMD MI300X (gfx942) on any machine, in every launch the sampler makes.

What this proves: `sampler_targets.py` runs the Triton sampler on CPU tensors with its launches
recorded instead of made, and compiles each one with the specialization a real launch gives it:
`sample`, `probs` (its second pass too) and `logprobs`; a sharded vocabulary's scan and select; the
kernels around the one-read paths (`sampling_one_read`); every keyword as a number (its pointer
operand absent, stood in for) and as a per-row tensor; the runs pre-pass of top-k rows, with runs of
64 and of 32; on sm_90 each launch with programmatic dependent launch (`SamplingPlan.pdl`: the
launch attribute and the kernels' waits), and the runs pre-pass overlapping the collect
(`SamplingPlan.overlap`: its register counts, on which the overlap rests). Here bfloat16 logits and
one vocabulary of several chunks, to keep the suite's time (the kernels' operand types, what only a
compile checks, do not depend on either); the script's defaults add float16, float32 and a one-chunk
vocabulary (`python tests/backends/triton/sampler_targets.py`, a few minutes). Register counts come
out of the binaries.

What it does not prove: nothing runs (results: tests/backends/triton/test_sampling_kernels.py
through the interpreter, and on a GPU). The interpreter types nothing, so only a compile finds
an operand whose type the kernel cannot take.

The compilation runs in a subprocess: this suite sets TRITON_INTERPRET=1, under which the
kernels are not compilable JITFunctions.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from compile_targets import REG_LIMIT, missing_backend, run_script
from sampler_targets import OPS

from anysoftmax.backends._triton_common.sampling import OVERLAP_RUNS, overlap_registers

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).resolve().parent / "sampler_targets.py"
CHECKED = ("sm_90", "gfx942")
# (16 rows: the default plan has the runs pre-pass; 4 rows: the fused plan, one launch a call)
DTYPE, SHAPES = "bfloat16", "16x20000,4x20000"


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    targets = [t for t in CHECKED if missing_backend(t) is None]
    if not targets:
        pytest.skip("; ".join(missing_backend(t) for t in CHECKED))
    return run_script(SCRIPT, ["--targets", ",".join(targets), "--dtypes", DTYPE, "--shapes", SHAPES], ROOT,
                      tmp_path_factory.mktemp("triton_cache"))


def _kernels(report: dict, target: str) -> list[dict]:
    reason = missing_backend(target)
    if reason:
        pytest.skip(reason)
    return [k for k in report["kernels"] if k["target"] == target]


@pytest.mark.parametrize("target", CHECKED)
def test_every_sampler_launch_compiles(report, target):
    kernels = _kernels(report, target)
    errors = [e for e in report["errors"] if e["target"] == target]
    assert not errors, f"{len(errors)} sampler launches failed on {target}:\n" + "\n".join(
        f"  {e['op']} {e['dtype']} V={e['vocab']} per-row={e['per_row']} "
        f"{e.get('kernel', '')} [{e['stage']}]: {e['error'].splitlines()[0]} ... {e['error'].splitlines()[-1]}"
        for e in errors[:6])
    done = {(k["op"], k["kernel"], k["dtype"]) for k in kernels}
    for op in OPS:
        assert {(op, "scan_kernel", DTYPE), (op, "select_kernel", DTYPE), (op, "scan_select_kernel", DTYPE)} <= done, op
    assert {("probs", "probs_kernel", DTYPE), ("sample-sharded", "select_kernel", DTYPE)} <= done
    for op in ("sample", "logprobs", "sample-short-runs"):
        assert {(op, "runs_kernel", DTYPE), (op, "collect_kernel", DTYPE)} <= done, op
    assert {("probs-one-read", "row_scale_kernel", DTYPE), ("probs-one-read", "probs_fixup_kernel", DTYPE),
            ("logprobs-one-read", "logprobs_gather_kernel", DTYPE),
            ("logprobs-one-read", "logprobs_kernel", DTYPE)} <= done
    assert all(k["specialization"] == "jit-binder" for k in kernels), \
        "compiled without the JIT's launch specialization (Triton internals changed?)"


@pytest.mark.parametrize("target", CHECKED)
def test_sampler_register_counts_are_within_limits(report, target):
    kernels = _kernels(report, target)
    assert kernels
    bad = [f"{k['op']} {k['kernel']} {k['dtype']}: {k['n_regs']}" for k in kernels
           if not 0 < k["n_regs"] <= REG_LIMIT[target]]
    assert not bad, f"register counts outside (0, {REG_LIMIT[target]}]:\n" + "\n".join(bad)


def test_pdl_launches_wait_for_the_previous_launch(report):
    """With `SamplingPlan.pdl` every sampler launch carries the attribute and its kernel waits for
    the launch before it before any load, then releases the next (both griddepcontrol
    instructions in the PTX); without it no launch carries either. A launch with the attribute
    and no wait would read the previous launch's workspace while it is being written."""
    kernels = _kernels(report, "sm_90")
    pdl = [k for k in kernels if k["op"].endswith("-pdl")]
    names = {k["kernel"] for k in pdl}
    assert {"runs_kernel", "collect_kernel", "scan_kernel", "select_kernel", "scan_select_kernel",
            "probs_kernel"} <= names, names
    bad = [f"{k['op']} {k['kernel']}" for k in pdl if not (k["launch_pdl"] and k["gdc_wait"] and k["gdc_launch"])]
    assert not bad, f"PDL launches without the attribute or the waits: {bad}"
    plain = [f"{k['op']} {k['kernel']}" for k in kernels
             if not k["op"].endswith("-pdl") and (k["launch_pdl"] or k["gdc_wait"] or k["gdc_launch"])]
    assert not plain, f"launches with PDL that did not ask for it: {plain}"


def test_the_overlapping_plans_programs_share_a_multiprocessor(report):
    """`SamplingPlan.overlap` on sm_90: its runs programs (4 warps, `overlap` of them) and one
    collect program (4 warps) a multiprocessor must fit its 64K registers (allocated per warp in
    units of 256), or the collect's programs wait for runs programs to leave instead of
    overlapping them; the runs kernel is held to `overlap_registers` where more would not fit."""
    kernels = [k for k in _kernels(report, "sm_90") if k["overlap"]]
    overlaps = sorted({k["overlap"] for k in kernels})
    assert overlaps == sorted((OVERLAP_RUNS, 6)), overlaps

    def registers(k) -> int:
        return k["num_warps"] * -(-k["n_regs"] * 32 // 256) * 256
    # (the collect and the scan compile alike for every `overlap`: listed once, under the first)
    collect = [k for k in kernels if k["kernel"] == "collect_kernel" and k["constexprs"]["OVERLAP"]]
    assert collect and any(k["kernel"] == "scan_kernel" and k["constexprs"]["OVERLAP"] for k in kernels)
    for n in overlaps:
        runs = [k for k in kernels if k["overlap"] == n and k["kernel"] == "runs_kernel" and k["constexprs"]["OVERLAP"]]
        assert runs, n
        for r in runs:
            assert r["n_regs"] <= overlap_registers(n), (n, r["n_regs"])
            for c in collect:
                used = n * registers(r) + registers(c)
                assert used <= 65536, f"{n} runs programs at {r['n_regs']}, collect at {c['n_regs']} registers: {used}"
