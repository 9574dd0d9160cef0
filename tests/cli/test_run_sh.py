"""run.sh's own messages, read from its real output."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("verbosity", ["-q", "-qq", "-v"])
def test_the_test_command_ends_with_the_counts_and_the_seed(tmp_path, verbosity):
    """`bash run.sh test` with the user's own verbosity: the summary counts and the seed print
    whatever it is (one tiny test, in this process: ANYSOFTMAX_TEST_WORKERS=0)."""
    env = {**os.environ, "ANYSOFTMAX_PYTHON": sys.executable, "ANYSOFTMAX_TEST_WORKERS": "0",
           "ANYSOFTMAX_RESULTS_DIR": str(tmp_path)}
    res = subprocess.run(["bash", str(REPO / "run.sh"), "test", verbosity, "-p", "no:cacheprovider",
                          "tests/test_suite_layout.py::test_module_names_are_unique"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    tail = res.stdout.strip().splitlines()[-3:]
    assert any(re.search(r"\b1 passed\b", line) for line in tail), res.stdout
    assert any("anysoftmax: random seed" in line for line in tail), res.stdout
    if verbosity == "-v":  # the user's verbosity is theirs, not cancelled by run.sh's own -q
        assert "test_module_names_are_unique PASSED" in res.stdout, res.stdout
