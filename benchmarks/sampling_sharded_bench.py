"""The sampler over a vocabulary sharded across ranks: `anysoftmax.distributed.sample` against
the local `anysoftmax.sampling.sample` of one shard and against gathering the logits and
sampling the whole rows, with a check that the sharded draw is the whole rows' draw.

    python -m torch.distributed.run --nproc_per_node=2 benchmarks/sampling_sharded_bench.py --out DIR \\
        [--backend triton|torch|both]
    python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        benchmarks/sampling_sharded_bench.py --quick-cpu --out DIR      # gloo on the CPU, one tiny shape

NCCL with one GPU a rank when CUDA is there (NVLink multicast off), else gloo on the CPU. Every
rank draws the same logits [B, V] (bfloat16, one generator seed per shape) and keeps its shard
in rank order (sizes differ by at most one token when V does not divide). The keywords, the same
for every provider: a per-row temperature tensor, top_k=50, top_p=0.9, min_p=0.05 and a per-row
int64 seed. Providers, per call:

* `sharded_<S>`: `anysoftmax.distributed.sample(shard, ..., backend=S)` for each S of
  `--backend` ("torch": the torch-ops path; "triton": the Triton sampler's shard kernels;
  default both on CUDA, "torch" on the CPU, where "triton" runs through the interpreter);
* `local_shard`: `anysoftmax.sampling.sample(shard, ..., backend=B)` (B: "triton" on CUDA, else
  "torch"): the goal is `sharded_<S>` <= this + 50 us;
* `gather_sample`: an all-gather of the logits shards, then `sample(logits, ..., backend=B)` on
  every rank: the goal is `sharded_<S>` below it from B = 8 on.

Timing: per call, after a barrier (and an L2 flush on CUDA), CUDA events around the call (the
wall clock on the CPU); the median over `--reps` calls per rank. The JSON holds rank 0's median
(`<name>_us`) and the largest rank's (`<name>_max_us`). The check (`match_<S>`): over `--check-rows`
rows in all (offsets 0, 1, ... of the same logits), the fraction of rows whose sharded id equals
`sample` on the whole logits with the same seed and offset (>= 0.999 expected: only near-ties
may differ). No shape (V, B) starts that would end after `--budget` seconds, judged by the
longest so far (`sampling_bench.run_grid`). Rank 0 writes
OUT/sampling_sharded_<dist backend>_x<world>.json and .png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # (before NCCL starts: NVLink multicast off)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import anysoftmax  # noqa: E402
import anysoftmax.distributed as asd  # noqa: E402
import anysoftmax.sampling as sampling  # noqa: E402
from anysoftmax.distributed import kernel_sampling  # noqa: E402
from anysoftmax.bench.report import gpu_dir_name  # noqa: E402
from benchmarks.sampling_bench import run_grid  # noqa: E402

BATCHES, VOCABS = (1, 8, 32, 128, 512), (128256, 262144)
QUICK_CPU_BATCHES, QUICK_CPU_VOCABS = (2,), (3000,)
KEYWORDS = dict(top_k=50, top_p=0.9, min_p=0.05)
SHARDED_BACKENDS = ("torch", "triton")  # (`anysoftmax.distributed.sample`'s backend=)
L2_FLUSH_BYTES = 256 << 20  # (above an H100's 50 MB L2, as triton.testing.do_bench flushes)


def shard_bounds(vocab: int, world: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank `rank`'s shard: `vocab` split in rank order, the first
    `vocab % world` ranks one token longer."""
    base, extra = divmod(vocab, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def gather_logits(shard: torch.Tensor, sizes: list[int], world: int) -> torch.Tensor:
    """The whole rows [B, V] on every rank: one all-gather of the shards, padded to the longest."""
    widest = max(sizes)
    padded = shard if shard.shape[-1] == widest else torch.nn.functional.pad(shard, (0, widest - shard.shape[-1]))
    parts = torch.empty((world,) + tuple(padded.shape), dtype=shard.dtype, device=shard.device)
    dist.all_gather(list(parts.unbind(0)), padded.contiguous())
    return torch.cat([parts[r, :, :sizes[r]] for r in range(world)], -1)


class Timer:
    """Per-call times in us of one rank: a barrier before each call, events around it on CUDA."""

    def __init__(self, device: torch.device, reps: int):
        self.device, self.reps = device, reps
        self.flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device) if device.type == "cuda" else None

    def median_us(self, call) -> float:
        call()  # (compiles, plans, the shard sizes' first exchange)
        times = []
        for _ in range(self.reps):
            if self.flush is not None:
                torch.cuda.synchronize(self.device)
                dist.barrier(device_ids=[self.device.index])
                self.flush.zero_()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                call()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3)
            else:
                dist.barrier()
                t0 = time.perf_counter()
                call()
                times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)


def rank0_and_max(value: float, device: torch.device) -> tuple[float, float]:
    """(rank 0's value, the largest over the ranks)."""
    every = torch.zeros(dist.get_world_size(), dtype=torch.float64, device=device)
    every[dist.get_rank()] = value
    dist.all_reduce(every)
    return float(every[0]), float(every.max())


def providers(sharded: tuple[str, ...]) -> tuple[str, ...]:
    return (*(f"sharded_{b}" for b in sharded), "local_shard", "gather_sample")


def one_shape(rows: int, vocab: int, dtype: torch.dtype, args, timer: Timer, backend: str) -> dict:
    """The timings and the match of one shape (every rank calls it with the same arguments)."""
    rank, world, device = dist.get_rank(), dist.get_world_size(), timer.device
    g = torch.Generator(device=device).manual_seed(rows * 1009 + vocab)  # the same logits on every rank
    logits = (torch.randn(rows, vocab, device=device, generator=g) * 4).to(dtype)
    keys = dict(KEYWORDS, temperature=torch.rand(rows, device=device, generator=g) + 0.5,
                seed=torch.randint(0, 2**62, (rows,), device=device, generator=g))
    start, stop = shard_bounds(vocab, world, rank)
    shard = logits[:, start:stop].contiguous()
    sizes = [b - a for a, b in (shard_bounds(vocab, world, r) for r in range(world))]
    calls = {f"sharded_{b}": (lambda b=b: asd.sample(shard, **keys, backend=b)) for b in args.sharded}
    calls |= {"local_shard": lambda: sampling.sample(shard, **keys, backend=backend),
             "gather_sample": lambda: sampling.sample(gather_logits(shard, sizes, world), **keys, backend=backend)}
    row = {"B": rows, "V": vocab, "dtype": str(dtype).removeprefix("torch."), "shard_sizes": sizes}
    for name, call in calls.items():
        row[f"{name}_us"], row[f"{name}_max_us"] = rank0_and_max(timer.median_us(call), device)
    offsets = max(1, math.ceil(args.check_rows / rows))
    row["checked_rows"] = offsets * rows
    for b in args.sharded:
        same = sum(int((asd.sample(shard, **keys, offset=k, backend=b) ==
                        sampling.sample(logits, **keys, offset=k, backend=backend)).sum()) for k in range(offsets))
        row[f"match_{b}"] = same / row["checked_rows"]
        row[f"sharded_{b}_minus_local_us"] = row[f"sharded_{b}_max_us"] - row["local_shard_max_us"]
        row[f"sharded_{b}_vs_gather"] = row[f"sharded_{b}_max_us"] / row["gather_sample_max_us"]
    return row


def plot(result: dict, path: Path) -> None:
    """Per vocabulary: us per call (largest rank) against B, with the goal local_shard + 50 us."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("sampling_sharded_bench: no plot (matplotlib is not installed: the `plot` extra)", file=sys.stderr)
        return
    vocabs = sorted({r["V"] for r in result["shapes"]})
    if not vocabs:
        return
    fig, axes = plt.subplots(1, len(vocabs), figsize=(5 * len(vocabs), 4), squeeze=False)
    for ax, vocab in zip(axes[0], vocabs):
        pts = sorted((r for r in result["shapes"] if r["V"] == vocab), key=lambda r: r["B"])
        batches = [r["B"] for r in pts]
        for name in providers(tuple(result["sharded_backends"])):
            ax.plot(batches, [r[f"{name}_max_us"] for r in pts], marker="o", ms=3, label=name)
        ax.plot(batches, [r["local_shard_max_us"] + 50 for r in pts], ls="--", color="grey",
                label="goal: local_shard + 50 us")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("rows (B)")
        ax.set_ylabel("us per call (largest rank)")
        match = min(r[f"match_{b}"] for r in pts for b in result["sharded_backends"])
        ax.set_title(f"V = {vocab} over {result['world']} ranks; match {match:.4f}+", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"anysoftmax.distributed.sample on {result['device']} ({result['dist_backend']}, "
                 f"{result['dtype']} logits)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args) -> dict | None:
    """The whole sweep on this rank (a process of torch.distributed.run); rank 0 returns the result."""
    cuda = torch.cuda.is_available() and not args.quick_cpu
    dist_backend = "nccl" if cuda else "gloo"
    dist.init_process_group(dist_backend, timeout=timedelta(seconds=300))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        device = torch.device("cpu")
        if cuda:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
            torch.cuda.set_device(device)
        backend = "triton" if cuda else "torch"
        dtype = getattr(torch, args.dtype)
        result = {"device": torch.cuda.get_device_name(device) if cuda else "cpu", "dist_backend": dist_backend,
                  "world": world, "sample_backend": backend, "sharded_backends": list(args.sharded),
                  "dtype": args.dtype, "keywords": KEYWORDS,
                  "reps": args.reps, "torch": torch.__version__, "anysoftmax": anysoftmax.__version__,
                  "unit": "us per call (median of reps; *_max_us: the largest rank's)", "shapes": [],
                  "stopped_early": None,
                  # (how the workspaces crossed: the mailbox kernel, or why the all-gather did)
                  "exchange": kernel_sampling.mailbox_refusal(device, world) or "the mailbox kernel"}
        timer = Timer(device, args.reps)
        began = time.perf_counter()

        def measure(shape):
            row = one_shape(shape[1], shape[0], dtype, args, timer, backend)
            if rank == 0:
                print(json.dumps(row), flush=True)
            return row

        # The clock is the slowest rank's, so every rank stops before the same shape.
        result["shapes"], result["stopped_early"] = run_grid(
            [(v, b) for v in args.vocabs for b in args.batches], measure, args.budget,
            lambda: rank0_and_max(time.perf_counter() - began, device)[1])
        result["seconds"] = time.perf_counter() - began
        return result if rank == 0 else None
    finally:
        dist.destroy_process_group()


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results/<device>/)")
    p.add_argument("--quick-cpu", action="store_true", help="gloo on the CPU, B=2, V=3000, the torch sampler")
    p.add_argument("--batches", type=_ints, default=None, help="rows (comma-separated; default 1,8,32,128,512)")
    p.add_argument("--vocabs", type=_ints, default=None, help="vocabularies (comma-separated; default 128256,262144)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--reps", type=int, default=30, help="timed calls per provider and shape")
    p.add_argument("--check-rows", type=int, default=2048, help="rows compared with the whole rows' draw")
    p.add_argument("--budget", type=float, default=180.0, help="seconds after which no shape may end")
    p.add_argument("--backend", choices=(*SHARDED_BACKENDS, "both"), default=None,
                   help="distributed.sample's backend (default: both with CUDA, torch on the CPU)")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.quick_cpu
    chosen = args.backend or ("both" if cuda else "torch")
    args.sharded = SHARDED_BACKENDS if chosen == "both" else (chosen,)
    if "triton" in args.sharded and not cuda:
        from anysoftmax import plugins

        plugins.use_interpreter_if_needed()  # (the Triton kernels on CPU tensors: interpreted, slow)
    if "RANK" not in os.environ:
        p.error("run it under torch.distributed.run (python -m torch.distributed.run --nproc_per_node=N ...)")
    if args.quick_cpu:
        args.batches, args.vocabs = args.batches or QUICK_CPU_BATCHES, args.vocabs or QUICK_CPU_VOCABS
        args.reps, args.check_rows = min(args.reps, 5), min(args.check_rows, 16)
    args.batches, args.vocabs = args.batches or BATCHES, args.vocabs or VOCABS
    result = run(args)
    if result is not None:
        out = args.out or ROOT / "benchmarks" / "results" / gpu_dir_name(result["device"])
        out.mkdir(parents=True, exist_ok=True)
        stem = out / f"sampling_sharded_{result['dist_backend']}_x{result['world']}"
        stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
        plot(result, stem.with_suffix(".png"))
        print(f"wrote {stem}.json ({result['seconds']:.0f} s; stopped early: {result['stopped_early']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
