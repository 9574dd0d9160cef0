"""Session 6: warps of the 4096-element tile, fused variants at S=4096, vs a same-bytes copy.

Tuning record for `fused_warps_by_tile_bytes` in backends/triton/tuning.yaml: ran on an NVIDIA H100 80GB HBM3 (torch 2.11, Triton 3.6) with
the repository on PYTHONPATH; results in benchmarks/results/NVIDIA_H100_80GB_HBM3/session6_fused_tile_warps.json (S=4096) and
session6_fused_tile_warps_2048.json.

    python benchmarks/experiments/fused_tile_warps.py OUT.json [S [DTYPES]]
"""
import json, sys, torch
from triton.testing import do_bench
import anysoftmax
from anysoftmax.backends.triton import heuristics
from same_bytes import copy_ms
B, H = 8, 16
S = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
rows = []
for dt in [getattr(torch, d) for d in (sys.argv[3] if len(sys.argv) > 3 else "float32,bfloat16").split(",")]:
    x = (torch.randn((B, H, S, S), device="cuda") * 4).to(dt)
    bmask = torch.rand((B, 1, S, S), device="cuda") < 0.3
    sinks = torch.randn((H, 1, 1), device="cuda").to(dt)
    n, e = x.numel(), x.element_size()
    kept = (S * (S + 1) // 2) / (S * S)
    VARS = {"plain": ({}, 2 * n * e), "scale": (dict(scale=0.125), 2 * n * e),
            "mask": (dict(scale=0.125, mask=bmask), 2 * n * e + bmask.numel()),
            "causal": (dict(scale=0.125, causal=True), n * e * kept + n * e),
            "softcap": (dict(scale=0.125, softcap=50.0), 2 * n * e), "sinks": (dict(scale=0.125, sinks=sinks), 2 * n * e)}
    for vname, (kw, nbytes) in VARS.items():
        tc = copy_ms(nbytes)
        for w in (4, 8, 16):
            # (the plain table's warps for this tile, which fused_warps_by_tile_bytes then leaves alone)
            with heuristics.override(warps_by_tile_elems=[[S // 2, 4], [S, w], [8192, 4], [16384, 8], [32768, 16]],
                                     fused_warps_by_tile_bytes=[[1 << 30, 0]]):
                f = lambda: anysoftmax.softmax(x, -1, **kw)
                f()
                t = do_bench(f, return_mode="median")
            r = dict(S=S, dtype=str(dt), variant=vname, warps=w, fwd=tc / t)
            rows.append(r)
            print(f"S={S} {str(dt):15s} {vname:8s} warps {w:2d} fwd {r['fwd']:.3f}", flush=True)
    del x, bmask
    torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
