"""Session 6: bytes per causal-prefix load in the backward kernel, vs a same-bytes copy.

Tuning record for `causal_load_bytes_bwd` in backends/triton/tuning.yaml: ran on an NVIDIA H100 80GB HBM3 (torch 2.11, Triton 3.6) with
the repository on PYTHONPATH; results in benchmarks/results/NVIDIA_H100_80GB_HBM3/session6_causal_load_bytes_bwd.json.

    python benchmarks/experiments/causal_load_bytes_bwd.py OUT.json
"""
import json, sys, torch
from triton.testing import do_bench
import anysoftmax
from anysoftmax.backends.triton import heuristics
B, H = 8, 16
rows = []
def copy_time(nbytes):
    half = int(nbytes) // 2
    src = torch.empty(2 * half, dtype=torch.uint8, device="cuda")
    return do_bench(lambda: src[half:].copy_(src[:half]), return_mode="median")
for S, dt in [(1024, torch.bfloat16), (2048, torch.bfloat16), (4096, torch.bfloat16), (1024, torch.float32), (2048, torch.float32)]:
    x = (torch.randn((B, H, S, S), device="cuda") * 4).to(dt)
    dy = torch.randn_like(x)
    n, e = x.numel(), x.element_size()
    kept = (S * (S + 1) // 2) / (S * S)
    tc = copy_time(2 * n * e * kept + n * e)
    ref = None
    if S <= 1024:
        xr = x.float().requires_grad_()
        yr = torch.softmax((xr * 0.125).masked_fill(torch.ones(S, S, dtype=torch.bool, device="cuda").triu(1), float("-inf")), -1)
        (ref,) = torch.autograd.grad(yr, xr, dy.float())
        del xr, yr
    for nb in (e, 4, 8, 16):
        if nb < e:
            continue
        with heuristics.override(causal_load_bytes_bwd=[[2, nb], [4, nb]]):
            xg = x.detach().requires_grad_()
            yg = anysoftmax.softmax(xg, -1, scale=0.125, causal=True)
            f = lambda: torch.autograd.grad(yg, xg, dy, retain_graph=True)
            (dx,) = f()
            err = ((dx.float() - ref).abs().max() / ref.abs().max()).item() if ref is not None else -1
            t = do_bench(f, return_mode="median")
        r = dict(S=S, dtype=str(dt), load_bytes=nb, bwd=tc / t, err=err)
        rows.append(r)
        print(f"bwd S={S} {str(dt):15s} load {nb:2d} B bwd {r['bwd']:.3f} relerr {err:.1e}", flush=True)
        del xg, yg, dx
    del x, dy, ref
    torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
