"""The GPU-only benchmark tools, checked where they can be without a GPU: the tuning sweep only
names keys the tuning table has, and merging runs keeps and replaces the right rows."""

import json

import pytest

from anysoftmax.config import load_tuning
from anysoftmax.bench import merge, tune_triton

SWEEPS = [name for name in dir(tune_triton) if name.endswith("_candidates")]


@pytest.mark.parametrize("sweep", SWEEPS)
def test_sweep_candidates_name_known_tuning_keys(sweep):
    known = set(load_tuning("triton")) | tune_triton.KERNEL_CANDIDATE_KEYS
    candidates = list(getattr(tune_triton, sweep)())
    assert candidates
    for cand in candidates:
        assert set(cand) <= known, f"{sweep}: unknown keys {set(cand) - known}"


def row(provider, n, frac):
    return dict(provider=provider, dtype="float32", M=4, N=n, dim=-1, frac_of_copy=frac, status="ok")


def test_merge_replaces_remeasured_rows_and_drops_stale_providers():
    old = dict(device="GPU", direction="fwd", copy_gbps=1.0, torch="t", triton="t",
               results=[row("a", 8, 0.1), row("a", 16, 0.2), row("b", 8, 0.3), row("stale", 8, 0.4)])
    new = dict(device="GPU", direction="fwd", copy_gbps=2.0, torch="t2", triton="t2", results=[row("a", 8, 0.9)])
    merged = merge.merge(old, new, "rerun of a", drop=("stale",))
    got = {(r["provider"], r["N"]): r["frac_of_copy"] for r in merged["results"]}
    assert got == {("a", 8): 0.9, ("a", 16): 0.2, ("b", 8): 0.3}
    assert [r["part"] for r in merged["runs"]] == ["earlier run", "rerun of a"]
    with pytest.raises(ValueError, match="cannot merge"):
        merge.merge(old, {**new, "direction": "bwd"}, "x")


def test_the_sampling_benchmark_fails_cleanly_without_a_gpu(tmp_path, capsys, monkeypatch):
    import torch

    from benchmarks import sampling_bench

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sampling_bench.main(["--out", str(tmp_path), "--quick"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_latency_pairs_each_round_with_torch_s_round():
    """`over_torch_us` is the median of same-round differences: a host that slows down halfway
    through (both providers alike) does not show up as overhead, which best-of-rounds would."""
    from anysoftmax.bench import latency
    from anysoftmax.bench.tables import latency_table

    torch_rounds, ours = [7.0, 7.2, 10.5, 10.8, 10.6], [9.5, 9.7, 13.0, 13.1, 13.2]
    timed = [(dict(provider="torch", host_us_rounds=torch_rounds), None),
             (dict(provider="anysoftmax", host_us_rounds=ours), None)]
    latency.paired_over_torch(timed)
    assert "over_torch_us" not in timed[0][0]
    assert timed[1][0]["over_torch_us"] == pytest.approx(2.5)
    rows = [dict(r, shape=[1, 128], direction="fwd", dtype="float32", status="ok", host_us=min(r["host_us_rounds"]),
                 gpu_us=4.0) for r, _ in timed]
    assert "| 1×128 | fwd | float32 | 7.0 (4.0) | 9.5 +2.5 (4.0) |" in latency_table(dict(device="GPU", results=rows))


def test_the_run_length_probe_text_becomes_json_and_a_plot(tmp_path):
    """`sampler_run_length_probe.plot`: every cell of the probe's text (its own line format) in
    the JSON, and a PNG beside it."""
    import random

    from benchmarks import sampler_run_length_probe as probe

    rng = random.Random(7)
    lines = ["# NVIDIA X: sample / logprobs, GPU us a call"]
    want = []
    for dtype in ("bfloat16", "float32"):
        for b in (16, 512):
            us = [round(rng.uniform(20, 900), 1) for _ in probe.PLANS]
            cells = [probe.cell(plan, {"runs_kernel": 1.0, "select_kernel": t - 1.0}, f"served {b:3d} same=True")
                     for plan, t in zip(probe.PLANS, us)]
            lines.append(" | ".join([f"{dtype:9s} B={b:3d} top_k=t100", *cells]))
            want += [(dtype, b, "top_k=t100", plan, t) for plan, t in zip(probe.PLANS, us)]
            lines.append(" | ".join([f"{dtype:9s} B={b:3d} logprobs top_n=20",
                                     *(probe.cell(plan, {"select_kernel": t}, "same_ids=False")
                                       for plan, t in zip(probe.PLANS, us))]))
            want += [(dtype, b, "logprobs top_n=20", plan, t) for plan, t in zip(probe.PLANS, us)]
    text = tmp_path / "run.txt"
    text.write_text("\n".join(lines) + "\n")
    json_path, png_path = probe.plot(text)
    run = json.loads(json_path.read_text())
    assert run["device"] == "NVIDIA X"
    assert [(r["dtype"], r["B"], r["case"], r["plan"], r["us"]) for r in run["rows"]] == want
    assert {r["same"] for r in run["rows"] if r["case"].startswith("logprobs")} == {False}
    assert png_path.stat().st_size > 0


def test_the_pdl_probe_plots_its_json_and_needs_a_gpu(tmp_path, capsys):
    """`sampler_pdl_probe`: a run's JSON (its own fields, a plan's only on the shapes that have
    it) becomes a plot beside it; without an sm_90 GPU the probe says so and exits 2 instead of
    measuring."""
    from benchmarks import sampler_pdl_probe as probe

    rows = [dict(dtype=d, B=b, op=op, one_read_us=2.0 * b, plain_us=30.0 + b, pdl_us=27.0 + b, plain_kernels_us=25.0,
                 pdl_kernels_us=26.0, plain_same_ids=True, pdl_same_ids=True)
            for d in ("bfloat16", "float32") for b in probe.ROWS for op in ("sample", "logprobs_top20")]
    for r in rows:  # (the overlapping plans: only where the plan has the runs pre-pass)
        if r["B"] >= 16:
            r.update(overlap4_us=25.0 + r["B"], overlap4_kernels_us=30.0, overlap4_same_ids=True)
    path = tmp_path / "pdl.json"
    path.write_text(json.dumps(dict(device="NVIDIA X", vocab=probe.VOCAB, rows=rows)))
    assert probe.plot(path).stat().st_size > 0
    assert probe.main([]) == 2
    assert "sm_90" in capsys.readouterr().out
