"""A/B probe of the causal/mask tile kernels (session 6): time vs a same-bytes copy.

Tuning record for the whole-vector causal loads and the one-layout bool mask: ran on an NVIDIA H100 80GB HBM3 (torch 2.11, Triton 3.6) with
the repository on PYTHONPATH; results in benchmarks/results/NVIDIA_H100_80GB_HBM3/session6_causal_mask_tiles_{old,new}.json.

    python benchmarks/experiments/causal_mask_tiles.py TAG OUT.json (run once per tree: old and new code)
"""
import json, sys, torch
from triton.testing import do_bench
import anysoftmax
from anysoftmax.backends.triton import heuristics
from same_bytes import copy_ms
tag = sys.argv[1]  # a label for the tree measured (old, new)
B, H = 8, 16
rows = []
CONFIGS = {"default": {}, "bm4": dict(rows_tile_elems=4096), "bm8": dict(rows_tile_elems=8192),
           "w8": dict(warps_by_tile_elems=[[2048, 8], [8192, 8], [16384, 8], [32768, 16]]),
           "bm4w8": dict(rows_tile_elems=4096, warps_by_tile_elems=[[8192, 8], [16384, 8], [32768, 16]])}
for S, dt in [(1024, torch.bfloat16), (2048, torch.bfloat16), (1024, torch.float32)]:
    x = (torch.randn((B, H, S, S), device="cuda") * 4).to(dt)
    dy = torch.randn_like(x)
    bmask = (torch.rand((B, 1, S, S), device="cuda") < 0.3)
    n, e = x.numel(), x.element_size()
    kept = (S * (S + 1) // 2) / (S * S)
    for vname, kw, fb, bb in [("causal", dict(scale=0.125, causal=True), n*e*kept + n*e, 2*n*e*kept + n*e),
                               ("mask", dict(scale=0.125, mask=bmask), 2*n*e + bmask.numel(), 3*n*e + bmask.numel())]:
        tf, tb = copy_ms(fb), copy_ms(bb)
        for cname, ov in CONFIGS.items():
            with heuristics.override(**ov):
                f = lambda: anysoftmax.softmax(x, -1, **kw)
                y = f()
                ref = torch.softmax((x.float()*0.125).masked_fill(torch.ones(S,S,dtype=torch.bool,device="cuda").triu(1) if vname=="causal" else bmask, float("-inf")), -1)
                err = (y.float() - ref).abs().max().item()
                t = do_bench(f, return_mode="median")
                xg = x.detach().requires_grad_()
                yg = anysoftmax.softmax(xg, -1, **kw)
                tbw = do_bench(lambda: torch.autograd.grad(yg, xg, dy, retain_graph=True), return_mode="median")
            r = dict(tag=tag, S=S, dtype=str(dt), variant=vname, config=cname, fwd=tf / t, bwd=tb / tbw, err=err)
            rows.append(r)
            print(f"{tag:4s} S={S} {str(dt):15s} {vname:6s} {cname:8s} fwd {r['fwd']:.3f} bwd {r['bwd']:.3f} err {err:.1e}", flush=True)
json.dump(rows, open(sys.argv[2], "w"), indent=1)
