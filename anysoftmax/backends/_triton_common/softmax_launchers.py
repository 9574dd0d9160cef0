"""The softmax's launchers of one request (`launcher.bind`), the operands laid out as the plan's
kernels (and `traced.launch`) read them. Plain: `f(x) -> y`, `f(y, grad) -> dx`; fused:
`f(x, operands) -> (y, p_sink)`, `f(grad, y, x, operands, p_sink) -> (dx, ds_rows)`."""

from __future__ import annotations

import torch

from ...core.layout import (POISON_OUTPUTS, RowLayout, allocate_rows, contiguous_strides, mask_fastest, new_output,
                            operand_strides, row_operand_strides)
from ...core.lse_merge import row_shape
from ...core.spec import SoftmaxSpec
from ...core.variant import Operands
from .launcher import bind
from .plan import KernelPlan, scalars


def mask_operand(mask: torch.Tensor | None, spec: SoftmaxSpec, materialise: bool,
                 as_bytes: bool = True) -> torch.Tensor | None:
    """The mask as the kernels read it: bool as bytes (nonzero = excluded) unless `as_bytes=False`
    (Inductor cannot lower a bool input's dtype view); `materialise`: copied to the input's shape."""
    if mask is None:
        return None
    if materialise:
        mask = mask.expand(spec.shape).contiguous()
    return mask.view(torch.uint8) if as_bytes and mask.dtype == torch.bool else mask


def sinks_operand(sinks: torch.Tensor | None, spec: SoftmaxSpec) -> torch.Tensor | None:
    """The sinks (or a row scale) as the kernels read them: contiguous over the input's row shape."""
    return None if sinks is None else sinks.expand(row_shape(spec.shape, spec.dim)).contiguous()


def stand_in_operands(spec: SoftmaxSpec, device, full: bool = False) -> tuple:
    """(mask, sinks, p_sink, row scale) of the variant's dtypes for a first compile, zero-filled:
    16 elements (the code depends on dtypes, not sizes), or with `full` the shapes the request reads."""
    v = spec.variant
    shape, rows = (spec.shape, row_shape(spec.shape, spec.dim)) if full else ((16,), (16,))
    dtypes = (None if v.mask is None else torch.uint8 if v.mask_kind == "bool" else v.mask.dtype,
              None if v.sinks is None else v.sinks.dtype, None if v.sinks is None else spec.acc_dtype,
              None if v.row_scale is None else v.row_scale.dtype)
    return tuple(None if d is None else torch.zeros(size, dtype=d, device=device)
                 for d, size in zip(dtypes, (shape, rows, rows, rows)))


def forward_layout(x: torch.Tensor, spec: SoftmaxSpec):
    """(x, y, layout, materialise): `allocate_rows`'s, else a contiguous x and materialised operands."""
    x, y, layout = allocate_rows(x, spec)
    if layout is not None:
        return x, y, layout, False
    x = x.contiguous()
    layout = RowLayout.from_strides(spec.shape, tuple(x.stride()), tuple(y.stride()), spec.dim,
                                    operand_strides(spec, materialised=True))
    return x, y, layout, True


def backward_layout(y: torch.Tensor, spec: SoftmaxSpec) -> tuple[RowLayout, bool]:
    # y (contiguous), dy and dx (and x) share one row layout; the mask has its own strides.
    ops = operand_strides(spec)
    st = tuple(y.stride())
    layout = RowLayout.from_strides(spec.shape, st, st, spec.dim, ops, mask_fastest(spec, st, st))
    if layout is not None:
        return layout, False
    return RowLayout.from_strides(spec.shape, st, st, spec.dim, operand_strides(spec, materialised=True)), True


def logical_rows(shape: tuple, x_strides: tuple, dim: int, mask_strides, has_sink: bool) -> tuple:
    """(copy, layout, operand strides): x's rows in logical order through x's and the mask's strides
    (None: no mask), the sinks (or a row scale) one value per row, the output contiguous; `copy`: x
    and the mask are read as contiguous copies (their strides leave more row dims than the kernels
    take); the mask's (ms0..ms2, msn) and the sinks' (ss0..ss2) strides by name, zeros if absent."""
    ops = [] if mask_strides is None else [mask_strides]
    if has_sink:
        ops.append(row_operand_strides(shape, dim))
    out = contiguous_strides(shape)
    copy, layout = False, RowLayout.from_strides(shape, x_strides, out, dim, tuple(ops))
    if layout is None:
        if mask_strides is not None:
            ops[0] = out
        copy, layout = True, RowLayout.from_strides(shape, out, out, dim, tuple(ops))
    (ms0, ms1, ms2), msn = ((layout.op_row_strides[0], layout.op_col_strides[0]) if mask_strides is not None
                            else ((0, 0, 0), 0))
    ss0, ss1, ss2 = layout.op_row_strides[-1] if has_sink else (0, 0, 0)
    return copy, layout, dict(ms0=ms0, ms1=ms1, ms2=ms2, msn=msn, ss0=ss0, ss1=ss1, ss2=ss2)


def forward(plan: KernelPlan, layout: RowLayout, spec: SoftmaxSpec, contiguous: bool = False, guard=None,
            materialise: bool = False):
    """`f(x) -> y` (plain) or `f(x, operands) -> (y, p_sink)` (fused) for requests like `spec`;
    `contiguous`: x is copied first; `materialise`: the operands' broadcast views are copied."""
    launch = bind(plan, layout, spec.log, spec.out_dtype, spec.device, guard)
    shape, dtype, device = spec.shape, spec.out_dtype, spec.device

    if spec.is_plain:
        # A contiguous input of the output's dtype: empty_like is the cheapest allocation (the
        # memo key fixes strides and dtype, so this holds for every call of the request).
        if not POISON_OUTPUTS and not contiguous and spec.in_dtype == dtype and spec.strides == contiguous_strides(shape):
            def run_like(x: torch.Tensor) -> torch.Tensor:
                y = torch.empty_like(x)
                launch((x, y, None, None, None, None))
                return y

            return run_like

        def run(x: torch.Tensor) -> torch.Tensor:
            if contiguous:
                x = x.contiguous()
            y = new_output(shape, dtype, device)
            launch((x, y, None, None, None, None))
            return y

        return run

    p_shape = row_shape(shape, spec.dim) if plan.fusion.has_sink else None

    def run_fused(x: torch.Tensor, ops: Operands):
        t = forward_tensors(x.contiguous() if contiguous else x, new_output(shape, dtype, device), ops, spec, p_shape,
                            materialise)
        launch(t, scalars(ops.scale, ops.softcap))
        return t[1], t[4]

    return run_fused


def forward_tensors(x, y, ops: Operands, spec: SoftmaxSpec, p_shape, materialise: bool, as_bytes: bool = True):
    """(x, y, mask, sinks, p_sink of `p_shape`, row scale) as a fused forward launch takes them."""
    p = None if p_shape is None else torch.empty(p_shape, dtype=spec.acc_dtype, device=x.device)
    return (x, y, mask_operand(ops.mask, spec, materialise, as_bytes), sinks_operand(ops.sinks, spec), p,
            row_scale_operand(ops, spec))


def row_scale_operand(ops: Operands, spec: SoftmaxSpec) -> torch.Tensor | None:
    """A row scale as the kernels read it (`sinks_operand`'s layout), None without one."""
    return sinks_operand(ops.scale, spec) if spec.variant.row_scale is not None else None


def backward(plan: KernelPlan, layout: RowLayout, spec: SoftmaxSpec, materialise: bool = False):
    """`f(y, grad) -> dx` (plain) or `f(grad, y, x, operands, p_sink) -> (dx, ds_rows)` (fused)."""
    launch = bind(plan, layout, spec.log, spec.out_dtype, spec.device)
    shape, dtype, device = spec.shape, spec.out_dtype, spec.device

    if spec.is_plain:
        def run(y: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
            y, grad = backward_operands(y, grad, dtype)
            # (y is now contiguous in the output's dtype: empty_like is the cheapest allocation)
            dx = new_output(shape, dtype, device) if POISON_OUTPUTS else torch.empty_like(y)
            launch((y, grad, dx, None, None, None, None))
            return dx

        return run

    has_cap, ds_shape = plan.fusion.has_cap, row_shape(shape, spec.dim) if plan.fusion.has_sink else None

    def run_fused(grad: torch.Tensor, y: torch.Tensor, x, ops: Operands, p_sink):
        t = backward_tensors(grad, y, x, ops, p_sink, spec, has_cap, ds_shape, materialise)
        launch(t, scalars(ops.scale, ops.softcap))
        return t[2], t[6]

    return run_fused


def backward_tensors(grad, y, x, ops: Operands, p_sink, spec: SoftmaxSpec, has_cap: bool, ds_shape,
                     materialise: bool, as_bytes: bool = True) -> tuple:
    """(y, grad, dx, x, mask, p_sink, ds_rows) as a fused backward launch takes them: x (read with
    softcap) in y's dtype, dx and ds_rows of `ds_shape` (None: no sinks) allocated here."""
    dtype = spec.out_dtype
    y, grad = backward_operands(y, grad, dtype)
    dx = new_output(spec.shape, dtype, y.device)
    xs = x.to(dtype).contiguous() if has_cap else None  # (the forward's rounding of x)
    ds = None if ds_shape is None else torch.empty(ds_shape, dtype=spec.acc_dtype, device=y.device)
    p = None if ds_shape is None else p_sink.contiguous()
    return y, grad, dx, xs, mask_operand(ops.mask, spec, materialise, as_bytes), p, ds


def backward_operands(y: torch.Tensor, grad: torch.Tensor, dtype: torch.dtype) -> tuple:
    """(y, grad) as the backward kernels read them: both contiguous, grad in y's dtype."""
    y = y.contiguous()
    if grad.dtype != dtype or not grad.is_contiguous():
        grad = grad.to(dtype).contiguous()
    return y, grad
