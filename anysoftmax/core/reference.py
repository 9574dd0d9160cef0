"""The single reference every backend is checked against: torch in float64, on the CPU."""

from __future__ import annotations

import torch

from .spec import SoftmaxSpec


def reference(x: torch.Tensor, spec: SoftmaxSpec, device: str | torch.device = "cpu") -> torch.Tensor:
    """Exact-as-possible result of `spec` on `x`, as a float64 tensor on `device` (the CPU by
    default; benchmarks of large tensors evaluate it on the GPU, in float64 all the same).

    The input is first converted to the output dtype (torch's `dtype=` semantics: this rounds
    when it narrows), then to float64, and the softmax is evaluated in float64.
    """
    x64 = x.detach().to(device).to(spec.out_dtype).to(torch.float64)
    op = torch.log_softmax if spec.log else torch.softmax
    return op(x64, spec.dim if x64.dim() else 0)


def backward_from_output(y: torch.Tensor, dy: torch.Tensor, dim: int, log: bool = False,
                         dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The input gradient of softmax (log_softmax with `log`) from its output `y` and the output
    gradient `dy`, evaluated in `dtype`: y * (dy - sum(y * dy)), or dy - exp(y) * sum(dy).
    The float64 reference of backward kernels, and in fp32/fp64 the backward of backends
    without a kernel of their own."""
    y, dy = y.to(dtype), dy.to(dtype)
    if log:
        return dy - torch.exp(y) * dy.sum(dim, keepdim=True)
    return y * (dy - (y * dy).sum(dim, keepdim=True))
