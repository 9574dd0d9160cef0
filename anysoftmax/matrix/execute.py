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
from ..core.spec import SoftmaxSpec, parse_dtype
from . import memory, lse_merge_cells, providers
from .cells import FAILED, PASSED, SKIPPED, Cell, Result
from .conformance import check_cell, make_input, rounded_output
from .devices import device_name
from .fused_cells import check_fused, fused_bench_inputs
from .labels import entry_label
from .variants import applies

CPU_BENCH_NOTE = ("benchmark skipped: needs a GPU (a CPU/Triton-interpreter timing says nothing about kernel "
                  "speed); set benchmark.cpu: true to time the CPU anyway")

# The Triton interpreter evaluates masked-off lanes too (-inf - -inf): numpy's warnings about
# them say nothing about the result, which the conformance check judges.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")

_copy_gbps: dict[str, float] = {}  # per process: one copy measurement per device
_names: dict[str, str] = {}
_warm: set[str] = set()  # devices this process has warmed up


def copy_gbps(device: str) -> float:
    """Copy bandwidth of `device`, measured once per process."""
    if device not in _copy_gbps:
        _copy_gbps[device] = perf.copy_bandwidth_gbps(device)
    return _copy_gbps[device]


def _bench_inputs(cell: Cell, device: str):
    """(inputs to rotate, fn(input), bytes read + written per call). Every provider is timed
    the same way: forward x -> y; backward (y, dy) -> dx, the backward kernel alone (what
    autograd runs per call, without its bookkeeping)."""
    dtype = parse_dtype(cell.dtype)
    numel = math.prod(cell.shape)
    ndim = len(cell.shape)
    if cell.direction == "forward":
        n = perf.rotation_count(numel * dtype.itemsize)
        fn = providers.forward(cell.backend, cell.op, cell.dim, ndim, device)
        inputs = [make_input(cell.shape, dtype, device, cell.seed + k) for k in range(n)]
        return inputs, fn, 2 * numel * dtype.itemsize
    n = perf.rotation_count(2 * numel * dtype.itemsize)
    bwd = providers.backward(cell.backend, cell.op, cell.dim, ndim, device)
    inputs = []
    spec = None
    for k in range(n):
        x = make_input(cell.shape, dtype, device, cell.seed + k)
        spec = spec or SoftmaxSpec.from_tensor(x, cell.dim, log=cell.op == "log_softmax")
        inputs.append((rounded_output(x, spec, device), make_input(cell.shape, dtype, device, cell.seed + k + n,
                                                                   scale=1.0)))
    # Backward reads y and dy and writes dx.
    return inputs, (lambda t: bwd(*t)), 3 * numel * dtype.itemsize


def _note(res: Result, text: str) -> None:
    res.note = f"{res.note}; {text}" if res.note else text


def _back_to_back_calls(cell: Cell, res: Result) -> int:
    """Calls for an accelerator's `host_us`: a fused cell's attention scores take milliseconds
    per call, where about a second of calls (at least 10) shows the host cost as well as 200
    would."""
    if res.timer == "gpu" and cell.variant.is_plain:
        return perf.BACK_TO_BACK_CALLS
    return max(10, min(perf.BACK_TO_BACK_CALLS, int(1000.0 / max(res.ms, 1e-3))))


def _benchmark(cell: Cell, device: str, res: Result) -> None:
    if device == "cpu" and not cell.bench_cpu:
        _note(res, CPU_BENCH_NOTE)
        return
    if math.prod(cell.shape) == 0:
        _note(res, "benchmark skipped: empty tensor")
        return
    if device not in _warm:
        perf.warm_up(device)
        _warm.add(device)
    if cell.op in lse_merge_cells.PIECES_OPS:
        inputs, fn, moved = lse_merge_cells.bench_inputs(cell, device)
    else:
        inputs, fn, moved = (_bench_inputs if cell.variant.is_plain else fused_bench_inputs)(cell, device)
    res.ms = perf.time_ms(fn, inputs, device, warmup_ms=cell.warmup_ms, rep_ms=cell.rep_ms)
    res.gbps = perf.gbps(moved, res.ms)
    res.copy_gbps = copy_gbps(device)
    res.frac_copy = res.gbps / res.copy_gbps
    res.timer = perf.timer_label(device)
    if res.timer == "cpu":
        # A CPU call returns when its work is done: its wall time, which `time_ms` just
        # measured, is the host's time per call (no device queue to run ahead of).
        res.host_us = res.ms * 1e3
        _note(res, "CPU wall-clock timing" + (" of the Triton interpreter" if entry_label(cell) != cell.entry else ""))
    else:
        res.host_us = perf.back_to_back_us(lambda: fn(inputs[0]), device, _back_to_back_calls(cell, res))


def run_cell(cell: Cell, device: str) -> Result:
    """Run `cell` on the concrete `device`; every exception becomes a failed result with its
    text, an unavailable backend or unsupported request a skipped one with the reason."""
    start = time.perf_counter()
    res = Result(cell, PASSED, ran_on=device, host=platform.node())
    try:
        if device not in _names:
            _names[device] = device_name(device)
        res.device_name = _names[device]
        # A variant that cannot apply to this shape and dim, or a cell too big for the device:
        # skipped with the reason, before anything is allocated.
        refused = lse_merge_cells.refusal(cell) or (None if cell.op in lse_merge_cells.PIECES_OPS else applies(
            cell.variant, cell.shape, cell.dim)) or memory.refusal(cell, device)
        if refused is not None:
            res.status, res.reason = SKIPPED, refused
            res.seconds = time.perf_counter() - start
            return res
        if providers.is_reference_only(cell.backend):
            cmp = None
            res.note = providers.REFERENCE_NOTE
        else:
            if cell.op in lse_merge_cells.PIECES_OPS:
                cmp, spec = lse_merge_cells.check(cell, device)
            else:
                cmp, spec = (check_cell if cell.variant.is_plain else check_fused)(cell, device)
            res.max_abs_err, res.err_ratio = cmp.max_abs_err, cmp.max_rel_err
            res.atol, res.rtol = spec.tolerance.atol, spec.tolerance.rtol
        if cmp is not None and not cmp.ok:
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
