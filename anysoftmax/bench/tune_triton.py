"""Sweep the `triton` backend's tuning table on the GPU at hand, to fill backends/triton/tuning.yaml.

    python -m anysoftmax.bench.tune_triton [--out DIR] [--groups small,tile,split,cols,warps,bwd,lse] [--name NAME]

For each shape and dtype, every candidate override of the table is checked against the
reference and timed (do_bench median, inputs rotated); the best per shape is printed and all
results are written to DIR/<gpu>/NAME.json. Each shape also records a same-size copy
(`candidate: copy`): the bandwidth a kernel moving that many bytes can reach at all.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

SMALL_SHAPES = [(32768, 128), (32768, 256), (4823, 781)]
TILE_SHAPES = [(32768, 1024), (16384, 4096), (16384, 8192)]
SPLIT_SHAPES = [(2048, 65536), (512, 262144), (64, 1048576), (16, 131072)]
COLS_SHAPES = [(8192, 8192), (16384, 1024), (1024, 8192)]  # reduced over dim 0
WARPS_SHAPES = [(16384, 4096), (16384, 8192), (8192, 16384), (4096, 32768)]


def small_candidates():
    for rows, warps in itertools.product([1024, 2048, 4096, 8192], [2, 4, 8]):
        yield dict(rows_tile_elems=rows, warps_by_tile_elems=[[2**40, warps]])


def tile_candidates():
    for per_slot, rows in itertools.product([1, 4, 64], [2048, 1]):
        yield dict(tile_programs_per_slot=per_slot, rows_tile_elems=rows)


def warps_candidates():
    yield {}  # the table as it stands
    for mid, top in [(8, 16), (16, 16), (8, 32), (16, 32)]:
        yield dict(warps_by_tile_elems=[[8192, 4], [16384, mid], [32768, top]])
    yield dict(warps_by_tile_elems=[[4096, 4], [8192, 8], [16384, 16], [32768, 16]])


BWD_SHAPES = [(16384, 8192), (8192, 16384), (4096, 32768), (2048, 65536)]
# logsumexp (`anysoftmax.logsumexp`: the softmax's plan in its STATES_ONLY form, or `lse_kernel`):
# the pieces benchmark's grid. Its copy moves the same bytes (x read, a float32 per row written).
LSE_SHAPES = [(32768, 128), (4823, 781), (32768, 1024), (16384, 4096), (2048, 65536), (512, 262144),
              (64, 1048576), (8, 1048576)]


def lse_candidates():
    yield {}  # the table as it stands
    for items in (4, 8):
        yield dict(split_items_per_sm=items)
    yield dict(split_chunk_bytes=32768)
    yield dict(split_chunk_bytes=8192, split_min_chunk_elems=2048)
    yield dict(long_rows="online")
    yield dict(long_rows="online", online_block_n=8192, online_warps=16)
    yield dict(rows_tile_elems=4096)
    yield dict(rows_tile_elems=8192, warps_by_tile_elems=[[2**40, 8]])
    yield dict(max_tile_elems=16384)
    # The standalone `lse_kernel` (one read, no output row): elements per step, programs per SM, warps.
    for elems, per_sm, warps in itertools.product([2048, 4096, 8192], [4, 8, 16], [4, 8]):
        yield dict(lse_kernel=(elems, per_sm, warps))


# Candidate keys that are no tuning-table values (the test of the sweeps allows these).
KERNEL_CANDIDATE_KEYS = {"lse_kernel"}


def lse_kernel_call(x, elems: int, per_sm: int, warps: int):
    """`lse_kernel` on x's rows (dim -1) with the given tile, grid and warps (the backend's
    `lse_plan` with those choices; long rows' chunks combined by its launcher)."""
    from anysoftmax.backends._triton_common.logsumexp import launcher
    from anysoftmax.backends.triton.backend import lse_plan
    from anysoftmax.core.lse_merge import logsumexp_request

    spec, operands = logsumexp_request(x, -1)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    run = launcher(x, spec, lambda rows, cols: lse_plan(rows, cols, x.element_size(), sms, elems=elems,
                                                        programs_per_sm=per_sm, num_warps=warps))
    return lambda t: run(t, operands)


def bwd_candidates():
    yield {}  # the table as it stands
    yield dict(bwd_split_chunk_bytes=16384)
    yield dict(bwd_split_chunk_bytes=4096)
    yield dict(bwd_max_tile_bytes=131072)


def split_candidates():
    yield {}  # the table as it stands
    yield dict(split_chunk_bytes=32768)
    yield dict(cooperative=False)


def cols_candidates():
    yield {}  # the table as it stands
    yield dict(cols_split_block_i=32, cols_chunk_bytes=65536)
    yield dict(cols_split_block_i=64, cols_chunk_bytes=32768)
    yield dict(cols_split_block_i=64, cols_chunk_bytes=65536)
    yield dict(cols_split_block_i=32, cols_chunk_bytes=16384)
    yield dict(cols_split_block_i=32, cols_warps_by_tile_elems=[[8192, 4], [32768, 8]])


def backward_ok(y_dy, dim) -> bool:
    """The Triton backward of (y, dy) checked as the benchmark checks every provider's."""
    from anysoftmax.torchop.api import softmax_backward
    from anysoftmax.core import SoftmaxSpec
    from anysoftmax.testing.compare import compare_backward

    y, dy = y_dy
    dx = softmax_backward(y, dy, dim, backend="triton")
    return compare_backward(dx, y, dy, SoftmaxSpec.from_tensor(y, dim), device=y.device).ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--groups", default="small,tile,split,cols")
    p.add_argument("--name", default="tune_triton")
    p.add_argument("--shapes", default="", help="only these of the groups' shapes, e.g. 32768x1024,8x1048576")
    args = p.parse_args(argv)

    import anysoftmax
    from anysoftmax.torchop.api import softmax_backward
    from anysoftmax.backends.triton import heuristics
    from anysoftmax.core import SoftmaxSpec
    from anysoftmax.testing.compare import compare, compare_logsumexp
    from anysoftmax.core.lse_merge import logsumexp_request

    from .report import gpu_dir_name
    from anysoftmax.perf import copy_bandwidth_gbps, rotation_count

    from .timing import median_ms

    dev = torch.cuda.get_device_name()
    copy = copy_bandwidth_gbps("cuda")
    print(f"{dev}: copy {copy:.0f} GB/s", flush=True)
    rows = []
    groups = {"small": (SMALL_SHAPES, -1, small_candidates), "tile": (TILE_SHAPES, -1, tile_candidates),
              "split": (SPLIT_SHAPES, -1, split_candidates), "cols": (COLS_SHAPES, 0, cols_candidates),
              "warps": (WARPS_SHAPES, -1, warps_candidates), "bwd": (BWD_SHAPES, -1, bwd_candidates),
              "lse": (LSE_SHAPES, -1, lse_candidates)}
    only = {tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s}
    work = [((m, n, dim), cands, g) for g in args.groups.split(",") for (shapes, dim, cands) in [groups[g]]
            for m, n in shapes if not only or (m, n) in only]
    for (m, n, dim), cands, group in work:
        backward, lse = group == "bwd", group == "lse"
        for dname in args.dtypes.split(","):
            dtype = getattr(torch, dname)
            n_sets = rotation_count((3 if backward else 2) * m * n * dtype.itemsize)
            if backward:  # (y, dy): the backward reads both and writes dx
                sets = [(torch.softmax(torch.randn(m, n, device="cuda") * 3, dim).to(dtype),
                         torch.randn(m, n, device="cuda").to(dtype)) for _ in range(n_sets)]
                copy_ms = median_ms(lambda y, dy: y + dy, sets)
            else:
                sets = [((torch.randn(m, n, device="cuda") * 3).to(dtype),) for _ in range(n_sets)]
                copy_ms = median_ms(lambda x: x.clone(), sets)
            moved = (3 if backward else 2) * m * n * dtype.itemsize
            if lse:  # x read, one float32 per row written: a copy of half as many bytes each way
                moved = m * n * dtype.itemsize + 4 * m
                half = torch.empty(moved // 8, dtype=torch.float32, device="cuda")
                copy_ms = median_ms(lambda t: t.clone(), [(half,)])
            rows.append(dict(M=m, N=n, dim=dim, dtype=dname, ok=True, ms=copy_ms, candidate="copy",
                             backward=backward, op=group, frac=moved / (copy_ms * 1e-3) / 1e9 / copy))
            print(f"{dname:9} {m}x{n} dim {dim}: same-size copy {rows[-1]['frac']:.3f}", flush=True)
            best = None
            for cand in cands():
                try:
                    with heuristics.override(**{k: v for k, v in cand.items() if k not in KERNEL_CANDIDATE_KEYS}):
                        if lse:
                            fn = (lse_kernel_call(sets[0][0], *cand["lse_kernel"]) if "lse_kernel" in cand
                                  else lambda x: anysoftmax.logsumexp(x, dim, backend="triton"))
                            sub = sets[0][0][:256]
                            ok = compare_logsumexp(fn(sets[0][0]).reshape(m, 1)[:256], sub, logsumexp_request(sub, dim)[0],
                                                   device="cuda").ok
                            ms = median_ms(fn, sets) if ok else float("nan")
                        elif backward:
                            ok = backward_ok(sets[0], dim)
                            ms = (median_ms(lambda y, dy: softmax_backward(y, dy, dim, backend="triton"), sets)
                                  if ok else float("nan"))
                        else:
                            out = anysoftmax.softmax(sets[0][0], dim, backend="triton")
                            ok = compare(out, sets[0][0], SoftmaxSpec.from_tensor(sets[0][0], dim), device="cuda").ok
                            ms = (median_ms(lambda x: anysoftmax.softmax(x, dim, backend="triton"), sets)
                                  if ok else float("nan"))
                except Exception as exc:  # a candidate that does not compile is a result too
                    ok, ms = False, float("nan")
                    cand = {**cand, "error": f"{type(exc).__name__}: {str(exc)[:120]}"}
                frac = moved / (ms * 1e-3) / 1e9 / copy if ok else 0.0
                rows.append(dict(M=m, N=n, dim=dim, dtype=dname, ok=ok, ms=ms, frac=frac, backward=backward, op=group,
                                 **{k: str(v) for k, v in cand.items()}))
                if ok and (best is None or frac > best[0]):
                    best = (frac, cand)
            print(f"{dname:9} {m}x{n} dim {dim}: best {best[0] if best else 0:.3f} with {best[1] if best else None}", flush=True)
            # Written after every shape: a run cut short by a time limit keeps what it measured.
            out = Path(args.out) / gpu_dir_name(dev)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{args.name}.json").write_text(json.dumps(dict(device=dev, copy_gbps=copy, results=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
