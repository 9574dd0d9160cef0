"""The softmax benchmark: anysoftmax against torch, torch.compile, the seed, Liger and QuACK.

    python -m anysoftmax.bench.softmax                 # forward, the full grid, every provider
    python -m anysoftmax.bench.softmax --bwd           # backward
    python -m anysoftmax.bench.softmax --quick         # a few shapes

One process per provider (a provider that crashes the CUDA context takes only itself down:
its current shape is recorded as failed and it restarts on the next shape). Copy bandwidth is
measured first, in the same run. Results: benchmarks/results/<gpu>/softmax_<fwd|bwd>.{json,csv,png}.
"""

from __future__ import annotations

import argparse
import json
import queue
import re
import subprocess
import sys
import threading
from pathlib import Path

GRID = [(32768, 128), (32768, 256), (32768, 1024), (16384, 4096), (16384, 8192), (8192, 16384),
        (4096, 32768), (2048, 65536), (1024, 131072), (512, 262144), (64, 1048576), (16, 131072), (4823, 781)]
SWEEP = [(4096, n) for n in range(256, 12672 + 1, 128)]
# Reductions over dim 0 (strided columns, adjacent rows): (M, N, dim).
NON_LAST = [(8192, 8192, 0), (16384, 1024, 0)]
QUICK = [(32768, 128), (32768, 1024), (16384, 8192), (1024, 131072), (64, 1048576), (16, 131072), (4823, 781)]
DTYPES = ["float32", "bfloat16", "float16"]


def _failed(provider, case, detail):
    dtype, m, n, *dim = case
    return dict(provider=provider, dtype=dtype, M=m, N=n, dim=dim[0] if dim else -1, gbps=0.0, frac_of_copy=0.0,
                us=0.0, max_err=float("nan"), status="failed", detail=detail)


def run_provider(provider: str, direction: str, cases: list, case_timeout: float) -> list[dict]:
    """All `cases` for one provider in a subprocess; a case that crashes the process or runs past
    `case_timeout` seconds (a compile that never ends) is recorded as failed and the provider
    restarts on the next case."""
    results, todo = [], list(cases)
    while todo:
        proc = subprocess.Popen([sys.executable, "-m", "anysoftmax.bench.worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc.stdin.write(json.dumps(dict(provider=provider, direction=direction, cases=todo)))
        proc.stdin.close()
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(text) for text in proc.stdout] + [lines.put(None)], daemon=True).start()
        while todo:
            try:
                line = lines.get(timeout=case_timeout)
            except queue.Empty:
                proc.kill()
                results.append(_failed(provider, todo[0], f"timed out after {case_timeout:.0f} s"))
                todo = todo[1:]
                break
            if line is None:  # the process died on todo[0]
                proc.wait()
                err = (proc.stderr.read().strip().splitlines() or ["process died"])[-1][:200]
                results.append(_failed(provider, todo[0], f"crashed: {err}"))
                todo = todo[1:]
                break
            if line.startswith("{"):
                results.append(json.loads(line))
                todo = todo[1:]
        proc.kill()
    return results


def gpu_dir_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m anysoftmax.bench.softmax", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bwd", action="store_true", help="benchmark the backward pass")
    p.add_argument("--latency", action="store_true",
                   help="per-call cost on small tensors instead: host us per call back to back and GPU us "
                        "(anysoftmax.bench.latency)")
    p.add_argument("--calls", type=int, default=2000, help="--latency: calls back to back per cell")
    p.add_argument("--quick", action="store_true", help="a few shapes only")
    p.add_argument("--sweep", action="store_true", help="also the seed's M=4096 N=256..12672 sweep (fp32)")
    p.add_argument("--non-last-only", action="store_true", help="only the reductions over dim 0")
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--providers", default="", help="comma list (default: anysoftmax providers + peers)")
    p.add_argument("--out", default="benchmarks/results", help="results folder (a sub-folder per GPU)")
    p.add_argument("--case-timeout", type=float, default=90.0, help="seconds one case may take (compile included)")
    args = p.parse_args(argv)
    if args.latency:
        from . import latency
        return latency.main(args.out, args.calls)

    import torch

    if not torch.cuda.is_available():
        print("the benchmark needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    import triton

    from . import providers, report
    from anysoftmax.perf import copy_bandwidth_gbps

    direction = "bwd" if args.bwd else "fwd"
    device = torch.cuda.get_device_name()
    copy = copy_bandwidth_gbps("cuda")
    print(f"{device}: copy bandwidth {copy:.0f} GB/s (read + write)", flush=True)
    names = [s for s in args.providers.split(",") if s] or providers.anysoftmax_names() + providers.PEERS
    shapes = [] if args.non_last_only else QUICK if args.quick else GRID
    cases = [(d, m, n) for d in args.dtypes.split(",") for m, n in shapes]
    if not args.bwd:
        cases += [(d, m, n, dim) for d in args.dtypes.split(",") for m, n, dim in NON_LAST]
    if args.sweep:
        cases += [("float32", m, n) for m, n in SWEEP]
    rows = []
    out_dir = Path(args.out) / gpu_dir_name(device)
    result = dict(device=device, copy_gbps=copy, torch=torch.__version__, triton=triton.__version__,
                  direction=direction, results=rows)
    for name in names:
        print(f"  {name} ...", flush=True)
        for r in run_provider(name, direction, cases, args.case_timeout):
            r["frac_of_copy"] = r["gbps"] / copy if r["status"] == "ok" else 0.0
            rows.append(r)
        paths = report.write(result, out_dir, f"softmax_{direction}")  # after each provider: a cut run keeps what it measured
    report.print_table(result)
    print("wrote " + ", ".join(map(str, paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
