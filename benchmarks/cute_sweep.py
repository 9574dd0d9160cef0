"""Tuning sweep of the `cute` backend on a CUDA sm_90+ host, beside QuACK, triton and the copy.

    python benchmarks/cute_sweep.py --out DIR [--quick] [--budget-s 300]

For each (direction, dtype, shape) and each candidate tuning table (`VARIANTS`, applied with
`anysoftmax.backends.cute.plan.overrides`): the plan, a correctness check of the compiled kernel
against the float64 reference (fresh random data, output poisoned with NaN first; a plan that
fails is recorded as wrong and not timed), then the median device time (`anysoftmax.perf`:
do_bench with L2 flushed, inputs rotated). Beside them, in the same process: the same-bytes
copy (forward: a clone; backward: y + dy), QuACK (when `quack` imports), anysoftmax's triton
backend. Then the per-call host cost (back-to-back calls) of both calling conventions.

Writes DIR/cute_sweep.json (every row) and prints a table of fractions of the 1 GiB copy
bandwidth last. The winners feed `anysoftmax/backends/cute/tuning.yaml`.
"""

from __future__ import annotations

import argparse
import json
import signal
import time
import traceback
from pathlib import Path

import torch

SHAPES = [(2048, 65536), (1024, 131072), (512, 262144), (64, 1048576), (16, 131072), (8, 1048576),
          (4096, 32768), (8192, 16384), (16384, 8192)]
QUICK = [(2048, 65536), (512, 262144), (64, 1048576), (16, 131072)]
DTYPES = ["float32", "bfloat16"]
# Candidate tables (overrides of tuning.yaml); "default" is the table as shipped.
VARIANTS = {
    "default": {},
    "half": dict(elems_scale=0.5),
    "double": dict(elems_scale=2.0),
    "t128": dict(threads=128),
    "t512": dict(threads=512),
    "max8": dict(clusters=[1, 2, 4, 8]),
    "t512-half": dict(threads=512, elems_scale=0.5),
    "t384": dict(threads=384),
    # Long rows (session 10): CTAs of 512 threads for rows 256-thread clusters cannot hold,
    # full tiles kept in shared memory between the passes (`stage_bytes` a CTA), equal tiles.
    "run9": dict(long_row_threads=256, stage_bytes=0, balance_tiles=False),
    "nostage": dict(stage_bytes=0),
    "unbalanced": dict(balance_tiles=False),
    "t512": dict(long_row_threads=512),
    "t256": dict(long_row_threads=256),
    "stage96k": dict(stage_bytes=98304),
    "t256-stage96k": dict(long_row_threads=256, stage_bytes=98304),
}


def _inputs(direction: str, shape, dtype, sets: int):
    """Rotated input sets: forward (x,), backward (y, dy) with y a real softmax output."""
    out = []
    for _ in range(sets):
        x = (torch.randn(shape, device="cuda") * 3).to(dtype)
        if direction == "fwd":
            out.append((x,))
        else:
            y = torch.softmax(x.float(), -1).to(dtype)
            out.append((y, torch.randn(shape, device="cuda").to(dtype)))
    return out


def _nbytes(direction: str, shape, dtype) -> int:
    numel = shape[0] * shape[1]
    return (2 if direction == "fwd" else 3) * numel * torch.empty((), dtype=dtype).element_size()


def _check(direction, call, args, out, log):
    """Compare `out` (written by `call(*args, out)`) with the float64 reference."""
    from anysoftmax.core import SoftmaxSpec
    from anysoftmax.testing.compare import compare, compare_backward

    out.fill_(float("nan"))
    res = call(*args, out)
    out = out if res is None else res  # peers that allocate their result return it
    torch.cuda.synchronize()
    if direction == "fwd":
        return compare(out, args[0], SoftmaxSpec.from_tensor(args[0], -1, log=log), device="cuda")
    y, dy = args
    return compare_backward(out, y, dy, SoftmaxSpec.from_tensor(y, -1, log=log), device="cuda")


def _cute_call(direction, shape, dtype, log, variant):
    """(plan, call(*args, out)) of the cute kernel planned under `variant`."""
    from anysoftmax.backends.cute import compiler, env, launch, plan

    name = str(dtype).removeprefix("torch.")
    with plan.overrides(**VARIANTS[variant]):
        key = plan.make_plan(direction == "bwd", name, name, log, shape[1], 64, env.compile_arch(),
                             env.tvm_ffi_available())
    return key, launch.bind(compiler.kernel(key), key)


def _peer_calls(direction, dtype):
    """name -> call(*args, out) for the reference providers available here (those that
    allocate their own result return it)."""
    import anysoftmax

    calls = {}
    if direction == "fwd":
        calls["copy"] = lambda x, out: out.copy_(x)
        calls["triton"] = lambda x, out: anysoftmax.softmax(x, -1, backend="triton")
    else:
        calls["copy"] = lambda y, dy, out: torch.add(y, dy, out=out)
        calls["triton"] = lambda y, dy, out: anysoftmax.softmax_backward(y, dy, -1, backend="triton")
    try:
        import importlib

        qs = importlib.import_module("quack.softmax")  # `import quack.softmax as` binds quack's function

        if direction == "fwd":
            calls["quack"] = lambda x, out: qs._softmax_fwd(x, out)
        else:
            calls["quack"] = lambda y, dy, out: qs.softmax_bwd(dy, y)
    except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on without QuACK
        print(f"quack unavailable: {type(exc).__name__}: {exc}")
    return calls


def sweep(shapes, dtypes, directions, variants, deadline, copy_gbps, rows):
    from anysoftmax import perf

    for direction in directions:
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            peers = _peer_calls(direction, dtype)
            for shape in shapes:
                if time.time() > deadline:
                    print("time budget spent: stopping the sweep")
                    return
                nbytes = _nbytes(direction, shape, dtype)
                inputs = _inputs(direction, shape, dtype, perf.rotation_count(nbytes))
                out = torch.empty(shape, dtype=dtype, device="cuda")
                seen = {}
                candidates = [(f"cute:{v}", v) for v in variants] + [(p, None) for p in peers]
                for name, variant in candidates:
                    row = dict(direction=direction, dtype=dtype_name, M=shape[0], N=shape[1], provider=name)
                    try:
                        if variant is not None:
                            key, call = _cute_call(direction, shape, dtype, False, variant)
                            row["plan"] = key.describe()
                            if key in seen:
                                row.update(seen[key], duplicate_of=seen[key]["provider"])
                                rows.append(row)
                                continue
                        else:
                            call = peers[name]
                        if name != "copy":
                            c = _check(direction, call, inputs[0], out, False)
                            row.update(ok=c.ok, max_err=c.max_abs_err, detail=c.detail)
                            if not c.ok:
                                rows.append(row)
                                print(f"WRONG {direction} {dtype_name} {shape} {name}: {c.detail}")
                                continue
                        ms = perf.time_ms(lambda a: call(*a, out), inputs, "cuda", warmup_ms=10, rep_ms=60)
                        row.update(us=ms * 1e3, frac=perf.gbps(nbytes, ms) / copy_gbps)
                        if variant is not None:
                            seen[key] = dict(provider=name, us=row["us"], frac=row["frac"], ok=True)
                    except Exception as exc:  # noqa: BLE001 - a failing candidate is a result
                        row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:400])
                        print(f"FAILED {direction} {dtype_name} {shape} {name}: {row['error']}")
                        traceback.print_exc(limit=3)
                    rows.append(row)
                    print(f"{direction} {dtype_name} {shape} {name}: " + (f"{row['frac']:.2f}" if "frac" in row else
                                                                         "no timing"), flush=True)
                del inputs, out
                torch.cuda.empty_cache()


def host_cost(rows):
    """us per call issued back to back (one sync at the end) on a small tensor, both calling
    conventions of the cute kernel, beside triton's and torch's own call."""
    import anysoftmax
    from anysoftmax import perf
    from anysoftmax.backends.cute import compiler, env, launch, plan

    x = torch.randn(8, 8192, device="cuda")
    y = torch.empty_like(x)
    g = torch.randn_like(x)
    sm = torch.softmax(x, -1)
    cases = {
        "torch.softmax": lambda: torch.softmax(x, -1),
        "torch._softmax_backward_data": lambda: torch._softmax_backward_data(g, sm, -1, sm.dtype),
        "torch.empty": lambda: torch.empty((8, 8192), device="cuda"),
        "anysoftmax triton fwd": lambda: anysoftmax.softmax(x, -1, backend="triton"),
        "anysoftmax triton bwd": lambda: anysoftmax.softmax_backward(sm, g, -1, backend="triton"),
        "anysoftmax cute fwd": lambda: anysoftmax.softmax(x, -1, backend="cute"),
        "anysoftmax cute bwd": lambda: anysoftmax.softmax_backward(sm, g, -1, backend="cute"),
    }
    for tvm in (True, False):
        key = plan.make_plan(False, "float32", "float32", False, 8192, 64, env.compile_arch(), tvm)
        try:
            call = launch.bind(compiler.kernel(key), key)
            cases[f"cute kernel only ({'tvm-ffi' if tvm else 'dlpack'})"] = lambda c=call: c(x, y)
        except Exception as exc:  # noqa: BLE001
            rows.append(dict(host=f"cute {'tvm-ffi' if tvm else 'dlpack'}", error=str(exc)[:300]))
    for name, f in cases.items():
        try:
            rows.append(dict(host=name, us=perf.back_to_back_us(f, "cuda", calls=2000, warmup=50)))
        except Exception as exc:  # noqa: BLE001
            rows.append(dict(host=name, error=f"{type(exc).__name__}: {exc}"[:300]))


def table(rows, copy_gbps, device) -> str:
    lines = [f"{device}: fraction of the 1 GiB copy ({copy_gbps:.0f} GB/s); us in brackets"]
    keys = sorted({(r["direction"], r["dtype"], r["M"], r["N"]) for r in rows if "direction" in r},
                  key=lambda k: (k[0], k[1], -k[3], -k[2]))
    for k in keys:
        cells = [r for r in rows if (r.get("direction"), r.get("dtype"), r.get("M"), r.get("N")) == k]
        parts = []
        for r in cells:
            v = f"{r['frac']:.2f}" if "frac" in r else ("WRONG" if r.get("ok") is False and "error" not in r else "fail")
            parts.append(f"{r['provider'].replace('cute:', '')}={v}")
        best = max((r for r in cells if "frac" in r and r["provider"].startswith("cute")), key=lambda r: r["frac"],
                   default=None)
        lines.append(f"{k[0]} {k[1]:8s} {k[2]:>5}x{k[3]:<8} " + " ".join(parts)
                     + (f" | best {best['provider']} {best.get('plan', '')}" if best else ""))
    for r in rows:
        if "host" in r:
            lines.append(f"host {r['host']:40s} " + (f"{r['us']:.1f} us" if "us" in r else r.get("error", "")))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--budget-s", type=float, default=300.0, help="stop starting new shapes after this long")
    p.add_argument("--directions", default="fwd,bwd")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--shapes", default="", metavar="MxN,...", help="these shapes instead of the list")
    args = p.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s] or (
        QUICK if args.quick else SHAPES)
    from anysoftmax import perf

    device = torch.cuda.get_device_name()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    perf.warm_up("cuda")
    copy = perf.copy_bandwidth_gbps("cuda")
    rows: list = []
    start = time.time()

    def stop(*_):  # a `timeout` kill: still write what was measured (the finally below)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        sweep(shapes, args.dtypes.split(","), args.directions.split(","), args.variants.split(","),
              start + args.budget_s, copy, rows)
        host_cost(rows)
    finally:
        doc = dict(device=device, copy_gbps=copy, torch=torch.__version__, seconds=time.time() - start, rows=rows)
        (out / "cute_sweep.json").write_text(json.dumps(doc, indent=1))
        print(table(rows, copy, device))


if __name__ == "__main__":
    main()
