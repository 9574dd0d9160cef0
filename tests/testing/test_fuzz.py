"""The call-sequence fuzzer (`anysoftmax.testing.fuzz`): a fixed budget on the CPU for torch,
triton and triton_ascend (the Triton backends through the interpreter), and proof that it can
fail: a backend that ignores the mask and one whose launcher memoises a stale layout are caught,
with the replay seed and the shrunk steps in the report; the CLI's `--fuzz` and the module's
JSON summary read from real runs. The seed is the session's (printed in the pytest header)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from anysoftmax.testing import check_backend, fuzz_backend
from anysoftmax.testing.fuzz import SEQUENCE_HEADER, run_fuzz
from conftest import SEED
from wrong_backends import IgnoresMask, Right, StaleStrides, WrongOnce

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
# Budgets: the whole file stays within a few minutes on one core (the interpreter runs every
# Triton program in turn). triton_ascend runs the triton backend's kernels on a fixed program grid
# (many more interpreted programs per call: ~1.4 s a call on CI's cores): fewer calls, the same
# kinds of sequence (the GPU runs take 2000 calls a backend: benchmarks/gpu_run.sh fuzz).
BUDGETS = {"torch": 300, "triton": 150, "triton_ascend": 50}

def _fuzz(record_property, backend, calls, **kw):
    record_property("fuzz_seed", SEED)
    report = run_fuzz(backend, calls=calls, seed=SEED, print_fn=None, shrink_seconds=30, **kw)
    return report


@pytest.mark.parametrize("backend", list(BUDGETS))
def test_fuzz_on_the_cpu(backend, record_property):
    report = _fuzz(record_property, backend, BUDGETS[backend])
    assert report.ok, report.text()
    # (triton_ascend refuses float64: fewer of its steps check a result than the other two)
    assert report.calls == BUDGETS[backend] and report.checked > BUDGETS[backend] // 6, report.summary()


# Seeds tried in turn: a run of 600 calls misses the stale layout about one time in three (12 seeds
# from one session's: 5 missed), so the chance that all of them miss is about 1 in 7000.
FAIL_SEEDS = 8


def _fails(make, calls=600) -> str:
    """The fuzzer's report on a fresh `make()` backend; up to `FAIL_SEEDS` seeds from the session's
    (a run stops at its first failure, so a caught backend costs seconds; a missed one about 4)."""
    for seed in range(SEED, SEED + FAIL_SEEDS):
        backend = make()
        try:
            fuzz_backend(backend, calls=calls, seed=seed, print_fn=None, shrink_seconds=20)
        except AssertionError as exc:
            text = str(exc)
            break
    else:
        pytest.fail(f"the fuzzer passed {backend.name} with seeds {SEED} to {SEED + FAIL_SEEDS - 1}")
    assert f"seed {seed}" in text and f"replay: fuzz_backend({backend.name!r}, calls={calls}, seed={seed})" in text
    # The sequence's checked steps, the failing one last (hypothesis's shrunk steps follow them
    # when its replay fails alike: a stale memo from earlier sequences may not).
    assert SEQUENCE_HEADER in text, text
    return text


def test_a_backend_that_ignores_the_mask_fails():
    text = _fails(IgnoresMask)
    assert "mask=" in text and ("exceeds" in text or "NaN mismatch" in text or "infinities" in text), text


def test_a_launcher_memoised_without_the_layout_fails():
    """Every single-call case of the kit passes this backend; the same request with another
    layout reads stale strides or offset, and only a sequence shows it."""
    text = _fails(StaleStrides)
    assert "operands" in text and ("exceeds" in text or "NaN mismatch" in text or "infinities" in text), text


def test_a_failure_that_does_not_replay_is_reported_once_with_its_steps():
    """hypothesis replays a failing sequence to shrink it; a failure that rests on earlier calls
    does not come back, and hypothesis raises its own flaky-data error beside (or instead of)
    the failure: the report names the failing call once, with its sequence's steps."""
    with pytest.raises(AssertionError) as failed:
        fuzz_backend(WrongOnce(), calls=200, seed=SEED, print_fn=None, shrink_seconds=5)
    text = str(failed.value)
    assert "1 failed" in text and text.count("failed:\n") == 1, text
    assert "FuzzFailure: forward" in text and SEQUENCE_HEADER in text, text
    assert "Inconsistent data generation" not in text, text


def test_a_right_backend_passes_and_refusals_are_skips(record_property):
    record_property("fuzz_seed", SEED)
    report = check_backend(Right(), quick=True, seed=SEED, fuzz=100)
    assert report.ok and report.fuzz.ok and report.fuzz.calls == 100, report.text()
    assert report.fuzz.skipped > 0  # float64 and the fused family are refused by Right: skips
    assert "anysoftmax fuzz of 'right' on cpu: 100 calls" in report.text()


def test_bad_budget_is_named():
    with pytest.raises(ValueError, match="calls"):
        run_fuzz("torch", calls=0, print_fn=None)


# ---- as a user runs it ------------------------------------------------------------------------

def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "ANYSOFTMAX_POISON_OUTPUTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(PLUGINS)])
    return env


def _run(args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)


def test_cli_fuzz(tmp_path):
    ok = _run(["-m", "anysoftmax", "conformance", "torch", "--quick", "--fuzz", "40", "--seed", "7"], tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "anysoftmax fuzz of 'torch' on cpu: 40 calls" in ok.stdout and "(seed 7)" in ok.stdout
    bad = _run(["-m", "anysoftmax", "conformance", "stale_strides", "--plugin", "wrong_backends:StaleStrides",
                "--quick", "--fuzz", "600", "--seed", "5"], tmp_path)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "anysoftmax fuzz of 'stale_strides'" in bad.stdout
    assert "anysoftmax conformance stale_strides --fuzz 600 --seed 5" in bad.stdout
    assert SEQUENCE_HEADER in bad.stdout, bad.stdout


def test_module_json_summary(tmp_path):
    out = tmp_path / "fuzz.json"
    run = _run(["-m", "anysoftmax.testing.fuzz", "--backend", "torch", "--calls", "30", "--seed", "3", "--json",
                str(out)], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "seed 3" in run.stdout and "RuntimeWarning" not in run.stderr
    summary = json.loads(out.read_text())
    assert summary["backend"] == "torch" and summary["device_name"] == "cpu" and summary["seed"] == 3
    assert summary["calls"] == 30 and summary["failures"] == [] and summary["seconds"] > 0
    helptext = _run(["-m", "anysoftmax.testing.fuzz", "--help"], tmp_path).stdout
    assert "ANYSOFTMAX_ASCEND_ON_CUDA=1" in helptext
