"""Launchers bound to one request, shared by the `triton` and `triton_ascend` backends: the
one `run` both use. A backend plans (its own rules); these functions only apply the plan."""

from __future__ import annotations

import torch

from ...core.layout import POISON_OUTPUTS, RowLayout, contiguous_strides, new_output
from ...core.spec import SoftmaxSpec
from .launcher import bind, device_guard
from .plan import KernelPlan


def _guard_for(device: torch.device, guard):
    """The device guard a launch needs, or None: a process that sees a single GPU (or runs on
    the CPU) never has another device current, so it skips the per-call check."""
    if guard is not None:
        return guard
    if device.type == "cpu" or (device.type == "cuda" and torch.cuda.device_count() == 1):
        return None
    return device_guard


def forward(plan: KernelPlan, layout: RowLayout, spec: SoftmaxSpec, contiguous: bool = False, guard=None):
    """`f(x) -> y` for requests like `spec`: allocates the output, makes `x` contiguous first
    when its rows needed that (`contiguous`: the one copy `core.layout.allocate_rows` makes) and
    launches `plan` on the device's current stream."""
    launch = bind(plan, layout, spec.log, spec.out_dtype)
    shape, dtype, device = spec.shape, spec.out_dtype, spec.device
    guard = _guard_for(device, guard)
    # A contiguous input of the output's dtype: empty_like is the cheapest allocation (the
    # memo key fixes strides and dtype, so this holds for every call of the request).
    like_input = (not POISON_OUTPUTS and not contiguous and spec.in_dtype == dtype
                  and spec.strides == contiguous_strides(shape))

    def run(x: torch.Tensor) -> torch.Tensor:
        if contiguous:
            x = x.contiguous()
        y = torch.empty_like(x) if like_input else new_output(shape, dtype, device)
        if guard is None:
            launch(x, y)
        else:
            with guard(device):  # checked per call: the current device may change between calls
                launch(x, y)
        return y

    return run


def backward(plan: KernelPlan, layout: RowLayout, spec: SoftmaxSpec, guard=None):
    """`f(y, grad) -> dx` for requests like `spec` (y contiguous, row layout `layout`); `grad`
    is converted to y's dtype and made contiguous when it is not already."""
    launch = bind(plan, layout, spec.log, spec.out_dtype)
    shape, dtype, device = spec.shape, spec.out_dtype, spec.device
    guard = _guard_for(device, guard)

    def run(y: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        y, grad = backward_operands(y, grad, dtype)
        dx = new_output(shape, dtype, device)
        if guard is None:
            launch(y, grad, dx)
        else:
            with guard(device):
                launch(y, grad, dx)
        return dx

    return run


def backward_operands(y: torch.Tensor, grad: torch.Tensor, dtype: torch.dtype) -> tuple:
    """(y, grad) as the backward kernels read them: both contiguous, grad in y's dtype."""
    y = y.contiguous()
    if grad.dtype != dtype or not grad.is_contiguous():
        grad = grad.to(dtype).contiguous()
    return y, grad
