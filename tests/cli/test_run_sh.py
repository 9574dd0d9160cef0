"""run.sh's own messages, read from its real output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_python_without_torch_gets_a_clear_message(tmp_path):
    # A bare venv: a working Python that has no torch (the base interpreter of this one).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    py = tmp_path / "bare" / "bin" / "python"
    env = {**os.environ, "ANYSOFTMAX_PYTHON": str(py), "ANYSOFTMAX_RESULTS_DIR": str(tmp_path / "out")}
    res = subprocess.run(["bash", str(REPO / "run.sh"), "matrix"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"run.sh: ANYSOFTMAX_PYTHON={py} has no torch" in res.stderr
    assert "--index-url https://download.pytorch.org/whl/cpu" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_missing_python_is_named(tmp_path):
    env = {**os.environ, "ANYSOFTMAX_PYTHON": "no-such-python-3", "ANYSOFTMAX_RESULTS_DIR": str(tmp_path)}
    res = subprocess.run(["bash", str(REPO / "run.sh"), "matrix"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "ANYSOFTMAX_PYTHON=no-such-python-3 is not an interpreter" in res.stderr
