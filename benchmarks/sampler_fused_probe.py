"""The sampler at a few rows: the scan and the select in one launch (`scan_select_kernel`, a
fused plan) against two launches, on a GPU. Per configuration and batch: the host cost and
wall time per call through `anysoftmax.sampling` (calls issued back to back: `host` is the
calling thread's time, `wall` closes the loop with one synchronize), the GPU time per call
(torch.profiler, every kernel of the call), and how many seeded draws equal the two-launch
plan's (the draw is a function of the seed, not of the plan: near-ties aside, all).

    python benchmarks/sampler_fused_probe.py [--vocab 128256] [--out FILE.json]
    python benchmarks/sampler_fused_probe.py --plot FILE.json   # FILE.png from a run's JSON

Configurations: `two` (FUSED_MAX_ROWS = 0), `fused` (the fused plan with 8192-element chunks
at 16 warps), `fused_c4096` (4096-element chunks at 8 warps). Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.sampler_kernels_probe import kernel_times  # noqa: E402
from benchmarks.sampling_host_gpu import host_and_wall_us  # noqa: E402

CONFIGS = {"two": dict(FUSED_MAX_ROWS=0), "fused": dict(FUSED_MAX_ROWS=64, FUSED_CHUNK=8192),
           "fused_c4096": dict(FUSED_MAX_ROWS=64, FUSED_CHUNK=4096)}


def configure(values: dict) -> None:
    """Set the sampler's plan constants and forget every plan, launcher and runner built before."""
    from anysoftmax.backends._triton_common import sampling as s
    from anysoftmax.sampling import api

    for name, value in values.items():
        setattr(s, name, value)
    s.plan_for.cache_clear()
    s._bound.clear()
    api._requests.clear()


def gpu_us(f) -> float:
    """GPU time per call: every kernel of 20 calls (torch.profiler), divided by 20."""
    return sum(kernel_times(f, reps=20).values())


def plot(path: Path) -> Path:
    """`path`'s rows drawn as host and GPU time of `sample` (numbers) by batch, one panel per dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = json.loads(path.read_text())
    dtypes = sorted({r["dtype"] for r in run["rows"]})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6 * len(dtypes), 4), squeeze=False)
    for ax, dname in zip(axes[0], dtypes):
        for config in run["configs"]:
            rows = [r for r in run["rows"] if r["config"] == config and r["dtype"] == dname
                    and r["call"] == "sample, numbers"]
            batches = [r["B"] for r in rows]
            ax.plot(batches, [r["host_us"] for r in rows], "o-", label=f"{config}: host")
            ax.plot(batches, [r["gpu_us"] for r in rows], "s--", label=f"{config}: GPU")
        ax.set(title=f"{run['device']}, sample (numbers), {dname}, V={run['vocab']}", xlabel="rows (B)",
               ylabel="us per call", xticks=sorted({r["B"] for r in run["rows"]}))
        ax.set_xticklabels(sorted({r["B"] for r in run["rows"]}))
        ax.legend(fontsize=7)
    out = path.with_suffix(".png")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None, help="a run's JSON: draw it (FILE.png) and exit")
    args = ap.parse_args()
    if args.plot:
        print(plot(Path(args.plot)))
        return
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        sys.exit(2)
    from anysoftmax import sampling

    device, v = torch.cuda.get_device_name(), args.vocab
    rows_out, draws = [], {}
    print(f"{device}: V={v}")
    print(f"{'config':12s} {'dtype':9s} {'B':>3s} {'call':24s} {'host us':>8s} {'wall us':>8s} {'gpu us':>8s} same")
    for dname in args.dtypes.split(","):
        dtype = getattr(torch, dname)
        for b in map(int, args.batches.split(",")):
            gen = torch.Generator(device="cuda").manual_seed(b)
            x = (torch.randn(b, v, device="cuda", generator=gen) * 3).to(dtype)
            t = torch.rand(b, device="cuda", generator=gen) + 0.5
            tensors = dict(temperature=t, top_k=torch.full((b,), 50, device="cuda"),
                           top_p=torch.full((b,), 0.9, device="cuda"), min_p=torch.full((b,), 0.05, device="cuda"),
                           seed=torch.arange(b, device="cuda") * 7919 + 1)
            numbers = dict(temperature=0.8, top_k=50, top_p=0.9, min_p=0.05, seed=1234)
            ids = torch.randint(0, v, (b, 1), device="cuda", generator=gen)
            calls = {
                "sample, numbers": lambda: sampling.sample(x, **numbers, backend="triton"),
                "sample, per-row tensors": lambda: sampling.sample(x, **tensors, backend="triton"),
                "sample, top_p only": lambda: sampling.sample(x, temperature=0.8, top_p=0.9, seed=5,
                                                              backend="triton"),
                "probs, three filters": lambda: sampling.probs(x, temperature=0.8, top_k=50, top_p=0.9,
                                                               backend="triton"),
                "logprobs, top_n 20": lambda: sampling.logprobs(x, ids, temperature=t, top_n=20, backend="triton"),
            }
            for config, values in CONFIGS.items():
                configure(values)
                for label, f in calls.items():
                    host, wall = host_and_wall_us(f)
                    gpu = gpu_us(f)
                    same = None
                    if label.startswith("sample"):
                        got = f().cpu()
                        key = (dname, b, label)
                        draws.setdefault(key, got)
                        same = int((got == draws[key]).sum())
                    rows_out.append(dict(config=config, dtype=dname, B=b, call=label, host_us=round(host, 2),
                                         wall_us=round(wall, 2), gpu_us=round(gpu, 2), same_draws=same))
                    print(f"{config:12s} {dname:9s} {b:3d} {label:24s} {host:8.1f} {wall:8.1f} {gpu:8.1f} "
                          f"{'' if same is None else f'{same}/{b}'}", flush=True)
    configure(CONFIGS["two"])
    if args.out:
        Path(args.out).write_text(json.dumps(dict(device=device, vocab=v, configs=CONFIGS, rows=rows_out), indent=1))
        plot(Path(args.out))


if __name__ == "__main__":
    main()
