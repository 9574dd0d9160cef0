"""Kernel plans: which shared kernel, with which tile, on how many programs — one type per
kernel kind, each building its own launch arguments. Pure data and arithmetic: no launches,
no process state (that is `launcher.py`), no device queries (that is the backend's planner).

A backend decides a plan from the request, the device and its tuning table; `launcher.bind`
turns a plan into a launcher for one request layout.

Kinds (forward): "tile" (a row fits one BLOCK_N tile, BLOCK_M rows per step), "online" (one
program walks a row in BLOCK_N sub-blocks), "split" (a row is cut into `chunks` pieces held by
different programs; `cooperative` fuses the statistics and normalisation phases in one launch
with a per-row barrier, else two launches), "cols" / "cols_split" (the transposed forms for a
reduction over a non-innermost dim, `core.layout.ColumnView`: BLOCK_N reduction steps x
BLOCK_M contiguous inner positions). Backward: "tile" (whole rows) and "split".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ...core.layout import RowLayout, column_view, next_power_of_2

INT32_MAX = 2**31 - 1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _row_strides(layout: RowLayout) -> tuple:
    _, s1, s2 = layout.row_sizes
    return (s1, s2, *layout.in_row_strides, layout.in_col_stride, *layout.out_row_strides, layout.out_col_stride)


def flat_rows(layout: RowLayout) -> bool:
    """True when the rows form one (size, stride) dimension: the tile kernel then addresses
    them as `rows * stride` (no div/mod), the form triton-ascend lowers to bounded loads."""
    return layout.row_sizes[0] == 1 and layout.row_sizes[1] == 1


def _wide_cols(layout: RowLayout, block_n: int) -> bool:
    # Column offsets are int32 unless the row's extent in elements could overflow it.
    extent = (layout.n_cols - 1) * max(abs(layout.in_col_stride), abs(layout.out_col_stride)) + block_n
    return extent > INT32_MAX


@dataclass(frozen=True)
class KernelPlan:
    """Common fields of every plan. `options` are launch options the backend needs
    (`num_warps` on GPUs, `multibuffer` on Ascend; `num_stages` is passed as a constexpr)."""

    block_m: int
    block_n: int
    grid: int
    options: dict = field(default_factory=dict)
    chunks: int = 1
    cooperative: bool = False
    prefetch: bool = False

    kind: ClassVar[str] = ""
    split: ClassVar[bool] = False  # programs of one row (group) combine partial statistics
    backward: ClassVar[bool] = False

    def kernel(self):
        """The @triton.jit function this plan launches (imported on first use: Triton decides
        at definition time whether kernels run compiled or interpreted)."""
        raise NotImplementedError

    def launch_options(self) -> dict:
        return {k: v for k, v in self.options.items() if k != "num_stages"}

    def phases(self) -> tuple:
        """PHASE values of the launches: one fused launch (0), or statistics then
        normalisation (1, 2) for a split plan that is not cooperative."""
        return (1, 2) if self.split and not self.cooperative else (0,)

    def groups(self, layout: RowLayout) -> int:
        """Rows (or column groups) whose chunks meet at one barrier."""
        return layout.n_rows

    def work_items(self, layout: RowLayout) -> int:
        """The most programs that can have work."""
        return _cdiv(layout.n_rows, self.block_m)

    def stats_numel(self, layout: RowLayout) -> int:
        """Elements (fp32; fp64 for fp64 outputs) of partial statistics the launch needs."""
        return 0

    def constexprs(self, layout: RowLayout, log: bool, out_dtype: torch.dtype, phase: int = 0) -> dict:
        raise NotImplementedError

    def static_args(self, layout: RowLayout) -> tuple:
        """The integer arguments after the tensors (and, for split kinds, the scratch)."""
        raise NotImplementedError

    def head(self, tensors: tuple, stats, counts) -> tuple:
        """The pointer arguments: the tensors, then the scratch where the kernel takes it."""
        return (*tensors, stats, counts) if self.split else tensors

    def calls(self, tensors: tuple, layout: RowLayout, log: bool, out_dtype: torch.dtype,
              stats=None, counts=None) -> list:
        """[(kernel, args, constexprs)] of the launches that run this plan."""
        args = self.head(tensors, stats, counts) + self.static_args(layout)
        return [(self.kernel(), args, self.constexprs(layout, log, out_dtype, p)) for p in self.phases()]


@dataclass(frozen=True)
class TilePlan(KernelPlan):
    kind: ClassVar[str] = "tile"

    def kernel(self):
        from .rows import softmax_tile_kernel
        return softmax_tile_kernel

    def static_args(self, layout):
        return (layout.n_rows, layout.n_cols, *_row_strides(layout))

    def constexprs(self, layout, log, out_dtype, phase=0):
        return dict(LOG=log, ACC_FP64=out_dtype == torch.float64, WIDE_COLS=_wide_cols(layout, self.block_n),
                    BLOCK_M=self.block_m, BLOCK_N=self.block_n, NUM_STAGES=self.options.get("num_stages", 1),
                    FLAT_ROWS=flat_rows(layout))


@dataclass(frozen=True)
class OnlinePlan(KernelPlan):
    kind: ClassVar[str] = "online"

    def kernel(self):
        from .rows import softmax_online_kernel
        return softmax_online_kernel

    def static_args(self, layout):
        return (layout.n_rows, layout.n_cols, *_row_strides(layout))

    def constexprs(self, layout, log, out_dtype, phase=0):
        return dict(LOG=log, ACC_FP64=out_dtype == torch.float64, WIDE_COLS=_wide_cols(layout, self.block_n),
                    BLOCK_N=self.block_n)


@dataclass(frozen=True)
class SplitPlan(KernelPlan):
    kind: ClassVar[str] = "split"
    split: ClassVar[bool] = True

    def kernel(self):
        from .rows import softmax_split_kernel
        return softmax_split_kernel

    def work_items(self, layout):
        return layout.n_rows * self.chunks

    def stats_numel(self, layout):
        return layout.n_rows * self.chunks * 2  # (max, sum) per chunk

    def static_args(self, layout):
        return (layout.n_rows, layout.n_cols, self.chunks, *_row_strides(layout))

    def constexprs(self, layout, log, out_dtype, phase=0):
        return dict(LOG=log, ACC_FP64=out_dtype == torch.float64, WIDE_COLS=_wide_cols(layout, self.block_n),
                    CHUNK=self.block_n, G_POW2=next_power_of_2(self.chunks), PHASE=phase,
                    PREFETCH=self.prefetch)


@dataclass(frozen=True)
class ColsPlan(KernelPlan):
    kind: ClassVar[str] = "cols"

    def kernel(self):
        from .cols import softmax_cols_kernel
        return softmax_cols_kernel

    def groups(self, layout):
        v = column_view(layout)
        return v.n_outer * _cdiv(v.n_inner, self.block_m)

    def work_items(self, layout):
        return self.groups(layout) * self.chunks

    def _sizes_strides(self, layout) -> tuple:
        v = column_view(layout)
        return (v.n_outer, v.n_red, v.n_inner), (v.in_outer_stride, v.in_red_stride, v.out_outer_stride,
                                                 v.out_red_stride)

    def static_args(self, layout):
        sizes, strides = self._sizes_strides(layout)
        return (*sizes, *strides)

    def _common_constexprs(self, layout, log, out_dtype) -> dict:
        # Reduction steps past N are masked but still multiplied by the stride: cover the tile.
        reach = max(layout.n_cols, self.block_n * self.chunks) + layout.row_sizes[2]
        stride = max(abs(layout.in_col_stride), abs(layout.out_col_stride), 1)
        return dict(LOG=log, ACC_FP64=out_dtype == torch.float64, WIDE=reach * stride > INT32_MAX)

    def constexprs(self, layout, log, out_dtype, phase=0):
        return dict(self._common_constexprs(layout, log, out_dtype), BLOCK_N=self.block_n, BLOCK_I=self.block_m)


@dataclass(frozen=True)
class ColsSplitPlan(ColsPlan):
    kind: ClassVar[str] = "cols_split"
    split: ClassVar[bool] = True

    def kernel(self):
        from .cols import softmax_cols_split_kernel
        return softmax_cols_split_kernel

    def stats_numel(self, layout):
        return self.groups(layout) * self.chunks * 2 * self.block_m  # (max, sum) per inner position

    def static_args(self, layout):
        sizes, strides = self._sizes_strides(layout)
        return (*sizes, self.chunks, *strides)

    def constexprs(self, layout, log, out_dtype, phase=0):
        return dict(self._common_constexprs(layout, log, out_dtype), CHUNK=self.block_n, BLOCK_I=self.block_m,
                    G_POW2=next_power_of_2(self.chunks), PHASE=phase)


@dataclass(frozen=True)
class BackwardTilePlan(KernelPlan):
    """dx from (y, dy): whole rows, BLOCK_M rows per step."""

    kind: ClassVar[str] = "tile"
    backward: ClassVar[bool] = True

    def kernel(self):
        from .bwd import softmax_bwd_kernel
        return softmax_bwd_kernel

    def head(self, tensors, stats, counts):
        return (*tensors, stats, counts)  # the one backward kernel always takes the scratch

    def static_args(self, layout):
        _, s1, s2 = layout.row_sizes
        return (layout.n_rows, layout.n_cols, self.chunks, s1, s2, *layout.in_row_strides, layout.in_col_stride)

    def constexprs(self, layout, log, out_dtype, phase=0):
        single = not self.split
        return dict(LOG=log, ACC_FP64=out_dtype == torch.float64, SINGLE=single,
                    BLOCK_M=self.block_m if single else 1, CHUNK=self.block_n,
                    G_POW2=next_power_of_2(self.chunks), PHASE=phase)


@dataclass(frozen=True)
class BackwardSplitPlan(BackwardTilePlan):
    """dx from (y, dy): rows cut into chunks that share one partial sum per chunk."""

    kind: ClassVar[str] = "split"
    split: ClassVar[bool] = True

    def work_items(self, layout):
        return layout.n_rows * self.chunks

    def stats_numel(self, layout):
        return layout.n_rows * self.chunks


FORWARD_PLANS = {p.kind: p for p in (TilePlan, OnlinePlan, SplitPlan, ColsPlan, ColsSplitPlan)}
BACKWARD_PLANS = {p.kind: p for p in (BackwardTilePlan, BackwardSplitPlan)}
SPLIT_KINDS = tuple(k for k, p in FORWARD_PLANS.items() if p.split)


def make_plan(kind: str, block_m: int, block_n: int, grid: int, backward: bool = False, **fields) -> KernelPlan:
    """The plan type for `kind` (forward, or backward when `backward`) with these fields."""
    table = BACKWARD_PLANS if backward else FORWARD_PLANS
    if kind not in table:
        raise ValueError(f"unknown {'backward' if backward else 'forward'} kernel kind {kind!r}; "
                         f"known: {', '.join(table)}")
    return table[kind](block_m, block_n, grid, **fields)
