"""The matrix as a newcomer reads it on a CPU machine, from real runs (subprocesses, stdout a
pipe): the entry's Triton rows say the interpreter runs them and its torch rows do not, the
summary fits 100 columns and its footer explains only what it shows, a backend whose extra
`bash run.sh matrix` did not install says how run.sh adds it, and status.png says why its grey
squares were skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import write_matrix

ROOT = Path(__file__).resolve().parents[2]

# No Wave here, as in run.sh's .venv for `matrix`: the import system refuses its packages.
NO_WAVE = """
import importlib.abc, sys
class _NoWave(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("iree", "wave_lang"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoWave())
from anysoftmax.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One summary-sized run (more cells than the per-cell table shows) of an entry named
    `cpu`, as `bash run.sh matrix` starts it (ANYSOFTMAX_RUN_SH=matrix)."""
    if torch.cuda.is_available():
        pytest.skip("the CPU machine's story: no GPU visible")
    folder = tmp_path_factory.mktemp("story")
    config = write_matrix(folder, {"name": "story", "backends": ["torch", "triton", "wave"],
                                   "shapes": [[3, 5], [4, 33]], "dtypes": ["float16", "bfloat16", "float32", "float64"],
                                   "ops": ["softmax", "log_softmax"], "directions": ["forward", "backward"],
                                   "devices": [{"name": "cpu", "device": "cpu"}]}, "story.yaml")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "COLUMNS", "ANYSOFTMAX_RESULTS_DIR")}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), ANYSOFTMAX_RUN_SH="matrix")
    res = subprocess.run([sys.executable, "-c", NO_WAVE, "matrix", str(config), "--no-progress", "--out",
                          str(folder / "out")], cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout, folder / "out"


def _table(out: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "one row per group" in line)
    end = next(i for i, line in enumerate(lines) if line.startswith("Skipped cells"))
    return lines[start:end]


def test_only_the_triton_rows_say_interpreter(run):
    rows = [line.split() for line in _table(run[0]) if " softmax " in line or " log_softmax " in line]
    labels = {}
    for cols in rows:
        backend = next(c for c in cols if c in ("torch", "triton", "wave"))
        labels.setdefault(backend, set()).add(" ".join(cols[:cols.index(backend)]))
    assert labels == {"torch": {"cpu"}, "triton": {"cpu (Triton interpreter)"}, "wave": {"cpu"}}, labels


def test_summary_fits_100_columns_and_its_footer_explains_what_it_shows(run):
    table = _table(run[0])
    assert max(len(line.rstrip()) for line in table) <= 100, max(table, key=len)
    footer = " ".join(table[-1].split())
    assert footer == "err/tol: worst error ÷ tolerance (≤ 1 passes)", footer  # nothing timed: no GB/s, no c:
    assert "GB/s" not in "\n".join(table) and "c:" not in "\n".join(table)


def test_a_backend_run_sh_did_not_install_says_how_run_sh_adds_it(run):
    skipped = [line for line in run[0].splitlines() if "× cpu (wave;" in line]
    assert len(skipped) == 1, run[0][-2000:]
    assert "ANYSOFTMAX_EXTRAS=wave bash run.sh matrix" in skipped[0]
    assert "pip install" not in skipped[0]


def test_status_png_is_laptop_sized_and_names_the_skip_reasons(run):
    matplotlib = pytest.importorskip("matplotlib", reason="status.png needs the plot extra")
    import matplotlib.image

    image = matplotlib.image.imread(run[1] / "status.png")
    height, width = image.shape[:2]
    assert width <= 1800 and height <= 1000, (width, height)
    report = (run[1] / "report.md").read_text()
    assert "status.png" in report
