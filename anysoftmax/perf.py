"""Timing and bandwidth, shared by the matrix runner and the benchmark suite.

GB/s is always (bytes read + bytes written) / time with 1 GB = 1e9 bytes, and a kernel's
"fraction of copy" is its GB/s over `copy_bandwidth_gbps` measured in the same run on the
same device: the best a memory-bound op can hope for on that machine.

On an accelerator, times are medians of `triton.testing.do_bench` (device events; do_bench
also flushes L2 before every call). On the CPU they are medians of `time.perf_counter`
wall-clock runs: a CPU timing (for Triton: the interpreter), not a kernel timing, and every
caller labels it so (`timer_label`).
"""

from __future__ import annotations

import itertools
import statistics
import time
from contextlib import nullcontext
from typing import Callable, Sequence

import torch

GPU_COPY_BYTES = 1 << 30  # >= 1 GiB: far beyond any L2, so the copy streams from HBM
CPU_COPY_BYTES = 64 << 20  # enough to leave the CPU caches; small enough for a 2-core CI machine


# Inputs rotated through in timing loops: enough sets that together they exceed twice the
# largest L2 (H100/H200: 50-60 MB) many times over, so a repeat never finds its input cached.
ROTATE_BYTES = 512 << 20
MAX_ROTATED_SETS = 8


def rotation_count(bytes_per_set: int) -> int:
    """How many input sets of `bytes_per_set` to rotate through (2 to MAX_ROTATED_SETS)."""
    return max(2, min(MAX_ROTATED_SETS, -(-ROTATE_BYTES // max(bytes_per_set, 1))))


# A graph replays calls back to back with no L2 flush between them: its rotated sets must
# themselves exceed the L2 several times over (256 MB against 50-60 MB), small sets included.
GRAPH_ROTATE_BYTES = 256 << 20
MAX_GRAPH_SETS = 16384


def graph_rotation_count(bytes_per_set: int) -> int:
    """How many input sets of `bytes_per_set` a graph timing (`graph_time_ms`) rotates through."""
    return max(2, min(MAX_GRAPH_SETS, -(-GRAPH_ROTATE_BYTES // max(bytes_per_set, 1))))


def timer_label(device) -> str:
    """'gpu' (device events via do_bench) or 'cpu' (wall clock, perf_counter)."""
    return "cpu" if torch.device(device).type == "cpu" else "gpu"


def gbps(bytes_moved: float, ms: float) -> float:
    """Bandwidth in GB/s (1e9 bytes/s) of `bytes_moved` bytes (read + written) in `ms` ms."""
    return bytes_moved / (ms * 1e-3) / 1e9


def _device_context(device: torch.device):
    # do_bench records events on the current device's stream: make `device` current.
    if device.type == "cpu" or device.index is None:
        return nullcontext()
    return torch.get_device_module(device.type).device(device)


def _cpu_median_ms(call: Callable[[], object], warmup_ms: float, rep_ms: float) -> float:
    call()  # first call: compilation, allocation
    start = time.perf_counter()
    call()
    estimate = max((time.perf_counter() - start) * 1e3, 1e-3)
    for _ in range(min(int(warmup_ms / estimate), 100)):
        call()
    times = []
    for _ in range(max(3, min(int(rep_ms / estimate), 1000))):
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def time_ms(fn: Callable[[object], object], inputs: Sequence[object], device, *, warmup_ms: float = 25,
            rep_ms: float = 100) -> float:
    """Median time in ms of one `fn(inp)` call, `inp` rotating through `inputs`.

    Rotating among several input buffers keeps a repeat from finding its input in L2 (on top
    of do_bench's own L2 flush); pass buffers whose total size exceeds the cache. On an
    accelerator this is `triton.testing.do_bench(..., return_mode="median")`; on the CPU a
    median of `time.perf_counter` runs (a CPU timing, see `timer_label`).
    """
    if not inputs:
        raise ValueError("time_ms needs at least one input")
    device = torch.device(device)
    rotation = itertools.cycle(inputs)

    def call():
        return fn(next(rotation))

    if device.type == "cpu":
        return _cpu_median_ms(call, warmup_ms, rep_ms)
    from triton.testing import do_bench

    with _device_context(device):
        return float(do_bench(call, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def graph_time_ms(fn: Callable[[object], object], inputs: Sequence[object], device, *, rep_ms: float = 20) -> float:
    """Median device time in ms of one `fn(inp)` call among calls captured back to back in a
    CUDA graph and replayed (`triton.testing.do_bench_cudagraph`), `inp` rotating through
    `inputs` (`graph_rotation_count` sets: no call finds its input in L2).

    What a small op costs the device when the host is out of the way (a model's decode step
    replayed from a graph): `time_ms` times one launch after an L2 flush and, once the host
    takes longer per call than the flush, times the host too. Accelerators with CUDA graphs only.
    """
    if not inputs:
        raise ValueError("graph_time_ms needs at least one input")
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"graph_time_ms needs a CUDA device, not {device}")
    rotation = itertools.cycle(inputs)

    def call():
        return fn(next(rotation))

    from triton.testing import do_bench_cudagraph

    with _device_context(device):
        return float(do_bench_cudagraph(call, rep=rep_ms, return_mode="median"))


BACK_TO_BACK_CALLS = 200  # enough to average out the host's jitter; little next to do_bench


def back_to_back_us(call: Callable[[], object], device, calls: int = BACK_TO_BACK_CALLS, warmup: int = 5) -> float:
    """Host wall time per call in us: `calls` calls of `call()` issued back to back (no L2
    flush, no per-call sync), then one synchronize. What an eager program pays per call: when
    it exceeds the device time of `time_ms`, the op is host-bound (launch overhead), which a
    device-event timing alone never shows."""
    device = torch.device(device)
    sync = (lambda: None) if device.type == "cpu" else torch.get_device_module(device.type).synchronize
    with _device_context(device):
        for _ in range(warmup):
            call()
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        sync()
    return (time.perf_counter() - start) / calls * 1e6


def warm_up(device, seconds: float = 0.5) -> None:
    """Keep an accelerator busy for a moment before its first timing (nothing on the CPU). A
    fresh process used to time its first (small) shapes at idle clocks: the provider that ran
    first lost up to 0.3 of copy bandwidth on 16-32 MB tensors against the same kernel timed
    second (H100)."""
    device = torch.device(device)
    if device.type == "cpu":
        return
    mod = torch.get_device_module(device.type)
    with _device_context(device):
        a = torch.randn(4096, 4096, device=device)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(8):
                a = (a @ a).mul_(1e-3)
            mod.synchronize()


def copy_bandwidth_gbps(device, nbytes: int | None = None) -> float:
    """Device-to-device copy bandwidth of `device` in GB/s (bytes read + written).

    Copies `nbytes` (default 1 GiB on an accelerator, 64 MiB on the CPU) from one buffer
    into another and times it with `time_ms`.
    """
    device = torch.device(device)
    if nbytes is None:
        nbytes = CPU_COPY_BYTES if device.type == "cpu" else GPU_COPY_BYTES
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda s: dst.copy_(s), [src], device)
    return gbps(2 * src.numel() * src.element_size(), ms)
