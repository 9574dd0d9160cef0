"""Compile Wave kernels ahead of time into the disk cache.

    python -m anysoftmax.backends.wave.aot --shapes 2x128,256x1024 --dtypes float32 --target sm_80
    python -m anysoftmax.backends.wave.aot --shapes 2x8x256x256 --target sm_80 \\
        --variants plain,scale+softcap,mask=bool:2x1x256x256+causal,sinks=float32:8x1x1

Shapes are full input shapes (the softmax runs over `--dim`, default the last). The plain
softmax depends only on the row length (M is dynamic); a member of the fused family also on
the row dims its operands and causal index reach, so give the real shape. `--ops` picks
softmax, log_softmax or both; `--out-dtypes` adds `dtype=` widenings (e.g. float16 in,
float32 out). `--variants` is a comma list, each item steps joined by '+':

    plain | scale | softcap | causal[=top_left|bottom_right] | empty=zero|nan|uniform
    mask=bool|float16|bfloat16|float32[:SHAPE[/STRIDES]]  (default SHAPE: the input's)
    sinks=float16|bfloat16|float32[:SHAPE[/STRIDES]]      (default: the input's, 1 in the softmax dim)

Operands are tensors of their SHAPE (broadcast to the input), contiguous unless STRIDES (in
elements, joined by 'x' like SHAPE) give their layout: the kernel reads them in place. Scale and
softcap values are runtime arguments: no value is given here. `--cache-dir` overrides
$ANYSOFTMAX_CACHE_DIR. Copy the printed folder to a machine with only iree-base-runtime and
point $ANYSOFTMAX_CACHE_DIR at its parent's parent to run there without a compiler.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

import torch

from ...core.spec import SoftmaxSpec, dtype_name, parse_dtype
from ...core.variant import CAUSAL_NONE, MASK_BOOL, TOP_LEFT
from .fusion import canonical
from .kernel import DTYPES, KernelKey
from .target import parse_target


def _shape(text: str) -> tuple[int, ...]:
    dims = tuple(int(d) for d in text.lower().split("x") if d)
    if not dims or any(d < 1 for d in dims):
        raise argparse.ArgumentTypeError(f"shape {text!r}: positive sizes joined by 'x', e.g. 2x8x256x256")
    return dims


def _shapes(text: str) -> list[tuple[int, ...]]:
    return sorted({_shape(s.strip()) for s in text.split(",") if s.strip()})


def _dtypes(text: str) -> list[str]:
    names = [dtype_name(parse_dtype(s.strip())) for s in text.split(",") if s.strip()]
    bad = [n for n in names if n not in DTYPES]
    if bad:
        raise argparse.ArgumentTypeError(f"unsupported dtype(s) {bad}; the Wave kernel takes {', '.join(DTYPES)}")
    return names


def _variants(text: str) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    for item in items:
        fused_kwargs(item, (2, 2), -1)  # validates the syntax (raises ArgumentTypeError)
    return items


def fused_kwargs(item: str, shape: tuple[int, ...], dim: int) -> dict:
    """The fused keywords of one `--variants` item for an input of `shape` reduced over `dim`,
    with operands as meta tensors (they carry layout and dtype, no data)."""
    kwargs: dict = {}
    for step in item.split("+"):
        name, _, arg = step.strip().partition("=")
        if name == "plain" and not arg:
            continue
        if name in ("scale", "softcap") and not arg:
            kwargs[name] = 1.0
        elif name == "causal":
            kwargs["causal"] = arg or TOP_LEFT
        elif name == "empty" and arg:
            kwargs["empty_rows"] = arg
        elif name in ("mask", "sinks") and arg:
            dtype_text, _, layout = arg.partition(":")
            shape_text, _, strides_text = layout.partition("/")
            dtype = torch.bool if dtype_text == "bool" and name == "mask" else parse_dtype(dtype_text)
            default = shape if name == "mask" else tuple(1 if d == dim % len(shape) else s for d, s in enumerate(shape))
            op_shape = _shape(shape_text) if shape_text else default
            try:
                strides = tuple(int(v) for v in strides_text.split("x")) if strides_text else None
            except ValueError:
                raise argparse.ArgumentTypeError(f"strides {strides_text!r}: integers joined by 'x'") from None
            if strides is not None and len(strides) != len(op_shape):
                raise argparse.ArgumentTypeError(f"{name}: {len(strides)} strides for a shape of {len(op_shape)} dims")
            kwargs[name] = (torch.empty_strided(op_shape, strides, dtype=dtype, device="meta") if strides
                            else torch.empty(op_shape, dtype=dtype, device="meta"))
        else:
            raise argparse.ArgumentTypeError(f"variant step {step!r} not understood (see --help)")
    return kwargs


def _layout(meta, x_shape: tuple[int, ...]) -> str:
    """SHAPE[/STRIDES] of an operand from its metadata (the strides of its broadcast view are
    its own on the dims it has; STRIDES only when they are not contiguous)."""
    own = meta.strides[len(x_shape) - len(meta.shape):] if meta.shape else ()
    shape = "x".join(map(str, meta.shape)) or "1"
    if not meta.shape:
        return shape
    contiguous = torch.empty(meta.shape, device="meta").stride()
    if all(n == 1 or a == b for n, a, b in zip(meta.shape, own, contiguous)):
        return shape
    return f"{shape}/{'x'.join(map(str, own))}"


def variant_arg(spec: SoftmaxSpec) -> str:
    """The `--variants` item that compiles `spec`'s variant (operand layouts included)."""
    v = spec.variant
    steps = [name for name, on in (("scale", v.scale is not None), ("softcap", v.softcap is not None)) if on]
    if v.mask is not None:
        kind = "bool" if v.mask_kind == MASK_BOOL else dtype_name(v.mask.dtype)
        steps.append(f"mask={kind}:{_layout(v.mask, spec.shape)}")
    if v.causal != CAUSAL_NONE:
        steps.append(f"causal={v.causal}")
    if v.sinks is not None:
        steps.append(f"sinks={dtype_name(v.sinks.dtype)}:{_layout(v.sinks, spec.shape)}")
    if v.has_empty_rows and v.empty_rows != "zero":
        steps.append(f"empty={v.empty_rows}")
    return "+".join(steps) or "plain"


def command_for(spec: SoftmaxSpec, target) -> str:
    """The command line that precompiles the kernel of `spec` on `target`."""
    shape = "x".join(map(str, spec.shape)) or "1"
    return (f"python -m anysoftmax.backends.wave.aot --shapes {shape} --dim {spec.dim} "
            f"--dtypes {dtype_name(spec.in_dtype)} --out-dtypes {dtype_name(spec.out_dtype)} "
            f"--ops {spec.op_name} --variants {variant_arg(spec)} --target {target.chip}")


def keys_for(shapes, dtypes, out_dtypes, ops, variants, target, dim: int = -1) -> list[KernelKey]:
    """Every kernel the command line asks for (duplicates, e.g. plain shapes of one row
    length, collapse: M is dynamic)."""
    keys = {}
    for shape, d in itertools.product(shapes, dtypes):
        x = torch.empty(shape, dtype=parse_dtype(d), device="meta")
        for out, log, item in itertools.product([d, *(o for o in out_dtypes if o != d)], ops, variants):
            try:
                fused = fused_kwargs(item, shape, dim)
                spec, _ = SoftmaxSpec.from_request(x, dim, parse_dtype(out), log=log, fused=fused)
            except (TypeError, ValueError) as exc:
                raise SystemExit(f"--variants {item!r} on shape {list(shape)}: {exc}") from None
            keys.setdefault(KernelKey(canonical(spec), target))
    return list(keys)


def main(argv: list[str] | None = None) -> int:
    """Compile the requested kernels into the cache; print one line per kernel. Returns 0."""
    p = argparse.ArgumentParser(prog="python -m anysoftmax.backends.wave.aot", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", type=_shapes, required=True, help="comma list of input shapes, e.g. 2x128,2x8x256x256")
    p.add_argument("--dim", type=int, default=-1, help="the softmax dim (default -1)")
    p.add_argument("--dtypes", type=_dtypes, default=["float32"], help="input dtypes (float32,float16,bfloat16)")
    p.add_argument("--out-dtypes", type=_dtypes, default=[], help="extra output dtypes (dtype= widening)")
    p.add_argument("--ops", choices=("softmax", "log_softmax", "both"), default="both")
    p.add_argument("--variants", type=_variants, default=["plain"], help="comma list of fused variants (see above)")
    p.add_argument("--target", type=parse_target, required=True, help="gfx942, gfx90a, ... or sm_80")
    p.add_argument("--cache-dir", help="cache root (sets $ANYSOFTMAX_CACHE_DIR)")
    p.add_argument("--force", action="store_true", help="recompile kernels already in the cache")
    args = p.parse_args(argv)
    if args.cache_dir:
        os.environ["ANYSOFTMAX_CACHE_DIR"] = args.cache_dir

    from . import diskcache
    from .compiler import compile_vmfb

    ops = {"softmax": [False], "log_softmax": [True], "both": [False, True]}[args.ops]
    for key in keys_for(args.shapes, args.dtypes, args.out_dtypes, ops, args.variants, args.target, args.dim):
        path = diskcache.vmfb_path(key)
        if path.exists() and not args.force:
            print(f"cached   {path}")
            continue
        t0 = time.perf_counter()
        diskcache.store(key, compile_vmfb(key))
        print(f"compiled {path} ({path.stat().st_size} bytes, {time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
