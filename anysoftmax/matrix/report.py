"""Reports of a matrix run: terminal tables, report.json / report.csv / report.md, merging."""

from __future__ import annotations

import csv
import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path

from .cells import FAILED, PASSED, SKIPPED, Result
from .runner import MatrixRun
from .labels import entry_label, reason_key
from .variants import PLAIN_NAME

DETAIL_LIMIT = 60  # up to this many cells the terminal shows every cell, beyond it a summary
GROUP_LIMIT = 30  # reasons printed in the terminal per status (report.md has them all)
CSV_SKIP = ("traceback", "variant_spec")  # the CSV names a variant (variant, variant_desc); the JSON defines it
STYLE = {PASSED: "green", FAILED: "bold red", SKIPPED: "yellow"}


def _num(v, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def _gbps(r: Result) -> str:
    if r.gbps is None:
        return "—"
    text = f"{r.gbps:.0f}" if r.gbps >= 100 else f"{r.gbps:.3g}"
    return f"{text} (cpu)" if r.timer == "cpu" else text


def _shape(r: Result) -> str:
    return "×".join(map(str, r.cell.shape)) or "()"


def _first_line(text: str, width: int = 100) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def _dir(direction: str) -> str:
    return {"forward": "fwd", "backward": "bwd"}.get(direction, direction)


def grouped(run: MatrixRun, status: str) -> dict[tuple[str, str], list[Result]]:
    """(entry, reason_key) -> the cells of `status` with that reason, in order of appearance."""
    groups: dict[tuple[str, str], list[Result]] = defaultdict(list)
    for r in run.results:
        if r.status == status:
            groups[(r.cell.entry, reason_key(r))].append(r)
    return groups


def _cells_of(rs: list[Result]) -> str:
    """What a group's cells have in common, briefly: backends and dtypes."""
    backends = ", ".join(sorted({r.cell.backend for r in rs}))
    dtypes = ", ".join(sorted({r.cell.dtype for r in rs}))
    return f"{backends}; {dtypes}"


def has_variants(results: list[Result]) -> bool:
    """True when any cell runs a fused variant: tables then get a `variant` column (a run of
    plain cells only keeps its tables as they were)."""
    return any(r.cell.variant.name != PLAIN_NAME for r in results)


def summarize(run: MatrixRun) -> list[dict]:
    """One row per (entry, backend, op, direction, dtype, variant): counts, worst error,
    bandwidth. An entry whose device is missing gets a single row (backend etc. "*")."""
    groups: dict[tuple, list[Result]] = defaultdict(list)
    for r in run.results:
        c = r.cell
        missing = run.devices.get(c.entry, {}).get("reason")
        groups[(c.entry, "*", "*", "*", "*", "*") if missing
               else (entry_label(c), c.backend, c.op, c.direction, c.dtype, c.variant.name)].append(r)
    rows = []
    for key, rs in groups.items():
        counts = Counter(r.status for r in rs)
        errs = [r.err_ratio for r in rs if r.err_ratio is not None]
        bw = [r for r in rs if r.gbps is not None]
        rows.append(dict(
            entry=key[0], backend=key[1], op=key[2], direction=key[3], dtype=key[4], variant=key[5], cells=len(rs),
            passed=counts[PASSED], failed=counts[FAILED], skipped=counts[SKIPPED],
            worst_err_ratio=max(errs) if errs else None,
            median_gbps=statistics.median(r.gbps for r in bw) if bw else None,
            median_frac_copy=statistics.median(r.frac_copy for r in bw) if bw else None,
            best_frac_copy=max(r.frac_copy for r in bw) if bw else None,
            timer=bw[0].timer if bw else "",
        ))
    return rows


def _counts_line(run: MatrixRun) -> str:
    c = run.counts()
    return f"{c[PASSED]} passed, {c[FAILED]} failed, {c[SKIPPED]} skipped"


# ---------------------------------------------------------------- terminal

def _name_column(t, header: str, values, justify: str = "left") -> None:
    # Names and short labels are never truncated or wrapped: the column is as wide as its
    # longest value; the free-text columns take what is left.
    t.add_column(header, justify=justify, no_wrap=True, min_width=max([len(header), *map(len, values)]))


def _caption(timed: bool, cpu_timed: bool, detail: bool = False) -> str:
    """The table's footer: it explains only the columns and markers the table shows."""
    parts = ["err/tol: worst error ÷ tolerance (≤ 1 passes)"]
    if timed:
        gbps = "GB/s" if detail else "GB/s: median"
        if cpu_timed:
            gbps += " ((cpu): CPU wall clock)" if detail else " (c: CPU wall clock)"
        parts += [gbps, "×copy: fraction of the same-run copy bandwidth"]
    return "; ".join(parts)


def print_report(run: MatrixRun, console, details: bool | None = None) -> None:
    """The terminal view: every cell (small runs or `details`) or one row per group, then the
    failures and the skip reasons, each reason once and whole, and the closing counts line."""
    from rich import box
    from rich.table import Table

    from ..output import print_table

    if details is None:
        details = len(run.results) <= DETAIL_LIMIT
    fused = has_variants(run.results)
    fails, skips = grouped(run, FAILED), grouped(run, SKIPPED)
    number = {key: i for i, key in enumerate([*fails, *skips], 1)}  # reasons printed below the table
    rs = run.results
    if details:
        t = Table(title=f"matrix {run.name}: cells", title_justify="left")
        for col, values in (("entry", [entry_label(r.cell) for r in rs]), ("backend", [r.cell.backend for r in rs]),
                            ("op", [r.cell.op for r in rs]), ("dir", ["fwd"]), ("dtype", [r.cell.dtype for r in rs]),
                            *([("variant", [r.cell.variant.name for r in rs])] if fused else []),
                            ("shape", [_shape(r) for r in rs])):
            _name_column(t, col, values)
        _name_column(t, "dim", [str(r.cell.dim) for r in rs], "right")
        _name_column(t, "status", [r.status for r in rs])
        # Bandwidth columns only when something was timed: a conformance run stays narrow.
        timed = any(r.gbps is not None or r.host_us is not None for r in rs)
        for col in ("err/tol", *(("GB/s", "×copy", "host µs") if timed else ())):
            _name_column(t, col, [], "right")
        t.add_column("reason / note", overflow="fold", min_width=24)
        for r in rs:
            c = r.cell
            key = (c.entry, reason_key(r))
            why = f"reason [{number[key]}] below" if r.status != PASSED and key in number else (r.reason or r.note)
            timing = (_gbps(r), _num(r.frac_copy, ".2f"), _num(r.host_us, ".3g")) if timed else ()
            t.add_row(entry_label(c), c.backend, c.op, _dir(c.direction), c.dtype,
                      *([c.variant.name] if fused else []), _shape(r), str(c.dim),
                      f"[{STYLE[r.status]}]{r.status}[/]", _num(r.err_ratio, ".2f"), *timing, why)
        cpu_timed = any(r.gbps is not None and r.timer == "cpu" for r in rs)
        t.caption = _caption(timed and any(r.gbps is not None for r in rs), cpu_timed, detail=True)
    else:
        # No vertical rules between columns: a conformance run fits 100 columns.
        t = Table(title=f"matrix {run.name}: one row per group (--details: every cell)", title_justify="left",
                  box=box.SIMPLE_HEAD, collapse_padding=True)
        rows = summarize(run)
        for col, key in (("entry", "entry"), ("backend", "backend"), ("op", "op"), ("dir", None), ("dtype", "dtype"),
                         *([("variant", "variant")] if fused else [])):
            _name_column(t, col, [s[key] for s in rows] if key else ["fwd"])
        # Bandwidth columns only when something was timed: a conformance run fits 100 columns.
        timed = any(r["median_gbps"] is not None for r in rows)
        for col in ("n", "ok", "fail", "skip", "err/tol", *(("GB/s", "×copy", "best") if timed else ())):
            _name_column(t, col, [], "right")
        for s in rows:
            bw = _num(s["median_gbps"], ".0f") + ("c" if s["timer"] == "cpu" else "")
            timing = (bw, _num(s["median_frac_copy"], ".2f"), _num(s["best_frac_copy"], ".2f")) if timed else ()
            t.add_row(s["entry"], s["backend"], s["op"], _dir(s["direction"]), s["dtype"],
                      *([s["variant"]] if fused else []), str(s["cells"]),
                      f"[green]{s['passed']}[/]", f"[bold red]{s['failed']}[/]" if s["failed"] else "0",
                      f"[yellow]{s['skipped']}[/]" if s["skipped"] else "0", _num(s["worst_err_ratio"], ".2f"),
                      *timing)
        t.caption = _caption(timed, any(s["timer"] == "cpu" and s["median_gbps"] is not None for s in rows))
    print_table(console, t)
    for title, style, groups in (("Failed", "bold red", fails), ("Skipped", "yellow", skips)):
        if not groups:
            continue
        n_cells = sum(map(len, groups.values()))
        console.print(f"[{style}]{title} cells ({n_cells}), by reason:[/]")
        for i, ((entry, reason), cells) in enumerate(groups.items()):
            if i == GROUP_LIMIT:
                console.print(f"  … and {len(groups) - GROUP_LIMIT} more reasons (report.md lists every cell)")
                break
            console.print(f"  [{number[(entry, reason)]}] {len(cells)} × {entry} ({_cells_of(cells)}): {reason}",
                          markup=False, highlight=False, soft_wrap=True)
    if run.copy_gbps:
        console.print("copy bandwidth: " + ", ".join(f"{d} {v:.0f} GB/s" for d, v in run.copy_gbps.items()))
    console.print(f"{_counts_line(run)} in {run.seconds:.1f} s", markup=False, highlight=False)


def summary_json(run: MatrixRun) -> dict:
    """The summary `matrix --json` prints: counts, groups, grouped failures and skips."""
    problems: dict[tuple, list[str]] = defaultdict(list)
    for r in run.results:
        if r.status in (FAILED, SKIPPED):
            problems[(r.status, r.cell.entry, r.cell.backend, reason_key(r))].append(r.cell.id)
    return dict(name=run.name, seconds=round(run.seconds, 2), counts=run.counts(), copy_gbps=run.copy_gbps,
                groups=summarize(run),
                problems=[dict(status=st, entry=e, backend=b, reason=reason, cells=ids)
                          for (st, e, b, reason), ids in problems.items()])


# ---------------------------------------------------------------- files

def to_json(run: MatrixRun) -> dict:
    return dict(name=run.name, path=run.path, description=run.description, started=run.started,
                seconds=run.seconds, counts=run.counts(), environment=run.environment, devices=run.devices,
                copy_gbps=run.copy_gbps, interrupted=run.interrupted, summary=summarize(run),
                cells=[r.as_row() for r in run.results])


def load_report(path: str | Path) -> MatrixRun:
    """Read a report.json back (to merge reports of several CI jobs)."""
    data = json.loads(Path(path).read_text())
    return MatrixRun(data["name"], data["path"], data.get("description", ""), data["environment"], data["devices"],
                     [Result.from_row(row) for row in data["cells"]], data.get("started", ""),
                     data.get("seconds", 0.0), data.get("copy_gbps", {}), data.get("interrupted", ""))


def merge(runs: list[MatrixRun], name: str | None = None) -> MatrixRun:
    """One run from several (e.g. one CI job per device entry). Entries must not repeat."""
    devices, results, copy, envs = {}, [], {}, {}
    for run in runs:
        for entry, info in run.devices.items():
            if entry in devices:
                raise ValueError(f"device entry {entry!r} appears in more than one report")
            devices[entry] = info
            envs[entry] = run.environment
        results.extend(run.results)
        copy.update({f"{run.environment.get('host', '?')}/{d}": v for d, v in run.copy_gbps.items()})
    return MatrixRun(name or runs[0].name, runs[0].path, runs[0].description, {"per_entry": envs}, devices, results,
                     min(r.started for r in runs), max(r.seconds for r in runs), copy)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(run: MatrixRun, plots: list[str]) -> str:
    """The Markdown report: counts, devices, summary, failures, skips, plots, every cell."""
    env = run.environment
    if "per_entry" in env:
        first = next(iter(env["per_entry"].values()), {})
        versions = "merged from several runs; " + ", ".join(f"{k} {first.get(k, '?')}" for k in ("anysoftmax", "torch"))
    else:
        versions = ", ".join(f"{k} {env[k]}" for k in ("anysoftmax", "torch", "triton", "commit") if env.get(k))
        if env.get("TRITON_INTERPRET") == "1":
            versions += ", TRITON_INTERPRET=1"
    out = [f"# anysoftmax matrix: {run.name}", ""]
    if run.description:
        out += [run.description.strip(), ""]
    if run.interrupted:
        out += [f"**Partial report: {run.interrupted}.**", ""]
    out += [f"**{_counts_line(run)}** of {len(run.results)} cells — `{run.path}`, started {run.started}, "
            f"{run.seconds:.1f} s; {versions}.", "",
            "A cell passes when its output (forward) or input gradient (backward) matches the float64 "
            "torch reference within the dtype's tolerance (`err/tol` ≤ 1). GB/s = (bytes read + written) / "
            "median time; ×copy = that over the device-to-device copy bandwidth measured in the same run; "
            "host µs = wall time per call with calls issued back to back and one synchronize (above the "
            "median time: host-bound). "
            "Values marked (cpu) are CPU wall-clock timings, not GPU kernel timings.", "", "## Devices", ""]
    rows = []
    for entry, info in run.devices.items():
        props = ", ".join(f"{k}={v}" for k, v in info.get("properties", {}).items())
        rows.append([entry, f"`{info['device']}`", ", ".join(info["ran_on"]) or "—",
                     info["reason"] or "present", props or "—"])
    out += [_md_table(["entry", "device", "ran on", "status", "properties"], rows), ""]
    if run.copy_gbps:
        out += ["Copy bandwidth: " + ", ".join(f"{d} {v:.0f} GB/s" for d, v in run.copy_gbps.items()), ""]
    fused = has_variants(run.results)
    var = (lambda v: [v]) if fused else (lambda v: [])  # noqa: E731  (the variant column, when any)
    if fused:
        defined = {r.cell.variant.name: r.cell.variant.describe() for r in run.results}
        out += ["## Variants", "", "GB/s of a fused variant counts the bytes a fused kernel must move "
                "(`anysoftmax.matrix.traffic`).", ""]
        out += [_md_table(["variant", "what it computes"], [[f"`{n}`", d] for n, d in defined.items()]), ""]
    out += ["## Summary", ""]
    rows = [[s["entry"], s["backend"], s["op"], s["direction"], s["dtype"], *var(s["variant"]), s["cells"],
             s["passed"], s["failed"], s["skipped"], _num(s["worst_err_ratio"], ".3g"),
             _num(s["median_gbps"], ".0f") + (" (cpu)" if s["timer"] == "cpu" else ""),
             _num(s["median_frac_copy"], ".2f"), _num(s["best_frac_copy"], ".2f")] for s in summarize(run)]
    out += [_md_table(["entry", "backend", "op", "direction", "dtype", *var("variant"), "cells", "passed", "failed",
                       "skipped", "worst err/tol", "median GB/s", "median ×copy", "best ×copy"], rows), ""]
    fails = [r for r in run.results if r.status == FAILED]
    if fails:
        out += [f"## Failed cells ({len(fails)})", ""]
        out += [f"- `{r.cell.id}`: {_first_line(r.reason, 300)}" for r in fails] + [""]
    skips = grouped(run, SKIPPED)
    if skips:
        out += ["## Skipped", ""]
        out += [f"- {len(cells)} × {entry} ({_cells_of(cells)}): {reason}" for (entry, reason), cells in
                sorted(skips.items(), key=lambda kv: -len(kv[1]))] + [""]
    if plots:
        out += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots] + [""]
    out += ["## All cells", ""]
    rows = [[r.cell.entry, r.cell.backend, r.cell.op, r.cell.direction, r.cell.dtype, *var(r.cell.variant.name),
             _shape(r), r.cell.dim, r.status, _num(r.err_ratio, ".3g"), _gbps(r), _num(r.frac_copy, ".2f"),
             _num(r.host_us, ".3g"), r.ran_on, _first_line(r.reason or r.note, 120)] for r in run.results]
    out += [_md_table(["entry", "backend", "op", "direction", "dtype", *var("variant"), "shape", "dim", "status",
                       "err/tol", "GB/s", "×copy", "host µs", "ran on", "reason / note"], rows), ""]
    return "\n".join(out)


def write_reports(run: MatrixRun, out_dir: str | Path) -> list[Path]:
    """Write report.json, report.csv, report.md and the PNG plots into `out_dir`."""
    from .plots import write_plots

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):  # plots of an earlier run would mislead
        old.unlink()
    paths = [out / "report.json", out / "report.csv", out / "report.md"]
    paths[0].write_text(json.dumps(to_json(run), indent=1, default=str))
    rows = [r.as_row() for r in run.results]
    with open(paths[1], "w", newline="") as f:
        names = [k for k in rows[0] if k not in CSV_SKIP] if rows else ["id"]
        w = csv.DictWriter(f, fieldnames=names, extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({**row, "shape": "x".join(map(str, row["shape"]))})
    plots, note = write_plots(run, out)
    text = markdown(run, [str(p) for p in plots])
    if note:
        text += f"\n_{note}_\n"
    paths[2].write_text(text)
    return paths + plots
