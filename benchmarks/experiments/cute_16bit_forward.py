"""The cute 16-bit forward on long rows against the same-bytes copy and QuACK, in one process.

    python benchmarks/experiments/cute_16bit_forward.py --label L --out DIR [--dtypes bfloat16,float16,float32]

Session 9 ran it once per kernel variant, each built with a temporary switch in kernels.py
(since removed; `--label` names the variant in the results): V0 the session-8 kernels; V1 the
packed 16-bit max; V2 V1 keeping exp(x - m) as float32 (88 registers: two CTAs an SM); V3 V2
compiled for three CTAs an SM (minctasm 3, 80 registers); W1 / W3 those with the cluster
exchange by st.async and an mbarrier instead of the release-fenced cluster barrier. W1 is what
the backend ships. Every process also times the copy and QuACK, so each row carries its own
reference. Outputs are checked against the float64 reference before timing. Appends one JSON
line per (shape, dtype) to DIR/cute_16bit_forward.jsonl
(benchmarks/results/NVIDIA_H100_80GB_HBM3/cute_16bit_forward.jsonl).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton

from anysoftmax.matrix import providers


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--label", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default="2048x65536,1024x131072,512x262144")
    p.add_argument("--dtypes", default="bfloat16,float16")
    a = p.parse_args()
    cute = providers.forward("cute", "softmax", -1, 2, "cuda")
    try:
        quack = providers.forward("peer:quack", "softmax", -1, 2, "cuda")
    except Exception as exc:  # noqa: BLE001 - a peer that does not import is left out
        print(f"quack left out: {exc}")
        quack = None
    Path(a.out).mkdir(parents=True, exist_ok=True)
    with open(Path(a.out) / "cute_16bit_forward.jsonl", "a") as log:
        for s in a.shapes.split(","):
            m, n = (int(v) for v in s.split("x"))
            for dt in a.dtypes.split(","):
                x = torch.randn(m, n, device="cuda").mul_(3).to(getattr(torch, dt))
                want = torch.softmax(x.double(), -1)
                got = torch.full_like(x, float("nan"))
                got.copy_(cute(x))
                err = (got.double() - want).abs().max().item()
                dst = torch.empty_like(x)
                row = dict(label=a.label, shape=[m, n], dtype=dt, max_abs_error=err,
                           device=torch.cuda.get_device_name())
                nbytes = 2 * x.numel() * x.element_size()
                calls = {"copy": lambda: dst.copy_(x), "cute": lambda: cute(x)}
                if quack is not None:
                    calls["quack"] = lambda: quack(x)
                for name, fn in calls.items():
                    ms = triton.testing.do_bench(fn, warmup=25, rep=200)
                    row[f"{name}_gbps"] = nbytes / ms / 1e6
                for name in ("cute", "quack"):
                    if f"{name}_gbps" in row:
                        row[f"{name}_of_copy"] = round(row[f"{name}_gbps"] / row["copy_gbps"], 3)
                log.write(json.dumps(row) + "\n")
                print(a.label, dt, f"{m}x{n}", f"err {err:.2g}", "cute", row.get("cute_of_copy"), "quack",
                      row.get("quack_of_copy"), f"copy {row['copy_gbps']:.0f} GB/s", flush=True)


if __name__ == "__main__":
    main()
