"""The softmax's launchers bound to one request, shared by the `triton` and `triton_ascend`
backends: the one `run` both use. A backend plans (its own rules); these functions lay the
operands out as the plan's kernels read them and launch through `launcher.bind`.

Plain requests: `f(x) -> y` and `f(y, grad) -> dx`. Fused ones (`core.variant`):
`f(x, operands) -> (y, p_sink)` and `f(grad, y, x, operands, p_sink) -> (dx, ds_rows)`.
"""

from __future__ import annotations

import torch

from ...core.layout import (POISON_OUTPUTS, RowLayout, allocate_rows, contiguous_strides, mask_fastest, new_output,
                            operand_strides, row_operand_strides)
from ...core.spec import SoftmaxSpec
from ...core.variant import Operands
from .launcher import bind
from .plan import KernelPlan, scalars


def row_shape(spec: SoftmaxSpec) -> tuple:
    """The shape of per-row statistics: the input's with size 1 in `dim`."""
    return tuple(1 if d == spec.dim else s for d, s in enumerate(spec.shape))


def mask_operand(mask: torch.Tensor | None, spec: SoftmaxSpec, materialise: bool,
                 as_bytes: bool = True) -> torch.Tensor | None:
    """The mask as the kernels read it: a bool mask as bytes (nonzero = excluded); with
    `materialise`, the broadcast view copied to the input's shape (only for operand layouts
    too irregular for three row dims: `core.layout.allocate_rows`). `as_bytes=False` keeps a
    bool mask bool (the kernels load it as a byte either way): Inductor cannot lower a dtype
    view of a bool graph input, so compiled graphs hand the kernels the bool tensor itself."""
    if mask is None:
        return None
    if materialise:
        mask = mask.expand(spec.shape).contiguous()
    return mask.view(torch.uint8) if as_bytes and mask.dtype == torch.bool else mask


def sinks_operand(sinks: torch.Tensor | None, spec: SoftmaxSpec) -> torch.Tensor | None:
    """The sinks as the kernels read them: one value per row, contiguous over the input's row
    shape (`core.layout.operand_strides` says why; no copy when they already are)."""
    if sinks is None:
        return None
    return sinks.expand(row_shape(spec)).contiguous()


def materialised_strides(spec: SoftmaxSpec) -> tuple:
    """`core.layout.operand_strides` of the operands copied to the input's shape (the mask,
    contiguous) and row shape (the sinks and their per-row output)."""
    v = spec.variant
    out = [contiguous_strides(spec.shape)] if v.mask is not None else []
    if v.sinks is not None:
        out += [row_operand_strides(spec.shape, spec.dim)] * 2
    return tuple(out)


def forward_layout(x: torch.Tensor, spec: SoftmaxSpec):
    """(x, y, layout, materialise): `allocate_rows`, and when the operands' own strides need more
    than three row dims even after that, the layout of materialised (contiguous) operands."""
    x, y, layout = allocate_rows(x, spec)
    if layout is not None:
        return x, y, layout, False
    x = x.contiguous()
    layout = RowLayout.from_strides(spec.shape, tuple(x.stride()), tuple(y.stride()), spec.dim,
                                    materialised_strides(spec))
    return x, y, layout, True


def backward_layout(y: torch.Tensor, spec: SoftmaxSpec) -> tuple[RowLayout, bool]:
    # y (contiguous), dy and dx (and x) share one row layout; the mask has its own strides.
    ops = operand_strides(spec)
    st = tuple(y.stride())
    layout = RowLayout.from_strides(spec.shape, st, st, spec.dim, ops, mask_fastest(spec, st, st))
    if layout is not None:
        return layout, False
    return RowLayout.from_strides(spec.shape, st, st, spec.dim, materialised_strides(spec)), True


def forward(plan: KernelPlan, layout: RowLayout, spec: SoftmaxSpec, contiguous: bool = False, guard=None,
            materialise: bool = False):
    """`f(x) -> y` (plain) or `f(x, operands) -> (y, p_sink)` (fused) for requests like `spec`:
    allocates the outputs, makes `x` contiguous first when its rows needed that (`contiguous`:
    the one copy `core.layout.allocate_rows` makes) and launches `plan` on the device's current
    stream. `materialise`: the operands' broadcast views are copied (see `mask_operand`)."""
    launch = bind(plan, layout, spec.log, spec.out_dtype, spec.device, guard)
    shape, dtype, device = spec.shape, spec.out_dtype, spec.device

    if spec.is_plain:
        # A contiguous input of the output's dtype: empty_like is the cheapest allocation (the
        # memo key fixes strides and dtype, so this holds for every call of the request).
        if not POISON_OUTPUTS and not contiguous and spec.in_dtype == dtype and spec.strides == contiguous_strides(shape):
            def run_like(x: torch.Tensor) -> torch.Tensor:
                y = torch.empty_like(x)
                launch((x, y, None, None, None))
                return y

            return run_like

        def run(x: torch.Tensor) -> torch.Tensor:
            if contiguous:
                x = x.contiguous()
            y = new_output(shape, dtype, device)
            launch((x, y, None, None, None))
            return y

        return run

    has_sinks = plan.fusion.has_sink
    p_shape = row_shape(spec)

    def run_fused(x: torch.Tensor, ops: Operands):
        if contiguous:
            x = x.contiguous()
        y = new_output(shape, dtype, device)
        p = torch.empty(p_shape, dtype=spec.acc_dtype, device=device) if has_sinks else None
        launch((x, y, mask_operand(ops.mask, spec, materialise), sinks_operand(ops.sinks, spec), p),
               scalars(ops.scale, ops.softcap))
        return y, p

    return run_fused


def backward(plan: KernelPlan, layout: RowLayout, spec: SoftmaxSpec, guard=None, materialise: bool = False):
    """`f(y, grad) -> dx` (plain) or `f(grad, y, x, operands, p_sink) -> (dx, ds_rows)` (fused)
    for requests like `spec` (y contiguous, row layout `layout`); `grad` (and x, read with
    softcap) are converted to y's dtype and made contiguous when they are not already."""
    launch = bind(plan, layout, spec.log, spec.out_dtype, spec.device, guard)
    shape, dtype, device = spec.shape, spec.out_dtype, spec.device

    if spec.is_plain:
        def run(y: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
            y, grad = backward_operands(y, grad, dtype)
            # (y is now contiguous in the output's dtype: empty_like is the cheapest allocation)
            dx = new_output(shape, dtype, device) if POISON_OUTPUTS else torch.empty_like(y)
            launch((y, grad, dx, None, None, None, None))
            return dx

        return run

    f = plan.fusion
    p_shape = row_shape(spec)

    def run_fused(grad: torch.Tensor, y: torch.Tensor, x, ops: Operands, p_sink):
        y, grad = backward_operands(y, grad, dtype)
        dx = new_output(shape, dtype, device)
        xs = x.to(dtype).contiguous() if f.has_cap else None  # (the forward's rounding of x)
        ds = torch.empty(p_shape, dtype=spec.acc_dtype, device=device) if f.has_sink else None
        p = p_sink.contiguous() if f.has_sink else None
        launch((y, grad, dx, xs, mask_operand(ops.mask, spec, materialise), p, ds), scalars(ops.scale, ops.softcap))
        return dx, ds

    return run_fused


def backward_operands(y: torch.Tensor, grad: torch.Tensor, dtype: torch.dtype) -> tuple:
    """(y, grad) as the backward kernels read them: both contiguous, grad in y's dtype."""
    y = y.contiguous()
    if grad.dtype != dtype or not grad.is_contiguous():
        grad = grad.to(dtype).contiguous()
    return y, grad
