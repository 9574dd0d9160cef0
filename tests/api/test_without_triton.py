"""anysoftmax without Triton (the core install on a CPU machine: Triton is the `triton` extra).

Each check runs in a fresh interpreter whose import system refuses `triton`, as on a machine
where it is not installed: `import anysoftmax` works, the torch backend computes, and the
Triton backends say which extra to install instead of failing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BLOCK = """
import importlib.abc, sys
class _NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoTriton())
"""


def _run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-c", BLOCK + code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def test_core_works_and_triton_backends_name_the_extra():
    res = _run("""
import json, torch, anysoftmax
assert "triton" not in sys.modules
x = torch.randn(7, 33)
assert torch.allclose(anysoftmax.softmax(x, -1), torch.softmax(x, -1))
with anysoftmax.use(backend="torch", devices=("cpu",)):
    y = torch.softmax(x, 0)
print(json.dumps({b.name: b.reason for b in anysoftmax.list_backends()}))
""")
    assert res.returncode == 0, res.stderr
    reasons = json.loads(res.stdout.splitlines()[-1])
    assert reasons["torch"] == ""
    assert "pip install 'anysoftmax[triton]'" in reasons["triton"], reasons["triton"]
    assert "triton-ascend==" in reasons["triton_ascend"] and "--no-deps" in reasons["triton_ascend"], reasons["triton_ascend"]
    assert "availability check failed" not in reasons["triton"] + reasons["triton_ascend"]


def test_cli_backends_without_triton():
    res = _run("from anysoftmax.cli import main; raise SystemExit(main(['backends', '--json']))")
    assert res.returncode == 0, res.stderr
    rows = {b["name"]: b for b in json.loads(res.stdout)["backends"]}
    assert rows["torch"]["available"] and not rows["triton"]["available"]
    assert "anysoftmax[triton]" in rows["triton"]["reason"]


def test_cli_backends_without_triton_claims_no_interpreter():
    res = _run("""
import os
from anysoftmax.cli import main
code = main(['backends'])
print('TRITON_INTERPRET:', os.environ.get('TRITON_INTERPRET'))
raise SystemExit(code)
""")
    assert res.returncode == 0, res.stderr
    assert "through the Triton interpreter" not in res.stdout + res.stderr, res.stdout + res.stderr
    assert "TRITON_INTERPRET: None" in res.stdout
    # Third-party plugins (CI installs the README's example) may run here too; no Triton backend may.
    (line,) = [ln for ln in res.stdout.splitlines() if ln.startswith("runs here: ")]
    here = [entry.split(":")[0].strip() for entry in line.removeprefix("runs here: ").split(";")]
    assert "torch" in here and not {"triton", "triton_ascend"} & set(here), line


def test_explicit_triton_without_triton_raises_naming_the_extra():
    res = _run("""
import torch, anysoftmax
try:
    anysoftmax.softmax(torch.randn(3, 4), -1, backend="triton")
except anysoftmax.BackendUnavailableError as exc:
    print(exc)
""")
    assert res.returncode == 0, res.stderr
    assert "backend 'triton' (requested explicitly) is not available" in res.stdout
    assert "pip install 'anysoftmax[triton]'" in res.stdout
