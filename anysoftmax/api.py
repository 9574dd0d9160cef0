"""Public functions: `softmax` and `log_softmax`, drop-in for `torch.softmax` / `torch.log_softmax`."""

from __future__ import annotations

from dataclasses import replace

import torch

from .core.registry import select
from .core.spec import SoftmaxSpec


def _softmax_backward(y: torch.Tensor, grad: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    # dx = y * (dy - sum(y * dy)) for softmax; dx = dy - exp(y) * sum(dy) for log_softmax,
    # accumulated in fp32 (fp64 for fp64) like the forward.
    acc = torch.float64 if y.dtype == torch.float64 else torch.float32
    y32, g32 = y.to(acc), grad.to(acc)
    if log:
        return g32 - torch.exp(y32) * g32.sum(dim, keepdim=True)
    return y32 * (g32 - (y32 * g32).sum(dim, keepdim=True))


class _SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, spec, backend):
        y = backend.run(x, spec)
        ctx.save_for_backward(y)
        ctx.dim, ctx.log, ctx.x_dtype = spec.dim, spec.log, x.dtype
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        dim = ctx.dim if y.dim() else 0
        return _softmax_backward(y, grad, dim, ctx.log).to(ctx.x_dtype), None, None


def _run(x, dim, dtype, backend, log: bool) -> torch.Tensor:
    spec = SoftmaxSpec.from_tensor(x, dim, dtype, log=log)
    if spec.needs_input_cast:
        # torch rounds the input to `dtype` first; that rounding is this one host-side copy.
        x = x.to(spec.out_dtype)
        spec = replace(spec, in_dtype=x.dtype, strides=tuple(x.stride()))
    chosen = select(spec, backend)
    if spec.numel == 0:
        return torch.empty(spec.shape, dtype=spec.out_dtype, device=x.device)
    if x.requires_grad and torch.is_grad_enabled():
        return _SoftmaxFunction.apply(x, spec, chosen)
    return chosen.run(x, spec)


def softmax(x: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None,
            backend: str | None = None) -> torch.Tensor:
    """Softmax of `x` along `dim`, as `torch.softmax(x, dim, dtype=dtype)`.

    `backend` names a backend explicitly (see `list_backends()`); otherwise
    $ANYSOFTMAX_BACKEND or the automatic choice for the tensor's device is used.
    """
    return _run(x, dim, dtype, backend, log=False)


def log_softmax(x: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None,
                backend: str | None = None) -> torch.Tensor:
    """Log-softmax of `x` along `dim`, as `torch.log_softmax(x, dim, dtype=dtype)`."""
    return _run(x, dim, dtype, backend, log=True)


def softmax_backward(y: torch.Tensor, grad: torch.Tensor, dim: int, *, log: bool = False,
                     backend: str | None = None) -> torch.Tensor:
    """Gradient of softmax (log_softmax with `log=True`) w.r.t. its input, given the forward
    output `y` and the output gradient `grad`: y * (grad - sum(y * grad)) along `dim`."""
    spec = SoftmaxSpec.from_tensor(y, dim, log=log)
    if grad.shape != y.shape:
        raise ValueError(f"softmax_backward: grad shape {tuple(grad.shape)} != output shape {tuple(y.shape)}")
    chosen = select(spec, backend)
    run_backward = getattr(chosen, "run_backward", None)
    if run_backward is not None and spec.numel:
        return run_backward(y, grad, spec)
    return _softmax_backward(y, grad, spec.dim if y.dim() else 0, log).to(y.dtype)
