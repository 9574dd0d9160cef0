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


def _row(r: Result, fused: bool) -> tuple:
    # With variants, one row per (entry, backend, variant): a dozen variants side by side
    # would make the map thousands of pixels wide.
    c = r.cell
    return (c.entry, c.backend) + ((c.variant.name,) if fused else ())


def _status_map(plt, results: list[Result], path: Path) -> Path:
    # rows and columns in the order the config lists them (dicts keep first appearance)
    fused = any(r.cell.variant.name != PLAIN_NAME for r in results)
    rows = list(dict.fromkeys(_row(r, fused) for r in results))
    cols = list(dict.fromkeys((r.cell.op, r.cell.direction, r.cell.dtype) for r in results))
    counts: dict[tuple, dict[str, int]] = defaultdict(lambda: {PASSED: 0, FAILED: 0, SKIPPED: 0})
    for r in results:
        counts[_row(r, fused), (r.cell.op, r.cell.direction, r.cell.dtype)][r.status] += 1
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cols) + 3), max(2.5, 0.5 * len(rows) + 1.5)))
    for i, row in enumerate(rows):
        for j, col in enumerate(cols):
            c = counts.get((row, col))
            if c is None:
                continue
            ran = c[PASSED] + c[FAILED]
            # green: all ran cells passed; red: any failed; grey: nothing ran (all skipped)
            color = "#bbbbbb" if ran == 0 else ("#d62728" if c[FAILED] else "#2ca02c")
            ax.add_patch(plt.Rectangle((j, i), 0.95, 0.9, color=color))
            ax.text(j + 0.47, i + 0.45, f"{c[PASSED]}/{c[FAILED]}/{c[SKIPPED]}", ha="center", va="center",
                    fontsize=8, color="white" if ran else "black")
    ax.set_xlim(0, len(cols))
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([j + 0.47 for j in range(len(cols))], [f"{o}\n{d}\n{t}" for o, d, t in cols], fontsize=7)
    ax.set_yticks([i + 0.45 for i in range(len(rows))], [" · ".join(row) for row in rows], fontsize=8)
    ax.set_title("cells passed / failed / skipped (green: all ran passed, red: a failure, grey: all skipped)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
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
    return [_status_map(plt, run.results, out / "status.png")] + _bandwidth(plt, run.results, out), ""
