"""Third-party backends through the `anysoftmax.backends` entry-point group: a dummy installed
distribution (a .dist-info folder on sys.path, as pip leaves it) is found on first use of the
registry, listed by `list_backends()` and the CLI, and serves requests; a broken one is logged
and skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

PLUGIN = textwrap.dedent('''
    import torch

    calls = [0]

    class DummyBackend:
        name = "dummy"
        devices = ("cpu",)
        priority = -1

        def is_available(self):
            return None

        def supports(self, spec):
            return None if spec.out_dtype == torch.float32 else "dummy: float32 only"

        def run(self, x, spec):
            calls[0] += 1
            op = torch.log_softmax if spec.log else torch.softmax
            return op(x.double(), spec.dim).to(spec.out_dtype)
''')


def _install(site, entry_points: str) -> dict:
    (site / "dummy_plugin").mkdir()
    (site / "dummy_plugin" / "__init__.py").write_text(PLUGIN)
    info = site / "dummy_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dummy-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    return env


def test_entry_point_backend_is_listed_and_serves(tmp_path):
    env = _install(tmp_path, "[anysoftmax.backends]\ndummy = dummy_plugin:DummyBackend\n")
    code = textwrap.dedent('''
        import json, torch, anysoftmax, dummy_plugin
        from anysoftmax.core import SoftmaxSpec
        from anysoftmax.testing.compare import compare
        names = [s.name for s in anysoftmax.list_backends()]
        x = torch.randn(4, 33) * 3
        y = anysoftmax.softmax(x, -1, backend="dummy")
        ok = compare(y, x, SoftmaxSpec.from_tensor(x, -1)).ok
        try:
            anysoftmax.softmax(x.double(), -1, backend="dummy")
            refused = ""
        except anysoftmax.UnsupportedRequestError as exc:
            refused = str(exc)
        print(json.dumps(dict(names=names, ok=ok, calls=dummy_plugin.calls[0], refused=refused)))
    ''')
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "dummy" in out["names"] and out["ok"] and out["calls"] == 1
    assert "float32 only" in out["refused"]
    cli = subprocess.run([sys.executable, "-m", "anysoftmax", "backends", "--json"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0 and "dummy" in [b["name"] for b in json.loads(cli.stdout)["backends"]]


def test_broken_entry_point_is_logged_not_fatal(tmp_path):
    env = _install(tmp_path, "[anysoftmax.backends]\nbroken = dummy_plugin:DoesNotExist\n")
    code = "import anysoftmax; print([s.name for s in anysoftmax.list_backends()])"
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "torch" in proc.stdout and "broken" not in proc.stdout
    assert "broken" in proc.stderr and "failed to load" in proc.stderr
