"""The runs pre-pass's collect and select at other warp counts, on one CUDA GPU: per-kernel GPU
time (torch.profiler, `sampler_kernels_probe.kernel_times`) of `sample` (top_k 50, top_p 0.9,
min_p 0.05, per-row temperature and seeds) and of `logprobs` with top_n 20, and whether every
variant draws the default plan's ids; `lse`: one read (`anysoftmax.logsumexp`).

    python benchmarks/sampler_warps_probe.py OUT.json [BUDGET_SECONDS]    # and OUT.png

Variants `cXsY`: the plan with the pre-pass forced on, collect_warps X, select_warps Y. Shapes:
bf16 at 512, 128, 32, 16 rows and fp32 at 512 rows of 128256 logits (randn x 3); no shape starts
after the budget (default 480 s).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

VARIANTS = {"c8s8": (8, 8), "c4s8": (4, 8), "c2s8": (2, 8), "c4s4": (4, 4), "c8s4": (8, 4), "c4s16": (4, 16)}
SHAPES = ((torch.bfloat16, 512), (torch.bfloat16, 128), (torch.bfloat16, 32), (torch.float32, 512),
          (torch.bfloat16, 16))
VOCAB = 128256


def measure(dtype, rows: int) -> dict:
    """One shape's row: per variant the kernels' times and whether its ids are the default's."""
    import anysoftmax
    from anysoftmax.backends._triton_common import sampling as ts
    from anysoftmax.sampling.spec import SamplingSpec, check_ids
    from sampler_kernels_probe import kernel_times

    g = torch.Generator(device="cuda").manual_seed(rows)
    x = (torch.randn(rows, VOCAB, device="cuda", generator=g) * 3).to(dtype)
    t = torch.rand(rows, device="cuda", generator=g) + 0.5
    keys = dict(temperature=t, top_k=torch.full((rows,), 50, device="cuda"),
                top_p=torch.full((rows,), 0.9, device="cuda"), min_p=torch.full((rows,), 0.05, device="cuda"))
    seeds = torch.randint(0, 2**62, (rows,), device="cuda", generator=g)
    spec = SamplingSpec.from_request("sample", x, **keys, seed=seeds)
    lspec = SamplingSpec.from_request("logprobs", x, temperature=t)
    some = check_ids("logprobs", lspec, torch.randint(0, VOCAB, (rows, 1), device="cuda", generator=g))
    base = dataclasses.replace(ts.plan_for(rows, VOCAB, x.device), runs=True)
    ref = ts.sample(spec, x, True, plan=base)
    row = {"dtype": str(dtype).removeprefix("torch."), "rows": rows, "V": VOCAB,
           "lse": sum(kernel_times(lambda: anysoftmax.logsumexp(x, -1)).values())}
    for name, (cw, sw) in VARIANTS.items():
        p = dataclasses.replace(base, collect_warps=cw, select_warps=sw)
        same = torch.equal(ts.sample(spec, x, True, plan=p)[0], ref[0])
        kt = kernel_times(lambda: ts.sample(spec, x, True, plan=p))
        lt = kernel_times(lambda: ts.logprobs(lspec, x, some, 20, plan=p))
        row[name] = {"same_ids": same, "sample_total": round(sum(kt.values()), 1),
                     "sample": {k: round(v, 1) for k, v in kt.items()}, "lp20_total": round(sum(lt.values()), 1),
                     "lp20": {k: round(v, 1) for k, v in lt.items()}}
        print(rows, row["dtype"], name, row[name], flush=True)
    return row


def plot(result: dict, path: Path) -> None:
    """Bars of `sample`'s and top-20 `logprobs`' GPU time over one read, per variant and shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    labels = [f"{r['dtype']} {r['rows']}" for r in result["rows"]]
    width = 0.8 / len(VARIANTS)
    for ax, what in zip(axes, ("sample_total", "lp20_total")):
        for i, name in enumerate(VARIANTS):
            ax.bar([j + i * width for j in range(len(labels))],
                   [r[name][what] / r["lse"] for r in result["rows"]], width, label=name)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))], labels)
        ax.set_title(f"{what.split('_')[0]} (GPU time / one read), {result['device']}")
    axes[0].set_ylabel("x one read of the logits")
    axes[0].legend(title="collect / select warps", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__)
        return 2
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    budget_end = time.time() + (float(argv[1]) if len(argv) > 1 else 480.0)
    rows = [measure(dtype, n) for dtype, n in SHAPES if time.time() < budget_end]
    result = {"device": torch.cuda.get_device_name(), "rows": rows}
    Path(argv[0]).write_text(json.dumps(result, indent=1))
    plot(result, Path(argv[0]).with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
