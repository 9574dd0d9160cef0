"""Nsight Compute view of merge_states against the copy of its bytes, at the shapes where the
graph-timed merge stays furthest under the copy (`pieces_probe.py --parts floor`):

    ncu --profile-from-start off --metrics <...> python3 benchmarks/merge_ncu.py

Warms every request up (compiles, binds), then profiles one merge and one copy per shape
between cudaProfilerStart/Stop; inputs are fresh buffers (not in L2)."""

from __future__ import annotations

import torch

import anysoftmax
from anysoftmax.bench.lse_merge import merge_sets

SHAPES = [(2, 64, 1), (8, 64, 1024), (2, 256, 8192)]


def main() -> None:
    runs = []
    for k, d, tokens in SHAPES:
        sets = merge_sets(tokens, 32, d, k, torch.bfloat16, "cuda", 3)
        nbytes = (k + 1) * tokens * 32 * (d * 2 + 4)
        src = torch.ones(2, nbytes // 8, device="cuda")
        dst = torch.empty(nbytes // 8, device="cuda")
        anysoftmax.merge_states(*sets[0])
        dst.copy_(src[0])
        runs.append((f"K={k} D={d} tokens={tokens}", sets, src, dst))
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, sets, src, dst in runs:
        flush.zero_()
        anysoftmax.merge_states(*sets[1])
        flush.zero_()
        dst.copy_(src[1])
        torch.cuda.synchronize()
        print("profiled", name, flush=True)
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
