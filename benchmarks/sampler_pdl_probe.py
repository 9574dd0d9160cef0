"""Programmatic dependent launch (PDL) for the sampler's launches on one CUDA GPU (sm_90+):
`sample` and top-20 `logprobs` on the default plan with plain launches and with `pdl=True`
(`SamplingPlan.pdl`: each launch's programs are placed while the launch before it finishes,
and wait for it), and where the plan has the runs pre-pass, overlapping too
(`SamplingPlan.overlap`: the collect reads each row as soon as the persistent runs launch has
counted its blocks; `overlap4`: the default's 4 runs programs a collect program, `overlap6`: 6
at the registers a thread that leaves them), beside one read of the logits (`anysoftmax.logsumexp`).

A call's GPU time here is a CUDA graph's replay of it, `triton.testing.do_bench_cudagraph`
(no host time; the gaps between its 2-5 launches counted, which a sum of kernel times leaves
out), with the sum of the kernels' own times (torch.profiler, `sampler_kernels_probe.kernel_times`)
beside it. Every shape checks that both plans draw the same ids (the same top-20 ids).

    python benchmarks/sampler_pdl_probe.py [OUT.json]        # OUT.png beside it
    python benchmarks/sampler_pdl_probe.py --plot OUT.json   # the plot of a run's JSON
    python benchmarks/sampler_pdl_probe.py --warm DTYPE ROWS # compile one shape's kernels, time nothing
                                                             # (a process a shape: the compiles in parallel)

Shapes: bf16 and fp32 logits of 128256 tokens (randn x 3) at 1-512 rows, per-row temperature and
seeds, top_k 50, top_p 0.9, min_p 0.05.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import warnings
from pathlib import Path

import torch

from benchmarks.figures import save

VOCAB = 128256
ROWS = (1, 4, 16, 32, 128, 512)


def plot(json_path: Path) -> Path:
    """The run in `json_path` as a plot beside it: graph-replay us by rows, a panel per dtype and
    op, a line per plan, one read dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = json.loads(json_path.read_text())
    dtypes = list(dict.fromkeys(r["dtype"] for r in run["rows"]))
    ops = list(dict.fromkeys(r["op"] for r in run["rows"]))
    fig, axes = plt.subplots(len(dtypes), len(ops), figsize=(4.2 * len(ops), 3.4 * len(dtypes)), squeeze=False)
    for ax_row, dtype in zip(axes, dtypes):
        for ax, op in zip(ax_row, ops):
            mine = sorted((r for r in run["rows"] if r["dtype"] == dtype and r["op"] == op), key=lambda r: r["B"])
            batches = [r["B"] for r in mine]
            plans = [key for key in dict.fromkeys(k for r in mine for k in r) if key.endswith("_us")
                     and not key.endswith("kernels_us") and key != "one_read_us"]
            for key, style in (*zip(plans, ("o--", "s-", "^-", "v-", "d-")), ("one_read_us", "k:")):
                shown = [(b, r[key]) for b, r in zip(batches, mine) if key in r]
                ax.plot(*zip(*shown), style, label=key[:-3].replace("_", " "), markersize=4)
            ax.set(title=f"{dtype}, {op}", xlabel="rows", ylabel="GPU us a call (graph replay)", yscale="log")
            ax.set_xscale("log", base=2)
            ax.legend(fontsize=7)
    title = f"{run['device']}: the sampler's launches (plain, PDL, overlapping), V = {run['vocab']}"
    return save(fig, json_path.with_suffix(".png"), title)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--plot"]:
        print(plot(Path(argv[1])))
        return 0
    warm = argv[:1] == ["--warm"]
    dtypes, batches = ((getattr(torch, argv[1]),), (int(argv[2]),)) if warm else ((torch.bfloat16, torch.float32), ROWS)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        print("needs a CUDA GPU of sm_90 or later (programmatic dependent launch)")
        return 2
    import anysoftmax
    from triton.testing import do_bench_cudagraph

    sys.path.append(str(Path(__file__).resolve().parents[1]))
    from anysoftmax.backends._triton_common import sampling as ts
    from anysoftmax.sampling.spec import SamplingSpec
    from benchmarks.sampler_kernels_probe import kernel_times

    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    json_path = Path(argv[0]) if argv and not warm else None
    dev = torch.device("cuda")
    run = dict(device=torch.cuda.get_device_name(), vocab=VOCAB, torch=torch.__version__,
               unit="GPU us a call: CUDA graph replay (graph_us), sum of kernel times (kernels_us)", rows=[])
    for dtype in dtypes:
        for rows in batches:
            g = torch.Generator(device="cuda").manual_seed(rows)
            x = (torch.randn(rows, VOCAB, device="cuda", generator=g) * 3).to(dtype)
            t = torch.rand(rows, device="cuda", generator=g) + 0.5
            seeds = torch.randint(0, 2**62, (rows,), device="cuda", generator=g)
            ids = torch.randint(0, VOCAB, (rows, 1), device="cuda", generator=g)
            one_read = 0.0 if warm else do_bench_cudagraph(lambda: anysoftmax.logsumexp(x, -1)) * 1e3
            kw = dict(temperature=t, top_k=50, top_p=0.9, min_p=0.05)
            spec = SamplingSpec.from_request("sample", x, **kw, seed=seeds)
            lspec = SamplingSpec.from_request("logprobs", x, temperature=t)
            short = ts.short_runs_window(rows, VOCAB, dev)
            base = ts.plan_for(rows, VOCAB, dev, short_runs=short[0] < 50 <= short[1])
            plans = dict(plain=dataclasses.replace(base, pdl=False), pdl=dataclasses.replace(base, pdl=True))
            if base.runs:
                for n in (ts.OVERLAP_RUNS, 6):
                    plans[f"overlap{n}"] = dataclasses.replace(base, pdl=True, overlap=n, collect_warps=4)
            cases = dict(sample=(lambda plan: ts.sample(spec, x, plan=plan), lambda out: out),
                         logprobs_top20=(lambda plan: ts.logprobs(lspec, x, ids, 20, plan=plan), lambda out: out[2]))
            for op, (call, ids_of) in cases.items():
                if warm:
                    for plan in plans.values():
                        call(plan)
                    continue
                row = dict(dtype=str(dtype)[6:], B=rows, op=op, one_read_us=round(one_read, 2))
                ref = ids_of(call(plans["plain"]))
                for name, plan in plans.items():
                    row[f"{name}_same_ids"] = bool(torch.equal(ids_of(call(plan)), ref))
                    row[f"{name}_us"] = round(do_bench_cudagraph(lambda plan=plan: call(plan)) * 1e3, 2)
                    row[f"{name}_kernels_us"] = round(sum(kernel_times(lambda plan=plan: call(plan)).values()), 2)
                run["rows"].append(row)
                if json_path:  # (after every line: a run cut short by its time limit keeps what it measured)
                    json_path.write_text(json.dumps(run, indent=1) + "\n")
                print(f"{row['dtype']:9s} B={rows:3d} {op:15s} one read {one_read:6.1f} | " + " | ".join(
                    f"{n} {row[f'{n}_us']:7.1f} us (kernels {row[f'{n}_kernels_us']:7.1f}) same={row[f'{n}_same_ids']}"
                    for n in plans), flush=True)
    if warm:
        torch.cuda.synchronize()
    elif json_path:
        print(plot(json_path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
