"""The `anysoftmax` console script as pip installs it, run from a user's project folder: a
`--plugin` module (or a matrix's `plugins:`) in the current folder imports as it does under
`python -m anysoftmax`, and `conformance` of a backend that is not available here exits with its
own status, not the one of a failure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import write_matrix

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "plugins"
EXAMPLE_BACKEND = ROOT / "examples" / "plugin" / "my_pkg" / "backend.py"

# What pip writes for `[project.scripts] anysoftmax = "anysoftmax.cli:main"`: Python runs it
# as a file, so sys.path[0] is its bin folder, never the current one.
CONSOLE_SCRIPT = """import sys
from anysoftmax.cli import main
if __name__ == "__main__":
    sys.exit(main())
"""


def _project(tmp_path: Path) -> Path:
    """A user's folder holding `cwd_pkg/backend.py`: the README's backend, named `mine_here`
    (CI installs the README's own `my_pkg`, which would import from anywhere)."""
    work = tmp_path / "project"
    (work / "cwd_pkg").mkdir(parents=True)
    (work / "cwd_pkg" / "__init__.py").write_text("")
    (work / "cwd_pkg" / "backend.py").write_text(EXAMPLE_BACKEND.read_text().replace('"mine"', '"mine_here"'))
    return work


def _anysoftmax(tmp_path: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    script = tmp_path / "bin" / "anysoftmax"
    script.parent.mkdir(exist_ok=True)
    script.write_text(CONSOLE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(PLUGINS)])
    return subprocess.run([sys.executable, str(script), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_plugin_in_the_current_folder_imports_from_the_console_script(tmp_path):
    work = _project(tmp_path)
    # An unknown name after the plugin: the plugin imported when the known backends list its one.
    res = _anysoftmax(tmp_path, "conformance", "nosuch", "--plugin", "cwd_pkg.backend", cwd=work)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "cannot import" not in res.stderr, res.stderr
    assert "unknown backend 'nosuch'" in res.stderr and "mine_here" in res.stderr, res.stderr


def test_a_matrix_plugin_in_the_current_folder_imports_from_the_console_script(tmp_path):
    work = _project(tmp_path)
    config = write_matrix(work, {"name": "here", "plugins": ["cwd_pkg.backend"], "backends": ["mine_here"],
                                 "shapes": [[2, 8]], "devices": [{"name": "cpu", "device": "cpu"}]}, "here.yaml")
    res = _anysoftmax(tmp_path, "matrix", str(config), "--dry-run", cwd=work)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "cpu (cpu): 1 cells" in res.stdout, res.stdout


def test_an_unavailable_backend_has_its_own_exit_status(tmp_path):
    from anysoftmax.testing.command import EXIT_UNAVAILABLE

    res = _anysoftmax(tmp_path, "conformance", "broken_absent", "--plugin", "broken_backends:Absent", "--quick",
                      cwd=tmp_path)
    assert res.returncode == EXIT_UNAVAILABLE == 3, res.stdout + res.stderr
    assert "'broken_absent' is not available here: needs the imaginary XPU-9000" in res.stderr, res.stderr
    assert "nothing was checked" in res.stderr, res.stderr


def test_the_exit_statuses_are_in_the_help(tmp_path):
    res = _anysoftmax(tmp_path, "conformance", "--help", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())
    for line in ("0 every check passed", "1 a check failed", "2 bad usage", "3 the backend is not available here"):
        assert line in text, res.stdout
