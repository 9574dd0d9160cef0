"""Sweep the `triton` backend's tuning table on the GPU at hand, to fill configs/tuning/triton.yaml.

    python -m benchmarks.tune_triton [--out DIR]

For each shape and dtype, every candidate override of the table is checked against the
reference and timed (do_bench median, inputs rotated); the best per shape is printed and all
results are written to DIR/tune_<gpu>.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

TILE_SHAPES = [(32768, 128), (32768, 1024), (16384, 4096), (16384, 8192), (4823, 781)]
SPLIT_SHAPES = [(2048, 65536), (512, 262144), (64, 1048576), (16, 131072)]
NON_LAST_SHAPES: list = []  # (M, N) reduced over dim 0; the dim-0 experiment used 8192x8192, 16384x1024


def tile_candidates():
    for per_slot, rows in itertools.product([1, 4, 64], [2048, 1]):
        yield dict(tile_programs_per_slot=per_slot, rows_tile_elems=rows)


def non_last_candidates():
    yield {}


def split_candidates():
    for chunk, prefetch in itertools.product([8192, 16384, 32768], [True, False]):
        yield dict(split_chunk_elems=chunk, split_prefetch=prefetch)
    yield dict(split_chunk_elems=32768, split_prefetch=False, split_warps_by_chunk=[[2**40, 32]])
    yield dict(split_chunk_elems=8192, cooperative=False)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--dtypes", default="float32,bfloat16")
    args = p.parse_args(argv)

    import anysoftmax
    from anysoftmax.backends.triton import heuristics
    from anysoftmax.core import SoftmaxSpec, compare

    from .softmax import gpu_dir_name
    from .timing import copy_bandwidth_gbps, median_ms, rotation_count

    dev = torch.cuda.get_device_name()
    copy = copy_bandwidth_gbps()
    print(f"{dev}: copy {copy:.0f} GB/s", flush=True)
    rows = []
    work = ([((m, n, -1), tile_candidates) for m, n in TILE_SHAPES]
            + [((m, n, -1), split_candidates) for m, n in SPLIT_SHAPES]
            + [((m, n, 0), non_last_candidates) for m, n in NON_LAST_SHAPES])
    for (m, n, dim), cands in work:
        for dname in args.dtypes.split(","):
            dtype = getattr(torch, dname)
            sets = [((torch.randn(m, n, device="cuda") * 3).to(dtype),)
                    for _ in range(rotation_count(m * n * dtype.itemsize))]
            best = None
            for cand in cands():
                try:
                    with heuristics.override(**cand):
                        out = anysoftmax.softmax(sets[0][0], dim, backend="triton")
                        ok = compare(out, sets[0][0], SoftmaxSpec.from_tensor(sets[0][0], dim), device="cuda").ok
                        ms = (median_ms(lambda x: anysoftmax.softmax(x, dim, backend="triton"), sets)
                              if ok else float("nan"))
                except Exception as exc:  # a candidate that does not compile is a result too
                    ok, ms = False, float("nan")
                    cand = {**cand, "error": f"{type(exc).__name__}: {str(exc)[:120]}"}
                frac = 2 * m * n * dtype.itemsize / (ms * 1e-3) / 1e9 / copy if ok else 0.0
                rows.append(dict(M=m, N=n, dim=dim, dtype=dname, ok=ok, ms=ms, frac=frac, **{k: str(v) for k, v in cand.items()}))
                if ok and (best is None or frac > best[0]):
                    best = (frac, cand)
            print(f"{dname:9} {m}x{n} dim {dim}: best {best[0] if best else 0:.3f} with {best[1] if best else None}", flush=True)
    out = Path(args.out) / gpu_dir_name(dev)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tune_triton.json").write_text(json.dumps(dict(device=dev, copy_gbps=copy, results=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
