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
        return op(x, spec.dim, dtype=spec.out_dtype)
