"""The sampler's host cost per call on a GPU (issue 47: <= 20 us a call at B = 1), beside its
wall time back to back. Host: the time the calling thread spends in one call, timed over calls
issued without waiting (fewer than the launch queue holds, so no call waits for the GPU); wall:
back-to-back calls closed by one synchronize (the larger of host cost and GPU time). Runs in
well under a minute on one GPU.

    python benchmarks/sampling_host_gpu.py [--vocab 128256] [--rows 1] [--backend triton]
"""

from __future__ import annotations

import argparse
import time

import torch

import anysoftmax
from anysoftmax import sampling


def host_and_wall_us(f, calls: int = 200, repeats: int = 7) -> tuple[float, float]:
    """(host us per call, wall us per call): the best of `repeats` loops of `calls` calls each."""
    for _ in range(20):
        f()
    torch.cuda.synchronize()
    host = wall = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            f()
        issued = time.perf_counter()
        torch.cuda.synchronize()
        done = time.perf_counter()
        host, wall = min(host, (issued - start) / calls), min(wall, (done - start) / calls)
    return host * 1e6, wall * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    args = ap.parse_args()
    b, dev, name = args.rows, "cuda", args.backend
    x = torch.randn(b, args.vocab, device=dev).to(getattr(torch, args.dtype))
    t = torch.rand(b, device=dev) + 0.5
    tensors = dict(temperature=t, top_k=torch.full((b,), 50, device=dev), top_p=torch.full((b,), 0.9, device=dev),
                   min_p=torch.full((b,), 0.05, device=dev), seed=torch.randint(0, 2**62, (b,), device=dev))
    numbers = dict(temperature=0.8, top_k=50, top_p=0.9, min_p=0.05, seed=1234)
    ids = torch.randint(0, args.vocab, (b, 1), device=dev)
    calls = {
        "sample, per-row tensors": lambda: sampling.sample(x, **tensors, backend=name),
        "sample, numbers": lambda: sampling.sample(x, **numbers, backend=name),
        "sample, no seed": lambda: sampling.sample(x, temperature=0.8, top_k=50, backend=name),
        "probs, temperature tensor": lambda: sampling.probs(x, temperature=t, backend=name),
        "logprobs, 1 id": lambda: sampling.logprobs(x, ids, temperature=t, backend=name),
        "anysoftmax.logsumexp (for scale)": lambda: anysoftmax.logsumexp(x, -1),
        "torch.empty (for scale)": lambda: torch.empty(b, dtype=torch.int64, device=dev),
    }
    print(f"{torch.cuda.get_device_name()}: B={b} V={args.vocab} {args.dtype}, backend={name!r}")
    print(f"{'':36s} {'host us':>9s} {'wall us':>9s}")
    for label, f in calls.items():
        host, wall = host_and_wall_us(f)
        print(f"{label:36s} {host:9.1f} {wall:9.1f}")


if __name__ == "__main__":
    main()
