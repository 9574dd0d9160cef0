"""Two or more versions of the package, the same calls: per-kernel GPU time of the sampler's
`sample` (top_k 50 / 20 / 100 with top_p 0.9 and min_p 0.05, temperature only), top-20 and
one-id `logprobs`, one read (`anysoftmax.logsumexp`) and the log_softmax backward, with each
version's draws kept to check they agree. One process a version: the package it imports is the
first on PYTHONPATH (a `git archive` copy of a commit, or the working tree).

    PYTHONPATH=/tmp/base python benchmarks/sampler_versions_probe.py --label base --out DIR
    PYTHONPATH=$PWD python benchmarks/sampler_versions_probe.py --label new --out DIR
    python benchmarks/sampler_versions_probe.py --compare DIR/base.json DIR/new.json --plot OUT.png

`--warm` runs every call once and measures nothing (compile several versions in parallel first,
then time them one after another). V = 128256, bf16 and fp32, B = 1, 32, 128, 512; GPU time per
call from torch.profiler (every kernel, 20 calls after 3). Needs a CUDA GPU (exits 2 without).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

VOCAB = 128256
BATCHES = (1, 32, 128, 512)


def calls(x: torch.Tensor, gen: torch.Generator) -> dict:
    """name -> (zero-argument call, whether it draws), for logits `x`."""
    import anysoftmax
    import anysoftmax.sampling as sampling

    rows, dev = x.shape[0], x.device
    t = torch.rand(rows, device=dev, generator=gen) + 0.5
    seeds = torch.randint(0, 2**62, (rows,), device=dev, generator=gen)
    ids = torch.randint(0, x.shape[1], (rows, 1), device=dev, generator=gen)

    def filters(k: int) -> dict:
        return dict(temperature=t, top_k=torch.full((rows,), k, device=dev), top_p=torch.full((rows,), 0.9, device=dev),
                    min_p=torch.full((rows,), 0.05, device=dev))

    made = {"lse": (lambda: anysoftmax.logsumexp(x, -1), False)}
    for name, kw in (("sample", filters(50)), ("sample_k100", filters(100)), ("sample_k20", dict(temperature=t, top_k=20)),
                     ("s_plain", dict(temperature=t))):
        made[name] = (lambda kw=kw: sampling.sample(x, **kw, seed=seeds, return_logprobs=True, backend="triton"), True)
    made["lp_top20"] = (lambda: sampling.logprobs(x, ids, temperature=t, top_n=20, backend="triton"), False)
    made["logprobs1"] = (lambda: sampling.logprobs(x, ids, temperature=t, backend="triton"), False)
    return made


def run(label: str, warm: bool) -> list[dict]:
    """Every call of every shape (measured unless `warm`), then the log_softmax backward."""
    import anysoftmax
    from benchmarks.sampler_kernels_probe import kernel_times

    rows_out = []
    gen = torch.Generator(device="cuda").manual_seed(1)  # (the same logits, seeds and ids in every version)
    for dtype in (torch.bfloat16, torch.float32):
        for b in BATCHES:
            x = (torch.randn(b, VOCAB, device="cuda", generator=gen) * 3).to(dtype)
            for name, (call, draws) in calls(x, gen).items():
                got = call()
                if warm:
                    continue
                times = kernel_times(call, reps=20)
                row = dict(dtype=str(dtype)[6:], B=b, call=name, total_us=sum(times.values()), kernels=times)
                if draws:
                    row["ids"] = got[0].tolist()
                rows_out.append(row)
                print(f"{label:6s} {row['dtype']:9s} {b:4d} {name:12s} {row['total_us']:8.1f}  "
                      + "  ".join(f"{k[:16]}={v:.1f}" for k, v in times.items()), flush=True)
        x = torch.randn(512, VOCAB, device="cuda", dtype=dtype, requires_grad=True)
        y = anysoftmax.log_softmax(x, -1)
        dy = torch.randn_like(y)

        def backward():
            return torch.autograd.grad(y, x, dy, retain_graph=True)

        backward()
        if not warm:
            times = kernel_times(backward, reps=20)
            rows_out.append(dict(dtype=str(dtype)[6:], B=512, call="log_softmax_bwd", total_us=sum(times.values()),
                                 kernels=times))
            print(f"{label:6s} {str(dtype)[6:]:9s}  512 log_softmax_bwd {rows_out[-1]['total_us']:8.1f}", flush=True)
    return rows_out


def compare(paths: list[Path], plot: Path | None) -> None:
    """A table of every version's GPU time (and how many draws equal the first's), and with
    `plot` a chart of each later version's time over the first's."""
    runs = [json.loads(p.read_text()) for p in paths]
    labels = [r["label"] for r in runs]
    keyed = [{(row["dtype"], row["B"], row["call"]): row for row in r["rows"]} for r in runs]
    print(runs[0]["device"], "| GPU us a call | draws equal to", labels[0])
    print(f"{'dtype':9s} {'B':>4s} {'call':16s} " + " ".join(f"{lab:>8s}" for lab in labels))
    for key, first in keyed[0].items():
        cells = [f"{k[key]['total_us']:8.1f}" if key in k else f"{'-':>8s}" for k in keyed]
        same = ""
        if "ids" in first:
            same = "  " + " ".join(f"{sum(a == b for a, b in zip(first['ids'], k[key]['ids']))}/{len(first['ids'])}"
                                   for k in keyed[1:] if key in k)
        print(f"{key[0]:9s} {key[1]:4d} {key[2]:16s} " + " ".join(cells) + same)
    if plot is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(keyed[0])
    fig, ax = plt.subplots(figsize=(max(8, len(keys) * 0.22), 4.5))
    width = 0.8 / max(1, len(runs) - 1)
    for i, k in enumerate(keyed[1:]):
        ratios = [k[key]["total_us"] / keyed[0][key]["total_us"] if key in k else float("nan") for key in keys]
        ax.bar([j + i * width for j in range(len(keys))], ratios, width, label=labels[i + 1])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))])
    ax.set_xticklabels([f"{d} {b} {c}" for d, b, c in keys], rotation=90, fontsize=6)
    ax.set_ylabel(f"GPU time over {labels[0]}'s")
    ax.set_title(f"{runs[0]['device']}: sampler kernels by version (V = {VOCAB})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(plot, dpi=130)
    print("wrote", plot)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", help="this version's name (its JSON: OUT/LABEL.json)")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder of the JSON")
    parser.add_argument("--warm", action="store_true", help="compile: run each call once, measure nothing")
    parser.add_argument("--compare", type=Path, nargs="+", help="versions' JSON files: print (and --plot) them")
    parser.add_argument("--plot", type=Path, default=None, help="with --compare: the chart's PNG")
    a = parser.parse_args(argv)
    if a.compare:
        compare(a.compare, a.plot)
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA GPU: torch.cuda.is_available() is False")
        return 2
    import anysoftmax  # (before this file's folder puts the repository first: PYTHONPATH's copy)
    print(a.label, anysoftmax.__file__, torch.cuda.get_device_name(), flush=True)
    sys.path.append(str(Path(__file__).resolve().parents[1]))
    import warnings
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    rows = run(a.label, a.warm)
    if not a.warm:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / f"{a.label}.json").write_text(json.dumps(dict(label=a.label, device=torch.cuda.get_device_name(),
                                                               package=anysoftmax.__file__, rows=rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
