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

from anysoftmax.bench import harness, merge, report, tables

REPO = Path(__file__).resolve().parents[2]
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


VARIANT_PROVIDERS = ["anysoftmax:triton", "copy", "torch", "seed"]


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_bench_variants_on_cpu_writes_the_variant_files(tmp_path, direction):
    proc = bench(tmp_path, "--variants", "plain,causal,mask,sinks", "--providers", ",".join(VARIANT_PROVIDERS),
                 "--dtypes", "float32", *(["--bwd"] if direction == "bwd" else []))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (folder,) = tmp_path.iterdir()
    doc = json.loads((folder / f"softmax_variants_{direction}.json").read_text())
    assert doc["direction"] == direction and doc["copy_gbps"] > 0
    assert doc["variants"]["mask"] == "mask=bool[b, 1, sq, sk]@0.3" and doc["shapes"] == [[2, 3, 8, 8], [2, 3, 16, 16]]
    rows = doc["results"]
    assert len(rows) == len(VARIANT_PROVIDERS) * 4 * 2
    moved = {}
    for r in rows:
        assert set(report.VARIANT_FIELDS) <= set(r), r
        if r["provider"] == "seed":  # a CUDA row kernel: unavailable on the CPU, with the reason
            assert r["status"] == "unavailable" and "CUDA" in r["detail"]
            continue
        assert r["status"] == "ok", r
        assert r["us"] > 0 and r["host_us"] > 0 and r["frac_of_copy"] == pytest.approx(r["gbps"] / doc["copy_gbps"])
        assert math.isnan(r["max_err"]) if r["provider"] == "copy" else r["max_err"] >= 0
        moved.setdefault((r["variant"], r["S"]), []).append(r["gbps"] * r["us"] * 1e3)  # bytes per call
    for key, values in moved.items():  # every provider of a cell, the copy too, is timed on the same bytes
        assert max(values) == pytest.approx(min(values), rel=1e-9, abs=8), key
    # causal on [2, 3, 8, 8] float32: 36 of 64 positions per plane are kept (read), all 64 written
    kept, planes = 36, 6
    want = {"fwd": 4 * planes * (kept + 64), "bwd": 4 * planes * (2 * kept + 64)}[direction]
    assert moved[("causal", 8)][0] == pytest.approx(want)
    with open(folder / f"softmax_variants_{direction}.csv") as f:
        assert [r["variant"] for r in csv.DictReader(f)] == [r["variant"] for r in rows]
    if importlib.util.find_spec("matplotlib") is not None:
        assert (folder / f"softmax_variants_{direction}.png").stat().st_size > 0
    assert "anysoftmax:triton ÷ copy" in proc.stdout and "| causal | 8 |" in proc.stdout


def test_bench_variants_refuses_unknown_names(tmp_path):
    proc = bench(tmp_path, "--variants", "scale,softcapp")
    assert proc.returncode == 2 and "unknown variant 'softcapp'" in proc.stderr and "gpt-oss" in proc.stderr
    assert not any(tmp_path.iterdir())


def _variant_row(provider, variant, seq, gbps):
    return dict(provider=provider, variant=variant, S=seq, shape=[2, 3, seq, seq], dtype="float32", M=6 * seq, N=seq,
                dim=-1, gbps=gbps, frac_of_copy=gbps / 100, us=1.0, host_us=2.0, max_err=0.0, status="ok", detail="")


def test_variant_files_merge_part_by_part(tmp_path):
    """One run per S (benchmarks/variants_gpu_run.sh): merged by variant and shape, a row
    measured again replaces its older one; the table orders variants as defined, S ascending."""
    doc = lambda rows, shapes, variants: dict(device="d", direction="fwd", copy_gbps=100.0, torch="t",  # noqa: E731
                                              triton="t", results=rows, shapes=shapes, variants=variants)
    a = doc([_variant_row(p, v, 16, g) for p, g in (("anysoftmax", 90), ("copy", 95)) for v in ("plain", "causal")],
            [[2, 3, 16, 16]], {"plain": "plain", "causal": "causal=top_left"})
    b = doc([_variant_row(p, "plain", 8, g) for p, g in (("anysoftmax", 50), ("copy", 60))]
            + [_variant_row("anysoftmax", "causal", 16, 80)], [[2, 3, 8, 8]], {"plain": "plain", "causal": "causal=top_left"})
    merged = merge.merge(a, b, "S=8")
    assert len(merged["results"]) == 6 and merged["shapes"] == [[2, 3, 16, 16], [2, 3, 8, 8]]
    assert [r["gbps"] for r in merged["results"] if r["variant"] == "causal" and r["provider"] == "anysoftmax"] == [80]
    table = tables.variants_tables(merged)
    lines = [line for line in table.splitlines() if line.startswith("| plain") or line.startswith("| causal")]
    assert [line.split(" | ")[:2] for line in lines] == [["| plain", "8"], ["| plain", "16"], ["| causal", "16"]]
    assert lines[0].endswith("| 0.50 | 0.60 | 0.83 | – | 2.0 |")  # 50 / 60 GB/s of the same bytes
    paths = report.write(merged, tmp_path, "softmax_variants_fwd")
    with open(paths[1]) as f:
        assert [(r["variant"], r["shape"]) for r in csv.DictReader(f)][-1] == ("causal", "2x3x16x16")


def test_compiled_block_with_scale_matches_torchs_block():
    """The compiled attention block's `scale=` form (CPU: Inductor's C++ code, the torch
    backend): fullgraph compiles, and output and gradients are those of torch's block."""
    import torch

    import anysoftmax
    from anysoftmax.bench.compiled_block import Attention, table

    torch.manual_seed(0)
    ours = Attention(2, 8, anysoftmax.softmax, fused_scale=True)
    ref = Attention(2, 8, torch.softmax)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 12, 16, requires_grad=True)
    torch._dynamo.reset()
    y = torch.compile(ours, fullgraph=True, dynamic=False)(x)
    y_ref = ref(x)
    g = torch.randn_like(y)
    (dx,), (dx_ref,) = torch.autograd.grad(y, [x], g), torch.autograd.grad(y_ref, [x], g)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dx, dx_ref, atol=1e-5, rtol=1e-5)
    rows = [dict(provider=p, batch=8, heads=16, seq=1024, head_dim=64, dtype="bfloat16", mode="default",
                 direction="fwd", gpu_ms=ms, wall_ms=ms, user_kernels_in_code=True)
            for p, ms in (("torch", 1.0), ("anysoftmax", 1.2), ("anysoftmax:scale", 0.9))]
    assert "| 1.000 | 1.200 | 1.20 | 0.900 | 0.90 |" in table(rows)


def test_variant_names_and_grid():
    from types import SimpleNamespace

    from anysoftmax.bench import variants
    from anysoftmax.matrix.variants import PRESETS

    assert variants.variant_names("") == ["plain", "scale", "mask", "causal", "softcap", "sinks"]  # the speed goals
    assert variants.variant_names("all") == list(PRESETS)
    assert variants.variant_names("gpt-oss,plain") == ["gpt-oss", "plain"]
    args = lambda **kw: SimpleNamespace(**{"shapes": "", "device": "cuda", "quick": False, **kw})  # noqa: E731
    assert variants.shapes(args()) == [(8, 16, s, s) for s in (1024, 2048, 4096)]
    assert variants.shapes(args(quick=True)) == [(8, 16, 2048, 2048)]
    assert variants.shapes(args(shapes="1x2x3x4")) == [(1, 2, 3, 4)]


def test_bench_help_shows_the_command_it_was_run_as(capsys):
    from anysoftmax.cli import main

    with pytest.raises(SystemExit) as done:
        main(["bench", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: anysoftmax bench ") and "python -m" not in text, text
    assert "    anysoftmax bench --bwd " in text and "    anysoftmax bench --variants " in text, text
