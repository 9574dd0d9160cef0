"""The `wave` backend's cost on an NVIDIA GPU through IREE's CUDA HAL: per call and bandwidth.

    ANYSOFTMAX_WAVE_ON_CUDA=1 python benchmarks/wave_latency.py --out DIR [--before FILE]

Writes DIR/latency_wave.{json,csv,png}:

* the latency benchmark's rows (`anysoftmax.bench.latency.measure`: host us per call back to
  back, GPU us from do_bench) for torch, anysoftmax:triton and anysoftmax:wave, and, from
  `--before` (that benchmark's latency.json run with the previous code: Wave's synchronous
  entry point), the same rows as provider 'anysoftmax:wave (sync entry point)';
* fused requests per call (8x1024 fp32 with scale, a bool mask and sinks) for wave, triton
  and torch's formula;
* `breakdown`: where one 8x1024 call's time goes (torch stream sync, DLPack imports, the
  async call and its wait, the whole API call), medians of single timed calls;
* `bandwidth`: 4096x4096 fp32 in GB/s (bytes read + written): wave per call through the API,
  wave through IREE's queue with the calls chained by fences and one wait at the end (the
  asynchronous ABI's throughput), triton and torch (do_bench, L2 flushed);
* with `--ptx`, `direct_launch_floor`: the same compiled kernel launched by the CUDA driver on
  torch's stream (no IREE runtime): how much of a call is IREE's queue.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import anysoftmax
from anysoftmax.backends.wave import runtime
from anysoftmax.backends.wave.backend import WaveBackend, as_rows
from anysoftmax.bench import latency
from anysoftmax.core import SoftmaxSpec
from anysoftmax.testing.compare import compare
from anysoftmax.perf import back_to_back_us

PROVIDERS = ["torch", "anysoftmax:triton", "anysoftmax:wave"]
BEFORE = "anysoftmax:wave (sync entry point)"


def _median_us(call, reps: int = 300, warmup: int = 20) -> float:
    """Median wall time of single calls (each ended by a device synchronise) in us."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def fused_rows(calls: int) -> list[dict]:
    """Per-call cost of one fused request (scale, bool mask, sinks) on 8x1024 fp32."""
    from triton.testing import do_bench

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(8, 1024, device="cuda", generator=g) * 3
    kw = dict(scale=0.3, mask=torch.rand(8, 1024, device="cuda", generator=g) < 0.2,
              sinks=torch.randn(8, 1, device="cuda", generator=g))
    spec, _ = SoftmaxSpec.from_request(x, -1, fused=kw)
    rows = []
    for provider in PROVIDERS:
        backend = provider.split(":")[-1] if ":" in provider else "torch"
        call = lambda: anysoftmax.softmax(x, -1, backend=backend, **kw)  # noqa: E731
        row = dict(provider=provider, shape=[8, 1024], direction="fwd", dtype="float32",
                   variant=spec.variant.describe())
        try:
            check = compare(call(), x, spec, "cuda", mask=kw["mask"], sinks=kw["sinks"])
            row.update(status="ok" if check.ok else "wrong", host_us=back_to_back_us(call, "cuda", calls, warmup=20),
                       gpu_us=do_bench(call, warmup=25, rep=100, return_mode="median") * 1e3)
        except Exception as exc:  # recorded, not fatal
            row.update(status="failed", detail=f"{type(exc).__name__}: {str(exc)[:200]}")
        rows.append(row)
    return rows


def _loaded(x: torch.Tensor):
    spec = SoftmaxSpec.from_tensor(x, -1)
    loaded, _ = WaveBackend()._kernel(spec, x.device)
    return spec, loaded


def breakdown(calls: int = 300) -> dict:
    """Median us of each step of one plain 8x1024 fp32 call through the async entry point."""
    x = torch.randn(8, 1024, device="cuda")
    y = torch.empty_like(x)
    spec, loaded = _loaded(x)
    dev = loaded.device
    views = (runtime._import(dev, x), runtime._import(dev, y))
    stream = torch.cuda.current_stream()
    api = lambda: anysoftmax.softmax(x, -1, backend="wave")  # noqa: E731
    out = {
        "device": torch.cuda.get_device_name(),
        "shape": [8, 1024],
        "spin_us (default)": runtime.SPIN_S * 1e6,
        "torch stream synchronize (idle)": _median_us(stream.synchronize, calls),
        "2 DLPack imports": _median_us(lambda: (runtime._import(dev, x), runtime._import(dev, y)), calls),
    }
    spin = runtime.SPIN_S
    for label, s in (("blocking wait", 0.0), ("polled wait", spin or 200e-6)):
        runtime.SPIN_S = s
        out[f"async call + {label} (views imported once)"] = _median_us(
            lambda: runtime.invoke(loaded, [views[0]], [views[1]], []), calls)
        out[f"runtime.launch, {label} (sync, imports, call, wait)"] = _median_us(
            lambda: runtime.launch(loaded, x, y), calls)
        out[f"anysoftmax.softmax(x, -1, backend='wave'), {label}"] = _median_us(api, calls)
        out[f"anysoftmax.softmax(x, -1, backend='wave'), {label}, back to back"] = back_to_back_us(api, "cuda", calls)
    runtime.SPIN_S = spin
    out["torch.softmax"] = _median_us(lambda: torch.softmax(x, -1), calls)
    return out


def profile(calls: int = 300) -> str:
    """cProfile of `calls` API calls (8x1024 fp32): where the host time of a call goes."""
    import cProfile
    import io
    import pstats

    x = torch.randn(8, 1024, device="cuda")
    anysoftmax.softmax(x, -1, backend="wave")
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        anysoftmax.softmax(x, -1, backend="wave")
    torch.cuda.synchronize()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
    return text.getvalue()


def direct_launch(ptx: Path, calls: int) -> dict:
    """A floor, not a path of the backend: the PTX that IREE compiled for the plain 8x1024 fp32
    kernel (dumped with --iree-hal-dump-executable-files-to), launched by the CUDA driver
    (cuda.bindings) on torch's stream, no IREE runtime in the call. Its arguments as IREE's
    CUDA HAL passes them: the two buffers, then M as two 32-bit push constants; one row per
    block along grid y, 128 threads (the PTX's .maxntid), the block exchange's dynamic shared
    memory (16 bytes; 1 KiB given)."""
    import ctypes

    from cuda.bindings import driver as cu

    def ok(result):
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA driver: {err}")
        return rest[0] if rest else None

    x = torch.randn(8, 1024, device="cuda") * 3
    torch.cuda.synchronize()
    ok(cu.cuInit(0))
    module = ok(cu.cuModuleLoadData(ptx.read_bytes() + b"\0"))
    fn = ok(cu.cuModuleGetFunction(module, b"softmax"))
    stream = cu.CUstream(torch.cuda.current_stream().cuda_stream)
    types = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32)

    def call():
        out = torch.empty_like(x)
        ok(cu.cuLaunchKernel(fn, 1, x.shape[0], 1, 128, 1, 1, 1024, stream,
                             ((x.data_ptr(), out.data_ptr(), x.shape[0], 0), types), 0))
        return out

    spec = SoftmaxSpec.from_tensor(x, -1)
    check = compare(call(), x, spec, "cuda")
    return dict(device=torch.cuda.get_device_name(), shape=[8, 1024], ok=check.ok, detail=check.detail,
                host_us=back_to_back_us(call, "cuda", calls, warmup=20), single_call_us=_median_us(call, 300))


def _chained_us(loaded, views, calls: int) -> float:
    """us per call of `calls` async calls queued back to back, each waiting on the previous
    one's fence (IREE orders them on the device), with one host wait at the end."""
    import iree.runtime as rt

    dev = loaded.device
    with dev.lock:
        start_value = dev.value
        t0 = time.perf_counter()
        for i in range(calls):
            args = rt.VmVariantList(4)
            args.push_ref(views[0])
            args.push_ref(views[1])
            args.push_ref(rt.HalFence.create_at(dev.timeline, start_value + i) if i else rt.HalFence(0))
            args.push_ref(rt.HalFence.create_at(dev.timeline, start_value + i + 1))
            loaded.context.invoke(loaded.function, args, rt.VmVariantList(1))
        dev.timeline.wait(start_value + calls)
        dev.value = start_value + calls
        return (time.perf_counter() - t0) / calls * 1e6


def bandwidth(shape=(4096, 4096)) -> list[dict]:
    """GB/s (read + written) of fp32 `shape` for wave per call, wave chained through IREE's
    queue, triton and torch."""
    from triton.testing import do_bench

    x = torch.randn(shape, device="cuda") * 3
    nbytes = 2 * x.numel() * x.element_size()
    spec, loaded = _loaded(x)
    y = torch.empty_like(x)
    rows = []

    def add(name, us, how):
        rows.append(dict(provider=name, shape=list(shape), dtype="float32", us=us, gbps=nbytes / us / 1e3, timing=how,
                         device=torch.cuda.get_device_name()))

    wave = lambda: anysoftmax.softmax(x, -1, backend="wave")  # noqa: E731
    assert compare(wave(), x, spec, "cuda").ok
    add("anysoftmax:wave", back_to_back_us(wave, "cuda", 200, warmup=10), "per call, back to back (host waits each)")
    views = (runtime._import(loaded.device, as_rows(x, spec)), runtime._import(loaded.device, y))
    _chained_us(loaded, views, 10)
    add("anysoftmax:wave (IREE queue, chained fences)", _chained_us(loaded, views, 200),
        "async calls chained by fences, one wait at the end")
    assert compare(y, x, spec, "cuda").ok
    for name, fn in (("anysoftmax:triton", lambda: anysoftmax.softmax(x, -1, backend="triton")),
                     ("torch", lambda: torch.softmax(x, -1))):
        add(name, do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3, "do_bench median (L2 flushed)")
        add(name + " (back to back)", back_to_back_us(fn, "cuda", 200, warmup=10), "per call, back to back")
    return rows


def write(doc: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "latency_wave.json", out / "latency_wave.csv", out / "latency_wave.png"]
    paths[0].write_text(json.dumps(doc, indent=1))
    keys = ["provider", "direction", "shape", "dtype", "variant", "status", "host_us", "gpu_us", "detail"]
    with open(paths[1], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for r in doc["results"]:
            w.writerow({**r, "shape": "x".join(map(str, r["shape"]))})
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return paths[:2]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(15, 5))
    # Forward host us per call: one group of bars per shape, one bar per provider.
    fwd = [r for r in doc["results"] if r["direction"] == "fwd" and not r.get("variant") and r.get("status") == "ok"]
    shapes = list(dict.fromkeys(tuple(r["shape"]) for r in fwd))
    names = [n for n in [*PROVIDERS, BEFORE] if any(r["provider"] == n for r in fwd)]
    width = 0.8 / max(len(names), 1)
    for k, name in enumerate(names):
        us = {tuple(r["shape"]): r["host_us"] for r in fwd if r["provider"] == name}
        ax.bar([i + k * width for i, sh in enumerate(shapes) if sh in us], [us[sh] for sh in shapes if sh in us],
               width, label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))], ["x".join(map(str, sh)) for sh in shapes],
                  rotation=45, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("host us per call (back to back)")
    ax.set_title(f"{doc['device']}: forward, per call")
    ax.legend(fontsize=7)
    bw = doc["bandwidth"]
    bx.barh([r["provider"] for r in bw], [r["gbps"] for r in bw])
    bx.set_xlabel("GB/s (read + written)")
    bx.set_title(f"{doc['device']}: 4096x4096 fp32")
    fig.tight_layout()
    fig.savefig(paths[2], dpi=110)
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--before", help="latency.json of the previous code (sync entry point)")
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--ptx", help="IREE's PTX of the plain 8x1024 fp32 kernel: also time it launched directly")
    args = p.parse_args(argv)
    device = torch.cuda.get_device_name()
    rows = latency.measure(args.calls, providers=PROVIDERS)
    if args.before:
        before = json.loads(Path(args.before).read_text())
        rows += [dict(r, provider=BEFORE) for r in before["results"] if r["provider"] == "anysoftmax:wave"]
    rows += fused_rows(args.calls)
    doc = dict(device=device, torch=torch.__version__, results=rows, breakdown=breakdown(), bandwidth=bandwidth(),
               profile=profile())
    if args.ptx:
        try:
            doc["direct_launch_floor"] = direct_launch(Path(args.ptx), args.calls)
        except Exception as exc:  # an experiment: recorded, never fatal
            doc["direct_launch_floor"] = dict(error=f"{type(exc).__name__}: {str(exc)[:300]}")
    paths = write(doc, Path(args.out))
    from anysoftmax.bench.tables import latency_table

    print(latency_table(dict(doc, results=[r for r in rows if not r.get("variant")]), [*PROVIDERS, BEFORE]))
    for r in rows:
        if r.get("variant"):
            print(f"{device}: fused {r['variant']} {'x'.join(map(str, r['shape']))} {r['provider']}: "
                  f"{r['status']} {r.get('host_us', float('nan')):.1f} us per call ({r.get('gpu_us', float('nan')):.1f})")
    print(json.dumps(doc["breakdown"], indent=1))
    print(doc["profile"])
    print("direct launch floor:", json.dumps(doc.get("direct_launch_floor")))
    for r in doc["bandwidth"]:
        print(f"{r['device']}: {r['provider']:<48} {r['us']:9.1f} us {r['gbps']:8.1f} GB/s  ({r['timing']})")
    print("wrote " + ", ".join(map(str, paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
