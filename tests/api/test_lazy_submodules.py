"""The package's namespace: `anysoftmax.testing` and `anysoftmax.distributed` work as the docs
spell them (`anysoftmax.testing.check_backend(...)` after a bare `import anysoftmax`), loaded on
first use, so `import anysoftmax` stays light (a fresh interpreter: pytest's plugin has
imported the kit in this one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CODE = """
import sys, anysoftmax
lazy = ('anysoftmax.testing', 'anysoftmax.distributed', 'anysoftmax.backends')
print(sorted(m for m in sys.modules if m.startswith(lazy) or m == 'triton' or m.startswith('triton.')))
print(anysoftmax.testing.check_backend.__name__, anysoftmax.distributed.__name__)
try:
    anysoftmax.no_such_name
except AttributeError as exc:
    print(exc)
"""


def test_testing_and_distributed_load_on_first_use():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", CODE], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    loaded, names, missing = res.stdout.splitlines()
    assert loaded == "[]", f"import anysoftmax pulled in: {loaded}"
    assert names == "check_backend anysoftmax.distributed"
    assert missing == "module 'anysoftmax' has no attribute 'no_such_name'"
