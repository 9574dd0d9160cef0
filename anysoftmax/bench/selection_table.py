"""Writing a selection table (`anysoftmax.core.selection`) from benchmark results.

Input: the benchmark's result documents of one device (`softmax_fwd.json`, `softmax_bwd.json`:
`anysoftmax bench [--bwd]`), whose `anysoftmax:<backend>` rows are the
candidates. Rules:

* Only backends that passed conformance in that run may be chosen: a backend with any `wrong`
  row (a comparison with the float64 reference that failed) is excluded from the whole table;
  one whose cell `failed` (crashed, timed out) is no candidate for that shape, so the classes
  around it go to what ran there; `unavailable` rows (refused, not installed) are missing data.
* Per measured shape, the priority order's choice stands unless another candidate costs less
  by more than `margin` (relative): noise never overrides priority. A call's cost is its device
  time or, when longer, its host time per call back to back (`host_us`: small tensors). A shape where fewer
  than two candidates ran compares nothing: its class gets no rule (the priority order decides).
* Shapes become classes per (direction, dtype, dim kind): row-length ranges split halfway (in
  log scale) between measured lengths, merged where neighbours agree; lengths measured at
  several row counts whose winners differ are split by row count the same way. Lengths reach
  to 1 and to unbounded (beyond the grid the nearest measured shape decides); row counts reach
  down half-way (log scale) from the fewest measured to one: tensors smaller than the grid's
  are bound by the launch, not measured, and left to the priority order.
"""

from __future__ import annotations

import math
from collections import defaultdict

from ..core.selection import device_key

OURS_PREFIX = "anysoftmax:"
DISQUALIFYING = ("wrong",)


def _priority(name: str) -> int:
    from ..core.registry import get_backend

    try:
        return get_backend(name).priority
    except ValueError:  # measured elsewhere, not registered here: lowest
        return -(10 ** 6)


def excluded_backends(docs: list[dict]) -> dict[str, str]:
    """backend -> why it may not be chosen (the first non-conforming row)."""
    out = {}
    for doc in docs:
        for r in doc["results"]:
            name = r["provider"]
            if name.startswith(OURS_PREFIX) and r["status"] in DISQUALIFYING and name[len(OURS_PREFIX):] not in out:
                out[name[len(OURS_PREFIX):]] = (f"{r['status']} at {doc['direction']} {r['dtype']} {r['M']}x{r['N']} "
                                               f"dim {r['dim']}: {r.get('detail', '')}"[:300])
    return out


def failed_cells(docs: list[dict]) -> list[str]:
    """'backend: direction dtype MxN dim D: why' for every cell that crashed or timed out."""
    return [f"{r['provider'][len(OURS_PREFIX):]}: {doc['direction']} {r['dtype']} {r['M']}x{r['N']} dim {r['dim']}: "
            f"{r.get('detail', '')}"[:200]
            for doc in docs for r in doc["results"] if r["provider"].startswith(OURS_PREFIX) and r["status"] == "failed"]


def _cells(docs: list[dict], excluded: dict) -> dict:
    """(direction, dtype, dim kind) -> {(N, M): {backend: row}} of conforming candidates."""
    cells: dict = defaultdict(lambda: defaultdict(dict))
    for doc in docs:
        for r in doc["results"]:
            name = r["provider"]
            if not name.startswith(OURS_PREFIX):
                continue  # peers and the automatic choice are no candidates
            kind = "non-last" if r["dim"] not in (-1, 1) else "last"  # the grid's tensors are 2-D
            shape = cells[(doc["direction"], r["dtype"], kind)][(r["N"], r["M"])]  # measured, if by nobody
            backend = name[len(OURS_PREFIX):]
            if r["status"] == "ok" and r.get("us") and backend not in excluded:
                shape[backend] = r
    return cells


def cost_us(row: dict) -> float:
    """What a call costs: the device time, or the host time per call issued back to back when
    that is longer (small tensors: an eager program waits for the host, not the kernel)."""
    return max(row["us"], row.get("host_us") or 0.0)


def winner(rows: dict, margin: float) -> str | None:
    """The backend for one measured shape: the priority order's choice unless another costs
    less (`cost_us`) by more than `margin` of its cost; None with fewer than two candidates
    (nothing was compared: the priority order decides at run time)."""
    if len(rows) < 2:
        return None
    default = max(rows, key=_priority)
    best = min(rows, key=lambda b: cost_us(rows[b]))
    return best if cost_us(rows[best]) < cost_us(rows[default]) * (1 - margin) else default


def _splits(values: list[int]) -> list[tuple[int, int | None]]:
    """Inclusive ranges around sorted distinct `values`, split at geometric midpoints."""
    spans, low = [], 1
    for a, b in zip(values, values[1:] + [None]):
        high = None if b is None else int(math.isqrt(a * b))
        spans.append((low, high))
        low = None if high is None else high + 1
    return spans


def _measured(rows: dict, n: int, m: int) -> dict:
    return {f"{m}x{n}": {b: round(r["frac_of_copy"], 3) for b, r in sorted(rows.items())}}


def _rules_for(direction: str, dtype: str, kind: str, shapes: dict, margin: float) -> list[dict]:
    by_n = defaultdict(dict)  # N -> {M: rows}
    for (n, m), rows in shapes.items():
        by_n[n][m] = rows
    ns = sorted(by_n)
    entries = []  # (n span, rows span, backend, measured)
    for n, n_span in zip(ns, _splits(ns)):
        ms = sorted(by_n[n])
        wins = {m: winner(by_n[n][m], margin) for m in ms}
        if len(set(wins.values())) == 1:
            measured = {}
            for m in ms:
                measured.update(_measured(by_n[n][m], n, m))
            entries.append([n_span, (1, None), wins[ms[0]], measured])
        else:
            for m, m_span in zip(ms, _splits(ms)):
                entries.append([n_span, m_span, wins[m], _measured(by_n[n][m], n, m)])
    merged = []
    for e in entries:
        last = merged[-1] if merged else None
        if last and last[1] == (1, None) == e[1] and last[2] == e[2]:
            last[0] = (last[0][0], e[0][1])
            last[3].update(e[3])
        else:
            merged.append(e)
    # A class without a winner (fewer than two candidates ran there) gets no rule: a gap the
    # neighbouring classes do not reach into. Row counts reach down only half-way (log scale)
    # to one row from the fewest measured: smaller tensors are bound by the launch, which the
    # grid did not measure, and are left to the priority order.
    rules = []
    for n_span, rows_span, backend, measured in merged:
        if backend is None:
            continue
        if rows_span[0] == 1:
            fewest = min(int(shape.split("x")[0]) for shape in measured)
            rows_span = (max(1, math.isqrt(fewest)), rows_span[1])
        rules.append(dict(direction=direction, dtype=dtype, dim=kind, n=list(n_span), rows=list(rows_span),
                          backend=backend, measured=measured))
    return rules


def build_table(docs: list[dict], margin: float = 0.02, sources: list[str] | None = None) -> dict:
    """The selection table (a YAML-ready dict) of the device the result documents `docs`
    were measured on. ValueError when they mix devices or hold no candidate rows."""
    devices = {d["device"] for d in docs}
    if len(devices) != 1:
        raise ValueError(f"results from {len(devices)} devices ({', '.join(sorted(devices))}); one table a device")
    excluded = excluded_backends(docs)
    cells = _cells(docs, excluded)
    rules = []
    for (direction, dtype, kind) in sorted(cells, key=lambda k: (k[0] != "fwd", k[1], k[2])):
        rules += _rules_for(direction, dtype, kind, cells[(direction, dtype, kind)], margin)
    if not rules:
        raise ValueError("no shape where two conforming anysoftmax:<backend> candidates ran: nothing to choose from")
    candidates = sorted({b for shapes in cells.values() for rows in shapes.values() for b in rows})
    device = devices.pop()
    return dict(device=device, key=device_key(device), margin=margin,
                copy_gbps={d["direction"]: round(d.get("copy_gbps", 0.0)) for d in docs},
                versions={k: docs[0].get(k) for k in ("torch", "triton") if docs[0].get(k)},
                sources=sources or [], candidates=candidates, excluded=excluded, failed=failed_cells(docs),
                rules=rules)


HEADER = """# Selection table of {device}: which backend the automatic choice takes per shape class.
# Written by `anysoftmax select` from the benchmark results listed under `sources`; `measured`
# is each candidate's fraction of the run's copy bandwidth on the shapes of the class. Only
# backends that passed conformance in that run are candidates. Read by anysoftmax.core.selection.
"""


def dump(table: dict) -> str:
    """The table as YAML, with a header saying where it comes from."""
    import yaml

    return HEADER.format(device=table["device"]) + yaml.safe_dump(table, sort_keys=False, default_flow_style=None,
                                                                  width=120)
