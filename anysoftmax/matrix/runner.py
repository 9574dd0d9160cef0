"""Running a whole matrix: locate devices, skip what is missing, run the rest, collect results."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

import torch

from .cells import FAILED, PASSED, SKIPPED, Result, expand
from .devices import environment, locate
from .schema import MatrixConfig
from .workers import assign, run_in_process, run_workers


@dataclass
class MatrixRun:
    """Everything a report needs: config identity, machine, located devices, results."""

    name: str
    path: str
    description: str
    environment: dict
    devices: dict  # entry name -> {"device", "ran_on": [...], "reason", "properties"}
    results: list[Result]
    started: str = ""
    seconds: float = 0.0
    copy_gbps: dict = field(default_factory=dict)  # concrete device -> GB/s
    interrupted: str = ""  # why the run stopped early (Ctrl-C, lost Ray head); "" = ran to the end

    def counts(self) -> dict[str, int]:
        out = {PASSED: 0, FAILED: 0, SKIPPED: 0}
        for r in self.results:
            out[r.status] += 1
        return out


def _in_process_ok(assignments, workers: int | None) -> bool:
    # Here is enough when every cell is a CPU cell, one worker is asked for, and this process
    # already runs Triton the way CPU cells need it (the interpreter, or no GPU to confuse).
    cpu_only = all(a.device == "cpu" for a in assignments)
    interpreter_ok = not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
    return cpu_only and (workers or 1) == 1 and interpreter_ok


def run_matrix(config: MatrixConfig, *, entries: list[str] | None = None, workers: int | None = None,
               cell_timeout: float | None = None, on_start: Callable[[int], None] | None = None,
               on_result: Callable[[Result], None] | None = None, isolate: bool = False) -> MatrixRun:
    """Run every cell of `config` (of the named `entries` only, when given).

    Cells of a missing device are `skipped` with the reason. CPU cells run in this process
    unless `workers` > 1 asks for that many worker processes, or `isolate` (a crash or a hang
    then costs only its cell); accelerator cells run in one worker process per device.
    `on_start(n_cells)` and `on_result(result)` report progress.
    """
    t0 = time.perf_counter()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    cells = expand(config, entries)
    if on_start:
        on_start(len(cells))
    located, devices = {}, {}
    for e in config.devices:
        if entries is None or e.name in entries:
            found, reason = locate(e.device, e.match)
            located[e.name] = found
            devices[e.name] = {"device": e.device, "ran_on": found, "reason": reason, "properties": e.properties}
    results: list[Result] = []

    def record(r: Result) -> None:
        results.append(r)
        if on_result:
            on_result(r)

    runnable = []
    for cell in cells:
        if located[cell.entry]:
            runnable.append(cell)
        else:
            record(Result(cell, SKIPPED, reason=devices[cell.entry]["reason"]))
    assignments = assign(runnable, located, workers or 1)
    if not isolate and _in_process_ok(assignments, workers):
        run_in_process(assignments, record)
    else:
        run_workers(assignments, record, config.plugins, cell_timeout)
    results.sort(key=lambda r: r.cell.index)
    copy = {r.ran_on: r.copy_gbps for r in results if r.copy_gbps}
    return MatrixRun(config.name, config.path, config.description, environment(), devices, results, started,
                     time.perf_counter() - t0, copy)


def failed(run: MatrixRun) -> bool:
    """True when any cell failed (the command's exit status)."""
    return any(r.status == FAILED for r in run.results)
