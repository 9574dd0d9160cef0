"""PNG plots of a matrix run: a pass/fail map, and GB/s against N where benchmarks ran.

With fused variants (`matrix.variants`) the pass/fail map gets a row per variant and the
bandwidth plots a legend entry (a marker) per variant."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path

from .cells import FAILED, PASSED, SKIPPED, Result
from .variants import PLAIN_NAME

MARKERS = ["o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h"]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


SHORT_DTYPES = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}
COLORS = {"passed": "#2ca02c", "failed": "#d62728", "skipped": "#bbbbbb"}
REASONS_SHOWN = 6  # skip reasons written under the map (report.md lists them all)


def _row(r: Result, fused: bool, missing: dict) -> tuple:
    # With variants, one row per (entry, backend, variant): a dozen variants side by side
    # would make the map thousands of pixels wide. An entry whose device is missing is one
    # row: every cell of it skipped for the one reason.
    from .labels import entry_label

    c = r.cell
    if c.entry in missing:
        return (c.entry, "every backend")
    return (entry_label(c), c.backend) + ((c.variant.name,) if fused else ())


def _status_map(plt, results: list[Result], path: Path, devices: dict | None = None) -> Path:
    """One square per (row, op / direction / dtype): passed/failed/skipped counts, green when
    every cell that ran passed, red on a failure, grey when nothing ran; the skip reasons of
    the grey squares are written under the map. Sized to be read on a laptop screen."""
    from matplotlib.patches import Patch

    from .labels import grouped_reasons

    missing = {name: d["reason"] for name, d in (devices or {}).items() if d.get("reason")}
    fused = any(r.cell.variant.name != PLAIN_NAME for r in results)
    rows = list(dict.fromkeys(_row(r, fused, missing) for r in results))
    cols = list(dict.fromkeys((r.cell.op, r.cell.direction, r.cell.dtype) for r in results))
    counts: dict[tuple, dict[str, int]] = defaultdict(lambda: {PASSED: 0, FAILED: 0, SKIPPED: 0})
    for r in results:
        col = ("", "", "") if r.cell.entry in missing else (r.cell.op, r.cell.direction, r.cell.dtype)
        counts[_row(r, fused, missing), col][r.status] += 1
    reasons = grouped_reasons(results, missing)
    shown = reasons[:REASONS_SHOWN]
    width = min(18.0, max(8.0, 0.85 * len(cols) + 4.5))
    height = max(3.0, 0.42 * len(rows) + 2.2 + 0.2 * (len(shown) + 1))
    fig, ax = plt.subplots(figsize=(width, height))
    for i, row in enumerate(rows):
        if row[0] in missing:  # one bar across: the device is not here
            c = counts[(row, ("", "", ""))]
            ax.add_patch(plt.Rectangle((0, i), len(cols) - 0.05, 0.9, color=COLORS["skipped"]))
            ax.text(len(cols) / 2, i + 0.45, f"{c[SKIPPED]} cells skipped: {missing[row[0]]}", ha="center",
                    va="center", fontsize=10)
            continue
        for j, col in enumerate(cols):
            c = counts.get((row, col))
            if c is None:
                continue
            ran = c[PASSED] + c[FAILED]
            color = COLORS["skipped"] if ran == 0 else (COLORS["failed"] if c[FAILED] else COLORS["passed"])
            ax.add_patch(plt.Rectangle((j, i), 0.95, 0.9, color=color))
            ax.text(j + 0.47, i + 0.45, f"{c[PASSED]}/{c[FAILED]}/{c[SKIPPED]}", ha="center", va="center",
                    fontsize=9, color="white" if ran else "black")
    ax.set_xlim(0, len(cols))
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([j + 0.47 for j in range(len(cols))],
                  [f"{o.replace('_softmax', ' sm').replace('softmax', 'sm')}\n{d[:3].replace('bac', 'bwd').replace('for', 'fwd')}"
                   f"\n{SHORT_DTYPES.get(t, t)}" for o, d, t in cols], fontsize=10)
    ax.set_yticks([i + 0.45 for i in range(len(rows))], [" · ".join(row) for row in rows], fontsize=10)
    ax.set_title("cells passed / failed / skipped (sm: softmax, log sm: log_softmax)", fontsize=12, pad=30)
    ax.legend(handles=[Patch(color=COLORS["passed"], label="every cell that ran passed"),
                       Patch(color=COLORS["failed"], label="a cell failed"),
                       Patch(color=COLORS["skipped"], label="nothing ran: skipped, reasons below")],
              loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, fontsize=10, frameon=False)
    lines = [f"[{i}] {n} cells, {who}: {why}" for i, (n, who, why) in enumerate(shown, 1)]
    if len(reasons) > len(shown):
        lines.append(f"… and {len(reasons) - len(shown)} more reasons in report.md")
    limit = int(width * 11)  # characters of 9-point monospace a line holds across the figure
    text = "\n".join(line if len(line) <= limit else line[: limit - 1] + "…" for line in lines)
    text_inches = 0.2 * len(lines) + 0.15
    fig.tight_layout(rect=(0, text_inches / height, 1, 1))
    if text:
        fig.text(0.01, 0.02 / height, text, ha="left", va="bottom", fontsize=9, family="monospace")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _bandwidth(plt, results: list[Result], out: Path) -> list[Path]:
    groups: dict[tuple, list[Result]] = defaultdict(list)
    for r in results:
        if r.gbps is not None:
            groups[(r.cell.entry, r.cell.op, r.cell.direction, r.cell.dtype)].append(r)
    paths = []
    for (entry, op, direction, dtype), rs in sorted(groups.items()):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        lines: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
        for r in rs:
            n = r.cell.shape[r.cell.dim] if r.cell.shape else 1
            rows = math.prod(r.cell.shape) // n if n else 0
            lines[(r.cell.backend, r.cell.variant.name, rows)].append((n, r.gbps))
        # one colour per backend, one marker per variant, one line style per row count M
        backends = list(dict.fromkeys(k[0] for k in lines))
        variants = list(dict.fromkeys(k[1] for k in lines))
        row_counts = sorted({k[2] for k in lines})
        styles = ["-", "--", ":", "-."]
        for (backend, variant, rows), pts in sorted(lines.items()):
            pts.sort()
            label = backend + (f" · {variant}" if len(variants) > 1 else "") + (
                f" (M={rows})" if len(row_counts) > 1 else "")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=MARKERS[variants.index(variant) % len(MARKERS)],
                    markersize=3, label=label, color=f"C{backends.index(backend)}",
                    linestyle=styles[row_counts.index(rows) % len(styles)])
        copies = {r.copy_gbps for r in rs if r.copy_gbps}
        if copies:
            ax.axhline(max(copies), color="grey", linestyle="--", linewidth=1, label="copy")
        ns = [p[0] for pts in lines.values() for p in pts]
        if ns and max(ns) / max(min(ns), 1) > 64:
            ax.set_xscale("log", base=2)
        timer = "CPU wall clock" if rs[0].timer == "cpu" else "GPU events"
        ax.set_title(f"{entry} ({rs[0].device_name}): {op} {direction} {dtype}\n"
                     f"GB/s = (bytes read + written) / median time ({timer})", fontsize=9)
        ax.set_xlabel("N (length of the reduced dim)")
        ax.set_ylabel("GB/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"bandwidth_{_slug(entry)}_{op}_{direction}_{dtype}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def write_plots(run, out: Path) -> tuple[list[Path], str]:
    """Write status.png and one bandwidth_*.png per benchmarked (entry, op, direction, dtype).

    Returns (paths, note); without matplotlib no plot is written and the note says so.
    """
    if not run.results:
        return [], ""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "No plots: matplotlib is not installed (pip install 'anysoftmax[plot]')."
    return [_status_map(plt, run.results, out / "status.png", run.devices)] + _bandwidth(plt, run.results, out), ""
