"""What the Wave kernel compiles for a request of the fused family: the request as the kernel reads
it (`canonical`: x's reduced dim last, one workgroup per row) and its operands' index arithmetic
(`Fusion`, `row_terms`: docs/wave.md, "The kernel"). Pure arithmetic on `SoftmaxSpec`s: no Wave
import.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ...core.layout import contiguous_strides
from ...core.spec import SoftmaxSpec, dtype_name
from ...core.variant import BOTTOM_RIGHT, CAUSAL_NONE, MASK_BOOL, MASK_NONE, OperandMeta

DYNAMIC = -1  # the size of the outermost row dim in a canonical spec when the kernel does not need it
META = torch.device("meta")  # canonical specs name no device: the compile target does
OPERAND_DTYPES = ("float32", "float16", "bfloat16")  # floating masks and sinks the kernel reads


def _rows_last(spec: SoftmaxSpec, strides: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape, strides) with the reduced dim moved last, and at least one (leading) row dim."""
    shape = list(spec.shape) or [1]
    strides = list(strides) or [0]
    dim = spec.dim if spec.shape else 0
    shape.append(shape.pop(dim))
    strides.append(strides.pop(dim))
    if len(shape) == 1:
        shape.insert(0, 1)
        strides.insert(0, 0)
    # A dim of size 1 is always at index 0: its stride is irrelevant, written as 0.
    return tuple(shape), tuple(0 if n == 1 else s for n, s in zip(shape, strides))


def _meta(meta: OperandMeta | None, spec: SoftmaxSpec) -> OperandMeta | None:
    if meta is None:
        return None
    _, strides = _rows_last(spec, meta.strides)
    return OperandMeta((), strides, meta.dtype)  # the operand's own shape matters only to gradients


def canonical(spec: SoftmaxSpec) -> SoftmaxSpec:
    """`spec` as the kernel computes it, whose `kernel_key()` is the kernel's identity: rows
    contiguous with the reduced dim last, no device, the outermost row dim `DYNAMIC` unless the
    kernel needs it, operand strides permuted alike, scale and softcap values dropped."""
    shape, _ = _rows_last(spec, spec.strides)
    v = spec.variant
    if spec.is_plain:
        shape = (DYNAMIC, shape[-1])  # every row the same: all leading dims fold into M
    elif not (v.causal != CAUSAL_NONE and len(shape) == 2):
        shape = (DYNAMIC, *shape[1:])
    variant = replace(v, scale=None if v.scale is None else 1.0, softcap=None if v.softcap is None else 1.0,
                      mask=_meta(v.mask, spec), sinks=_meta(v.sinks, spec))
    # (contiguous_strides counts DYNAMIC as 1: the outermost size never enters a stride)
    return replace(spec, shape=shape, strides=contiguous_strides(shape), dim=len(shape) - 1, device=META,
                   variant=variant)


@dataclass(frozen=True)
class Term:
    """One group of row dims in an operand's offset: ((r // period) % size) * stride, without
    the modulo when `size` is None (the outermost group)."""

    period: int
    size: int | None
    stride: int


def row_terms(row_shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[Term, ...]:
    """The offset terms of an operand with `strides` over rows of `row_shape` (its outermost size
    possibly `DYNAMIC`), outermost first: size-1 dims and stride-0 groups dropped, a dim merged into
    its inner neighbour's term where laid out contiguously; the outermost term has no modulo."""
    terms: list[list] = []  # [period, size, stride], innermost first
    period = 1
    for size, stride in zip(reversed(row_shape), reversed(strides)):
        if size == 1:
            continue
        inner = terms[-1] if terms else None
        if inner is not None and inner[1] != DYNAMIC and stride == inner[2] * inner[1]:
            inner[1] = DYNAMIC if size == DYNAMIC else inner[1] * size
        else:
            terms.append([period, size, stride])
        period *= max(size, 1)
    if terms:
        terms[-1][1] = None
    return tuple(Term(p, None if n in (None, DYNAMIC) else n, s) for p, n, s in reversed(terms) if s != 0)


# Wave's read takes no constant index (its mapping needs an iterator: "Memory dimension not
# found in identity mapping"), so an operand with one value for every row is indexed by
# row // ROW_LIMIT, which is 0 for every row an int32 index reaches.
ROW_LIMIT = 2**31 - 1
ONE_VALUE = (Term(ROW_LIMIT, None, 1),)


@dataclass(frozen=True)
class Fusion:
    """The fused steps one Wave kernel compiles (from a canonical spec). `mask_terms` / `sink_terms`
    locate an operand's element per row (`mask_col`: the mask's stride along the row, 0 = one value
    a row); causal keeps column j of query q = row % `causal_sq` when j <= q + `causal_offset`;
    `empty` finds empty rows: 'count' (a bool mask's kept columns), 'causal' (q + offset < 0), 'none'."""

    scale: bool = False
    softcap: bool = False
    mask: str = MASK_NONE
    mask_dtype: str = ""
    mask_terms: tuple[Term, ...] = ()
    mask_col: int = 1
    causal_sq: int = 0  # 0: no causal step
    causal_offset: int = 0
    sink_dtype: str = ""  # "": no sinks
    sink_terms: tuple[Term, ...] = ()
    empty_rows: str = "zero"
    empty: str = "none"

    @property
    def needs_row(self) -> bool:
        """True when the kernel needs each row's global index (it takes the launch's first row)."""
        return self.mask != MASK_NONE or bool(self.sink_dtype) or bool(self.causal_sq)

    def describe(self) -> str:
        """A short stable name for file names: 'scale-softcap-maskbool-causal-sinks-emptynan'."""
        parts = [name for name, on in (("scale", self.scale), ("softcap", self.softcap)) if on]
        if self.mask != MASK_NONE:
            parts.append(f"mask{'bool' if self.mask == MASK_BOOL else self.mask_dtype}")
        if self.causal_sq:
            parts.append("causal")
        if self.sink_dtype:
            parts.append(f"sinks{self.sink_dtype}")
        if self.empty != "none":
            parts.append(f"empty{self.empty_rows}")
        return "-".join(parts) or "plain"


def fusion_of(spec: SoftmaxSpec) -> Fusion:
    """The `Fusion` of a canonical spec (`canonical(spec)`)."""
    v = spec.variant
    if spec.is_plain:
        return Fusion()
    row_shape = spec.shape[:-1]
    fields: dict = {"scale": v.scale is not None, "softcap": v.softcap is not None, "empty_rows": v.empty_rows}
    if v.mask is not None:
        terms, col = row_terms(row_shape, v.mask.strides[:-1]), v.mask.strides[-1]
        fields.update(mask=v.mask_kind, mask_dtype=dtype_name(v.mask.dtype), mask_col=col,
                      mask_terms=terms or (ONE_VALUE if col == 0 else ()))
    if v.sinks is not None:
        fields.update(sink_dtype=dtype_name(v.sinks.dtype),
                      sink_terms=row_terms(row_shape, v.sinks.strides[:-1]) or ONE_VALUE)
    if v.causal != CAUSAL_NONE:
        sq, sk = spec.shape[-2], spec.shape[-1]
        fields.update(causal_sq=sq, causal_offset=sk - sq if v.causal == BOTTOM_RIGHT else 0)
    if v.mask_kind == MASK_BOOL:
        fields["empty"] = "count"
    elif fields.get("causal_offset", 0) < 0:
        fields["empty"] = "causal"  # only bottom_right with fewer keys than queries empties rows
    return Fusion(**fields)


def refusal(spec: SoftmaxSpec) -> str | None:
    """Why the Wave kernel does not take the variant of `spec` (any spec), or None."""
    v = spec.variant
    for name, meta in (("mask", v.mask if v.mask_kind != MASK_BOOL else None), ("sinks", v.sinks)):
        if meta is not None and dtype_name(meta.dtype) not in OPERAND_DTYPES:
            return (f"{name} of dtype {dtype_name(meta.dtype)}: the Wave kernel reads floating operands of "
                    f"{', '.join(OPERAND_DTYPES)} (it accumulates in float32); pass the {name} in float32")
    return None
