"""Benchmark outputs: JSON (the issue's format), CSV, a GB/s-vs-N plot and a terminal table."""

from __future__ import annotations

import csv
import json
import re
from collections import defaultdict
from pathlib import Path


def gpu_dir_name(name: str) -> str:
    """A device name as a results folder: 'NVIDIA H100 80GB HBM3' -> 'NVIDIA_H100_80GB_HBM3'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")

FIELDS = ["provider", "dtype", "M", "N", "dim", "gbps", "frac_of_copy", "us", "host_us", "max_err", "status", "detail"]
# `anysoftmax bench --variants` rows (bench.variants) also name the variant and the whole shape.
VARIANT_FIELDS = ["variant", "S", "shape"] + FIELDS


def write(result: dict, out_dir: Path, stem: str) -> list[Path]:
    """Write <stem>.json, .csv and .png into `out_dir`; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fused = "variants" in result
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.csv", out_dir / f"{stem}.png"]
    paths[0].write_text(json.dumps(result, indent=1))
    with open(paths[1], "w", newline="") as f:
        # rows of older runs have no host_us: left empty
        w = csv.DictWriter(f, VARIANT_FIELDS if fused else FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows({**r, "shape": "x".join(map(str, r["shape"]))} if fused else r for r in result["results"])
    try:
        (plot_variants if fused else plot)(result, paths[2])
    except ImportError:
        print("no plot: matplotlib is not installed (pip install 'anysoftmax[plot]')")
        return paths[:2]
    return paths


def plot(result: dict, path: Path) -> None:
    """GB/s against N per provider (a line per row count M), one panel per dtype, the copy bandwidth as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = sorted({r["dtype"] for r in result["results"]})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6 * len(dtypes), 4.5), squeeze=False)
    for ax, dtype in zip(axes[0], dtypes):
        series = defaultdict(list)
        for r in result["results"]:
            if r["dtype"] == dtype and r["status"] == "ok" and r.get("dim", -1) in (-1, 1):
                series[r["provider"]].append((r["N"], r["gbps"], r["M"]))
        for i, (name, pts) in enumerate(sorted(series.items())):
            # Lines join only shapes of one family (same M); every shape is a marker. One colour
            # and one legend entry per provider.
            by_m = defaultdict(list)
            for n, gbps, m in pts:
                by_m[m].append((n, gbps))
            for j, (m, line) in enumerate(sorted(by_m.items())):
                line.sort()
                ax.plot([p[0] for p in line], [p[1] for p in line], marker="o", ms=3, color=f"C{i % 10}",
                        label=name if j == 0 else "_nolegend_")
        ax.axhline(result["copy_gbps"], color="k", ls="--", lw=0.8, label="copy bandwidth of the run")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N (row length)")
        ax.set_ylabel("GB/s (read + written)")
        ax.set_title(f"{result['device']} {result.get('direction', 'fwd')} {dtype}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_variants(result: dict, path: Path) -> None:
    """Fraction of the run's copy bandwidth against S: one panel per variant, one colour per
    provider, one line style per dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["results"] if r["status"] == "ok"]
    variants = list(result["variants"])
    providers = list(dict.fromkeys(r["provider"] for r in result["results"]))
    dtypes = list(dict.fromkeys(r["dtype"] for r in result["results"]))
    cols = min(3, max(1, len(variants)))
    n_rows = -(-len(variants) // cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(5 * cols, 3.6 * n_rows), squeeze=False)
    for ax, variant in zip(axes.flat, variants):
        for p in providers:
            for k, dtype in enumerate(dtypes):
                pts = sorted((r["S"], r["frac_of_copy"]) for r in rows
                             if r["variant"] == variant and r["provider"] == p and r["dtype"] == dtype)
                if pts:
                    ax.plot([q[0] for q in pts], [q[1] for q in pts], marker="o", ms=3,
                            color=f"C{providers.index(p) % 10}", ls=["-", "--", ":", "-."][k % 4], label=f"{p} {dtype}")
        ax.set_title(f"{variant}: {result['variants'][variant]}", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("S (scores [B, H, S, S])")
        ax.set_ylabel("fraction of copy bandwidth")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(variants):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.suptitle(f"{result['device']} {result.get('direction', 'fwd')}: GB/s of the bytes a fused kernel must move, "
                 f"over the run's copy bandwidth", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(result: dict) -> None:
    """Fraction of copy bandwidth per shape (rows) and provider (columns), as markdown tables."""
    from .tables import bandwidth_tables

    print("\n" + bandwidth_tables(result))
