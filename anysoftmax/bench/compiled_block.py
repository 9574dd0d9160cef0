"""A compiled attention block with anysoftmax against the same block with torch.softmax.

    python -m anysoftmax.bench.compiled_block --out DIR [--shapes 8x16x1024x64 ...] [--dtypes bf16 fp32]

The block: x -> qkv projection -> QK^T * scale -> softmax -> @V -> output projection, compiled
with `torch.compile(fullgraph=True, dynamic=False)` in the default mode and in
`mode="reduce-overhead"` (CUDA graphs). Providers (`--providers`; the first three by default):
* `torch`: torch.softmax (Inductor generates and may fuse its own softmax);
* `anysoftmax`: anysoftmax.softmax, whose Triton kernels appear in the graph as user-defined
  kernels (`anysoftmax.torchop.traced_ops`);
* `anysoftmax:scale`: the same with the temperature folded in, `softmax(QK^T, -1, scale=)`
  (the fused family): no separate multiply, no scaled copy of the scores;
* `anysoftmax:opaque`: the same with $ANYSOFTMAX_COMPILE_KERNELS=0 while compiling, i.e. the
  opaque custom operator of before (the kernels launched from Python at run time).

Per (shape, dtype, provider, mode, direction): GPU ms per step (median of
`triton.testing.do_bench`, L2 flushed between steps) and wall ms per step (`--steps` steps back
to back, one synchronize; what a training loop sees, host overhead included). `fwd` runs under
`torch.no_grad()`; `fwd+bwd` is the forward plus `torch.autograd.grad` of the output w.r.t. the
input and every parameter. Each row records the output's largest difference from the torch
provider's and whether anysoftmax's kernels are in Inductor's code. Writes
DIR/compiled_block.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time
from pathlib import Path
from unittest import mock

import torch

PROVIDERS = ["torch", "anysoftmax", "anysoftmax:scale", "anysoftmax:opaque"]
MODES = ["default", "reduce-overhead"]
DIRECTIONS = ["fwd", "fwd+bwd"]
DEFAULT_SHAPES = ["8x16x1024x64", "8x16x4096x64"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class Attention(torch.nn.Module):
    """QK^T -> softmax -> V with input and output projections; `softmax` picks the function.
    With `fused_scale` the temperature is its `scale=` argument (anysoftmax's fused family)
    instead of a multiply of the scores before it."""

    def __init__(self, heads: int, head_dim: int, softmax, fused_scale: bool = False):
        super().__init__()
        dim = heads * head_dim
        self.heads, self.head_dim, self.softmax, self.fused_scale = heads, head_dim, softmax, fused_scale
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        scores, scale = q @ k.transpose(-1, -2), self.head_dim ** -0.5
        p = self.softmax(scores, -1, scale=scale) if self.fused_scale else self.softmax(scores * scale, -1)
        return self.out((p @ v).transpose(1, 2).reshape(b, s, d))


def _softmax_of(provider: str):
    if provider == "torch":
        return torch.softmax
    import anysoftmax

    return anysoftmax.softmax


def _reset() -> None:
    torch._dynamo.reset()
    with contextlib.suppress(Exception):
        from torch._inductor import cudagraph_trees
        cudagraph_trees.reset_cudagraph_trees()
    gc.collect()
    torch.cuda.empty_cache()


def _step_fn(model, compiled, x, gout, mode: str, direction: str):
    params = list(model.parameters())

    if direction == "fwd":
        def run():
            if mode == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            with torch.no_grad():
                return compiled(x)
    else:
        xg = x.detach().requires_grad_()

        def run():
            if mode == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            out = compiled(xg)
            torch.autograd.grad(out, [xg, *params], gout)
            return out
    return run


def measure_cell(provider: str, shape: tuple, dtype: torch.dtype, mode: str, direction: str,
                 steps: int, reference: torch.Tensor | None) -> tuple[dict, torch.Tensor]:
    import triton
    from torch._inductor.utils import run_and_get_code

    b, h, s, hd = shape
    torch.manual_seed(0)
    model = Attention(h, hd, _softmax_of(provider), fused_scale=provider == "anysoftmax:scale").cuda().to(dtype)
    x = torch.randn(b, s, h * hd, device="cuda", dtype=dtype)
    gout = torch.randn_like(x)
    _reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=False, mode=None if mode == "default" else mode)
    run = _step_fn(model, compiled, x, gout, mode, direction)
    opaque = provider == "anysoftmax:opaque"
    with mock.patch.dict(os.environ, {"ANYSOFTMAX_COMPILE_KERNELS": "0"}) if opaque else contextlib.nullcontext():
        out, codes = run_and_get_code(run)
    code = "\n".join(codes)
    for _ in range(3):  # reduce-overhead: warm-up, record, replay
        out = run()
    torch.cuda.synchronize()
    first = out.detach().float().clone()
    gpu_ms = triton.testing.do_bench(run, warmup=25, rep=200, return_mode="median")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        run()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    row = dict(provider=provider, batch=b, heads=h, seq=s, head_dim=hd, dtype=str(dtype).replace("torch.", ""),
               mode=mode, direction=direction, gpu_ms=gpu_ms, wall_ms=wall_ms,
               user_kernels_in_code=any(k in code for k in ("softmax_tile_kernel", "softmax_split_kernel",
                                                            "softmax_online_kernel")),
               opaque_op_in_code="torch.ops.anysoftmax" in code,
               max_abs_diff_vs_torch=None if reference is None else (first - reference).abs().max().item())
    del model, compiled, run, out, x, gout
    _reset()
    return row, first


def measure(shapes: list[tuple], dtypes: list[torch.dtype], providers: list[str], steps: int,
            modes: list[str] = MODES, directions: list[str] = DIRECTIONS, on_row=None) -> list[dict]:
    """Every cell; `on_row(rows)` after each (the JSON is rewritten as cells finish, so a run
    cut short keeps what it measured)."""
    rows = []
    for shape in shapes:
        for dtype in dtypes:
            for mode in modes:
                for direction in directions:
                    reference = None
                    for provider in providers:
                        label = f"{provider} {'x'.join(map(str, shape))} {dtype} {mode} {direction}"
                        try:
                            row, out = measure_cell(provider, shape, dtype, mode, direction, steps, reference)
                        except torch.cuda.OutOfMemoryError as exc:
                            row, out = dict(provider=provider, shape=list(shape), dtype=str(dtype), mode=mode,
                                            direction=direction, error=f"out of memory: {exc}".splitlines()[0]), None
                            _reset()
                        except Exception as exc:  # one failing cell must not lose the others
                            row, out = dict(provider=provider, shape=list(shape), dtype=str(dtype), mode=mode,
                                            direction=direction, error=f"{type(exc).__name__}: {exc}"[:500]), None
                            _reset()
                        if provider == "torch":
                            reference = out
                        print(f"  {label}: " + (f"gpu {row['gpu_ms']:.3f} ms, wall {row['wall_ms']:.3f} ms"
                                                if "error" not in row else row["error"]), file=sys.stderr, flush=True)
                        rows.append(row)
                        if on_row is not None:
                            on_row(rows)
    return rows


def table(rows: list[dict]) -> str:
    """Markdown: one line per (shape, dtype, mode, direction), ms per step and the ratio to torch
    (anysoftmax with a separate multiply, and with `scale=`)."""
    keyed: dict = {}
    for r in rows:
        if "error" in r:
            continue
        key = (f"{r['batch']}x{r['heads']}x{r['seq']}x{r['head_dim']}", r["dtype"], r["mode"], r["direction"])
        keyed.setdefault(key, {})[r["provider"]] = r
    lines = ["| shape (BxHxSxD) | dtype | mode | step | torch gpu ms | anysoftmax gpu ms | ratio | "
             "scale= gpu ms | ratio | opaque gpu ms | torch wall ms | anysoftmax wall ms | ratio | scale= wall ms | "
             "ratio | kernels in graph |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, by in keyed.items():
        t, a, sc, o = by.get("torch"), by.get("anysoftmax"), by.get("anysoftmax:scale"), by.get("anysoftmax:opaque")

        def f(r, k):
            return f"{r[k]:.3f}" if r else "-"

        def ratio(r, k):
            return f"{r[k] / t[k]:.2f}" if r and t else "-"

        kernels = (a or sc or {}).get("user_kernels_in_code", "-")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {f(t, 'gpu_ms')} | {f(a, 'gpu_ms')} | "
                     f"{ratio(a, 'gpu_ms')} | {f(sc, 'gpu_ms')} | {ratio(sc, 'gpu_ms')} | {f(o, 'gpu_ms')} | "
                     f"{f(t, 'wall_ms')} | {f(a, 'wall_ms')} | {ratio(a, 'wall_ms')} | {f(sc, 'wall_ms')} | "
                     f"{ratio(sc, 'wall_ms')} | {kernels} |")
    errors = [r for r in rows if "error" in r]
    for r in errors:
        lines.append(f"\nerror: {r['provider']} {r['shape']} {r['dtype']} {r['mode']} {r['direction']}: {r['error']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for compiled_block.json")
    ap.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, help="BxHxSxD (batch, heads, seq, head dim)")
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=sorted(DTYPES))
    ap.add_argument("--providers", nargs="+", default=["torch", "anysoftmax", "anysoftmax:scale"], choices=PROVIDERS,
                    help="anysoftmax:opaque adds the opaque-operator form (compiles again: slower run)")
    ap.add_argument("--modes", nargs="+", default=MODES, choices=MODES)
    ap.add_argument("--directions", nargs="+", default=DIRECTIONS, choices=DIRECTIONS)
    ap.add_argument("--steps", type=int, default=50, help="back-to-back steps for the wall time")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("compiled_block: needs a CUDA GPU (torch.cuda.is_available() is False); nothing measured",
              file=sys.stderr)
        return 2
    import triton

    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
    if any(len(s) != 4 for s in shapes):
        ap.error("--shapes: BxHxSxD, e.g. 8x16x1024x64")
    providers = ["torch"] + [p for p in args.providers if p != "torch"]  # torch first: the reference
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               steps=args.steps, rows=[])

    def save(rows):
        doc["rows"] = rows
        (out / "compiled_block.json").write_text(json.dumps(doc, indent=1))

    rows = measure(shapes, [DTYPES[d] for d in args.dtypes], providers, args.steps, args.modes, args.directions,
                   on_row=save)
    save(rows)
    print(f"# compiled attention block on {doc['device']} (torch {doc['torch']}, triton {doc['triton']})\n")
    print(table(rows))
    print(f"\n(written: {out / 'compiled_block.json'})")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
