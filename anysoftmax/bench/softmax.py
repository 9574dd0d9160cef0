"""The softmax benchmark: anysoftmax against torch, torch.compile, the seed, Liger and QuACK.

    anysoftmax bench                   # forward, the full grid, every provider
    anysoftmax bench --bwd             # backward
    anysoftmax bench --quick           # a few shapes
    anysoftmax bench --device cpu      # tiny shapes on the CPU (Triton interpreter)
    anysoftmax bench --variants [all|NAMES] [--bwd]   # the fused family (bench.variants)

A thin entry point to the device matrix: every (provider, dtype, shape) is a matrix cell,
checked against the float64 reference (one tolerance, `anysoftmax.testing.compare`) and then
timed, in the matrix's worker process per device (a cell that crashes the process or runs
past --case-timeout is recorded as failed and a fresh worker takes the rest). Each worker
measures the copy bandwidth once. Besides the median device time (`us`, L2 flushed, inputs
rotated) each row has `host_us`: wall time per call with calls issued back to back and one
synchronize, so a host-bound provider shows. Results:
<out>/<device>/softmax_<fwd|bwd>.{json,csv,png}; with --variants (the fused family on attention
scores, `anysoftmax.bench.variants`) <out>/<device>/softmax_variants_<fwd|bwd>.{json,csv,png}.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from .report import gpu_dir_name

GRID = [(32768, 128), (32768, 256), (32768, 1024), (16384, 4096), (16384, 8192), (8192, 16384),
        (4096, 32768), (2048, 65536), (1024, 131072), (512, 262144), (64, 1048576), (16, 131072), (8, 1048576),
        (4823, 781)]
SWEEP = [(4096, n) for n in range(256, 12672 + 1, 128)]
# Reductions over dim 0 (strided columns, adjacent rows): (M, N, dim).
NON_LAST = [(8192, 8192, 0), (16384, 1024, 0)]
QUICK = [(32768, 128), (32768, 1024), (16384, 8192), (1024, 131072), (64, 1048576), (16, 131072), (4823, 781)]
# --device cpu: shapes the Triton interpreter runs in seconds (the whole path, not a speed).
CPU_GRID = [(4, 128), (16, 781)]
CPU_NON_LAST = [(64, 32, 0)]
DTYPES = ["float32", "bfloat16", "float16"]
GPU_TIMING = dict(warmup_ms=10, rep_ms=60)
CPU_TIMING = dict(warmup_ms=1, rep_ms=20, cpu=True)


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """'4x128,64x32:0' -> [(4, 128, -1), (64, 32, 0)]."""
    out = []
    for item in filter(None, text.split(",")):
        shape, _, dim = item.partition(":")
        m, n = (int(v) for v in shape.lower().split("x"))
        out.append((m, n, int(dim) if dim else -1))
    return out


def grid(args) -> list[tuple[str, list[str], list[tuple[int, int, int]]]]:
    """The benchmark's parts: (entry name, dtypes, [(M, N, dim)])."""
    dtypes = [d for d in args.dtypes.split(",") if d] or DTYPES
    if args.shapes:
        return [("grid", dtypes, parse_shapes(args.shapes))]
    cpu = args.device == "cpu"
    last = [] if args.non_last_only else CPU_GRID if cpu else QUICK if args.quick else GRID
    shapes = [(m, n, -1) for m, n in last] + (CPU_NON_LAST if cpu else NON_LAST)
    parts = [("grid", dtypes, shapes)]
    if args.sweep:
        parts.append(("sweep", ["float32"], [(m, n, -1) for m, n in SWEEP]))
    return parts


COMMAND = "anysoftmax bench"


def parse(argv, prog: str = "python -m anysoftmax.bench.softmax"):
    # The examples name the command the user ran (`prog`).
    p = argparse.ArgumentParser(prog=prog, description=re.sub(rf"^    {COMMAND}", f"    {prog}", __doc__, flags=re.M),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bwd", action="store_true", help="benchmark the backward pass")
    p.add_argument("--latency", action="store_true",
                   help="per-call cost on small tensors instead: host us per call back to back and GPU us "
                        "(anysoftmax.bench.latency)")
    p.add_argument("--calls", type=int, default=2000, help="--latency: calls back to back per cell")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda (default: refuses to run without a GPU) or cpu: tiny shapes through the Triton "
                        "interpreter, CPU wall-clock timings (exercises the whole path, says nothing about speed)")
    p.add_argument("--quick", action="store_true", help="a few shapes only")
    p.add_argument("--sweep", action="store_true", help="also the seed's M=4096 N=256..12672 sweep (fp32)")
    p.add_argument("--non-last-only", action="store_true", help="only the reductions over dim 0")
    p.add_argument("--shapes", default="", metavar="MxN[:dim],...",
                   help="these shapes instead of the grid (with --variants: BxHxSqxSk,...)")
    p.add_argument("--dtypes", default="", help=f"comma list (default: {','.join(DTYPES)}; with --variants: "
                   "bfloat16,float32)")
    p.add_argument("--variants", nargs="?", const="", default=None, metavar="NAMES|all",
                   help="the fused family on attention scores [8, 16, S, S] instead (anysoftmax.bench.variants): "
                        "the variants of the speed goals, `all` presets, or a comma list of preset names")
    p.add_argument("--providers", default="",
                   help="comma list: anysoftmax, anysoftmax:<backend>, and peers copy, torch, torch.compile, seed, "
                        "liger, quack (also spelled peer:<name>); default: anysoftmax providers + peers. With "
                        "--latency: names of anysoftmax.bench.latency.PROVIDERS")
    p.add_argument("--out", default="benchmarks/results", help="results folder (a sub-folder per device)")
    p.add_argument("--case-timeout", type=float, default=90.0, help="seconds one case may take (compile included)")
    return p.parse_args(argv)


def main(argv=None, prog: str = "python -m anysoftmax.bench.softmax") -> int:
    """The benchmark suite; `prog` is the command name its usage and errors show."""
    args = parse(argv, prog)
    if args.latency:
        from . import latency
        return latency.main(args.out, args.calls, [s for s in args.providers.split(",") if s] or None)

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("the benchmark needs a CUDA GPU (torch.cuda.is_available() is False); --device cpu runs tiny "
              "shapes on the CPU", file=sys.stderr)
        return 2
    import triton

    from ..matrix import ConfigError
    from ..matrix.devices import device_name
    from . import harness, report, variants

    device = "cuda:0" if args.device == "cuda" else "cpu"
    if device == "cpu":  # Triton kernels on CPU tensors: the interpreter, as `anysoftmax matrix` chooses
        from ..plugins import use_interpreter_if_needed
        use_interpreter_if_needed()
    direction = "bwd" if args.bwd else "fwd"
    timing = GPU_TIMING if args.device == "cuda" else CPU_TIMING
    chosen = [s for s in args.providers.split(",") if s]
    try:
        if args.variants is not None:  # the fused family on attention scores (bench.variants)
            names = chosen or variants.default_providers(device)
            config, row_names = variants.config(args, names, direction, device, timing)
            stem, to_row, printed = f"softmax_variants_{direction}", variants.row, variants.print_table
        else:
            names = chosen or harness.default_providers(device)
            config, row_names = harness.config(names, direction, device, grid(args), timing)
            stem, to_row, printed = f"softmax_{direction}", harness.row, report.print_table
    except (harness.UnknownProvider, variants.UnknownVariant, ConfigError) as exc:
        print(f"anysoftmax bench: {exc}", file=sys.stderr)
        return 2
    name = device_name(device)
    out_dir = Path(args.out) / gpu_dir_name(name)
    doc = dict(device=name, copy_gbps=0.0, torch=torch.__version__, triton=triton.__version__,
               direction=direction, results=[])
    if args.variants is not None:
        doc.update(variants.describe(config))
    print(f"{name}: {len(names)} providers, {direction}", flush=True)
    paths = harness.run(config, row_names, doc, to_row, lambda d: report.write(d, out_dir, stem), args.case_timeout)
    print(f"{name}: copy bandwidth {doc['copy_gbps']:.0f} GB/s (read + write)")
    printed(doc)
    print("wrote " + ", ".join(map(str, paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
