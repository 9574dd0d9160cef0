"""What a user's log shows: `anysoftmax.use()` and interpreted Triton runs on ordinary input emit
no warning. Each check runs in a fresh interpreter that records every warning (the test suite's
own filters, pyproject.toml's `filterwarnings`, do not apply there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

RECORD = """
import json, warnings
warnings.simplefilter("always")
_seen = []
warnings.showwarning = lambda message, category, *a, **k: _seen.append(f"{category.__name__}: {message}")
"""
REPORT = "\nprint(json.dumps(_seen))\n"


def _warnings_of(code: str, **env_extra) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONWARNINGS")}
    env.update(PYTHONPATH=str(REPO), **env_extra)
    res = subprocess.run([sys.executable, "-c", RECORD + code + REPORT], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "Warning" not in res.stderr, res.stderr  # nothing printed behind the recorder's back
    return json.loads(res.stdout.splitlines()[-1])


def test_use_registers_its_kernels_without_torchs_override_warning():
    seen = _warnings_of("""
import torch, anysoftmax
with anysoftmax.use(backend="torch", devices=("cpu",)):
    torch.softmax(torch.randn(4, 5), -1)
with anysoftmax.use(backend="torch", devices=("cpu",)):  # a second registration, too
    torch.log_softmax(torch.randn(4, 5), 0)
""")
    assert seen == [], seen


def test_a_warning_of_another_kind_still_shows_inside_use():
    seen = _warnings_of("""
import torch, anysoftmax
with anysoftmax.use(backend="torch", devices=("cpu",)):
    warnings.warn("a user's own warning", UserWarning)
""")
    assert seen == ["UserWarning: a user's own warning"], seen


def test_interpreted_triton_runs_on_ordinary_input_emit_no_numpy_warning():
    seen = _warnings_of("""
import torch, anysoftmax
torch.manual_seed(0)
x = torch.randn(37, 300, requires_grad=True)
for b in ("triton", "triton_ascend"):
    anysoftmax.softmax(x, 1, backend=b).sum().backward()
    anysoftmax.log_softmax(x, 0, backend=b)
    s = torch.randn(2, 3, 37, 37)
    anysoftmax.softmax(s, -1, scale=0.5, causal=True, mask=torch.rand(37, 37) < 0.3, backend=b)
    anysoftmax.log_softmax(s, -1, causal=True, backend=b)
""", TRITON_INTERPRET="1")
    assert seen == [], seen
