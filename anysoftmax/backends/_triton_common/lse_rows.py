"""logsumexp from the softmax forward's row kernels (docs/speed.md): the softmax's own plan with
STATES_ONLY stores each row's lse instead of the row (split: the statistics pass, the last chunk
combining). Column plans have no such form (`ROW_KINDS`): `logsumexp.lse_kernel` serves them."""

from __future__ import annotations

from dataclasses import replace

import torch

from ...core.layout import RowLayout, contiguous_strides, mask_fastest, operand_strides, output_maker, row_operand_strides
from ...core.lse_merge import row_shape
from ...core.spec import SoftmaxSpec
from ...core.variant import Operands
from .launcher import bind
from .plan import PLAIN_SCALARS, KernelPlan, scalars
from .softmax_launchers import mask_operand, row_scale_operand, sinks_operand

# Plan kinds whose kernels have the STATES_ONLY form.
ROW_KINDS = ("tile", "online", "split")


def layouts(x: torch.Tensor, spec: SoftmaxSpec):
    """(x, planning layout, launch layout, materialise): the planning layout is the softmax's own
    (logsumexp shares its plan and memo entry), the launch layout the same but writing through
    the result's strides. x is copied only when its row dims do not fit three strided dims, the
    operands materialised only when theirs do not either."""
    shape, dim = spec.shape, spec.dim
    y_like, out = contiguous_strides(shape), row_operand_strides(shape, dim)
    for materialise in (False, True):
        ops = operand_strides(spec, materialise)
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


def launcher(plan: KernelPlan, layout: RowLayout, spec: SoftmaxSpec, materialise: bool, copy_x: bool = False,
             shape: tuple | None = None):
    """`f(x, operands) -> lse` (accumulation dtype; keepdim, or `shape`) for requests like `spec`
    through the forward row `plan`'s STATES_ONLY form, x read as `layout` (a copy with `copy_x`)."""
    plan = replace(plan.non_cooperative(), states_only=True)
    # Constexprs from the softmax's output dtype: the same PRECISE (softcap's tanh) and
    # accumulation as the softmax; the store converts to the result's dtype.
    launch = bind(plan, layout, False, spec.out_dtype, spec.device)
    # (`layout`'s result strides, a contiguous keepdim result's, write a result without dim alike)
    new_lse = output_maker(row_shape(spec.shape, spec.dim) if shape is None else shape, spec.acc_dtype, spec.device)
    v = spec.variant
    plain_values = v.scale is None and v.softcap is None and v.row_scale is None
    plain = plain_values and v.mask is None and v.sinks is None  # (the request key says they are absent)

    def run(x: torch.Tensor, operands: Operands) -> torch.Tensor:
        if copy_x:
            x = x.contiguous()
        out = new_lse()
        if plain:
            launch((x, out, None, None, None, None))
        else:  # (PLAIN_SCALARS itself: the bound launcher's fast path passes it pre-joined)
            launch((x, out, mask_operand(operands.mask, spec, materialise),
                    sinks_operand(operands.sinks, spec), None, row_scale_operand(operands, spec)),
                   PLAIN_SCALARS if plain_values else scalars(operands.scale, operands.softcap))
        return out

    return run
