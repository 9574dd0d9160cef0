"""How the time of the cute forward on rows of 1M grows with the row count: do clusters of 16
run in waves?

    python benchmarks/experiments/cute_cluster_waves.py --out DIR [--rows 1,2,...] [--dtypes float32,bfloat16]

A row of 1048576 elements takes a cluster of 16 CTAs. With CTAs of 512 threads (one an SM) only
as many clusters run at once as the GPU's GPCs have 16 free SMs for; with 256 threads (two an
SM, `long_row_threads=256`) about twice as many. If the time per call stays flat up to some row
count and then steps, that count is the clusters resident at once, and row counts just past a
multiple of it pay a whole extra wave (8 x 1048576, 64 x 1048576). Each row count is timed
beside the same-bytes copy, outputs checked against the float64 reference first. Appends JSON
lines to DIR/cute_cluster_waves.jsonl.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton

from anysoftmax.backends.cute import plan
from anysoftmax.matrix import providers

TABLES = {"512 threads (shipped)": {}, "256 threads": dict(long_row_threads=256)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, default=1 << 20)
    p.add_argument("--rows", default="1,2,4,6,7,8,9,10,12,14,15,16,17,24,32,64")
    p.add_argument("--dtypes", default="float32,bfloat16")
    a = p.parse_args()
    cute = providers.forward("cute", "softmax", -1, 2, "cuda")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    with open(Path(a.out) / "cute_cluster_waves.jsonl", "a") as log:
        for dt in a.dtypes.split(","):
            for label, table in TABLES.items():
                with plan.overrides(**table):
                    for m in (int(v) for v in a.rows.split(",")):
                        x = torch.randn(m, a.n, device="cuda").mul_(3).to(getattr(torch, dt))
                        got = torch.full_like(x, float("nan"))
                        got.copy_(cute(x))
                        err = (got.double() - torch.softmax(x.double(), -1)).abs().max().item()
                        dst = torch.empty_like(x)
                        cute_ms = triton.testing.do_bench(lambda: cute(x), warmup=25, rep=150)
                        copy_ms = triton.testing.do_bench(lambda: dst.copy_(x), warmup=25, rep=150)
                        row = dict(table=label, dtype=dt, rows=m, n=a.n, cute_us=cute_ms * 1e3,
                                   copy_us=copy_ms * 1e3, of_copy=round(copy_ms / cute_ms, 3), max_abs_error=err,
                                   device=torch.cuda.get_device_name())
                        log.write(json.dumps(row) + "\n")
                        print(f"{dt} {label:22s} {m:3d} rows: cute {row['cute_us']:8.1f} us "
                              f"({row['cute_us'] / m:6.1f} a row), copy {row['copy_us']:7.1f} us, "
                              f"{row['of_copy']:.2f} of copy, err {err:.1g}", flush=True)
                        del x, got, dst


if __name__ == "__main__":
    main()
