"""The CLI's output as logs and terminals get it, read from real runs (subprocesses: stdout is a
pipe, as in CI): names whole, skip reasons grouped once and whole, `backends` and `matrix` agree
on what runs here, reports under the results folder and never in the current folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import anysoftmax
from anysoftmax.output import WIDE, console_width
from helpers import write_matrix

ROOT = Path(__file__).resolve().parents[2]
ENTRY = "laptop cpu (Triton interpreter, a long entry name)"


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "COLUMNS", "ANYSOFTMAX_RESULTS_DIR")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def _cli(args, cwd, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anysoftmax", *args], cwd=cwd, env=_env(**env), capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def small_matrix(tmp_path_factory):
    """A matrix with a long entry name, every built-in backend, a dtype triton_ascend refuses."""
    folder = tmp_path_factory.mktemp("matrix")
    return write_matrix(folder, {"name": "small", "backends": ["torch", "triton", "triton_ascend", "wave"],
                                 "shapes": [[4, 33], [3, 5]], "dtypes": ["float32", "float64"],
                                 "devices": [{"name": ENTRY, "device": "cpu"}]}, "small.yaml")


def test_console_width_follows_the_terminal_or_columns():
    assert console_width(is_terminal=True, environ={}) is None  # rich asks the terminal
    assert console_width(is_terminal=False, environ={}) == WIDE  # a log: wide
    assert console_width(is_terminal=False, environ={"COLUMNS": "77"}) == 77
    assert console_width(is_terminal=True, environ={"COLUMNS": "300"}) == 300
    assert console_width(is_terminal=False, environ={"COLUMNS": "wide"}) == WIDE


@pytest.mark.parametrize("columns", [None, "60"], ids=["log", "60-columns"])
def test_matrix_log_shows_names_whole_and_each_reason_once(small_matrix, tmp_path, columns):
    res = _cli(["matrix", str(small_matrix), "--no-progress", "--out", str(tmp_path / "o")], tmp_path,
               **({"COLUMNS": columns} if columns else {}))
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    cell_rows = [line for line in out.splitlines() if line.startswith("│") and "softmax" in line]
    assert len(cell_rows) == 16, out  # one line per cell: nothing wrapped
    for backend in ("torch", "triton", "triton_ascend", "wave"):
        assert sum(f"│ {backend} " in line for line in cell_rows) == 4, (backend, out)
    assert all(ENTRY in line for line in cell_rows), out
    assert sum("│ passed " in line for line in cell_rows) == 10 and sum("│ skipped " in line for line in cell_rows) == 6
    assert "…" not in out, out
    # triton_ascend's float64 refusal and wave's absence: one group each, the whole reason.
    assert "Skipped cells (6), by reason:" in out
    refusal = [line for line in out.splitlines() if "(triton_ascend; float64):" in line]
    assert len(refusal) == 1, out
    assert refusal[0].rstrip().endswith("so that its CPU and CUDA runs match the NPU's"), refusal[0]
    assert "does not support this request" in refusal[0]
    assert sum("wave is not available" in line or "'wave' is not available" in line for line in out.splitlines()) == 1


def test_backends_and_matrix_agree_on_what_runs_here(small_matrix, tmp_path):
    backends = _cli(["backends"], tmp_path).stdout
    matrix = _cli(["matrix", str(small_matrix), "--dry-run"], tmp_path).stdout
    here = [line for line in backends.splitlines() if line.startswith("runs here:")]
    assert len(here) == 1 and here[0] in matrix.splitlines(), (backends, matrix)
    if not torch.cuda.is_available():
        assert "triton: via the interpreter on CPU" in here[0]
        assert "triton_ascend: via the interpreter on CPU" in here[0]
    table = {line.split("│")[1].strip(): line for line in backends.splitlines() if line.startswith("│")}
    assert "triton_ascend" in table and "yes" in table["triton"], backends


def test_reports_go_to_the_results_folder_not_the_current_one(small_matrix, tmp_path):
    work = tmp_path / "somewhere"
    work.mkdir()
    res = _cli(["matrix", str(small_matrix), "--no-progress", "--json"], work, XDG_DATA_HOME=str(tmp_path / "data"))
    assert res.returncode == 0, res.stderr
    expected = tmp_path / "data" / "anysoftmax" / "results" / "matrix" / "small"
    assert (expected / "report.json").is_file(), res.stderr
    assert f"reports: {expected}/" in res.stderr  # (--json: the other lines go to stderr)
    assert json.loads(res.stdout)["counts"]["failed"] == 0
    assert list(work.iterdir()) == []
    res = _cli(["matrix", str(small_matrix), "--no-progress", "--dry-run"], work,
               ANYSOFTMAX_RESULTS_DIR=str(tmp_path / "mine"))
    assert res.returncode == 0 and list(work.iterdir()) == []


def test_use_and_enable_warn_when_they_serve_no_device_present():
    from anysoftmax.torchop.override import device_present

    absent = [d for d in ("cuda", "npu") if not device_present(d)]
    if not absent:
        pytest.skip("every accelerator device type is present here")
    with pytest.warns(RuntimeWarning, match="none is present here"):
        anysoftmax.enable(backend="torch", devices=(absent[0],))
    anysoftmax.disable()
    with pytest.warns(RuntimeWarning, match=r"anysoftmax.use\(backend='torch', devices=\('cpu',\)\)"):
        with anysoftmax.use(backend="torch", devices=tuple(absent)):
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with anysoftmax.use(backend="torch", devices=("cpu",)) as served:
            assert served == ("cpu",)


def test_conformance_prints_no_warnings_of_the_interpreters_numpy(monkeypatch, capsys):
    """The interpreter emulates a kernel with numpy, which warns where the GPU computes inf and
    NaN silently: `conformance triton` shows none of those, and every other warning still."""
    from anysoftmax.cli import main
    from anysoftmax.testing import kit

    def one_overflowing_launch(name, **_):
        anysoftmax.softmax(torch.full((2, 8), 3e38), -1, backend=name, scale=10.0)  # inf in numpy's multiply
        warnings.warn("a warning of the backend's own", RuntimeWarning)

        class Report:
            def text(self):
                return "checked"

        return Report()

    monkeypatch.setattr(kit, "check_backend", one_overflowing_launch)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert main(["conformance", "triton", "--device", "cpu"]) == 0
    shown = [str(w.message) for w in seen]
    if os.environ.get("TRITON_INTERPRET") == "1":
        assert not [m for m in shown if "encountered" in m], shown
    assert "a warning of the backend's own" in shown, shown
