"""logsumexp from the softmax forward's row kernels: the same plan (`KernelPlan`: kind, tiles,
warps, grid from the occupancy model), launched with STATES_ONLY so the kernels close each
row's statistics into ``lse = m + log(s)`` and write that one float instead of the row.

logsumexp is the softmax forward's first half: the same reads of x (16-byte loads, several
short rows per program, whole rows in registers, rows split across programs), and one float
per row written instead of N. Serving it from the kernels that already reach the copy
bandwidth for softmax gives it that bandwidth without a second set of tiles to tune.

* tile / online plans: one launch; the row's lse is stored through the output layout's row
  strides, here those of the [..., 1, ...] result (contiguous over the row shape).
* split plans (long rows, few of them): the statistics pass alone (no barrier, never
  cooperative), each chunk writing its own lse to the scratch; the row's last chunk to finish
  (the reused, self-resetting row counters) combines the row's chunks and the sink into the
  result, in the same launch.
* column plans (a reduction over a non-innermost dim read as transposed tiles) are not
  served here: `row_plan_kind` says so and the caller keeps `logsumexp.lse_kernel` for them.

Special values (`core.pieces`): nothing kept is -inf (the sink's value with a sink), NaN
anywhere NaN, +inf (without NaN) +inf; `fused.lse_sub` keeps the infinities out of exp's
argument, the sums carry NaN where the GPU's max (fmax) drops it.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ...core.layout import RowLayout, contiguous_strides, mask_fastest, operand_strides, output_maker, row_operand_strides
from ...core.pieces import row_shape
from ...core.spec import SoftmaxSpec
from ...core.variant import Operands
from .launcher import bind
from .plan import PLAIN_SCALARS, KernelPlan, scalars
from .softmax_launchers import mask_operand, materialised_strides, sinks_operand

# Plan kinds whose kernels have the STATES_ONLY form.
ROW_KINDS = ("tile", "online", "split")


def layouts(x: torch.Tensor, spec: SoftmaxSpec):
    """(x, planning layout, launch layout, materialise). The planning layout is the softmax's
    own (a contiguous output of x's shape), so logsumexp shares softmax's plan (and its memo
    entry) and never changes it; the launch layout reads x and the operands the same way but
    writes through the result's strides. x is copied (contiguous) only when its row dims do not
    fit three strided dims, the operands materialised only when theirs do not either (as
    `softmax_launchers.forward_layout`). The result is contiguous over the row shape."""
    shape, dim = spec.shape, spec.dim
    y_like, out = contiguous_strides(shape), row_operand_strides(shape, dim)
    for materialise in (False, True):
        ops = materialised_strides(spec) if materialise else operand_strides(spec)
        for xx in ((x,) if materialise else (x, None)):
            xx = x.contiguous() if xx is None else xx
            st = tuple(xx.stride())
            fastest = None if materialise else mask_fastest(spec, st, y_like)
            planning = RowLayout.from_strides(shape, st, y_like, dim, ops, fastest)
            launch = RowLayout.from_strides(shape, st, out, dim, ops, fastest)
            if planning is not None and launch is not None:
                return xx, planning, launch, materialise
        x = x.contiguous()
    raise ValueError(f"logsumexp: no row layout for shape {list(shape)}")  # (contiguous always has one)


def row_plan_kind(plan: KernelPlan) -> bool:
    """Whether `plan` (a forward softmax plan) has the row kernels' STATES_ONLY form."""
    return plan.kind in ROW_KINDS and not plan.backward


def launcher_for(plan: KernelPlan, layout: RowLayout, spec: SoftmaxSpec, materialise: bool):
    """`launcher(...)` when `plan` is a row kind, else None (the caller's fallback serves it)."""
    return launcher(plan, layout, spec, materialise) if row_plan_kind(plan) else None


def launcher(plan: KernelPlan, layout: RowLayout, spec: SoftmaxSpec, materialise: bool):
    """`f(x, operands) -> lse` (keepdim, accumulation dtype) for requests like `spec`, through
    `plan`'s row kernel in its STATES_ONLY form; x laid out as `layout` (`layouts`)."""
    plan = replace(plan.non_cooperative(), states_only=True)
    # Constexprs from the softmax's output dtype: the same PRECISE (softcap's tanh) and
    # accumulation as the softmax; the store converts to the result's dtype.
    launch = bind(plan, layout, False, spec.out_dtype, spec.device)
    new_lse = output_maker(row_shape(spec.shape, spec.dim), spec.acc_dtype, spec.device)
    v = spec.variant
    plain_values = v.scale is None and v.softcap is None
    if plain_values and v.mask is None and v.sinks is None:  # (the request key says the operands are absent)
        def run_plain(x: torch.Tensor, operands: Operands) -> torch.Tensor:
            out = new_lse()
            launch((x, out, None, None, None))
            return out

        return run_plain

    def run(x: torch.Tensor, operands: Operands) -> torch.Tensor:
        out = new_lse()
        # (PLAIN_SCALARS itself: the bound launcher's fast path passes it pre-joined)
        launch((x, out, mask_operand(operands.mask, spec, materialise), sinks_operand(operands.sinks, spec), None),
               PLAIN_SCALARS if plain_values else scalars(operands.scale, operands.softcap))
        return out

    return run


__all__ = ["ROW_KINDS", "launcher", "launcher_for", "layouts", "row_plan_kind"]
