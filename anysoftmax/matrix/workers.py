"""Spreading cells over worker processes: one per GPU (or NPU), N for CPU cells.

Workers are `torch.multiprocessing` *spawn* processes (a fresh interpreter: no inherited CUDA
state, and the place to choose the Triton interpreter before the kernels are imported). Each
worker runs its cells in order and sends ("start", slot, cell index) and ("done", slot, result)
messages. A worker that dies (segfault, os._exit, a kernel that poisoned the CUDA context) is
noticed by the parent: the cell it was running fails with the exit code, and a fresh worker
takes the remaining cells. A worker that dies three times in a row before finishing a cell
gives up, and its remaining cells fail; nothing hangs.
"""

from __future__ import annotations

import itertools
import os
import platform
import queue as queue_mod
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from .cells import FAILED, Cell, Result
from .devices import accelerator_module
from .execute import run_cell
from .schema import import_plugins

MAX_IDLE_DEATHS = 3  # consecutive deaths without finishing a cell before a worker gives up
EXIT_DEVICE_FAULT = 3  # a worker leaves with this after its device stopped answering


@dataclass
class Assignment:
    """The cells one worker runs on one concrete device."""

    slot: str  # "cuda:0", "cpu#1": names the worker
    device: str  # concrete torch device for its cells
    interpret: bool  # set TRITON_INTERPRET=1 in the worker before the kernels are imported
    cells: list[Cell] = field(default_factory=list)
    threads: int = 0  # torch CPU threads (0: torch's default)


def assign(cells: list[Cell], located: dict[str, list[str]], cpu_workers: int) -> list[Assignment]:
    """Map cells to workers: accelerator cells round-robin over their entry's located devices
    (one worker per device), CPU cells round-robin over `cpu_workers` workers.

    CPU workers run Triton kernels through the interpreter unless the user set
    TRITON_INTERPRET themselves (on a GPU host, that is how the CPU cells still run).
    """
    interpret = "TRITON_INTERPRET" not in os.environ or os.environ["TRITON_INTERPRET"] == "1"
    slots: dict[str, Assignment] = {}
    cycles = {entry: itertools.cycle(devs) for entry, devs in located.items() if devs}
    cpu_slots = itertools.cycle(range(max(1, cpu_workers)))
    for cell in cells:
        device = next(cycles[cell.entry])
        if device == "cpu":
            slot = f"cpu#{next(cpu_slots)}"
            slots.setdefault(slot, Assignment(slot, "cpu", interpret)).cells.append(cell)
        else:
            slots.setdefault(device, Assignment(device, device, False)).cells.append(cell)
    if any(a.device != "cpu" for a in slots.values()):
        # CPU cells beside GPU benchmarks: a CPU worker using every core would slow the GPU
        # workers' kernel launches, and with them the timings of small kernels.
        for a in slots.values():
            if a.device == "cpu":
                a.threads = 2
    return list(slots.values())


def run_in_process(assignments: list[Assignment], on_result: Callable[[Result], None]) -> None:
    """Run every cell here, in order (the CPU default: no start-up cost, test backends visible)."""
    for a in assignments:
        for cell in a.cells:
            on_result(run_cell(cell, a.device))


def _device_healthy(device: str) -> bool:
    try:
        torch.get_device_module(device.split(":")[0]).synchronize()
        return True
    except Exception:
        return False


def _worker_main(a: Assignment, results, plugins: tuple[str, ...]) -> None:
    if a.interpret:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports the kernels
    import_plugins(plugins)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.device != "cpu":
        kind, _, index = a.device.partition(":")
        accelerator_module(kind).set_device(int(index))  # imports torch_npu for "npu"
    for cell in a.cells:
        results.put(("start", a.slot, cell.index))
        res = run_cell(cell, a.device)
        results.put(("done", a.slot, res))
        if res.status == FAILED and a.device != "cpu" and not _device_healthy(a.device):
            # A faulting kernel (illegal address) poisons the context for every later cell:
            # leave, so that the parent gives the remaining cells to a fresh worker.
            results.close()
            results.join_thread()
            os._exit(EXIT_DEVICE_FAULT)
    results.put(("end", a.slot, None))


@dataclass
class _Worker:
    a: Assignment
    remaining: dict[int, Cell]
    proc: object = None
    current: int | None = None
    started: float = 0.0
    idle_deaths: int = 0
    progressed: bool = False
    done: bool = False


def run_workers(assignments: list[Assignment], on_result: Callable[[Result], None], plugins: tuple[str, ...] = (),
                cell_timeout: float | None = None) -> None:
    """Run each assignment in its own spawned process; results arrive through `on_result`."""
    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.Queue()
    workers = {a.slot: _Worker(a, {c.index: c for c in a.cells}) for a in assignments if a.cells}

    def start(w: _Worker) -> None:
        todo = replace(w.a, cells=list(w.remaining.values()))
        w.proc = ctx.Process(target=_worker_main, args=(todo, results, plugins), daemon=True,
                             name=f"anysoftmax-matrix-{w.a.slot}")
        w.proc.start()
        w.current, w.progressed = None, False

    def fail(w: _Worker, index: int, reason: str) -> None:
        on_result(Result(w.remaining.pop(index), FAILED, reason=reason, ran_on=w.a.device, host=platform.node()))

    def handle(msg) -> None:
        kind, slot, payload = msg
        w = workers[slot]
        if kind == "start":
            w.current, w.started = payload, time.monotonic()
        elif kind == "done":
            w.current, w.progressed, w.idle_deaths = None, True, 0
            if w.remaining.pop(payload.cell.index, None) is not None:  # never report a cell twice
                on_result(payload)
        elif kind == "end":
            w.done = True

    def drain() -> None:
        while True:
            try:
                handle(results.get(timeout=0.1))
            except queue_mod.Empty:
                return

    def died(w: _Worker, why: str) -> None:
        drain()  # messages it sent before dying
        if w.done:
            return
        if w.current is not None and w.current in w.remaining:
            fail(w, w.current, f"{why} while running this cell")
            w.progressed = True
        w.idle_deaths = 0 if w.progressed else w.idle_deaths + 1
        if w.remaining and w.idle_deaths < MAX_IDLE_DEATHS:
            start(w)
            return
        for index in list(w.remaining):
            fail(w, index, f"not run: the worker for {w.a.device} died {MAX_IDLE_DEATHS} times in a row ({why})")
        w.done = True

    try:
        for w in workers.values():
            start(w)
        last_check = 0.0
        while not all(w.done for w in workers.values()):
            try:
                handle(results.get(timeout=0.2))
            except queue_mod.Empty:
                pass
            now = time.monotonic()
            if now - last_check < 0.5:  # look at the processes twice a second, busy or not
                continue
            last_check = now
            for w in workers.values():
                if w.done:
                    continue
                if cell_timeout and w.current is not None and now - w.started > cell_timeout:
                    w.proc.kill()
                    w.proc.join()
                    died(w, f"timed out after {cell_timeout:g} s (worker killed)")
                elif not w.proc.is_alive():
                    died(w, f"worker process for {w.a.device} died (exit code {w.proc.exitcode})")
    finally:
        for w in workers.values():
            if w.proc is not None and w.proc.is_alive():
                if w.done:
                    w.proc.join(timeout=10)
                if w.proc.is_alive():
                    w.proc.kill()
