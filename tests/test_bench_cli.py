"""`anysoftmax bench` on the CPU (`--device cpu`): the benchmark's whole path (matrix cells, the
worker pool, one tolerance, the report files) with tiny shapes through the Triton interpreter."""

import csv
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from anysoftmax.bench import harness, merge, report

REPO = Path(__file__).resolve().parent.parent
PROVIDERS = ["peer:copy", "peer:torch", "anysoftmax:torch", "anysoftmax:triton", "liger"]


def bench(tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "anysoftmax", "bench", "--device", "cpu", "--out", str(tmp_path),
                           *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    return proc


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_bench_on_cpu_writes_the_benchmark_files(tmp_path, direction):
    proc = bench(tmp_path, "--providers", ",".join(PROVIDERS), "--dtypes", "float32,bfloat16",
                 "--shapes", "4x33,8x100,16x8:0", *(["--bwd"] if direction == "bwd" else []))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (folder,) = tmp_path.iterdir()
    doc = json.loads((folder / f"softmax_{direction}.json").read_text())
    assert doc["direction"] == direction and doc["copy_gbps"] > 0 and doc["device"].startswith("cpu")
    rows = doc["results"]
    assert len(rows) == len(PROVIDERS) * 2 * 3
    names = ["copy", "torch", "anysoftmax:torch", "anysoftmax:triton", "liger"]  # the benchmark's spelling
    assert list(dict.fromkeys(r["provider"] for r in rows)) == names
    assert {(r["M"], r["N"], r["dim"]) for r in rows} == {(4, 33, -1), (8, 100, -1), (16, 8, 0)}
    for r in rows:
        assert set(report.FIELDS) <= set(r), r
        if r["provider"] == "liger" and importlib.util.find_spec("liger_kernel") is None:
            assert r["status"] == "unavailable" and "liger-kernel" in r["detail"]
            continue
        assert r["status"] == "ok", r
        assert r["us"] > 0 and r["host_us"] > 0 and r["gbps"] > 0
        assert r["frac_of_copy"] == pytest.approx(r["gbps"] / doc["copy_gbps"])
        if r["provider"] == "copy":
            assert math.isnan(r["max_err"]) and "reference" in r["detail"]
        else:
            assert r["max_err"] >= 0  # checked against the float64 reference
    with open(folder / f"softmax_{direction}.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    if importlib.util.find_spec("matplotlib") is not None:
        assert (folder / f"softmax_{direction}.png").stat().st_size > 0
    assert "fraction of copy bandwidth" in proc.stdout and "wrote " in proc.stdout


def test_bench_refuses_unknown_providers_and_a_missing_gpu(tmp_path):
    proc = bench(tmp_path, "--providers", "torch,numpy")
    assert proc.returncode == 2 and "unknown provider 'numpy'" in proc.stderr
    proc = bench(tmp_path, "--providers", "anysoftmax:nope")
    assert proc.returncode == 2 and "'nope'" in proc.stderr
    assert not any(tmp_path.iterdir())


def test_provider_names_map_to_matrix_backends():
    assert harness.to_backend("anysoftmax") == ("anysoftmax", "auto")
    assert harness.to_backend("anysoftmax:triton") == ("anysoftmax:triton", "triton")
    assert harness.to_backend("torch") == harness.to_backend("peer:torch") == ("torch", "peer:torch")
    with pytest.raises(harness.UnknownProvider):
        harness.to_backend("peer:numpy")


def test_older_result_files_still_load_merge_and_write(tmp_path):
    """Results written before host_us existed: merged with a newer row and written again."""
    old = json.loads((REPO / "benchmarks/results/NVIDIA_H200/softmax_fwd.json").read_text())
    assert old["results"] and "host_us" not in old["results"][0]
    newer = dict(old["results"][0], host_us=12.5, frac_of_copy=0.5)
    merged = merge.merge(old, {**old, "results": [newer]}, "newer row")
    paths = report.write(merged, tmp_path, "softmax_fwd")
    assert paths[0].exists() and paths[1].exists()
    with open(paths[1]) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(old["results"]) and "host_us" in rows[0]
