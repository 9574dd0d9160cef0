"""Compile Wave kernels ahead of time into the disk cache.

    python -m anysoftmax.backends.wave.aot --shapes 2x128,256x1024 --dtypes float32 --target sm_80

Shapes are MxN or N: M is dynamic in the kernel, so only N selects a kernel. Each (N, dtype,
op) gets one .vmfb; `--ops` picks softmax, log_softmax or both; `--out-dtypes` adds `dtype=`
widenings (e.g. float16 in, float32 out). `--cache-dir` overrides $ANYSOFTMAX_CACHE_DIR.
Copy the printed folder to a machine with only iree-base-runtime and point
$ANYSOFTMAX_CACHE_DIR at its parent's parent to run there without a compiler.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ...core.spec import dtype_name, parse_dtype
from .kernel import DTYPES, KernelKey
from .target import parse_target


def _row_lengths(text: str) -> list[int]:
    lengths = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        n = int(item.lower().split("x")[-1])
        if n < 1:
            raise argparse.ArgumentTypeError(f"row length must be positive in {item!r}")
        lengths.append(n)
    return sorted(set(lengths))


def _dtypes(text: str) -> list[str]:
    names = [dtype_name(parse_dtype(s.strip())) for s in text.split(",") if s.strip()]
    bad = [n for n in names if n not in DTYPES]
    if bad:
        raise argparse.ArgumentTypeError(f"unsupported dtype(s) {bad}; the Wave kernel takes {', '.join(DTYPES)}")
    return names


def keys_for(lengths, dtypes, out_dtypes, ops, target) -> list[KernelKey]:
    """Every kernel the command line asks for."""
    keys = []
    for n in lengths:
        for d in dtypes:
            for out in [d, *(o for o in out_dtypes if o != d)]:
                for log in ops:
                    keys.append(KernelKey(n, d, out, log, target))
    return keys


def main(argv: list[str] | None = None) -> int:
    """Compile the requested kernels into the cache; print one line per kernel. Returns 0."""
    p = argparse.ArgumentParser(prog="python -m anysoftmax.backends.wave.aot", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", type=_row_lengths, required=True, help="comma list of MxN or N, e.g. 2x128,781")
    p.add_argument("--dtypes", type=_dtypes, default=["float32"], help="input dtypes (float32,float16,bfloat16)")
    p.add_argument("--out-dtypes", type=_dtypes, default=[], help="extra output dtypes (dtype= widening)")
    p.add_argument("--ops", choices=("softmax", "log_softmax", "both"), default="both")
    p.add_argument("--target", type=parse_target, required=True, help="gfx942, gfx90a, ... or sm_80")
    p.add_argument("--cache-dir", help="cache root (sets $ANYSOFTMAX_CACHE_DIR)")
    p.add_argument("--force", action="store_true", help="recompile kernels already in the cache")
    args = p.parse_args(argv)
    if args.cache_dir:
        os.environ["ANYSOFTMAX_CACHE_DIR"] = args.cache_dir

    from . import diskcache
    from .compiler import compile_vmfb

    ops = {"softmax": [False], "log_softmax": [True], "both": [False, True]}[args.ops]
    for key in keys_for(args.shapes, args.dtypes, args.out_dtypes, ops, args.target):
        path = diskcache.vmfb_path(key)
        if path.exists() and not args.force:
            print(f"cached   {path}")
            continue
        t0 = time.perf_counter()
        diskcache.store(key, compile_vmfb(key))
        print(f"compiled {path} ({path.stat().st_size} bytes, {time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
