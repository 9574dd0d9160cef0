"""Launching a plan: the process-wide state the shared kernels need, and launchers bound once
per request.

State kept here, and why:
* barrier counters per (device, stream): the cooperative split kernels leave them zeroed, so
  they are allocated once and reused (no memset launch per call);
* one lock per kernel, held only around a launcher's first launch: Triton compiles a
  specialization on first launch without a lock of its own, so two threads launching a new
  shape at once would compile it twice. Later launches take no lock. Under the interpreter every
  launch shares one lock (it patches `triton.language` globally while a kernel runs).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict

import torch

from ...core.layout import RowLayout
from .plan import KernelPlan

# (device, stream) -> counters, least recently used first; bounded: a program that makes
# streams on the fly must not grow it forever.
_counters: OrderedDict = OrderedDict()
_counters_lock = threading.Lock()
MAX_COUNTER_STREAMS = 64

_launch_locks: dict = {}
_launch_locks_lock = threading.Lock()
_interpreter_lock = threading.Lock()


def launch_lock(kernel) -> threading.Lock:
    """The lock around a first launch (compile) of `kernel`; the one interpreter lock when
    kernels are interpreted."""
    if type(kernel).__name__ == "InterpretedFunction":
        return _interpreter_lock
    with _launch_locks_lock:
        return _launch_locks.setdefault(kernel, threading.Lock())


def row_counters(device: torch.device, n_rows: int) -> torch.Tensor:
    """Zeroed (arrived, departed) int32 counters for `n_rows` rows, reused across launches.

    The cooperative kernels leave them zero again (the last program to leave a row resets
    it), so they are allocated and zeroed once per (device, stream) and grown when needed. One
    buffer per stream, because launches on different streams may overlap.
    """
    n = max(2 * n_rows, 2)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    with _counters_lock:
        buf = _counters.get(key)
        if buf is None or buf.numel() < n:
            buf = torch.zeros(max(n, 2 * (buf.numel() if buf is not None else 0)), dtype=torch.int32, device=device)
            _counters[key] = buf
        _counters.move_to_end(key)
        while len(_counters) > MAX_COUNTER_STREAMS:
            # Safe to drop: the caching allocator hands a block freed on a stream back only to
            # allocations on that same stream, which run after the kernels queued there.
            _counters.popitem(last=False)
        return buf


def device_guard(device: torch.device):
    """Context making a CUDA/ROCm `device` current for a launch (Triton launches on the current
    device), entered only when it is not current already; nothing for other devices."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def scratch_maker(plan: KernelPlan, layout: RowLayout, out_dtype: torch.dtype):
    """A function `make(device) -> (stats, counts)`: the documented scratch of a launch, sized
    once here. `stats` holds the partial statistics (`plan.stats_numel`; one element when there
    are none, the kernels still take a pointer), `counts` the reused barrier counters."""
    acc = torch.float64 if out_dtype == torch.float64 else torch.float32
    n_stats = max(plan.stats_numel(layout), 1)
    counter_groups = plan.groups(layout) if plan.cooperative else 0

    def make(device) -> tuple:
        return torch.empty(n_stats, dtype=acc, device=device), row_counters(device, counter_groups)

    return make


def bind(plan: KernelPlan, layout: RowLayout, log: bool, out_dtype: torch.dtype):
    """A function `run(*tensors)` launching `plan` on tensors laid out as `layout`: (x, y) for a
    forward plan, (y, dy, dx) for a backward one. Constexprs, options and integer arguments are
    worked out once here; a call allocates the split scratch (if any) and launches."""
    kernel = plan.kernel()
    opts = plan.launch_options()
    metas = [{**plan.constexprs(layout, log, out_dtype, p), **opts} for p in plan.phases()]
    static = plan.static_args(layout)
    needs_scratch = plan.split or plan.backward
    scratch = scratch_maker(plan, layout, out_dtype) if needs_scratch else None
    grid = (plan.grid,)
    lock = launch_lock(kernel)
    always_lock = lock is _interpreter_lock
    compiled = [False]

    def launch_all(tensors) -> None:
        head = plan.head(tensors, *scratch(tensors[0].device)) if needs_scratch else tensors
        for meta in metas:
            kernel[grid](*head, *static, **meta)

    def run(*tensors: torch.Tensor) -> None:
        if compiled[0] and not always_lock:
            launch_all(tensors)
            return
        with lock:
            launch_all(tensors)
            compiled[0] = True

    return run
