"""Launching the shared softmax kernels: a `KernelPlan` (chosen by a backend) applied to rows."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.layout import RowLayout
from .softmax import softmax_online_kernel, softmax_tile_kernel

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class KernelPlan:
    """Which kernel, with which tile, on how many programs.

    kind: "tile" (a row fits in one BLOCK_N tile, BLOCK_M rows per step) or "online"
    (a row is walked in BLOCK_N sub-blocks). `options` are extra launch options a backend needs
    (`num_warps`/`num_stages` on GPUs, `multibuffer` on Ascend).
    """

    kind: str
    block_m: int
    block_n: int
    grid: int
    options: dict = field(default_factory=dict)


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return type(softmax_tile_kernel).__name__ == "InterpretedFunction"


def kernel_for(kind: str):
    return {"tile": softmax_tile_kernel, "online": softmax_online_kernel}[kind]


def kernel_args(x: torch.Tensor, y: torch.Tensor, layout: RowLayout) -> tuple:
    """Positional arguments shared by both kernels."""
    _, s1, s2 = layout.row_sizes
    return (x, y, layout.n_rows, layout.n_cols, s1, s2, *layout.in_row_strides, layout.in_col_stride,
            *layout.out_row_strides, layout.out_col_stride)


def kernel_constexprs(plan: KernelPlan, layout: RowLayout, log: bool, out_dtype: torch.dtype) -> dict:
    """Compile-time parameters of the plan's kernel."""
    # Column offsets are int32 unless the row's extent in elements could overflow it.
    col_extent = (layout.n_cols - 1) * max(abs(layout.in_col_stride), abs(layout.out_col_stride))
    meta = dict(LOG=log, ACC_FP64=out_dtype == torch.float64, WIDE_COLS=col_extent > INT32_MAX,
                BLOCK_N=plan.block_n)
    if plan.kind == "tile":
        meta.update(BLOCK_M=plan.block_m, NUM_STAGES=plan.options.get("num_stages", 1))
    return meta


def launch(plan: KernelPlan, x: torch.Tensor, y: torch.Tensor, layout: RowLayout, log: bool) -> None:
    """Run `plan` writing the softmax of rows of `x` into `y`."""
    meta = kernel_constexprs(plan, layout, log, y.dtype)
    opts = {k: v for k, v in plan.options.items() if k != "num_stages"}
    kernel_for(plan.kind)[(plan.grid,)](*kernel_args(x, y, layout), **meta, **opts)
