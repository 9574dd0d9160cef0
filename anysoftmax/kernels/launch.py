"""Launching the shared softmax kernels: a `KernelPlan` (chosen by a backend) applied to rows."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton

from ..core.layout import RowLayout
from .softmax import softmax_online_kernel, softmax_split_kernel, softmax_tile_kernel

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class KernelPlan:
    """Which kernel, with which tile, on how many programs.

    kind: "tile" (a row fits in one BLOCK_N tile, BLOCK_M rows per step), "online" (a row is
    walked in BLOCK_N sub-blocks by one program) or "split" (a row is cut into `chunks` pieces of
    BLOCK_N held by different programs; `cooperative` fuses the two phases in one launch).
    `align` > 1 reads rows through 16-byte aligned windows (tile kernel, contiguous rows).
    `options` are extra launch options a backend needs (`num_warps`/`num_stages` on GPUs,
    `multibuffer` on Ascend).
    """

    kind: str
    block_m: int
    block_n: int
    grid: int
    options: dict = field(default_factory=dict)
    align: int = 1
    chunks: int = 1
    cooperative: bool = False


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return type(softmax_tile_kernel).__name__ == "InterpretedFunction"


KERNELS = {"tile": softmax_tile_kernel, "online": softmax_online_kernel, "split": softmax_split_kernel}


def kernel_for(kind: str):
    return KERNELS[kind]


def strides_args(layout: RowLayout) -> tuple:
    _, s1, s2 = layout.row_sizes
    return (s1, s2, *layout.in_row_strides, layout.in_col_stride, *layout.out_row_strides, layout.out_col_stride)


def kernel_args(x: torch.Tensor, y: torch.Tensor, layout: RowLayout) -> tuple:
    """Positional arguments of the tile and online kernels."""
    return (x, y, layout.n_rows, layout.n_cols, *strides_args(layout))


def split_args(plan: KernelPlan, x, y, layout: RowLayout, stats, counts) -> tuple:
    """Positional arguments of the split kernel."""
    return (x, y, stats, counts, layout.n_rows, layout.n_cols, plan.chunks, *strides_args(layout))


def aligned_rows(layout: RowLayout, elem_bytes: int) -> int:
    """Elements per 16-byte window if rows may be read through aligned windows, else 1: only
    for unit-stride rows laid out identically in input and output (both contiguous) whose row
    strides are not already multiples of 16 bytes."""
    vec = 16 // elem_bytes
    same = layout.in_row_strides == layout.out_row_strides and layout.in_col_stride == layout.out_col_stride == 1
    if vec <= 1 or not same or all(s % vec == 0 for s in layout.in_row_strides):
        return 1
    return vec


def kernel_constexprs(plan: KernelPlan, layout: RowLayout, log: bool, out_dtype: torch.dtype, phase: int = 0) -> dict:
    """Compile-time parameters of the plan's kernel."""
    # Column offsets are int32 unless the row's extent in elements could overflow it.
    col_extent = (layout.n_cols - 1) * max(abs(layout.in_col_stride), abs(layout.out_col_stride)) + plan.block_n
    meta = dict(LOG=log, ACC_FP64=out_dtype == torch.float64, WIDE_COLS=col_extent > INT32_MAX)
    if plan.kind == "tile":
        meta.update(BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, NUM_STAGES=plan.options.get("num_stages", 1),
                    ALIGN=plan.align)
    elif plan.kind == "online":
        meta.update(BLOCK_N=plan.block_n)
    else:
        meta.update(CHUNK=plan.block_n, G_POW2=triton.next_power_of_2(plan.chunks), PHASE=phase)
    return meta


def launch_options(plan: KernelPlan) -> dict:
    return {k: v for k, v in plan.options.items() if k != "num_stages"}


def launch(plan: KernelPlan, x: torch.Tensor, y: torch.Tensor, layout: RowLayout, log: bool) -> None:
    """Run `plan` writing the softmax of rows of `x` into `y`."""
    opts = launch_options(plan)
    if plan.kind != "split":
        meta = kernel_constexprs(plan, layout, log, y.dtype)
        kernel_for(plan.kind)[(plan.grid,)](*kernel_args(x, y, layout), **meta, **opts)
        return
    # Scratch of a split launch: (max, sum) per chunk and an arrival counter per row.
    acc = torch.float64 if y.dtype == torch.float64 else torch.float32
    stats = torch.empty(layout.n_rows * plan.chunks * 2, dtype=acc, device=x.device)
    counts = torch.zeros(layout.n_rows if plan.cooperative else 1, dtype=torch.int32, device=x.device)
    args = split_args(plan, x, y, layout, stats, counts)
    for phase in ((0,) if plan.cooperative else (1, 2)):
        meta = kernel_constexprs(plan, layout, log, y.dtype, phase)
        softmax_split_kernel[(plan.grid,)](*args, **meta, **opts)
