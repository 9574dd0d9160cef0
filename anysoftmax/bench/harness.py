"""The benchmark as a matrix: its providers become matrix backends, its grid one in-memory
matrix config, its rows the matrix's results (one worker pool, one tolerance, one timing).

Provider names keep the benchmark's spelling in its rows (`anysoftmax`, `anysoftmax:triton`,
`torch`, `copy`, ...) so that older result files merge with newer ones; `--providers` also
takes the matrix's peer spelling (`peer:torch`).
"""

from __future__ import annotations

import math
import statistics

from ..matrix import providers, run_matrix
from ..matrix.cells import PASSED, SKIPPED, Result
from ..matrix.schema import MatrixConfig, validate

OURS = "anysoftmax"
# Benchmark status of a matrix result: a failed comparison is "wrong", any other failure
# (crash, timeout, dead worker) "failed", a provider that cannot run here "unavailable".
OK, WRONG, CRASHED, UNAVAILABLE = "ok", "wrong", "failed", "unavailable"


class UnknownProvider(ValueError):
    """A --providers name that is neither ours nor a peer."""


def to_backend(name: str) -> tuple[str, str]:
    """(row name, matrix backend) of a benchmark provider name: `anysoftmax` -> `auto`,
    `anysoftmax:<b>` -> `<b>`, `torch` or `peer:torch` -> `peer:torch`."""
    if name == OURS:
        return OURS, providers.AUTO
    if name.startswith(OURS + ":"):
        return name, name.split(":", 1)[1]
    peer = name[len(providers.PEER_PREFIX):] if providers.is_peer(name) else name
    if peer in providers.PEERS:
        return peer, providers.PEER_PREFIX + peer
    raise UnknownProvider(f"unknown provider {name!r}; allowed: {OURS}, {OURS}:<backend>, "
                          f"{', '.join(providers.PEERS)} (or peer:<name>)")


def anysoftmax_names(device: str) -> list[str]:
    """`anysoftmax` (automatic choice) and `anysoftmax:<backend>` for every backend the automatic
    choice takes a float32 request on `device` from (`registry.runners`), by priority."""
    from dataclasses import replace

    import torch

    from anysoftmax.core import SoftmaxSpec, registry

    # A request described without allocating on the device (the parent leaves the GPU to the workers).
    probe = replace(SoftmaxSpec.from_tensor(torch.empty(2, 2, device="meta"), 1), device=torch.device(device))
    return [OURS] + [f"{OURS}:{name}" for name in registry.runners(probe)]


def default_providers(device: str) -> list[str]:
    """Every provider that may run on `device`: ours, then the peers (missing ones are skipped)."""
    return anysoftmax_names(device) + list(providers.PEERS)


def config(names: list[str], direction: str, device: str, parts: list[tuple[str, list[str], list]],
           bench: dict, variants: list | None = None) -> tuple[MatrixConfig, dict[str, str]]:
    """The matrix of the benchmark: one entry per part (name, dtypes, [(*shape, dim)], e.g.
    (M, N, dim)), every provider on every cell (and every variant of `variants`, names or
    mappings of `matrix.variants`), conformance then benchmark. Returns it with the map matrix
    backend -> row name. Names are checked by the matrix schema (ConfigError)."""
    backend_of = dict(to_backend(n) for n in names)  # row name -> matrix backend
    entries = [{"name": name, "device": device, "dtypes": dtypes,
                "shapes": [{"shape": list(s[:-1]), "dims": [s[-1]]} for s in shapes]}
               for name, dtypes, shapes in parts if shapes]
    data = {"name": f"softmax_{direction}", "backends": list(backend_of.values()),
            "directions": ["forward" if direction == "fwd" else "backward"],
            "checks": ["conformance", "benchmark"], "benchmark": bench, "devices": entries,
            **({"variants": list(variants)} if variants else {})}
    return validate(data, "<anysoftmax bench>"), {b: row for row, b in backend_of.items()}


def _num(v, default):
    return default if v is None else v


def row(r: Result, provider: str) -> dict:
    """The benchmark's row of one matrix result: M, N the shape of a 2-d cell, else the rows
    and the length of the reduced dim."""
    shape = r.cell.shape
    m, n = shape if len(shape) == 2 else (math.prod(shape) // max(shape[r.cell.dim], 1), shape[r.cell.dim])
    if r.status == PASSED:
        status, detail = OK, r.note
    elif r.status == SKIPPED:
        status, detail = UNAVAILABLE, r.reason
    else:  # a comparison that ran and failed, or a crash / timeout / dead worker
        status, detail = (WRONG if r.max_abs_err is not None else CRASHED), r.reason
    timed = status == OK and r.ms is not None
    return dict(provider=provider, dtype=r.cell.dtype, M=m, N=n, dim=r.cell.dim,
                gbps=r.gbps if timed else 0.0, frac_of_copy=r.frac_copy if timed else 0.0,
                us=r.ms * 1e3 if timed else 0.0, host_us=_num(r.host_us, 0.0) if timed else 0.0,
                max_err=_num(r.max_abs_err, math.nan), status=status, detail=detail.strip().splitlines()[0][:300]
                if detail.strip() else "")


def run(config: MatrixConfig, row_names: dict[str, str], doc: dict, to_row, write, case_timeout: float | None):
    """Run the benchmark's matrix in the worker pool, appending `to_row(result, provider)` to
    `doc["results"]`; `write(doc)` after each provider (a cut run keeps what it measured) and
    at the end, whose return value is returned."""
    seen: list[Result] = []

    def on_result(r: Result) -> None:
        provider = row_names[r.cell.backend]
        if not seen or row_names[seen[-1].cell.backend] != provider:
            if seen:
                write(doc)
            print(f"  {provider} ...", flush=True)
        seen.append(r)
        doc["results"].append(to_row(r, provider))
        doc["copy_gbps"] = copy_gbps(seen)

    done = run_matrix(config, cell_timeout=case_timeout, on_result=on_result, isolate=True)
    doc["results"] = [to_row(r, row_names[r.cell.backend]) for r in done.results]
    doc["copy_gbps"] = copy_gbps(done.results)
    return write(doc)


def copy_gbps(results: list[Result]) -> float:
    """The copy bandwidth of a run: the median of its workers' measurements (0 when none)."""
    values = [r.copy_gbps for r in results if r.copy_gbps]
    return statistics.median(values) if values else 0.0

