# Experiment record (issue 15): ran on an NVIDIA H100 80GB HBM3 against the code before the
# `_triton_common` restructuring (it patches the old `anysoftmax.kernels.launch`); its results
# are benchmarks/results/NVIDIA_H100_80GB_HBM3/cluster_probe.json. Kept to reproduce that run
# at commit e66a57e; the cooperative-grid launch it measured is now the backend's default.
"""GPU probe (issue 15): the cluster-split long-row kernel against the current split kernel.

Run on an sm_90 GPU: `python benchmarks/cluster_probe.py [--quick]`. For each shape and dtype it
checks every variant against a float64 torch reference (fresh random data, output poisoned
with NaN first), then times it with triton.testing.do_bench (median; inputs rotated so that no
call finds its input in L2) together with a torch clone of the same bytes, and reports the
fraction of that copy's time. Variants:

* current: anysoftmax.softmax(x, -1, backend="triton") (the cooperative spin-barrier split);
* coop: the same plans launched with launch_cooperative_grid=True (the driver then refuses a
  grid that cannot be co-resident instead of letting it hang);
* cl_*: gluon_cluster_softmax.cluster_softmax with several cluster sizes, chunk
  limits and grids.

It also checks that the driver refuses a cooperative launch larger than the GPU can hold
(a kernel with no barrier, so nothing can hang). Writes $OUT/cluster_probe.json (or ./).
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import math
import os
import sys
import time
import traceback

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import anysoftmax  # noqa: E402
from anysoftmax.kernels import launch as launch_mod  # noqa: E402
sys.path.insert(0, os.path.dirname(__file__))
from gluon_cluster_softmax import cluster_softmax  # noqa: E402

SHAPES = [(2048, 65536), (1024, 131072), (512, 262144), (64, 1048576), (16, 131072), (8, 1048576)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TOL = {torch.float32: (2e-5, 1e-9), torch.bfloat16: (1.6e-2, 1e-6), torch.float16: (2e-3, 1e-7)}
CLUSTER_VARIANTS = {
    "cl_default": {},
    "cl_rows": {"grid_rows": True},          # one cluster per row, no persistence
    "cl_w8": {"waves": 8},
    "cl_c8_64k": {"ctas": 8, "max_resident_bytes": 65536},
    "cl_c16_64k": {"ctas": 16, "max_resident_bytes": 65536},
    "cl_c16": {"ctas": 16},
}


def coop_supported() -> bool:
    from triton.backends.nvidia.compiler import CUDAOptions
    return "launch_cooperative_grid" in {f.name for f in __import__("dataclasses").fields(CUDAOptions)}


def set_cooperative(on: bool) -> None:
    """Launch the backend's cooperative plans with launch_cooperative_grid (or not)."""
    if not hasattr(launch_mod, "_orig_launch_options"):
        launch_mod._orig_launch_options = launch_mod.launch_options
    orig = launch_mod._orig_launch_options

    def opts(plan):
        o = orig(plan)
        if on and plan.cooperative:
            o["launch_cooperative_grid"] = True
        return o

    launch_mod.launch_options = opts
    from anysoftmax.backends.triton import backend as be
    be._launchers.clear()


def run_cluster(kw: dict):
    kw = dict(kw)
    grid_rows = kw.pop("grid_rows", False)

    def fn(x, y):
        extra = {"grid": x.shape[0]} if grid_rows else {}
        return cluster_softmax(x, y, **kw, **extra)
    return fn


def check(out: torch.Tensor, ref: torch.Tensor, dtype) -> dict:
    rtol, atol = TOL[dtype]
    out64 = out.double()
    nan_ok = bool(torch.equal(torch.isnan(out64), torch.isnan(ref)))
    diff = (out64 - ref).abs().nan_to_num(0.0)
    bound = atol + rtol * ref.abs().nan_to_num(0.0)
    worst = float((diff / bound).max())
    return {"ok": nan_ok and worst <= 1.0, "worst_over_tol": worst, "nan_pattern_ok": nan_ok,
            "max_abs_err": float(diff.max())}


def fresh(shape, dtype, special=False):
    x = torch.randn(shape, device="cuda", dtype=torch.float32) * 3
    if special:  # -inf entries, a row of all -inf (torch gives NaN), a huge-offset row
        x[0, ::7] = float("-inf")
        x[-1] = float("-inf")
        if shape[0] > 2:
            x[1] += 1e4
    return x.to(dtype)


def bench(fn, xs) -> float:
    it = itertools.cycle(xs)
    return triton.testing.do_bench(lambda: fn(next(it)), warmup=25, rep=100, return_mode="median")


def probe_cell(shape, dtype, variants: dict, log) -> dict:
    rows, cols = shape
    cell = {"shape": list(shape), "dtype": str(dtype).replace("torch.", ""), "variants": {}}
    x = fresh(shape, dtype, special=True)
    ref = torch.softmax(x.double(), -1)
    for name, fn in variants.items():
        res = {}
        set_cooperative(name == "coop")
        try:
            y = torch.full_like(x, float("nan"))
            r = fn(x, y)
            torch.cuda.synchronize()
            res.update(check(y if r is None or isinstance(r, dict) else r, ref, dtype))
            if isinstance(r, dict):
                res["plan"] = r
        except Exception as e:  # recorded, not raised: one failing variant must not hide the rest
            res = {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
        cell["variants"][name] = res
    del ref
    # Timing on fresh data (no special values), rotated over enough copies to exceed L2.
    nbytes = x.numel() * x.element_size()
    copies = max(2, math.ceil(256e6 / nbytes))
    xs = [fresh(shape, dtype) for _ in range(copies)]
    ys = [torch.empty_like(xs[0]) for _ in range(copies)]
    t_copy = bench(lambda a: a.clone(), xs)
    cell["copy_ms"] = t_copy
    cell["copy_GBps"] = 2 * nbytes / t_copy / 1e6
    for name, fn in variants.items():
        res = cell["variants"][name]
        if "error" in res:
            continue
        set_cooperative(name == "coop")
        try:
            pairs = itertools.cycle(list(zip(xs, ys)))
            ms = triton.testing.do_bench(lambda: fn(*next(pairs)), warmup=25, rep=100, return_mode="median")
            res["ms"] = ms
            res["frac_copy"] = t_copy / ms
        except Exception as e:
            res["time_error"] = f"{type(e).__name__}: {e}"[:500]
    set_cooperative(False)
    line = " ".join(f"{n}={v.get('frac_copy', float('nan')):.3f}{'' if v.get('ok') else '(BAD)'}"
                    for n, v in cell["variants"].items())
    log(f"{rows}x{cols} {cell['dtype']}: copy {cell['copy_GBps']:.0f} GB/s | {line}")
    del xs, ys
    torch.cuda.empty_cache()
    return cell


@triton.jit
def _noop_kernel(p):
    tl.store(p + tl.program_id(0), 1)


def refusal_check(log) -> dict:
    """Does the driver refuse a cooperative grid larger than the GPU holds? (no barrier inside)"""
    out = {}
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    buf = torch.zeros(1 << 20, device="cuda", dtype=torch.int32)
    for grid in (sm, sm * 16, sm * 64, sm * 2048):
        try:
            _noop_kernel[(grid,)](buf, num_warps=32, launch_cooperative_grid=True)
            torch.cuda.synchronize()
            out[str(grid)] = "launched"
        except Exception as e:
            out[str(grid)] = f"refused: {type(e).__name__}: {e}"[:300]
    log(f"cooperative refusal (1024-thread blocks, {sm} SMs): {out}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="first two shapes only")
    args = ap.parse_args()
    out_dir = os.environ.get("OUT", ".")
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    props = torch.cuda.get_device_properties(0)
    doc = {"device": props.name, "sm_count": props.multi_processor_count, "torch": torch.__version__,
           "triton": triton.__version__, "anysoftmax": anysoftmax.__file__, "cells": []}
    log(f"device {props.name} ({props.multi_processor_count} SMs) torch {torch.__version__} triton {triton.__version__}")
    has_coop = coop_supported()
    doc["launch_cooperative_grid_option"] = has_coop
    if has_coop:
        try:
            doc["coop_refusal"] = refusal_check(log)
        except Exception as e:
            doc["coop_refusal"] = f"{type(e).__name__}: {e}"

    def current(x, y):
        return anysoftmax.softmax(x, -1, backend="triton")

    variants = {"current": current}
    if has_coop:
        variants["coop"] = current  # run with set_cooperative(True) around it (probe_cell)
    variants.update({n: run_cluster(kw) for n, kw in CLUSTER_VARIANTS.items()})
    # Correctness of odd sizes and fp16 (no timing): rows not divisible by the cluster.
    extra = []
    for shape, dtype in (((37, 70001), torch.float32), ((5, 300007), torch.bfloat16), ((64, 65536), torch.float16)):
        x = fresh(shape, dtype, special=True)
        ref = torch.softmax(x.double(), -1)
        res = {}
        for name in ("cl_default", "cl_c16"):
            y = torch.full_like(x, float("nan"))
            try:
                variants[name](x, y)
                torch.cuda.synchronize()
                res[name] = check(y, ref, dtype)
            except Exception as e:
                res[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
        log(f"odd {shape} {dtype}: {res}")
        extra.append({"shape": list(shape), "dtype": str(dtype), "results": res})
    doc["odd_shapes"] = extra
    shapes = SHAPES[:2] if args.quick else SHAPES
    t0 = time.time()
    for shape in shapes:
        for dname, dtype in DTYPES.items():
            try:
                doc["cells"].append(probe_cell(shape, dtype, variants, log))
            except Exception:
                log(f"{shape} {dname}: {traceback.format_exc()[-800:]}")
            with open(os.path.join(out_dir, "cluster_probe.json"), "w") as f:
                json.dump(doc, f, indent=1)
    log(f"done in {time.time() - t0:.0f} s")
    doc["log"] = lines
    with open(os.path.join(out_dir, "cluster_probe.json"), "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
