"""The sampler's benchmarks where they run without a GPU: sampling_bench's temperature softmax
providers against the float64 reference, its ratios, grid options, budget and plot; the
sharded sampler's benchmark end to end over gloo with 2 processes on a tiny grid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from anysoftmax.core import SoftmaxSpec
from anysoftmax.testing.compare import compare
from anysoftmax.core.reference import with_row_scale
from benchmarks import sampling_bench

REPO = Path(__file__).resolve().parents[2]


def _temperature_spec(x: torch.Tensor, inv_t: torch.Tensor) -> SoftmaxSpec:
    spec, _ = SoftmaxSpec.from_request(x, -1, torch.float32, fused={"scale": inv_t[:, None]})
    return spec.with_variant(with_row_scale(spec.variant, inv_t[:, None]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_temperature_softmax_providers_match_the_reference_and_keep_their_input(dtype, gen):
    x = (torch.randn(3, 700, generator=gen) * 4).to(dtype)
    before = x.clone()
    inv_t, calls = sampling_bench.temperature_softmax_calls(x, torch.rand(3, generator=gen) + 0.5)
    spec = _temperature_spec(x, inv_t)
    for name in ("softmax_t", "torch_softmax_t"):
        for _ in range(2):  # (a second call sees the same logits: no provider divides them in place)
            result = compare(calls[name](), x, spec)
            assert result.ok, f"{name}: {result.detail}"
        assert torch.equal(x, before), f"{name} modified the logits"


def test_ratios_to_the_copy_and_to_one_read():
    row = {"B": 8, "V": 128256, "dtype": "bfloat16", "copy": 10.0, "logsumexp": 5.0, "softmax_t": 12.5,
           "torch_softmax_t": 40.0, "sample": 9.0, "logprobs_1": 6.0, "flashinfer_softmax": None}
    sampling_bench.add_ratios(row)
    assert row["frac_of_copy"] == {"logsumexp": 2.0, "softmax_t": 0.8, "torch_softmax_t": 0.25, "sample": 10 / 9,
                                   "logprobs_1": 10 / 6}
    assert row["over_logsumexp"] == {"sample": 1.8, "logprobs_1": 1.2}


def test_the_grid_options_pick_dtypes_batches_and_vocabularies():
    args = sampling_bench.parse_args(["--out", "x", "--dtypes", "float32", "--batches", "1,512", "--vocabs", "151936"])
    assert sampling_bench.grid(args) == [("float32", 151936, 1), ("float32", 151936, 512)]
    full = sampling_bench.grid(sampling_bench.parse_args(["--out", "x"]))
    assert len(full) == 30 and {s[0] for s in full} == {"bfloat16", "float32"}
    quick = sampling_bench.grid(sampling_bench.parse_args(["--out", "x", "--quick", "--dtypes", "bfloat16"]))
    assert quick == [("bfloat16", v, b) for v in (128256, 262144) for b in (1, 32, 512)]
    for wrong in (["--out", "x", "--dtypes", "int8"], ["--quick"]):  # (an unknown dtype; no --out)
        with pytest.raises(SystemExit):
            sampling_bench.parse_args(wrong)
    assert sampling_bench.parse_args(["--warm-flashinfer"]).out is None  # (the child that loads FlashInfer)


def test_the_budget_starts_no_shape_that_would_end_past_it():
    now = [0.0]
    cost = {1: 10.0, 2: 10.0, 3: 10.0, 4: 10.0, 5: 10.0}

    def measure(shape):
        now[0] += cost[shape]
        return {"shape": shape}

    rows, stopped = sampling_bench.run_grid([1, 2, 3, 4, 5], measure, budget=35.0, clock=lambda: now[0])
    assert [r["shape"] for r in rows] == [1, 2, 3] and now[0] == 30.0  # (a 4th would end at 40 s)
    assert stopped == "--budget 35 s: 2 shapes not measured, from 4"
    rows, stopped = sampling_bench.run_grid([1, 2], measure, budget=100.0, clock=lambda: now[0])
    assert len(rows) == 2 and stopped is None


def test_the_plot_draws_fractions_of_the_copy_from_a_json(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (the `plot` extra) is not installed")
    row = {"B": 1, "V": 128256, "dtype": "bfloat16", "copy": 8.0, "logsumexp": 7.0, "softmax_t": 9.0,
           "torch_softmax_t": 40.0, "probs": 30.0, "sample": 60.0, "logprobs_1": 20.0}
    sampling_bench.add_ratios(row)
    result = {"device": "a GPU", "flashinfer": "skipped", "shapes": [row]}
    path = tmp_path / "sampling.json"
    path.write_text(json.dumps(result))
    assert sampling_bench.main(["--out", str(tmp_path), "--plot", str(path)]) == 0
    assert (tmp_path / "sampling.png").stat().st_size > 0


def test_the_sharded_bench_runs_over_gloo_with_two_processes(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "benchmarks/sampling_sharded_bench.py", "--quick-cpu", "--vocabs", "3001", "--backend",
                           "both", "--out", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "sampling_sharded_gloo_x2.json").read_text())
    assert (result["world"], result["dist_backend"], result["sample_backend"]) == (2, "gloo", "torch")
    (row,) = result["shapes"]
    assert (row["B"], row["V"], row["shard_sizes"]) == (2, 3001, [1501, 1500])  # (an uneven split)
    assert result["sharded_backends"] == ["torch", "triton"] and row["checked_rows"] >= 16
    assert row["match_torch"] >= 0.999 and row["match_triton"] >= 0.999  # (unequal shards: triton's exact path)
    for name in ("sharded_torch", "sharded_triton", "local_shard", "gather_sample"):
        assert 0 < row[f"{name}_us"] <= row[f"{name}_max_us"]
