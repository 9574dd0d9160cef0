"""Shape normalisation shared by every kernel: a request as rows of `n_cols` strided elements, read through
up to `MAX_ROW_DIMS` (size, stride) row dims (docs/kernels.md); a layout irregular in more dims is copied
once (`RowLayout.from_strides`: None)."""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch

MAX_ROW_DIMS = 3

# Debug mode: every output is NaN-filled before a kernel writes it, so an element it forgets
# shows up. Read once at import (the hot path reads no environment); the test suite sets it.
POISON_OUTPUTS = os.environ.get("ANYSOFTMAX_POISON_OUTPUTS") == "1"


def _poison(dtype: torch.dtype):
    # (NaN for floating outputs; integer ones, token ids, get their dtype's least value: no id)
    return float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min


def new_output(shape, dtype, device):
    """Allocate a kernel's output; poisoned (NaN, an integer dtype's least value) when
    $ANYSOFTMAX_POISON_OUTPUTS=1 at import."""
    if POISON_OUTPUTS:
        return torch.full(shape, _poison(dtype), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def output_maker(shape, dtype, device):
    """`make() -> a new output` of `shape` (`new_output`'s poisoning): `empty_like` of a template
    costs under half of `torch.empty` with a shape, dtype and device on a GPU host."""
    template = new_output(shape, dtype, device)
    if POISON_OUTPUTS:
        return functools.partial(torch.full_like, template, _poison(dtype))
    return functools.partial(torch.empty_like, template)


def new_output_like(t: torch.Tensor, dtype):
    """A contiguous output of `t`'s shape and device in `dtype` (`new_output`'s poisoning)."""
    if POISON_OUTPUTS:
        return torch.full_like(t, float("nan"), dtype=dtype, memory_format=torch.contiguous_format)
    return torch.empty_like(t, dtype=dtype, memory_format=torch.contiguous_format)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n, as `triton.next_power_of_2` (planning imports no Triton)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive b."""
    return -(-a // b)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of `shape`."""
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class RowLayout:
    """Rows of a request: `row_sizes` (outermost first, padded with 1 to `MAX_ROW_DIMS`) with
    their input and output strides, and the column count and strides of the reduced dim."""

    n_rows: int
    n_cols: int
    row_sizes: tuple[int, ...]
    in_row_strides: tuple[int, ...]
    out_row_strides: tuple[int, ...]
    in_col_stride: int
    out_col_stride: int
    # Broadcast operands of the fused family (mask, sinks, the sinks' per-row output), in that
    # order: their row strides (as `in_row_strides`) and column stride; () for a plain request.
    op_row_strides: tuple[tuple[int, ...], ...] = ()
    op_col_strides: tuple[int, ...] = ()
    # Position (in `row_sizes`) of the row dim that holds the innermost logical row dim (the
    # queries of causal attention scores): rows are not always numbered in logical order.
    inner_pos: int = MAX_ROW_DIMS - 1

    @classmethod
    def from_strides(cls, shape: tuple[int, ...], in_strides: tuple[int, ...],
                     out_strides: tuple[int, ...], dim: int,
                     operands: tuple[tuple[int, ...], ...] = (), fastest_where_zero: int | None = None
                     ) -> "RowLayout | None":
        """Normalise; None when more than `MAX_ROW_DIMS` irregular row dims remain. `operands`: the
        strides of broadcast operands. `fastest_where_zero`: an operand whose broadcast row dims
        vary fastest, so that consecutive rows share its row (the heads of one query share a
        [B, 1, Sq, Sk] mask row) and it is read from memory once, not per head."""
        if not shape:  # 0-dim: one row of one element
            zeros = (0,) * MAX_ROW_DIMS
            return cls(1, 1, (1,) * MAX_ROW_DIMS, zeros, zeros, 0, 0, tuple(zeros for _ in operands),
                       tuple(0 for _ in operands))
        all_strides = (in_strides, out_strides, *operands)
        rows: list[list[int]] = []  # [size, stride of each tensor...], outermost first
        for d, size in enumerate(shape):
            if d == dim or size == 1:
                continue
            strides = [st[d] for st in all_strides]
            if rows and all(prev == size * cur for prev, cur in zip(rows[-1][1:], strides)):
                rows[-1] = [rows[-1][0] * size, *strides]
            else:
                rows.append([size, *strides])
        if len(rows) > MAX_ROW_DIMS:
            return None
        inner = len(rows) - 1  # the last entry holds the innermost logical row dim
        if fastest_where_zero is not None and rows:
            k = 3 + fastest_where_zero
            order = sorted(range(len(rows)), key=lambda i: rows[i][k] == 0)  # stable: broadcast dims last
            rows = [rows[i] for i in order]
            inner = order.index(inner)
        pad = MAX_ROW_DIMS - len(rows)
        rows = [[1] + [0] * len(all_strides)] * pad + rows
        return cls(
            n_rows=math.prod(r[0] for r in rows), n_cols=shape[dim],
            row_sizes=tuple(r[0] for r in rows),
            in_row_strides=tuple(r[1] for r in rows),
            out_row_strides=tuple(r[2] for r in rows),
            in_col_stride=in_strides[dim], out_col_stride=out_strides[dim],
            op_row_strides=tuple(tuple(r[3 + k] for r in rows) for k in range(len(operands))),
            op_col_strides=tuple(st[dim] for st in operands),
            inner_pos=max(inner + pad, 0),
        )

    @property
    def inner_div(self) -> int:
        """Rows to divide a row number by before taking the innermost logical row dim's index
        modulo its size: the product of the row dims numbered faster than it."""
        return math.prod(self.row_sizes[self.inner_pos + 1:])


@dataclass(frozen=True)
class ColumnView:
    """A reduction over a non-innermost dim as (n_outer, n_red, n_inner), the inner dim contiguous."""

    n_outer: int
    n_red: int
    n_inner: int
    in_outer_stride: int
    in_red_stride: int
    out_outer_stride: int
    out_red_stride: int


def column_view(layout: RowLayout) -> ColumnView | None:
    """`layout` as a `ColumnView`, or None when it is not one."""
    s0, s1, s2 = layout.row_sizes
    if s0 != 1 or s2 < 2 or layout.in_row_strides[2] != 1 or layout.out_row_strides[2] != 1 \
            or layout.in_col_stride == 1 or layout.out_col_stride == 1:
        return None
    return ColumnView(s1, layout.n_cols, s2, layout.in_row_strides[1], layout.in_col_stride,
                      layout.out_row_strides[1], layout.out_col_stride)


def operand_strides(spec, materialised: bool = False) -> tuple[tuple[int, ...], ...]:
    """The strides the kernels read the fused operands with: the mask's broadcast view (in place, or
    with `materialised` copied to x's shape), and with sinks or a row scale two per-row tensors
    (`row_operand_strides`: the operand, copied to that layout as docs/kernels.md says, and the sink
    shares the kernels write)."""
    v = getattr(spec, "variant", None)
    if v is None:
        return ()
    out = [] if v.mask is None else [contiguous_strides(spec.shape) if materialised else v.mask.strides]
    if v.sinks is not None or v.row_scale is not None:
        out += [row_operand_strides(spec.shape, spec.dim)] * 2
    return tuple(out)


def row_operand_strides(shape: tuple[int, ...], dim: int) -> tuple[int, ...]:
    """Strides of a per-row operand contiguous over `shape` with size 1 in `dim` (0 along `dim`)."""
    rows = contiguous_strides(tuple(1 if d == dim else s for d, s in enumerate(shape)))
    return tuple(0 if d == dim else st for d, st in enumerate(rows))


def mask_fastest(spec, in_strides, out_strides) -> int | None:
    """`fastest_where_zero` for a request: the mask (operand 0) when the reduction is over the
    last, contiguous dim (the column kernels number rows in logical order), else None."""
    v = getattr(spec, "variant", None)
    if v is None or v.mask is None or not spec.shape or spec.dim != len(spec.shape) - 1:
        return None
    return 0 if in_strides[spec.dim] == 1 and out_strides[spec.dim] == 1 else None


def allocate_rows(x, spec):
    """(x, y, layout): a new contiguous output and the tensors described as rows. `x` is the one
    copy this library makes (`x.contiguous()`) when its row dims need more than `MAX_ROW_DIMS`;
    `layout` is None when a broadcast operand's own strides still need more (the caller copies it)."""
    y = new_output(spec.shape, spec.out_dtype, x.device)
    ops = operand_strides(spec)
    layout = RowLayout.from_strides(spec.shape, tuple(x.stride()), tuple(y.stride()), spec.dim, ops,
                                    mask_fastest(spec, x.stride(), y.stride()))
    if layout is None:
        x = x.contiguous()
        layout = RowLayout.from_strides(spec.shape, tuple(x.stride()), tuple(y.stride()), spec.dim, ops,
                                        mask_fastest(spec, x.stride(), y.stride()))
    return x, y, layout
