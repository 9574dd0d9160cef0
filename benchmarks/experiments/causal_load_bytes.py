"""Session 6: bytes per causal-prefix load in the forward tile kernel or the backward kernel, vs
a same-bytes copy.

Tuning record for `causal_load_bytes` / `causal_load_bytes_bwd` in backends/triton/tuning.yaml:
ran on an NVIDIA H100 80GB HBM3 (torch 2.11, Triton 3.6) with the repository on PYTHONPATH;
results in benchmarks/results/NVIDIA_H100_80GB_HBM3/session6_causal_load_bytes{,_bwd}.json.

    python benchmarks/experiments/causal_load_bytes.py fwd|bwd OUT.json
"""
import json
import sys

import torch
from triton.testing import do_bench

import anysoftmax
from anysoftmax.backends.triton import heuristics
from same_bytes import causal_bytes, copy_ms

B, H = 8, 16
backward = sys.argv[1] == "bwd"
key = "causal_load_bytes_bwd" if backward else "causal_load_bytes"
rows = []
# (the backward's float32 S=4096 cell does not fit beside the others on an 80 GB card)
shapes = [(S, torch.bfloat16) for S in (1024, 2048, 4096)] + [(S, torch.float32) for S in (1024, 2048, 4096)]
for S, dt in shapes[:-1] if backward else shapes:
    x = (torch.randn((B, H, S, S), device="cuda") * 4).to(dt)
    dy = torch.randn_like(x)
    tc = copy_ms(causal_bytes(x, backward))
    ref = None
    if S <= (1024 if backward else 2048):  # the float32 reference, where it fits beside x
        xr = x.float().requires_grad_(backward)
        yr = torch.softmax((xr * 0.125).masked_fill(torch.ones(S, S, dtype=torch.bool, device="cuda").triu(1),
                                                    float("-inf")), -1)
        ref = torch.autograd.grad(yr, xr, dy.float())[0] if backward else yr.detach()
        del xr, yr
    for nb in (b for b in (2, 4, 8, 16) if b >= x.element_size()):
        with heuristics.override(**{key: [[2, nb], [4, nb]]}):
            xg = x.detach().requires_grad_(backward)
            y = anysoftmax.softmax(xg, -1, scale=0.125, causal=True)
            f = (lambda: torch.autograd.grad(y, xg, dy, retain_graph=True)[0]) if backward else \
                (lambda: anysoftmax.softmax(x, -1, scale=0.125, causal=True))
            got = f()
            err = ((got.float() - ref).abs().max() / ref.abs().max()).item() if ref is not None else -1
            t = do_bench(f, return_mode="median")
        r = dict(S=S, dtype=str(dt), load_bytes=nb, err=err, **{"bwd" if backward else "fwd": tc / t})
        rows.append(r)
        print(f"{'bwd' if backward else 'fwd'} S={S} {str(dt):15s} load {nb:2d} B {tc / t:.3f} of copy, "
              f"rel. err {err:.1e}", flush=True)
        del xg, y, got
    del x, dy, ref
    torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[2], "w"), indent=1)
