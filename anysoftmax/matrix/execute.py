"""Running one cell: conformance, then (if asked) the benchmark; never raises."""

from __future__ import annotations

import math
import platform
import time
import traceback
import warnings

import torch

from .. import perf
from ..core.registry import BackendUnavailableError, UnsupportedRequestError
from ..core.spec import parse_dtype
from . import memory
from .cells import FAILED, PASSED, SKIPPED, Cell, Result
from .conformance import OPS, check_cell, make_input
from .devices import device_name

# Benchmark inputs rotate among buffers totalling at least this much (beyond the largest
# last-level caches: H100 L2 50 MB, MI300X Infinity Cache 256 MB), 2 to 8 buffers.

CPU_BENCH_NOTE = ("benchmark skipped: needs a GPU (a CPU/Triton-interpreter timing says nothing about kernel "
                  "speed); set benchmark.cpu: true to time the CPU anyway")

# The Triton interpreter evaluates masked-off lanes too (-inf - -inf): numpy's warnings about
# them say nothing about the result, which the conformance check judges.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")

_copy_gbps: dict[str, float] = {}  # per process: one copy measurement per device
_names: dict[str, str] = {}


def copy_gbps(device: str) -> float:
    """Copy bandwidth of `device`, measured once per process."""
    if device not in _copy_gbps:
        _copy_gbps[device] = perf.copy_bandwidth_gbps(device)
    return _copy_gbps[device]


def _bench_inputs(cell: Cell, device: str):
    """(inputs to rotate, fn(input), bytes read + written per call)."""
    dtype = parse_dtype(cell.dtype)
    numel = math.prod(cell.shape)
    n = perf.rotation_count(numel * dtype.itemsize)
    op = OPS[cell.op]
    if cell.direction == "forward":
        inputs = [make_input(cell.shape, dtype, device, cell.seed + k) for k in range(n)]
        return inputs, (lambda x: op(x, cell.dim, backend=cell.backend)), 2 * numel * dtype.itemsize
    inputs = []
    for k in range(n):
        x = make_input(cell.shape, dtype, device, cell.seed + k).requires_grad_()
        dy = make_input(cell.shape, dtype, device, cell.seed + k + n, scale=1.0)
        inputs.append((x, op(x, cell.dim, backend=cell.backend), dy))
    # Backward reads y and dy and writes dx.
    return inputs, (lambda t: torch.autograd.grad(t[1], t[0], t[2], retain_graph=True)), 3 * numel * dtype.itemsize


def _benchmark(cell: Cell, device: str, res: Result) -> None:
    if device == "cpu" and not cell.bench_cpu:
        res.note = CPU_BENCH_NOTE
        return
    if math.prod(cell.shape) == 0:
        res.note = "benchmark skipped: empty tensor"
        return
    inputs, fn, moved = _bench_inputs(cell, device)
    res.ms = perf.time_ms(fn, inputs, device, warmup_ms=cell.warmup_ms, rep_ms=cell.rep_ms)
    res.gbps = perf.gbps(moved, res.ms)
    res.copy_gbps = copy_gbps(device)
    res.frac_copy = res.gbps / res.copy_gbps
    res.timer = perf.timer_label(device)
    if res.timer == "cpu":
        res.note = "CPU wall-clock timing" + (" of the Triton interpreter" if cell.backend == "triton" else "")


def run_cell(cell: Cell, device: str) -> Result:
    """Run `cell` on the concrete `device`; every exception becomes a failed result with its
    text, an unavailable backend or unsupported request a skipped one with the reason."""
    start = time.perf_counter()
    res = Result(cell, PASSED, ran_on=device, host=platform.node())
    try:
        if device not in _names:
            _names[device] = device_name(device)
        res.device_name = _names[device]
        too_big = memory.refusal(cell, device)
        if too_big is not None:
            res.status, res.reason = SKIPPED, too_big
            res.seconds = time.perf_counter() - start
            return res
        cmp, spec = check_cell(cell, device)
        res.max_abs_err, res.err_ratio = cmp.max_abs_err, cmp.max_rel_err
        res.atol, res.rtol = spec.tolerance.atol, spec.tolerance.rtol
        if not cmp.ok:
            res.status, res.reason = FAILED, cmp.detail
        elif cell.benchmark:
            _benchmark(cell, device, res)
    except (BackendUnavailableError, UnsupportedRequestError) as exc:
        res.status, res.reason = SKIPPED, str(exc)
    except Exception as exc:  # noqa: BLE001  (a crashing cell must not stop the matrix)
        res.status, res.reason = FAILED, f"crashed: {type(exc).__name__}: {exc}"
        res.traceback = traceback.format_exc(limit=8)
    res.seconds = time.perf_counter() - start
    return res
