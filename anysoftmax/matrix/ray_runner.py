"""Running a matrix on a Ray cluster (`anysoftmax matrix CONFIG --ray [auto|ADDRESS]`).

Entries with the same Ray request (resources.ray_options) share a pool of workers: one Ray actor
per device slot (one GPU, one NPU, one CPU worker), so Triton compiles and the device warms up
once per slot, not once per cell. Each actor is fed one cell at a time from its pool's queue;
results stream back (`ray.wait`) into the same `on_result` callback and report as local runs.

Faults: actors get no automatic restarts or retries (Ray's defaults would re-run a crashing
cell several times). A worker that dies in a cell (segfault, os._exit, lost node) costs that
cell one retry on a fresh actor, which Ray places on any node that still fits; a second death
records the cell `failed` with the reason. An entry no alive node can hold is `skipped` as not
schedulable (checked up front, and again before each replacement) instead of waiting forever.
Ctrl-C or a lost head stops the run: what finished is reported, the rest is `skipped` as not
run and `MatrixRun.interrupted` says why.

Ray is imported only here, and only when a run asks for it.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

from .cells import FAILED, SKIPPED, Cell, Result, expand
from .devices import environment
from .resources import capacity, ray_options
from .runner import MatrixRun
from .schema import MatrixConfig

LOCAL = "local"  # start a private single-node cluster on 127.0.0.1
AUTO = "auto"  # join the running cluster (RAY_ADDRESS, or the one `ray start` made here), else LOCAL


def _first_line(text: str) -> str:
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[0].strip() if lines else ""


def connect(address: str) -> bool:
    """Join or start Ray; True when this call started it (and the caller must shut it down).

    A cluster started here listens on 127.0.0.1 only, without the dashboard. Ray 2.60's token
    authentication is left on: a local cluster creates its token (~/.ray/auth_token) itself;
    joining a remote one needs that cluster's token (RAY_AUTH_TOKEN or ~/.ray/auth_token).
    """
    if address.rpartition(":")[0] in ("127.0.0.1", "localhost") and "ray" not in sys.modules:
        # Ray rewrites a loopback address to the host's interface address (where a cluster
        # bound to 127.0.0.1 does not listen) unless this, read when ray is imported, says no.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return False
    quiet = dict(log_to_driver=False, logging_level="WARNING")
    if address == AUTO:
        try:
            ray.init(address="auto", **quiet)
            return True
        except ConnectionError:
            address = LOCAL
    if address == LOCAL:
        ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, **quiet)
    else:
        ray.init(address=address, **quiet)
    return True


class CellWorker:
    """One device slot: runs cells one by one on the device Ray gave it (made remote lazily)."""

    def __init__(self, plugins: tuple[str, ...], threads: int):
        import ray
        import torch

        from .schema import import_plugins

        import_plugins(plugins)
        if threads:
            torch.set_num_threads(threads)
        context = ray.get_runtime_context()
        self.node = context.get_node_id()
        self.host = platform.node()
        # Ray shows the worker only its own accelerator (as cuda:0): record which physical one.
        try:
            self.physical = {k: list(v) for k, v in context.get_accelerator_ids().items() if v}
        except Exception:  # older Ray: no accelerator ids; the visible index is all there is
            self.physical = {}
        self.located: dict = {}

    def run(self, cell: Cell, match: tuple[str, ...]) -> tuple[Result, bool]:
        """(result, device still healthy)."""
        from .devices import accelerator_module, locate
        from .execute import run_cell

        # Ray makes only the assigned device visible: "cuda" / "cuda:1" both mean that one.
        kind = cell.device.partition(":")[0]
        if (kind, match) not in self.located:
            found, reason = locate(kind, match)
            if found and kind != "cpu":
                accelerator_module(kind).set_device(int(found[0].partition(":")[2]))
            self.located[kind, match] = (found[0] if found else None, reason)
        device, reason = self.located[kind, match]
        if device is None:
            res = Result(cell, SKIPPED, reason=f"on Ray node {self.host}: {reason}")
            healthy = True
        else:
            res = run_cell(cell, device)
            healthy = res.status != FAILED or device == "cpu" or _healthy(device)
        res.host, res.node = self.host, self.node
        ids = self.physical.get("GPU" if kind == "cuda" else kind.upper())
        if res.ran_on and ids:
            res.ran_on = f"{res.ran_on} (Ray {'GPU' if kind == 'cuda' else kind.upper()} {','.join(map(str, ids))})"
        return res, healthy


def _healthy(device: str) -> bool:
    import torch
    try:
        torch.get_device_module(device.split(":")[0]).synchronize()
        return True
    except Exception:
        return False


@dataclass
class _Pool:
    opts: dict
    env: dict
    threads: int
    slots: int
    queue: deque = field(default_factory=deque)


@dataclass
class _Slot:
    pool: _Pool
    actor: object = None
    cell: Cell | None = None
    started: float = 0.0
    killed_for: str = ""


def _pools(config: MatrixConfig, cells: list[Cell], entries, workers: int | None, nodes: list[dict],
           known_types: list[str], skip: Callable[[Cell, str], None], devices: dict) -> list[_Pool]:
    """Group the cells by Ray request; skip the entries no node can hold."""
    by_entry = {e.name: e for e in config.devices}
    user_interp = os.environ.get("TRITON_INTERPRET")
    pools: dict[tuple, _Pool] = {}
    accel = any(by_entry[c.entry].device != "cpu" for c in cells)
    for cell in cells:
        e = by_entry[cell.entry]
        opts = ray_options(e, known_types)
        fits, why = capacity(opts, nodes)
        if not fits:
            devices[e.name]["reason"] = why
            skip(cell, why)
            continue
        cpu = e.device == "cpu"
        # CPU cells run Triton through the interpreter (unless the user chose), GPU cells
        # compiled; set per actor, whatever the driver's own environment says.
        env = {"TRITON_INTERPRET": (user_interp or "1") if cpu else "0"}
        key = (repr(sorted(opts.items())), repr(env))
        if key not in pools:
            slots = max(1, workers or 1) if cpu and not e.resources else fits
            pools[key] = _Pool(opts, env, 2 if cpu and accel else 0, slots)
        pools[key].queue.append(cell)
    for p in pools.values():
        p.slots = min(p.slots, len(p.queue))
    return list(pools.values())


def run_matrix_ray(config: MatrixConfig, address: str = AUTO, *, entries: list[str] | None = None,
                   workers: int | None = None, cell_timeout: float | None = None,
                   on_start: Callable[[int], None] | None = None,
                   on_result: Callable[[Result], None] | None = None) -> MatrixRun:
    """`run_matrix` on Ray: the same cells, results and report, spread over the cluster."""
    import ray
    from ray.exceptions import RayActorError
    from ray.util import accelerators

    t0 = time.perf_counter()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    cells = expand(config, entries)
    if on_start:
        on_start(len(cells))
    owned = connect(address)
    results: list[Result] = []
    devices = {e.name: {"device": e.device, "ran_on": [], "reason": "", "properties": e.properties}
               for e in config.devices if entries is None or e.name in entries}
    by_entry = {e.name: e for e in config.devices}
    ran_on: dict[str, set] = {name: set() for name in devices}
    done: set[int] = set()

    def record(r: Result) -> None:
        done.add(r.cell.index)
        results.append(r)
        if r.ran_on and r.status != SKIPPED:
            ran_on[r.cell.entry].add(f"{r.host}/{r.ran_on}")
        if on_result:
            on_result(r)

    def skip(cell: Cell, why: str) -> None:
        record(Result(cell, SKIPPED, reason=why))

    known = [v for k, v in vars(accelerators).items() if k.isupper() and isinstance(v, str)]
    nodes = ray.nodes()
    pools = _pools(config, cells, entries, workers, nodes, known, skip, devices)
    remote = ray.remote(CellWorker)
    attempts: dict[int, int] = {}
    inflight: dict = {}  # ObjectRef -> _Slot
    interrupted = ""

    def new_actor(pool: _Pool):
        return remote.options(max_restarts=0, max_task_retries=0, runtime_env={"env_vars": pool.env},
                              **pool.opts).remote(config.plugins, pool.threads)

    def fail_rest(pool: _Pool, why: str) -> None:
        while pool.queue:
            c = pool.queue.popleft()
            record(Result(c, FAILED, reason=why))

    def feed(slot: _Slot) -> None:
        """Give the slot its next cell, or retire its actor when the pool is empty."""
        pool = slot.pool
        if not pool.queue:
            if slot.actor is not None:
                ray.kill(slot.actor)  # frees the device for the next pool
            slot.actor = None
            return
        if slot.actor is None:
            fits, why = capacity(pool.opts, ray.nodes())
            if not fits:
                fail_rest(pool, f"not run: {why}")
                return
            slot.actor = new_actor(pool)
        slot.cell = pool.queue.popleft()
        slot.started, slot.killed_for = time.monotonic(), ""
        inflight[slot.actor.run.remote(slot.cell, by_entry[slot.cell.entry].match)] = slot

    def died(slot: _Slot, exc: Exception) -> None:
        cell, pool = slot.cell, slot.pool
        slot.actor = None  # a dead actor is never reused; the next feed starts a fresh one
        why = slot.killed_for or _first_line(exc)
        if "creation task" in str(exc):  # the worker cannot even start (e.g. a plugin fails to import)
            record(Result(cell, FAILED, reason=f"Ray worker could not start: {why}"))
            fail_rest(pool, f"not run: Ray worker could not start: {why}")
            return
        attempts[cell.index] = attempts.get(cell.index, 0) + 1
        if slot.killed_for or attempts[cell.index] >= 2:
            tries = "" if slot.killed_for else "; died again on its retry on a fresh worker"
            record(Result(cell, FAILED, reason=f"Ray worker died while running this cell ({why}){tries}"))
        else:
            pool.queue.appendleft(cell)  # one retry, on a fresh actor

    slots = [_Slot(p) for p in pools for _ in range(p.slots)]
    try:
        for s in slots:
            feed(s)
        while inflight:
            try:
                ready, _ = ray.wait(list(inflight), num_returns=1, timeout=0.5)
            except Exception as exc:  # noqa: BLE001  (the head or our connection is gone)
                interrupted = f"lost the Ray cluster: {type(exc).__name__}: {_first_line(exc)}"
                break
            for ref in ready:
                slot = inflight.pop(ref)
                try:
                    res, healthy = ray.get(ref)
                except RayActorError as exc:
                    died(slot, exc)
                else:
                    record(res)
                    if not healthy:  # a faulting kernel poisons the device context: fresh actor
                        ray.kill(slot.actor)
                        slot.actor = None
                feed(slot)
            if cell_timeout:
                now = time.monotonic()
                for slot in inflight.values():
                    if not slot.killed_for and now - slot.started > cell_timeout:
                        slot.killed_for = f"timed out after {cell_timeout:g} s (worker killed)"
                        ray.kill(slot.actor)
    except KeyboardInterrupt:
        interrupted = "interrupted (Ctrl-C)"
    finally:
        if interrupted:
            for c in cells:
                if c.index not in done:
                    results.append(Result(c, SKIPPED, reason=f"not run: {interrupted}"))
        for s in slots:
            if s.actor is not None:
                try:
                    ray.kill(s.actor)
                except Exception:  # noqa: BLE001  (best effort: the cluster may be gone)
                    pass
        env = environment()
        try:
            env["ray"] = {"version": ray.__version__, "address": address,
                          "nodes": sum(1 for n in ray.nodes() if n.get("Alive"))}
        except Exception:  # noqa: BLE001
            env["ray"] = {"version": ray.__version__, "address": address}
        if owned:
            ray.shutdown()
    for name, info in devices.items():
        info["ran_on"] = sorted(ran_on[name])
    results.sort(key=lambda r: r.cell.index)
    copy = {f"{r.host}/{r.ran_on}": r.copy_gbps for r in results if r.copy_gbps}
    return MatrixRun(config.name, config.path, config.description, env, devices, results, started,
                     time.perf_counter() - t0, copy, interrupted)
