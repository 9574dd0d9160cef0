"""The softmax of a vocabulary sharded across ranks (issue 37): `anysoftmax.distributed.softmax`
against the local fused softmax of one shard and against gathering the rows to one rank and one
softmax there; the all-gather of the row states alone is the collective's share.

    torchrun --nproc_per_node=2 benchmarks/distributed_bench.py            # NCCL, one GPU a rank
    python benchmarks/distributed_bench.py --nprocs 2                       # the same, spawned
    python benchmarks/distributed_bench.py --nprocs 1                       # one GPU: a trivial collective
    python benchmarks/distributed_bench.py --cpu --nprocs 2                 # gloo on the CPU, tiny shapes
    ... --check                                                             # the conformance cases first
    ... --profile                                                           # + one shape under torch.profiler

`--profile` (after the sweep; `--profile-only` without it) runs one shape (`--profile-shape
TOKENS,VOCAB`) under torch.profiler: per rank, the ops table of the sharded softmax and of the
local fused softmax of the shard (sorted by device time, then by host time), the ops and
kernels per call, and the host time to issue one call (no sync: when it is near the per-call
time, the call is bound by Python, not by the GPU), in distributed_profile_<backend>_x<world>_rank<r>.txt.

Times are per call, the slowest rank's, from a loop of calls between barriers (collectives keep
the ranks in step, so one rank cannot be timed alone), median of `--repeats` loops. Rank 0
writes distributed_softmax.json and .png under benchmarks/results/<device>/ (`--out` another
folder). NVLink multicast (NVLS) stays off.

Providers: `distributed` (what `anysoftmax.distributed.softmax` does: on NVIDIA GPUs the
one-read kernel, the row states exchanged inside it through a symmetric-memory mailbox,
`anysoftmax.distributed.one_read`), `two_pass` (the same call with the one-read path off: the
shard's logsumexp, an all-gather of the states, then the fused softmax re-reading the shard
with the other ranks as its sink: about 1.5 local softmaxes), `local_shard` (the local fused
softmax of one shard: the goal is at most this plus one small collective), `states_gather`
(the all-gather of one float per row alone) and `gather_rows` (the rows gathered to one rank
and one softmax there). `--one-read-variants "split_chunk_bytes=8192;sharded_prefetch_16bit=true"`
adds the one-read kernel under those triton tuning overrides (`;` between variants, `,` between
keys of one), `one_read[<variant>]_ms`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # (before NCCL starts: NVLink multicast off)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import anysoftmax  # noqa: E402
import anysoftmax.distributed as asd  # noqa: E402
from anysoftmax.bench.report import gpu_dir_name  # noqa: E402
from anysoftmax.backends.triton import heuristics  # noqa: E402
from anysoftmax.distributed import one_read  # noqa: E402
from anysoftmax.distributed.collective import gather_states  # noqa: E402

GPU_VOCABS, GPU_TOKENS = (131072, 262144), (1, 16, 128, 1024, 4096, 16384)
CPU_VOCABS, CPU_TOKENS = (1024, 4096), (1, 16, 64)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def per_call_ms(fn, device, calls: int, repeats: int) -> float:
    """The slowest rank's time per call of `fn`, median over `repeats` loops of `calls`."""
    fn()  # warm-up (compiles, plans)
    times = []
    for _ in range(repeats):
        _sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        elapsed = torch.tensor([(time.perf_counter() - t0) * 1e3 / calls], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(elapsed.item())
    return statistics.median(times)


def gather_then_softmax(shard: torch.Tensor, world: int, rank: int):
    """The rows gathered to rank 0 (equal shards), put back in order, one softmax there."""
    if world == 1:
        return anysoftmax.softmax(shard, -1)
    parts = [torch.empty_like(shard) for _ in range(world)] if rank == 0 else None
    dist.gather(shard, parts, dst=0)
    return anysoftmax.softmax(torch.cat(parts, -1), -1) if rank == 0 else None


def two_pass(shard: torch.Tensor) -> torch.Tensor:
    """`anysoftmax.distributed.softmax` with the one-read path off (`one_read.ENABLED`)."""
    one_read.ENABLED = False
    try:
        return asd.softmax(shard, -1)
    finally:
        one_read.ENABLED = True


def bench(args, rank: int, world: int, device: torch.device) -> list[dict]:
    vocabs, tokens = (CPU_VOCABS, CPU_TOKENS) if args.cpu else (GPU_VOCABS, GPU_TOKENS)
    tokens = args.tokens or tokens
    dtypes = [torch.float32] if args.cpu else [torch.bfloat16, torch.float32]
    rows = []
    for dtype in dtypes:
        for v in vocabs:
            for t in tokens:
                shard = torch.randn(t, v // world, device=device, dtype=dtype)
                state = torch.randn(t, device=device, dtype=torch.float32)
                row = {"dtype": str(dtype).removeprefix("torch."), "vocab": v, "tokens": t, "world": world}
                before = one_read.stats["calls"]
                asd.softmax(shard, -1)
                row["path"] = "one_read" if one_read.stats["calls"] > before else "two_pass"
                for name, fn in (("distributed", lambda: asd.softmax(shard, -1)),
                                 ("two_pass", lambda: two_pass(shard)),
                                 ("local_shard", lambda: anysoftmax.softmax(shard, -1)),
                                 ("states_gather", lambda: gather_states(state, world, None)),
                                 ("gather_rows", lambda: gather_then_softmax(shard, world, rank))):
                    row[f"{name}_ms"] = per_call_ms(fn, device, args.calls, args.repeats)
                for name, values in args.one_read_variants.items():
                    with heuristics.override(**values):
                        row[f"one_read[{name}]_ms"] = per_call_ms(lambda: asd.softmax(shard, -1), device, args.calls,
                                                                  args.repeats)
                row["collective_share"] = row["states_gather_ms"] / row["distributed_ms"]
                row["vs_local"] = row["distributed_ms"] / row["local_shard_ms"]
                row["vs_local_plus_gather"] = row["distributed_ms"] / (row["local_shard_ms"] + row["states_gather_ms"])
                row["vs_gather_rows"] = row["distributed_ms"] / row["gather_rows_ms"]
                rows.append(row)
                if rank == 0:
                    extra = "".join(f"  [{n}] {row[f'one_read[{n}]_ms']:.4f}" for n in args.one_read_variants)
                    print(f"{row['dtype']:9s} V={v:7d} T={t:6d}  distributed ({row['path']}) "
                          f"{row['distributed_ms']:.4f} ms  two-pass {row['two_pass_ms']:.4f}  "
                          f"local {row['local_shard_ms']:.4f}  states {row['states_gather_ms']:.4f}  "
                          f"gather+softmax {row['gather_rows_ms']:.4f}{extra}", flush=True)
                del shard
    return rows


def profile_one(args, rank: int, world: int, device: torch.device, out: Path) -> Path:
    """The --profile report of this rank (module docstring), written under `out`."""
    from torch.profiler import ProfilerActivity, profile

    tokens, vocab = (int(v) for v in args.profile_shape.split(","))
    dtype = torch.float32 if args.cpu else torch.bfloat16
    shard = torch.randn(tokens, vocab // world, device=device, dtype=dtype)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    calls = args.calls
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    lines = [f"{world} ranks ({dist.get_backend()}), rank {rank}, {where}; "
             f"{str(dtype).removeprefix('torch.')} tokens={tokens} vocab={vocab} (shard {vocab // world}); "
             f"{calls} calls profiled after a warm-up; torch {torch.__version__}", ""]
    for name, fn in (("distributed", lambda: asd.softmax(shard, -1)),
                     ("local_shard", lambda: anysoftmax.softmax(shard, -1))):
        for _ in range(3):
            fn()
        _sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        issue_us = (time.perf_counter() - t0) * 1e6 / calls
        _sync(device)
        per_call_us = (time.perf_counter() - t0) * 1e6 / calls
        dist.barrier()
        with profile(activities=activities) as prof:
            for _ in range(calls):
                fn()
            _sync(device)
        events = prof.events()
        ops = sum(1 for e in events if e.name.startswith("aten::")
                  and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))
        kernels = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
        syncs = {n: sum(1 for e in events if e.name == n) for n in ("aten::item", "aten::_local_scalar_dense",
                                                                  "aten::nonzero", "cudaStreamSynchronize",
                                                                  "cudaDeviceSynchronize")}
        collectives = sum(1 for e in events if e.name.startswith("c10d::"))
        lines += [f"== {name}: host time to issue one call {issue_us:.1f} us, one call to completion "
                  f"{per_call_us:.1f} us (unprofiled); per call: {ops / calls:.1f} top-level aten ops, "
                  f"{kernels / calls:.1f} device kernels/copies, {collectives / calls:.1f} collectives; host "
                  f"syncs in {calls} calls: {syncs} (one cudaDeviceSynchronize ends the profiled loop)", ""]
        table = prof.key_averages()
        if device.type == "cuda":
            lines += ["-- by device time", table.table(sort_by="self_cuda_time_total", row_limit=25), ""]
        lines += ["-- by host time", table.table(sort_by="cpu_time_total", row_limit=40), ""]
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"distributed_profile_{dist.get_backend()}_x{world}_rank{rank}.txt"
    path.write_text("\n".join(lines))
    return path


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({(r["dtype"], r["vocab"]) for r in result["results"]})
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
    for ax, (dtype, v) in zip(axes[0], keys):
        pts = sorted((r for r in result["results"] if (r["dtype"], r["vocab"]) == (dtype, v)),
                     key=lambda r: r["tokens"])
        for name in ("distributed", "two_pass", "local_shard", "gather_rows", "states_gather"):
            ax.plot([r["tokens"] for r in pts], [r[f"{name}_ms"] for r in pts], marker="o", ms=3, label=name)
        for key in sorted(k for k in pts[0] if k.startswith("one_read[")):  # (--one-read-variants)
            ax.plot([r["tokens"] for r in pts], [r[key] for r in pts], ls="--", marker=".", ms=3,
                    label=key.removesuffix("_ms"))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens (rows)")
        ax.set_ylabel("ms per call (slowest rank)")
        ax.set_title(f"{dtype}, vocab {v} over {result['world']} ranks")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{result['device']} ({result['dist_backend']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(rank: int, world: int, args, init: str | None) -> None:
    backend = "gloo" if args.cpu else "nccl"
    if init is None:  # torchrun: the environment holds the rendezvous
        dist.init_process_group(backend, timeout=timedelta(seconds=300))
    else:
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=world,
                                timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if not args.cpu:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    try:
        result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                  "dist_backend": backend, "world": world, "calls": args.calls, "repeats": args.repeats,
                  "torch": torch.__version__, "anysoftmax": anysoftmax.__version__}
        if args.check:
            from anysoftmax.testing.distributed import check_distributed

            failures = check_distributed(dtypes=(torch.float32, torch.bfloat16, torch.float16))
            result["check_failures"] = failures
            if rank == 0:
                print(f"conformance over {backend}, {world} ranks: {len(failures)} failures", *failures, sep="\n")
        out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / gpu_dir_name(result["device"])
        if args.profile_only:
            print(f"wrote {profile_one(args, rank, world, device, out)}", flush=True)
            return
        result["results"] = bench(args, rank, world, device)
        if args.profile:
            print(f"wrote {profile_one(args, rank, world, device, out)}", flush=True)
        if rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            stem = f"distributed_softmax_{backend}_x{world}"
            (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
            try:
                plot(result, out / f"{stem}.png")
            except ImportError:
                print("no plot: matplotlib is not installed")
            print(f"wrote {out / stem}.json")
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nprocs", type=int, default=None, help="spawn this many ranks (default: torchrun's, else 2)")
    p.add_argument("--cpu", action="store_true", help="gloo on the CPU with tiny shapes")
    p.add_argument("--check", action="store_true", help="run the conformance cases first")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--profile", action="store_true", help="after the sweep, one shape under torch.profiler")
    p.add_argument("--profile-only", action="store_true", help="the --profile report without the sweep")
    p.add_argument("--profile-shape", default=None, help="TOKENS,VOCAB for --profile (default 16,131072; "
                                                         "--cpu: 16,1024)")
    p.add_argument("--out", default=None, help="results folder (default benchmarks/results/<device>/)")
    p.add_argument("--one-read-variants", default="", help="triton tuning overrides to time the one-read kernel "
                                                           "under too (module docstring)")
    p.add_argument("--tokens", default=None, help="token counts (comma-separated; default the sweep's)")
    args = p.parse_args(argv)
    args.one_read_variants = {v: dict((k.strip(), yaml.safe_load(x)) for k, x in (kv.split("=") for kv in v.split(",")))
                              for v in args.one_read_variants.split(";") if v}
    args.tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else None
    if args.profile_shape is None:
        args.profile_shape = "16,1024" if args.cpu else "16,131072"
    if "RANK" in os.environ and args.nprocs is None:
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, None)
        return 0
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(run, args=(args.nprocs or 2, args, f"file://{tmp}/rendezvous"), nprocs=args.nprocs or 2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
