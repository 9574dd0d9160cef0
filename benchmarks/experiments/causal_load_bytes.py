"""Session 6: bytes per causal-prefix load in the forward tile kernel, vs a same-bytes copy.

Tuning record for `causal_load_bytes` in backends/triton/tuning.yaml: ran on an NVIDIA H100 80GB HBM3 (torch 2.11, Triton 3.6) with
the repository on PYTHONPATH; results in benchmarks/results/NVIDIA_H100_80GB_HBM3/session6_causal_load_bytes.json.

    python benchmarks/experiments/causal_load_bytes.py OUT.json
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
    n, e = x.numel(), x.element_size()
    kept = (S * (S + 1) // 2) / (S * S)
    tc = copy_time(n * e * kept + n * e)
    ref = torch.softmax((x.float() * 0.125).masked_fill(torch.ones(S, S, dtype=torch.bool, device="cuda").triu(1), float("-inf")), -1) if S <= 2048 else None
    for nb in (e, 4, 8, 16):
        if nb < e:
            continue
        with heuristics.override(causal_load_bytes=[[2, nb], [4, nb]]):
            f = lambda: anysoftmax.softmax(x, -1, scale=0.125, causal=True)
            y = f()
            err = (y.float() - ref).abs().max().item() if ref is not None else -1
            t = do_bench(f, return_mode="median")
        r = dict(S=S, dtype=str(dt), load_bytes=nb, fwd=tc / t, err=err)
        rows.append(r)
        print(f"S={S} {str(dt):15s} load {nb:2d} B fwd {r['fwd']:.3f} err {err:.1e}", flush=True)
    del x, ref
    torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
