"""Fold a newer (partial) benchmark run into a results file: the providers the newer run
measured replace their rows for the shapes it measured; everything else is kept.

    python -m anysoftmax.bench.merge benchmarks/results/<gpu>/softmax_fwd.json NEW.json --part "what NEW is"

Each row keeps its `frac_of_copy` from its own run (against that run's copy bandwidth); the
`runs` list records which parts came from which run and that run's copy bandwidth. JSON, CSV
and PNG are rewritten beside the old file. `softmax_variants_*` files (`bench --variants`)
merge alike, a row keyed by its variant too (e.g. one run per S, as benchmarks/variants_gpu_run.sh).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import report


def row_key(r: dict) -> tuple:
    return (r["provider"], r["dtype"], r["M"], r["N"], r.get("dim", -1), r.get("variant", "plain"))


def merge(old: dict, new: dict, part: str, drop: tuple = ()) -> dict:
    """`old` with `new`'s rows in place of the rows they measure again; `drop` names providers
    whose old rows are stale (their code changed) and are not kept at all."""
    if old["device"] != new["device"] or old.get("direction") != new.get("direction"):
        raise ValueError(f"cannot merge {new['device']}/{new.get('direction')} into "
                         f"{old['device']}/{old.get('direction')}")
    replaced = {row_key(r) for r in new["results"]}
    kept = [r for r in old["results"] if row_key(r) not in replaced and r["provider"] not in drop]
    runs = old.get("runs") or [dict(part="earlier run", copy_gbps=old["copy_gbps"])]
    merged = {**old, "copy_gbps": new["copy_gbps"], "torch": new["torch"], "triton": new["triton"],
              "runs": runs + [dict(part=part, copy_gbps=new["copy_gbps"])], "results": kept + new["results"]}
    if "variants" in new:  # `bench --variants` files: the definitions and shapes of both
        merged["variants"] = {**old.get("variants", {}), **new["variants"]}
        merged["shapes"] = [list(s) for s in dict.fromkeys(map(tuple, old.get("shapes", []) + new["shapes"]))]
    return merged


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m anysoftmax.bench.merge", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument("--part", required=True, help="what the newer run measured (recorded in `runs`)")
    p.add_argument("--drop", default="", help="comma list of providers whose old rows are stale")
    args = p.parse_args(argv)
    merged = merge(json.loads(args.old.read_text()), json.loads(args.new.read_text()), args.part,
                   tuple(filter(None, args.drop.split(","))))
    paths = report.write(merged, args.old.parent, args.old.stem)
    if "variants" in merged:
        from .tables import variants_tables
        print(variants_tables(merged))
    else:
        report.print_table(merged)
    print("wrote " + ", ".join(map(str, paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
