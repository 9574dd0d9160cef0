"""Profile the `cute` row kernels beside QuACK's under Nsight Compute, one launch each.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... \
        python3 benchmarks/experiments/cute_ncu_profile.py [--shapes 1024x131072,...] [--dtypes ...]

Why: the 16-bit forward on long rows stays at 0.88-0.93 of copy where QuACK reaches 0.99 with
the same cluster sizes and elements per thread (64 bf16 a thread at 65536-262144); the counters
(DRAM throughput, achieved occupancy, warp stall reasons, instructions) say whether the gap is
memory-level parallelism, issue, or the cluster synchronisation. Every kernel is compiled and
checked against torch in float64 first, outside the profiled range; then each runs once inside
cudaProfilerStart/Stop, in the order printed.
"""

from __future__ import annotations

import argparse

import torch

from anysoftmax.matrix import providers


def _providers(names: list[str]) -> dict:
    """The forward of each named provider (`cute`, `triton`: anysoftmax's backends; `quack`),
    through the matrix's provider table; one that cannot run here is reported and left out."""
    out = {}
    for name in names:
        full = name if name in ("cute", "triton") else providers.PEER_PREFIX + name
        try:
            out[name] = providers.forward(full, "softmax", -1, 2, "cuda")
        except Exception as exc:  # noqa: BLE001 - a provider that cannot run is reported, not fatal
            print(f"{name} unavailable: {exc}")
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="1024x131072,2048x65536")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--providers", default="cute,quack")
    a = p.parse_args()
    calls = _providers(a.providers.split(","))
    cases = []
    for s in a.shapes.split(","):
        m, n = (int(v) for v in s.split("x"))
        for dt in a.dtypes.split(","):
            x = torch.randn(m, n, device="cuda").mul_(3).to(getattr(torch, dt))
            want = torch.softmax(x.double(), -1)
            for name, fn in calls.items():
                got = fn(x)  # compiles
                err = (got.double() - want).abs().max().item()
                print(f"{name} {dt} {m}x{n}: max abs error {err:.3g}")
                cases.append((name, dt, m, n, fn, x))
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, dt, m, n, fn, x in cases:
        torch.cuda.nvtx.range_push(f"{name} {dt} {m}x{n}")
        fn(x)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        print(f"profiled: {name} {dt} {m}x{n}")
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
