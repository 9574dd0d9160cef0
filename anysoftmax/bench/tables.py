"""Markdown tables from benchmark JSON files (the speed tables of docs/speed.md are printed by this).

    python -m anysoftmax.bench.tables benchmarks/results/<gpu>/softmax_fwd.json [--providers a,b,...]
    python -m anysoftmax.bench.tables benchmarks/results/<gpu>/latency.json
    python -m anysoftmax.bench.tables benchmarks/results/<gpu>/softmax_variants_fwd.json

Bandwidth files give one table per dtype: fraction of the copy bandwidth measured in the same
run, one row per shape, one column per provider (`failed` / `wrong` / `unavailable` as recorded).
Latency files give host us per call back to back and GPU us per provider. Variant files
(`anysoftmax bench --variants`) give one table per dtype: variant x S, fractions of the copy
bandwidth per provider, then anysoftmax over the same-bytes copy and over torch.compile.
"""

from __future__ import annotations

import argparse
import json
import sys


def _shape_label(r: dict) -> str:
    label = f"{r['M']}×{r['N']}"
    return label if r.get("dim", -1) in (-1, 1) else f"dim {r['dim']} of {label}"


def _cell(r: dict | None, key: str, fmt: str) -> str:
    if r is None:
        return "–"
    return format(r[key], fmt) if r["status"] == "ok" else r["status"]


def bandwidth_tables(result: dict, providers: list[str] | None = None) -> str:
    """One markdown table per dtype of `result` (a bench JSON document)."""
    rows = result["results"]
    providers = providers or list(dict.fromkeys(r["provider"] for r in rows))
    by_key = {(r["dtype"], r["M"], r["N"], r.get("dim", -1), r["provider"]): r for r in rows}
    out = [f"{result['device']}, {result.get('direction', 'fwd')}, fraction of copy bandwidth "
           f"({result['copy_gbps']:.0f} GB/s)\n"]
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        shapes = list(dict.fromkeys((r["M"], r["N"], r.get("dim", -1)) for r in rows if r["dtype"] == dtype))
        out.append(f"| {dtype} | " + " | ".join(providers) + " |")
        out.append("|---" * (len(providers) + 1) + "|")
        for m, n, dim in shapes:
            label = _shape_label(dict(M=m, N=n, dim=dim))
            cells = [_cell(by_key.get((dtype, m, n, dim, p)), "frac_of_copy", ".2f") for p in providers]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def _ours(providers: list[str]) -> str | None:
    return "anysoftmax" if "anysoftmax" in providers else next((p for p in providers if p.startswith("anysoftmax")),
                                                               None)


def _ratio(a: dict | None, b: dict | None) -> str:
    ok = a is not None and b is not None and a["status"] == b["status"] == "ok" and b["gbps"] > 0
    return f"{a['gbps'] / b['gbps']:.2f}" if ok else "–"


def variants_tables(result: dict, providers: list[str] | None = None) -> str:
    """One markdown table per dtype of a `softmax_variants_*` document: a row per (variant, S),
    each provider's fraction of the run's copy bandwidth, anysoftmax's GB/s over the
    same-bytes copy's and over torch.compile's (same bytes, so ratios of time), and
    anysoftmax's host us per call back to back."""
    rows = result["results"]
    providers = providers or list(dict.fromkeys(r["provider"] for r in rows))
    ours = _ours(providers)
    by_key = {(r["dtype"], r["variant"], r["S"], r["provider"]): r for r in rows}
    scores = ", ".join("×".join(map(str, s)) for s in result.get("shapes", []))
    out = [f"{result['device']}, {result.get('direction', 'fwd')}, scores {scores}: fraction of copy bandwidth "
           f"({result['copy_gbps']:.0f} GB/s); GB/s counts the bytes a fused kernel must move; ÷: ratios of GB/s "
           f"(above 1: anysoftmax is faster)\n"]
    tail = [f"{ours} ÷ copy", f"{ours} ÷ torch.compile", f"{ours} host µs"] if ours else []
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        order = list(result.get("variants", {}))
        keys = sorted(dict.fromkeys((r["variant"], r["S"]) for r in rows if r["dtype"] == dtype),
                      key=lambda k: (order.index(k[0]) if k[0] in order else len(order), k[1]))
        out.append(f"| {dtype} variant | S | " + " | ".join(providers + tail) + " |")
        out.append("|---" * (len(providers) + len(tail) + 2) + "|")
        for variant, seq in keys:
            get = lambda p: by_key.get((dtype, variant, seq, p))  # noqa: E731
            cells = [_cell(get(p), "frac_of_copy", ".2f") for p in providers]
            if ours:
                mine = get(ours)
                cells += [_ratio(mine, get("copy")), _ratio(mine, get("torch.compile")),
                          _cell(mine, "host_us", ".1f")]
            out.append(f"| {variant} | {seq} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def latency_table(result: dict, providers: list[str] | None = None) -> str:
    """Host us per call back to back (then, where recorded, the same rounds' difference to torch;
    GPU us in brackets), one row per shape and direction."""
    rows = result["results"]
    providers = providers or list(dict.fromkeys(r["provider"] for r in rows))
    by_key = {(tuple(r["shape"]), r["direction"], r["dtype"], r["provider"]): r for r in rows}
    keys = list(dict.fromkeys((tuple(r["shape"]), r["direction"], r["dtype"]) for r in rows))
    out = [f"{result['device']}: host us per call back to back (+/- torch, paired by round) (GPU us)\n",
           "| shape | dir | dtype | " + " | ".join(providers) + " |", "|---" * (len(providers) + 3) + "|"]
    for shape, direction, dtype in keys:
        cells = []
        for p in providers:
            r = by_key.get((shape, direction, dtype, p))
            over = "" if r is None or r.get("over_torch_us") is None else f" {r['over_torch_us']:+.1f}"
            cells.append("–" if r is None or r["status"] != "ok" else f"{r['host_us']:.1f}{over} ({r['gpu_us']:.1f})")
        out.append(f"| {'×'.join(map(str, shape))} | {direction} | {dtype} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m anysoftmax.bench.tables", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", help="a softmax_<fwd|bwd>.json or latency.json file")
    p.add_argument("--providers", default="", help="comma list and order of columns (default: all, as recorded)")
    args = p.parse_args(argv)
    with open(args.json) as f:
        result = json.load(f)
    providers = [s for s in args.providers.split(",") if s] or None
    is_latency = result["results"] and "host_us" in result["results"][0] and "M" not in result["results"][0]
    if "variants" in result:
        print(variants_tables(result, providers), end="")
    else:
        print(latency_table(result, providers) if is_latency else bandwidth_tables(result, providers), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
