"""Kernels compiled for sm_90 in a subprocess (this suite sets TRITON_INTERPRET=1, under which
Triton compiles nothing): the script's last line of output, read as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def compile_script_json(script: str, *argv: str, timeout: float = 600):
    """Run `script` (python source that compiles and prints one JSON line last) with the
    repository importable and the interpreter off; skips where Triton has no nvidia backend."""
    import triton
    import triton.backends

    if "nvidia" not in triton.backends.backends:
        pytest.skip(f"Triton {triton.__version__} has no 'nvidia' backend: cannot compile for sm_90")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", script, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
