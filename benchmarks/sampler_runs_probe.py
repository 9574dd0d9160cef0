"""The sampler's runs pre-pass against the scan alone, on one CUDA GPU: per-kernel GPU time
(torch.profiler, `sampler_kernels_probe.kernel_times`) of `sample`, `probs` and `logprobs` with
top-n, and whether both plans draw the same ids.

    python benchmarks/sampler_runs_probe.py [--budget 150] [--out DIR]

Shapes: bf16 and fp32 logits of 128256 tokens at 1-512 rows (randn x 3), per-row temperature and
seeds, top_k 50, top_p 0.9, min_p 0.05. Per shape: `sample_runs` (the default plan with the
pre-pass forced on), `sample_scan` (the same plan without it), `probs_runs`, `lp20_runs` /
`lp20_scan` (`logprobs` of one id with top_n 20), `lse` (one read: `anysoftmax.logsumexp`),
`copy` (read the logits, write float32); `same_ids` (also on logits rounded to a few values:
ties), `served_left` (rows the pre-pass served / left to the scan). Stops adding shapes after
`--budget` seconds (compiles included). Writes <out>/<device>/sampler_runs.{json,png}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = ((torch.bfloat16, 512, 128256), (torch.bfloat16, 32, 128256), (torch.bfloat16, 128, 128256),
          (torch.float32, 512, 128256), (torch.bfloat16, 1, 128256), (torch.bfloat16, 8, 128256),
          (torch.bfloat16, 512, 262144), (torch.float32, 32, 128256))


def measure(dtype, rows: int, vocab: int, dev: str = "cuda") -> dict:
    """One shape's row of the results (see the module)."""
    import anysoftmax
    from anysoftmax.backends._triton_common import sampling as ts
    from anysoftmax.sampling.spec import SamplingSpec, check_ids
    from sampler_kernels_probe import kernel_times

    g = torch.Generator(device=dev).manual_seed(rows * 7 + vocab)
    x = (torch.randn(rows, vocab, device=dev, generator=g) * 3).to(dtype)
    t = torch.rand(rows, device=dev, generator=g) + 0.5
    keys = dict(temperature=t, top_k=torch.full((rows,), 50, device=dev), top_p=torch.full((rows,), 0.9, device=dev),
                min_p=torch.full((rows,), 0.05, device=dev))
    seeds = torch.randint(0, 2**62, (rows,), device=dev, generator=g)
    spec = SamplingSpec.from_request("sample", x, **keys, seed=seeds)
    base = ts.plan_for(rows, vocab, x.device)
    plans = {"runs": dataclasses.replace(base, runs=True), "scan": dataclasses.replace(base, runs=False)}
    ids = {k: ts.sample(spec, x, True, plan=p) for k, p in plans.items()}
    pspec = SamplingSpec.from_request("probs", x, temperature=t, top_k=50, top_p=0.9, min_p=0.05)
    served, left = ts.runs_rows(pspec, x, plan=plans["runs"])
    tied = (x.float() * 0.5).round().to(dtype)
    tspec = SamplingSpec.from_request("sample", tied, **keys, seed=seeds)
    lspec = SamplingSpec.from_request("logprobs", x, temperature=t)
    some = check_ids("logprobs", lspec, torch.randint(0, vocab, (rows, 1), device=dev, generator=g))
    lp = {k: ts.logprobs(lspec, x, some, 20, plan=p) for k, p in plans.items()}
    out = torch.empty(rows, vocab, dtype=torch.float32, device=dev)
    row = dict(dtype=str(dtype)[6:], B=rows, V=vocab, same_ids=bool(torch.equal(ids["runs"][0], ids["scan"][0])),
               lp_diff=float((ids["runs"][1] - ids["scan"][1]).abs().max()),
               same_ids_ties=bool(torch.equal(ts.sample(tspec, tied, plan=plans["runs"]),
                                              ts.sample(tspec, tied, plan=plans["scan"]))),
               lp_top20_same=bool(torch.equal(lp["runs"][2], lp["scan"][2])),
               served_left=(len(served), len(left)))
    calls = {"sample_runs": lambda: ts.sample(spec, x, plan=plans["runs"]),
             "sample_scan": lambda: ts.sample(spec, x, plan=plans["scan"]),
             "probs_runs": lambda: ts.probs(pspec, x, plan=plans["runs"]),
             "lp20_runs": lambda: ts.logprobs(lspec, x, some, 20, plan=plans["runs"]),
             "lp20_scan": lambda: ts.logprobs(lspec, x, some, 20, plan=plans["scan"]),
             "lse": lambda: anysoftmax.logsumexp(x, -1),
             "copy": lambda: out.copy_(x)}
    for name, call in calls.items():
        times = kernel_times(call)
        row[name] = dict(total=round(sum(times.values()), 1),
                         **{k.split("_kernel")[0][:14]: round(v, 1) for k, v in times.items()})
    return row


def plot(rows: list, path: Path, device: str) -> None:
    """Bars of `sample`'s GPU time per shape (bf16), scan alone vs the pre-pass vs one read."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted((r for r in rows if r["dtype"] == "bfloat16" and r["V"] == 128256), key=lambda r: r["B"])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs, w = list(range(len(rows))), 0.27
    for dx, key, label in ((-w, "sample_scan", "sample, scan alone"), (0, "sample_runs", "sample, runs pre-pass"),
                           (w, "lse", "one read (logsumexp)")):
        ax.bar([x + dx for x in xs], [r[key]["total"] for r in rows], w, label=label)
    for x, r in zip(xs, rows):
        ax.text(x, r["sample_runs"]["total"] * 1.08, f"{r['sample_runs']['total'] / r['lse']['total']:.1f}x",
                ha="center", fontsize=8)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"B={r['B']}" for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("GPU time per call (us)")
    ax.set_title(f"Sampler, bf16 V=128256, top_k 50 / top_p 0.9 / min_p 0.05\n{device}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=150.0, help="seconds before no new shape starts")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    a = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU: torch.cuda.is_available() is False")
        return 2
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    device = torch.cuda.get_device_name()
    print(device, flush=True)
    start, rows = time.perf_counter(), []
    for dtype, n, vocab in SHAPES:
        if time.perf_counter() - start > a.budget:
            print(f"budget of {a.budget:.0f} s spent before {dtype} B={n} V={vocab}", flush=True)
            break
        rows.append(measure(dtype, n, vocab))
        print(json.dumps(rows[-1]), flush=True)
    where = a.out / device.replace(" ", "_")
    where.mkdir(parents=True, exist_ok=True)
    json.dump(dict(device=device, torch=torch.__version__, rows=rows), open(where / "sampler_runs.json", "w"), indent=1)
    plot(rows, where / "sampler_runs.png", device)
    print(f"wrote {where / 'sampler_runs.json'}, {where / 'sampler_runs.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
