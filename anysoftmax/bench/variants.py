"""`anysoftmax bench --variants`: the fused family on attention scores, against torch.

    anysoftmax bench --variants                   # the speed goals' variants, fwd
    anysoftmax bench --variants all --bwd         # every preset, backward
    anysoftmax bench --variants scale,mask --quick
    anysoftmax bench --variants --device cpu      # tiny shapes, the whole path

Scores [8, 16, S, S], S in 1024, 2048, 4096 (`--quick`: S = 2048), bf16 and fp32; each
variant a preset of `matrix.variants` (operands from the cell's seed). Providers: anysoftmax
(its automatic choice), `copy` (one device copy of the bytes a fused kernel must move for
that variant and direction, `matrix.traffic`), `torch` (the composition a user writes,
`matrix.composition`), `torch.compile` (that function compiled); seed, Liger and QuACK only
for plain (their fused cells are recorded unavailable, with the reason). Every cell is
checked against the float64 reference first. GB/s = those bytes / median time, so every
provider of a cell is measured against the same bytes. Forward times x -> y; the backward of
a fused variant times the gradient call autograd makes (dx and dsinks from each provider's own
saved tensors: `matrix.fused_cells`), the plain variant's as `anysoftmax bench --bwd` does
(the kernel from y and dy). Results:
<out>/<device>/softmax_variants_{fwd,bwd}.{json,csv,png}, and a table per dtype: variant x S
-> fraction of the run's copy bandwidth per provider, anysoftmax over the same-bytes copy
and over torch.compile, and anysoftmax's host us per call.
"""

from __future__ import annotations

from ..matrix.schema import MatrixConfig
from ..matrix.variants import PRESETS
from . import harness
from .harness import OURS
from .tables import variants_tables

BATCH, HEADS = 8, 16
SEQS = [1024, 2048, 4096]
QUICK_SEQS = [2048]
CPU_SHAPES = [(2, 3, 8, 8), (2, 3, 16, 16)]  # --device cpu: the Triton interpreter runs these in moments
DTYPES = ["bfloat16", "float32"]
# The speed goals name these; `all` adds the other presets (the combinations of a model).
GOALS = ["plain", "scale", "mask", "causal", "softcap", "sinks"]
PROVIDERS = [OURS, "copy", "torch", "torch.compile", "seed", "liger", "quack"]


class UnknownVariant(ValueError):
    """A --variants name that is no preset."""


def variant_names(text: str) -> list[str]:
    """'' -> the speed goals' variants; 'all' -> every preset; else a comma list of presets."""
    if not text:
        return list(GOALS)
    if text == "all":
        return list(PRESETS)
    names = [s for s in text.split(",") if s]
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        raise UnknownVariant(f"unknown variant {unknown[0]!r}; allowed: all, or presets {', '.join(PRESETS)}")
    return names


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """'8x16x1024x1024,2x3x8x8' -> [(8, 16, 1024, 1024), (2, 3, 8, 8)]."""
    return [tuple(int(v) for v in item.lower().split("x")) for item in text.split(",") if item]


def shapes(args) -> list[tuple[int, ...]]:
    if args.shapes:
        return parse_shapes(args.shapes)
    if args.device == "cpu":
        return list(CPU_SHAPES)
    return [(BATCH, HEADS, s, s) for s in (QUICK_SEQS if args.quick else SEQS)]


def default_providers(device: str) -> list[str]:
    """anysoftmax and every peer (the row kernels run for plain only; a missing one is skipped)."""
    return list(PROVIDERS)


def config(args, names: list[str], direction: str, device: str, timing: dict) -> tuple[MatrixConfig, dict]:
    """The benchmark's matrix: every provider x variant x shape x dtype, reduced over the last dim."""
    dtypes = [d for d in args.dtypes.split(",") if d] or DTYPES
    parts = [("variants", dtypes, [(*s, -1) for s in shapes(args)])]
    return harness.config(names, direction, device, parts, timing, variant_names(args.variants))


def describe(config: MatrixConfig) -> dict:
    """What the result document says about its grid: each variant's definition and the shapes."""
    entry = config.devices[0]
    return dict(variants={v.name: v.describe() for v in entry.variants},
                shapes=[list(c.shape) for c in entry.shapes])


def row(r, provider: str) -> dict:
    """`harness.row` plus the variant and the whole shape (S = the key length)."""
    return {**harness.row(r, provider), "variant": r.cell.variant.name, "shape": list(r.cell.shape),
            "S": r.cell.shape[-1]}


def print_table(doc: dict) -> None:
    print("\n" + variants_tables(doc))
