"""The installed wheel, used as a new user would: built from the checkout, installed (not
editable) into a fresh virtual environment, and run from a directory outside the repository;
with it, a plugin author's view: the README's example plugin installed beside it passes the
conformance kit (CLI and pytest plugin), and a subtly wrong backend fails with its cases named.

A clone-only test once hid a package that could not run (its YAML files were not in the wheel):
this test imports nothing from the checkout. It takes a minute or two (a venv with CPU torch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WRONG = Path(__file__).resolve().parent / "plugins" / "wrong_backends.py"
TORCH_PIN = "torch==2.13.0"  # the CPU wheel this machine holds (README: an unpinned torch pulls CUDA)


def _run(cmd, cwd, env=None, timeout=900):
    # Never this process's PYTHONPATH: with the checkout on it (and its egg-info, after an
    # editable install) pip would find anysoftmax "already installed" and skip the wheel.
    proc = subprocess.run(cmd, cwd=cwd, env=_env() if env is None else env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode in (0,), f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python, bin dir, a working directory outside the repository) of a fresh venv holding
    the wheel built from this checkout."""
    base = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base / "dist"), str(REPO)], cwd=base)
    wheels = list((base / "dist").glob("anysoftmax-*.whl"))
    assert len(wheels) == 1, wheels
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=base)
    py = venv / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "-q", TORCH_PIN], cwd=base)
    # The core has no Triton (an extra): the tests below run its kernels through the interpreter.
    _run([str(py), "-m", "pip", "install", "-q", f"{wheels[0]}[triton]"], cwd=base)
    outside = base / "elsewhere"
    outside.mkdir()
    return py, venv / "bin", outside, wheels[0]


def _env(extra=None):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET", "ANYSOFTMAX_CONFIG_DIR")}
    env.update(extra or {})
    return env


def test_wheel_contents(installed):
    *_, wheel = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("anysoftmax/configs/default.yaml", "anysoftmax/configs/h100.yaml",
                   "anysoftmax/backends/triton/tuning.yaml", "anysoftmax/backends/triton_ascend/tuning.yaml",
                   "anysoftmax/backends/triton_ascend/profiles.yaml", "anysoftmax/backends/wave/tuning.yaml",
                   "anysoftmax/backends/_triton_common/native_launch.cc",
                   "anysoftmax/py.typed", "anysoftmax/bench/softmax.py", "anysoftmax/testing/cases.py",
                   "anysoftmax/testing/kit.py", "anysoftmax/testing/fuzz.py", "_anysoftmax_pytestplugin.py"):
        assert needed in names, f"{needed} missing from {wheel.name}"
    assert any(n.endswith("licenses/LICENSE") for n in names), "LICENSE missing from the wheel"
    meta = next(n for n in names if n.endswith("METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "License-Expression: Apache-2.0" in text
    assert "Project-URL: Documentation" in text
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "[pytest11]\nanysoftmax = _anysoftmax_pytestplugin" in entry_points
    core = [line.split()[1].split(">")[0] for line in text.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert sorted(core) == ["numpy", "pyyaml", "rich", "torch"], core  # no matplotlib, no triton


def test_installed_package_runs_from_outside(installed):
    py, bindir, outside, _ = installed
    probe = ("import anysoftmax, sys; print(anysoftmax.__file__); "
             "print([m for m in sys.modules if m.startswith('anysoftmax.backends')])")
    out = _run([str(py), "-c", probe], cwd=outside, env=_env()).stdout.splitlines()
    assert "site-packages" in out[0] and str(REPO) not in out[0]
    assert out[1] == "[]", f"import anysoftmax loaded backends: {out[1]}"
    code = """
import torch, anysoftmax
x = torch.randn(37, 300)
for b in ("triton", "triton_ascend"):
    y = anysoftmax.softmax(x, 1, backend=b)
    assert (y - torch.softmax(x, 1)).abs().max() < 1e-6, b
# The fused family from the wheel: a broadcast bool mask and causal rows of 37 (a prefix that
# ends inside a load vector, a row that ends inside one), empty rows "zero".
s = torch.randn(2, 3, 37, 37) * 4
m = torch.rand(2, 1, 37, 37) < 0.3
z = (s * 0.5).masked_fill(m | torch.ones(37, 37, dtype=torch.bool).triu(1), float("-inf"))
want = torch.softmax(z.double(), -1).nan_to_num(0.0)
for b in ("triton", "triton_ascend"):
    got = anysoftmax.softmax(s, -1, scale=0.5, mask=m, causal=True, backend=b)
    assert (got.double() - want).abs().max() < 1e-6, b
# The pieces from the wheel: merge_states of a split row (vLLM's [heads, tokens] lses), its
# logsumexp, and the sharded softmax over a group of one gloo rank (the local op).
x = torch.randn(5, 3, 64)
parts = x.split([20, 44], -1)
lses = [anysoftmax.logsumexp(t, -1, backend="triton").t().contiguous().t() for t in parts]
outs = [torch.softmax(t, -1) @ torch.eye(t.shape[-1], 8) for t in parts]
out, lse = anysoftmax.merge_states(outs, lses, backend="triton")
assert (lse - torch.logsumexp(x, -1)).abs().max() < 1e-5
assert (out - torch.softmax(x, -1) @ torch.cat([torch.eye(20, 8), torch.eye(44, 8)])).abs().max() < 1e-5
# The sampler from the wheel: the Triton kernels draw what the torch sampler draws for a seed;
# a per-row scale is read in the softmax kernel.
import anysoftmax.sampling as smp
lg = torch.randn(4, 500) * 3
kw = dict(temperature=torch.tensor([0.7, 1.0, 1.3, 0.9]), top_k=50, top_p=0.9, seed=7, offset=3)
assert torch.equal(smp.sample(lg, backend="triton", **kw), smp.sample(lg, backend="torch", **kw))
kw = dict(temperature=0.8, top_k=20)
assert (smp.probs(lg, backend="triton", **kw) - smp.probs(lg, backend="torch", **kw)).abs().max() < 1e-5
assert torch.equal(smp.sample(lg, backend="triton_ascend", seed=5, **kw), smp.sample(lg, backend="torch", seed=5, **kw))
# 16 rows of two chunks: the runs pre-pass serves the top-k rows
lg = torch.randn(16, 9000) * 3
kw = dict(temperature=0.9, top_k=torch.arange(1, 17), seed=11)
assert torch.equal(smp.sample(lg, backend="triton", **kw), smp.sample(lg, backend="torch", **kw))
lg = lg[:4, :500]
r = torch.rand(4, 1) + 0.5
assert (anysoftmax.softmax(lg, -1, scale=r, backend="triton") - torch.softmax(lg * r, -1)).abs().max() < 1e-6
import tempfile, torch.distributed as dist, anysoftmax.distributed as asd
with tempfile.TemporaryDirectory() as tmp:
    dist.init_process_group("gloo", init_method=f"file://{tmp}/r", rank=0, world_size=1)
    assert (asd.softmax(x, -1, backend="triton") - torch.softmax(x, -1)).abs().max() < 1e-6
    dist.destroy_process_group()
print("ok", anysoftmax.__version__)
"""
    res = _run([str(py), "-c", code], cwd=outside, env=_env({"TRITON_INTERPRET": "1"}))
    assert res.stdout.startswith("ok ")


def test_installed_cli(installed):
    py, bindir, outside, _ = installed
    cli = str(bindir / "anysoftmax")
    backends = json.loads(_run([cli, "backends", "--json"], cwd=outside, env=_env()).stdout)
    assert {b["name"] for b in backends["backends"]} >= {"torch", "triton", "triton_ascend", "wave"}
    help_text = _run([cli, "bench", "--help"], cwd=outside, env=_env()).stdout
    assert "--latency" in help_text or "usage" in help_text
    res = _run([cli, "matrix", "--no-progress", "--json", "--out", str(outside / "report")], cwd=outside,
               env=_env(), timeout=1200)
    summary = json.loads(res.stdout)  # stdout holds the JSON document alone
    assert summary["counts"]["passed"] > 0 and summary["counts"]["failed"] == 0, summary["counts"]
    assert (outside / "report" / "report.json").is_file()
    bad = subprocess.run([cli, "matrix", str(outside)], cwd=outside, env=_env(), capture_output=True, text=True)
    assert bad.returncode == 2 and "is a directory" in bad.stderr


def test_the_kit_from_the_wheel_passes_the_readme_plugin_and_fails_a_wrong_one(installed):
    py, bindir, outside, _ = installed
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(REPO / "examples" / "plugin")], cwd=outside)
    cli = str(bindir / "anysoftmax")
    ok = _run([cli, "conformance", "mine"], cwd=outside, env=_env())  # the entry point registers it
    assert "anysoftmax conformance of 'mine' on cpu:" in ok.stdout and " 0 failed" in ok.stdout, ok.stdout
    assert "mine: no float64" in ok.stdout  # its declared refusal: skipped, with the reason
    (outside / "wrong_backends.py").write_text(WRONG.read_text())
    bad = subprocess.run([cli, "conformance", "long_row_off", "--plugin", "wrong_backends:LongRowOff"], cwd=outside,
                         env=_env({"PYTHONPATH": str(outside)}), capture_output=True, text=True, timeout=900)
    assert bad.returncode == 1, bad.stdout[-3000:] + bad.stderr[-3000:]
    assert "forward softmax seed-1823x781 float32: softmax(shape=[1823, 781], dim=1, float32->float32" in bad.stdout
    assert "failed (" in bad.stdout and "replay:" in bad.stdout
    _run([str(py), "-m", "pip", "install", "-q", "pytest"], cwd=outside)
    tests = _run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--anysoftmax-backend", "mine",
                  "--anysoftmax-quick"], cwd=outside, env=_env())
    assert " passed" in tests.stdout and "failed" not in tests.stdout, tests.stdout[-2000:]
