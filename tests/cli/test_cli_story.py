"""One story in the CLI, read from real runs (subprocesses, stdout a pipe): the listing and
--explain agree on Triton here, --explain names the tables that ship and takes a unique part of
a GPU's name, each subcommand's help names itself, unknown backend names get a did-you-mean."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import anysoftmax

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args, cwd=ROOT, **extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "COLUMNS", "ANYSOFTMAX_CONFIG_DIR", "ANYSOFTMAX_RESULTS_DIR")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update(extra)
    return subprocess.run([sys.executable, "-m", "anysoftmax", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU machine's story: no GPU visible")
def test_backends_and_explain_agree_on_triton_through_the_interpreter():
    listing = _cli("backends")
    assert listing.returncode == 0, listing.stderr
    triton_row = next(line for line in listing.stdout.splitlines() if line.startswith("│ triton "))
    assert "via the interpreter on CPU" in triton_row
    explained = _cli("backends", "--explain", "64x131072")
    assert explained.returncode == 0, explained.stderr
    line = explained.stdout.strip()
    assert line.startswith("64x131072 fwd on cuda: triton <- priority 100"), line
    assert "TRITON_INTERPRET is not set" not in line
    # No table for a device not visible here: the line names the tables that ship.
    assert "tables: 'NVIDIA H100 80GB HBM3'" in line and "--gpu-name" in line


def test_explain_takes_a_unique_part_of_a_gpu_name():
    res = _cli("backends", "--explain", "1024x131072", "--gpu-name", "H100")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("1024x131072 fwd on NVIDIA H100 80GB HBM3: ")
    assert "NVIDIA_H100_80GB_HBM3.yaml rule" in res.stdout
    bad = _cli("backends", "--explain", "1024x131072", "--gpu-name", "MI300")
    assert bad.returncode == 2
    assert "--gpu-name: no selection table for 'MI300'; tables: 'NVIDIA H100 80GB HBM3'" in bad.stderr


def test_each_help_names_its_command():
    bench = _cli("bench", "--help")
    assert bench.returncode == 0 and bench.stdout.startswith("usage: anysoftmax bench"), bench.stdout[:200]
    matrix = _cli("matrix", "--help")
    flat = " ".join(matrix.stdout.split())
    for name in ("default", "ci", "h100", "mi300x", "ascend-910b", "variants"):
        assert f"{name}," in flat or f"{name};" in flat, (name, flat)


def test_select_writes_outside_the_package_by_default(tmp_path):
    import json

    def doc(direction):  # the benchmark's result document, as tests/core/test_selection.py writes it
        rows = [dict(provider=p, dtype="float32", M=64, N=128, dim=-1, us=us, host_us=0.0,
                     frac_of_copy=2 * 64 * 128 * 4 / (us * 1e-6) / 1e9 / 3000, gbps=0.0, max_err=0.0, status="ok",
                     detail="") for p, us in (("anysoftmax:triton", 50.0), ("anysoftmax:torch", 10.0))]
        return dict(device="Test GPU 9000", copy_gbps=3000.0, torch="2.x", triton="3.x", direction=direction,
                    results=rows)

    paths = []
    for d in ("fwd", "bwd"):
        paths.append(tmp_path / f"softmax_{d}.json")
        paths[-1].write_text(json.dumps(doc(d)))
    res = _cli("select", *map(str, paths), cwd=tmp_path, ANYSOFTMAX_RESULTS_DIR=str(tmp_path / "results"))
    assert res.returncode == 0, res.stdout + res.stderr
    written = tmp_path / "results" / "selection"
    assert f"wrote {written}/" in res.stdout, res.stdout
    assert f"the automatic choice reads it with ANYSOFTMAX_CONFIG_DIR={tmp_path / 'results'}" in res.stdout
    assert not list((ROOT / "anysoftmax" / "configs" / "selection").glob("Test_GPU*"))


def test_unknown_backend_names_get_a_did_you_mean():
    with pytest.raises(ValueError, match=r"unknown backend 'Triton' \(did you mean 'triton'\?\)"):
        anysoftmax.softmax(torch.randn(2, 3), -1, backend="Triton")
    res = _cli("conformance", "Triton")
    assert res.returncode == 2 and "unknown backend 'Triton' (did you mean 'triton'?)" in res.stderr


def test_sinks_per_head_get_a_shape_hint():
    with pytest.raises(ValueError, match=r"give sinks of shape \[8, 1, 1\]: sinks.view\(8, 1, 1\)"):
        anysoftmax.softmax(torch.randn(2, 8, 5, 5), -1, sinks=torch.randn(8))
