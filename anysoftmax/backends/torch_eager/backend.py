"""The `torch` backend: eager `torch.softmax` / `torch.log_softmax` on whatever device."""

from __future__ import annotations

import torch

from ...core.spec import SoftmaxSpec


class TorchBackend:
    name = "torch"
    devices = ("*",)
    priority = 0

    def is_available(self) -> str | None:
        return None

    def supports(self, spec: SoftmaxSpec) -> str | None:
        return None

    def run(self, x: torch.Tensor, spec: SoftmaxSpec) -> torch.Tensor:
        op = torch.log_softmax if spec.log else torch.softmax
        if x.device.type == "cpu" and spec.out_dtype.itemsize == 2:
            # torch's CPU kernels for 16-bit dtypes do not keep the whole reduction in fp32
            # (fp16 log_softmax of 1823x781 was off by 1.6e-2, 8 ulps): the spec promises fp32
            # accumulation, so compute in fp32 and round once.
            return op(x, spec.dim, dtype=torch.float32).to(spec.out_dtype)
        if x.dtype == spec.out_dtype:  # torch's dtype= path costs ~50 us even when it changes nothing
            return op(x, spec.dim)
        return op(x, spec.dim, dtype=spec.out_dtype)
