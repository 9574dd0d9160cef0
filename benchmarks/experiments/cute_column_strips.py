"""Does the column kernels' speed follow the strip width (contiguous bytes per strip row)?

For dim-0 reductions of (rows, 8192) tensors, the cute column kernel with every strip width of
`column_strip_bytes` that holds the column, timed with `triton.testing.do_bench` against a copy
of the same bytes in the same process. Writes <out>/cute_column_strips.json.

    python benchmarks/experiments/cute_column_strips.py --out DIR
"""

import argparse
import json
from pathlib import Path

import torch
import triton

import anysoftmax
from anysoftmax.backends.cute import plan as cute_plan
from anysoftmax.backends.cute.backend import CuteBackend, columns_of
from anysoftmax.core import SoftmaxSpec


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--rows", default="1024,2048,4096,8192")
    p.add_argument("--cols", type=int, default=8192)
    args = p.parse_args()
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, args.cols, device="cuda").to(dtype)
            dst = torch.empty_like(x)
            copy_ms = triton.testing.do_bench(lambda: dst.copy_(x), warmup=10, rep=60)
            nbytes = 2 * x.numel() * x.element_size()
            for strip in (32, 64, 128, 256, 512):
                with cute_plan.overrides(column_strip_bytes=[strip]):
                    spec = SoftmaxSpec.from_tensor(x, 0)
                    if CuteBackend().supports(spec) is not None:  # the backward's kernel must fit too
                        continue
                    key = CuteBackend().column_plan(False, spec, columns_of(spec, spec.strides), 64)
                    y = anysoftmax.softmax(x, 0, backend="cute")
                    err = (y.double() - torch.softmax(x.double(), 0)).abs().max().item()
                    ms = triton.testing.do_bench(lambda: anysoftmax.softmax(x, 0, backend="cute"), warmup=10, rep=60)
                row = dict(dtype=str(dtype), rows=rows, cols=args.cols, strip_bytes=strip, plan=key.describe(),
                           us=ms * 1e3, copy_us=copy_ms * 1e3, frac_of_copy=copy_ms / ms,
                           gbps=nbytes / ms / 1e6, max_err=err)
                results.append(row)
                print(f"{row['dtype']:15s} {rows:5d}x{args.cols} strip {strip:3d} B  {row['frac_of_copy']:.2f} of copy  "
                      f"{key.describe()}  err {err:.1e}", flush=True)
    out = Path(args.out) / "cute_column_strips.json"
    out.write_text(json.dumps(dict(device=torch.cuda.get_device_name(), results=results), indent=1))


if __name__ == "__main__":
    main()
