"""Launchers bound to one request, shared by the `triton` and `triton_ascend` backends: the
one `run` both use. A backend plans (its own rules); these functions only apply the plan."""

from __future__ import annotations

import torch

from ...core.layout import RowLayout, new_output
from ...core.spec import SoftmaxSpec
from .launcher import bind, device_guard
from .plan import KernelPlan


def forward(plan: KernelPlan, layout: RowLayout, spec: SoftmaxSpec, contiguous: bool = False, guard=None):
    """`f(x) -> y` for requests like `spec`: allocates the output, makes `x` contiguous first
    when its rows needed that (`contiguous`: the one copy `core.layout.allocate_rows` makes) and
    launches `plan` on the device's current stream."""
    launch = bind(plan, layout, spec.log, spec.out_dtype)
    shape, dtype = spec.shape, spec.out_dtype
    guard = guard or device_guard

    def run(x: torch.Tensor) -> torch.Tensor:
        if contiguous:
            x = x.contiguous()
        y = new_output(shape, dtype, x.device)
        with guard(x.device):  # checked per call: the current device may change between calls
            launch(x, y)
        return y

    return run


def backward(plan: KernelPlan, layout: RowLayout, spec: SoftmaxSpec, guard=None):
    """`f(y, grad) -> dx` for requests like `spec` (y contiguous, row layout `layout`); `grad`
    is converted to y's dtype and made contiguous when it is not already."""
    launch = bind(plan, layout, spec.log, spec.out_dtype)
    shape, dtype = spec.shape, spec.out_dtype
    guard = guard or device_guard

    def run(y: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        y = y.contiguous()
        if grad.dtype != dtype or not grad.is_contiguous():
            grad = grad.to(dtype).contiguous()
        dx = new_output(shape, dtype, y.device)
        with guard(y.device):
            launch(y, grad, dx)
        return dx

    return run
