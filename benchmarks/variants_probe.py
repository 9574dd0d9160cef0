"""A quick GPU probe of the fused family's kernels (tuning aid; the reported numbers come from
`python -m anysoftmax.bench.softmax --variants`): for scores [8, 16, S, S], each variant's forward
and backward time, as a fraction of a copy of the bytes the fused kernel must move, beside torch
eager and torch.compile of the same composition. Checks every output against the float64
reference first.

    python benchmarks/variants_probe.py --out DIR [--sizes 1024,2048,4096] [--dtypes bfloat16,float32]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from triton.testing import do_bench

import anysoftmax
from anysoftmax.core import SoftmaxSpec
from anysoftmax.testing.compare import compare, compare_fused_backward

B, H = 8, 16


def variants(S, dtype, device):
    g = torch.Generator(device="cpu").manual_seed(S)
    bmask = (torch.rand((B, 1, S, S), generator=g) < 0.3).to(device)
    add = torch.zeros((B, 1, S, S)).masked_fill(torch.rand((B, 1, S, S), generator=g) < 0.3,
                                                  torch.finfo(dtype).min).to(dtype).to(device)
    sinks = torch.randn((H, 1, 1), generator=g).to(dtype).to(device)
    return {
        "scale": dict(scale=0.125),
        "bool-mask": dict(scale=0.125, mask=bmask),
        "additive-mask": dict(scale=0.125, mask=add),
        "causal": dict(scale=0.125, causal=True),
        "softcap": dict(scale=0.125, softcap=50.0),
        "sinks-causal": dict(scale=0.125, causal=True, sinks=sinks),
        "plain": dict(),
    }


def composed(x, scale=None, mask=None, causal=False, softcap=None, sinks=None):
    z = x.float() * (1.0 if scale is None else scale)
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    if mask is not None:
        z = z.masked_fill(mask, -math.inf) if mask.dtype == torch.bool else z + mask
    if causal:
        S = z.shape[-1]
        z = z.masked_fill(torch.ones(S, S, dtype=torch.bool, device=z.device).triu(1), -math.inf)
    if sinks is not None:
        z = torch.cat([z, sinks.float().expand(*z.shape[:-1], 1)], -1)
        return z.softmax(-1)[..., :-1].to(x.dtype)
    return z.softmax(-1).to(x.dtype)


def moved_bytes(x, kw, backward):
    n, e = x.numel(), x.element_size()
    S = x.shape[-1]
    kept = (S * (S + 1) // 2) / (S * S) if kw.get("causal") else 1.0
    mask = kw.get("mask")
    mb = mask.numel() * mask.element_size() if mask is not None else 0
    if backward:
        xb = n * e * kept if kw.get("softcap") else 0
        return 2 * n * e * kept + mb + xb + n * e
    return n * e * kept + mb + n * e


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="out/probe")
    p.add_argument("--sizes", default="1024,2048,4096")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--max-gb", type=float, default=4.5, help="skip score tensors larger than this")
    a = p.parse_args()
    dev = "cuda"
    name = torch.cuda.get_device_name()
    rows = []
    for S in map(int, a.sizes.split(",")):
        for dname in a.dtypes.split(","):
            dtype = getattr(torch, dname)
            if B * H * S * S * dtype.itemsize > a.max_gb * 2**30:
                continue
            x = (torch.randn((B, H, S, S), device=dev) * 4).to(dtype)
            dy = torch.randn_like(x)
            for vname, kw in variants(S, dtype, dev).items():
                fwd = lambda: anysoftmax.softmax(x, -1, **kw)  # noqa: E731
                y = fwd()
                spec, _ = SoftmaxSpec.from_request(x, -1, fused=kw)
                ok = compare(y, x, spec, "cuda", kw.get("mask"), kw.get("sinks")) if S <= 2048 else None
                xg = x.detach().requires_grad_()
                yg = anysoftmax.softmax(xg, -1, **kw)
                (dx,) = torch.autograd.grad(yg, xg, dy, retain_graph=True)
                okb = compare_fused_backward(dx, yg.detach(), dy, x, spec, kw.get("mask"), kw.get("sinks"),
                                             device="cuda") if S <= 1024 else None
                bwd = lambda: torch.autograd.grad(yg, xg, dy, retain_graph=True)  # noqa: E731
                fb, bb = moved_bytes(x, kw, False), moved_bytes(x, kw, True)
                # The same-bytes copy: half the bytes read, half written.
                half_f, half_b = int(fb) // 2, int(bb) // 2
                src = torch.empty(2 * max(half_f, half_b), dtype=torch.uint8, device=dev)
                t_copy_f = do_bench(lambda: src[half_f:2 * half_f].copy_(src[:half_f]), return_mode="median")
                t_copy_b = do_bench(lambda: src[half_b:2 * half_b].copy_(src[:half_b]), return_mode="median")
                t_f = do_bench(fwd, return_mode="median")
                t_b = do_bench(bwd, return_mode="median")
                t_e = do_bench(lambda: composed(x, **kw), return_mode="median")
                t_c = None
                if not a.no_compile:
                    torch._dynamo.reset()
                    cf = torch.compile(lambda t: composed(t, **kw))
                    cf(x)
                    t_c = do_bench(lambda: cf(x), return_mode="median")
                row = dict(device=name, S=S, dtype=dname, variant=vname, fwd_ms=t_f, bwd_ms=t_b,
                           fwd_frac=t_copy_f / t_f, bwd_frac=t_copy_b / t_b, eager_frac=t_copy_f / t_e,
                           compile_frac=(t_copy_f / t_c) if t_c else None,
                           fwd_ok=None if ok is None else ok.ok, bwd_ok=None if okb is None else okb.ok,
                           detail=(ok.detail if ok is not None and not ok.ok else "") + (
                               okb.detail if okb is not None and not okb.ok else ""))
                rows.append(row)
                del yg, xg, dx
                torch.cuda.empty_cache()
                print(f"{name} S={S} {dname:9s} {vname:14s} fwd {row['fwd_frac']:.2f} bwd {row['bwd_frac']:.2f} "
                      f"eager {row['eager_frac']:.2f} compile {row['compile_frac'] or 0:.2f} ok {row['fwd_ok']} "
                      f"{row['bwd_ok']} {row['detail'][:80]}", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "variants_probe.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
