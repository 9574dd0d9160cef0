"""The conformance kit (`anysoftmax.testing`): it passes a right backend, fails each subtly wrong
one naming its cases, counts declared refusals as skips (never passes, never failures), and
leaves the user's registry as it found it. The CLI and the pytest plugin are run as a user
runs them (subprocesses), and their real output is read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import anysoftmax
from anysoftmax.backends.torch_eager import TorchBackend
from anysoftmax.core import registry
from anysoftmax.testing import check_backend, conformance_checks
from helpers import write_matrix
from wrong_backends import (BoolSupports, ChannelsLastOff, Float64LseMergeOff, FusedLongOff, HalfLongOff, IgnoresMask,
                            LastDimLongOff, LongRowOff, LseOff, ManyRowsOff, MaskAllKeptOff, MergeIntoOutOff,
                            NaiveMerge, Over2048Off, ReusesOutput, Right, RowScaleAfterSoftmax, RowScalePerColumn,
                            ScalesInputInPlace, SkipsLastElement, SoftcapNanGradient, StridedMergeOff)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "plugin"
PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def failures(backend, quick=True) -> str:
    with pytest.raises(AssertionError) as info:
        check_backend(backend, quick=quick, seed=3)
    return str(info.value)


def test_a_right_backend_passes_and_refusals_are_skips():
    report = check_backend(Right(), seed=3)
    assert report.ok and not report.failed
    assert len(report.passed) > 300
    # float64 refused by supports(), the fused family by the gate: skips with the reasons.
    reasons = list(report.skipped)
    assert "right: no float64" in reasons
    assert any("fused = True" in r for r in reasons)
    assert not any(name in report.passed for names in report.skipped.values() for name in names)


WRONG = [
    (LongRowOff(), ["forward softmax seed-1823x781 float32", "shape=[1823, 781], dim=1, float32->float32"]),
    (IgnoresMask(), ["fused softmax bool-mask-full-empty-zero float32", "mask=bool[2, 3, 16, 24]"]),
    (SkipsLastElement(), ["forward softmax seed-1823x781 float32", "NaN mismatch at [1822, 780]"]),
    (ReusesOutput(), ["repeat softmax rank2-dim1 float32", "same output buffer"]),
    (ScalesInputInPlace(), ["forward softmax seed-1823x781 float32", "modified its input"]),
    (BoolSupports(), ["supports() returned True"]),
    (LseOff(), ["logsumexp logsumexp lse-specials float32", "logsumexp(shape=[8, 100], dim=1, float32"]),
    (NaiveMerge(), ["merge merge_states split-masked-and-specials float32", "NaN mismatch"]),
]


@pytest.mark.parametrize("backend,named", WRONG, ids=[b.name for b, _ in WRONG])
def test_subtly_wrong_backends_fail_naming_their_cases(backend, named):
    text = failures(backend)
    assert f"anysoftmax conformance of {backend.name!r}" in text
    for piece in named:
        assert piece in text, text[:3000]


# The torch backend with one defect planted (`wrong_backends.Planted`): each is wrong only under
# its condition, passed the kit before the kit had a case meeting it, and must now fail it,
# named by a case that meets it (in the quick run too).
PLANTED = [
    (MaskAllKeptOff(), "fused softmax bool-mask-nothing-excluded float32"),
    (LastDimLongOff(), "forward softmax row-4097 float32"),
    (HalfLongOff(), "forward softmax row-4097 bfloat16"),
    (Over2048Off(), "forward log_softmax row-4097 float32"),
    (FusedLongOff(), "fused softmax fused-row-1100 float32"),
    (ChannelsLastOff(), "forward softmax channels-last float32"),
    (ManyRowsOff(), "forward softmax rows-4097 float32"),
    (StridedMergeOff(), "merge merge_states split-strided float32"),
    (Float64LseMergeOff(), "merge merge_states split-float64-lses bfloat16"),
    (MergeIntoOutOff(), "merge merge_states split-into-out float32"),
    (SoftcapNanGradient(), "fused-backward softmax softcap-nan-excluded float32"),
    (RowScalePerColumn(), "fused softmax row-scale float32"),
    (RowScaleAfterSoftmax(), "fused log_softmax row-scale float32"),
]


def failed_checks(text: str) -> set[str]:
    """The names of the failed checks in a report's text."""
    lines = text.split("failed (", 1)[1].splitlines()[1:]
    return {line[2:].split(": ", 1)[0] for line in lines if line.startswith("  ") and not line.startswith("   ")}


@pytest.mark.parametrize("backend,case", PLANTED, ids=[b.name for b, _ in PLANTED])
def test_planted_defects_fail_naming_a_case_that_meets_them(backend, case):
    failed = failed_checks(failures(backend))
    assert case in failed, sorted(failed)


def test_the_fused_gate_is_a_skip_and_a_fused_backend_is_checked():
    plain = check_backend(Right(), quick=True, seed=3)
    gate = [r for r in plain.skipped if "fused = True" in r]
    assert gate and not [n for n in plain.passed if n.startswith("fused")]
    # torch declares the family: its fused checks run and pass.
    torch_report = check_backend("torch", quick=True, seed=3)
    assert [n for n in torch_report.passed if n.startswith("fused-backward")]


def test_a_tensor_scale_is_a_skip_for_a_fused_backend_that_does_not_declare_it():
    class FusedWithoutRowScale(TorchBackend):
        name, devices, priority, row_scale = "fused_without_row_scale", ("cpu",), -100, False

    report = check_backend(FusedWithoutRowScale(), quick=True, seed=3)
    gate = [names for reason, names in report.skipped.items() if "row_scale = True" in reason]
    assert gate and all("row-scale" in name for name in gate[0])
    assert not [n for n in report.passed if "row-scale" in n]


def test_everything_refused_is_not_a_pass():
    class RefusesAll(Right):
        name = "refuses_all"

        def supports(self, spec):
            return "refuses_all: nothing"

    text = failures(RefusesAll())
    assert "nothing was checked: every case was refused" in text and " 0 failed" in text


def test_an_unavailable_backend_is_not_a_pass():
    class Absent(Right):
        name = "absent"

        def is_available(self):
            return "needs the imaginary XPU-9000"

    assert "not available here: needs the imaginary XPU-9000" in failures(Absent())


def test_the_users_registration_comes_back():
    mine, other = Right(), Right()
    anysoftmax.register(mine)
    try:
        check_backend(other, quick=True, seed=3)  # the same name, another object
        assert registry.get_backend("right") is mine
    finally:
        anysoftmax.unregister("right")
    check_backend(Right(), quick=True, seed=3)
    assert "right" not in registry.registered()


def test_checks_are_named_by_case_dtype_and_op():
    names = [c.name for c in conformance_checks("torch")]
    assert len(names) == len(set(names))
    assert "forward log_softmax seed-1823x781 float16" in names
    assert "fused-backward softmax everything float32" in names
    quick = conformance_checks("torch", quick=True)
    assert 100 < len(quick) < len(names) / 4


# ---- the command line and the pytest plugin, as a user runs them -----------------------------

def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "ANYSOFTMAX_POISON_OUTPUTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(EXAMPLE), str(PLUGINS)])
    return env


def _run(args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)


def test_cli_exit_status_and_report(tmp_path):
    ok = _run(["-m", "anysoftmax", "conformance", "mine", "--plugin", "my_pkg.backend", "--quick"], tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "anysoftmax conformance of 'mine' on cpu:" in ok.stdout and " 0 failed" in ok.stdout
    bad = _run(["-m", "anysoftmax", "conformance", "long_row_off", "--plugin", "wrong_backends:LongRowOff",
                "--quick", "--seed", "5"], tmp_path)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "forward softmax seed-1823x781 float32: softmax(shape=[1823, 781], dim=1" in bad.stdout
    assert "--seed 5" in bad.stdout
    usage = _run(["-m", "anysoftmax", "conformance", "nosuch", "--device", "cpu"], tmp_path)
    assert usage.returncode == 2 and "unknown backend 'nosuch'" in usage.stderr


def test_the_readme_plugin_as_a_matrix_plugins_entry(tmp_path):
    """`plugins: [my_pkg.backend]` imports the module, which registers `mine`: its cells run."""
    config = write_matrix(tmp_path, {"name": "mine", "plugins": ["my_pkg.backend"], "backends": ["mine", "torch"],
                                     "shapes": [[3, 40]], "dtypes": ["float32", "float64"],
                                     "devices": [{"name": "cpu", "device": "cpu"}]}, "mine.yaml")
    res = _run(["-m", "anysoftmax", "matrix", str(config), "--no-progress", "--out", str(tmp_path / "o")], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "3 passed, 0 failed, 1 skipped" in res.stdout and "mine: no float64" in res.stdout


def _pytest_args() -> list[str]:
    # Installed (run.sh, a wheel), the plugin loads through its pytest11 entry point; from a bare
    # checkout on PYTHONPATH it is named.
    from importlib.metadata import entry_points

    installed = any(ep.value == "_anysoftmax_pytestplugin" for ep in entry_points(group="pytest11"))
    return ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--anysoftmax-quick"] + (
        [] if installed else ["-p", "_anysoftmax_pytestplugin"])


def test_pytest_plugin_adds_the_checks(tmp_path):
    ok = _run(_pytest_args() + ["--anysoftmax-plugin", "my_pkg.backend", "--anysoftmax-backend", "mine",
                                "-k", "forward or fused"], tmp_path)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-2000:]
    assert " passed" in ok.stdout and "skipped" in ok.stdout  # fused: the gate's skips
    bad = _run(_pytest_args() + ["--anysoftmax-plugin", "wrong_backends:IgnoresMask", "--anysoftmax-backend",
                                 "ignores_mask", "-k", "fused and mask"], tmp_path)
    assert bad.returncode == 1, bad.stdout[-3000:]
    assert "FAILED anysoftmax-conformance[ignores_mask@cpu]::fused softmax bool-mask-full-empty-zero" in bad.stdout


def test_the_pytest_plugin_imports_nothing_until_asked(tmp_path):
    """pytest loads it in every session of an environment that has anysoftmax, before any
    conftest: importing anysoftmax there would read $ANYSOFTMAX_POISON_OUTPUTS too early."""
    code = "import sys, _anysoftmax_pytestplugin; print(sorted(m for m in sys.modules if m.startswith('anysoftmax')))"
    res = _run(["-c", code], tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr


def test_poisoned_allocations_fill_floats_only():
    from anysoftmax.testing import poisoned_allocations

    with poisoned_allocations():
        f, i = torch.empty(4), torch.empty(4, dtype=torch.int32)
        like = torch.empty_like(torch.zeros(2, 2))
    assert torch.isnan(f).all() and torch.isnan(like).all() and i.dtype == torch.int32
    assert not torch.isnan(torch.empty(4).fill_(0)).any()  # outside the block: torch as usual


def test_case_keywords_build_for_logits_on_another_device():
    """A case's keywords come from a CPU generator but must build for logits that already sit
    on the device under test (a GPU test moves the logits first); "meta" stands in for it."""
    from anysoftmax.testing.cases import LONG_VARIANT_CASES, VARIANT_CASES

    for case in VARIANT_CASES + LONG_VARIANT_CASES:
        gen = torch.Generator().manual_seed(0)
        x = case.make(gen, case.dtypes[0]).to("meta")
        case.kwargs(gen, x)
