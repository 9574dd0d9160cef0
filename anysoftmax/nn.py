"""`torch.nn` modules: drop-ins for `torch.nn.Softmax` and `torch.nn.LogSoftmax`.

They subclass torch's modules, so `isinstance(m, torch.nn.Softmax)`, `extra_repr`, state dicts
(none: no parameters or buffers) and pickles behave as torch's; `backend=` picks a backend.
"""

from __future__ import annotations

import torch

from .torchop.api import log_softmax, softmax


class Softmax(torch.nn.Softmax):
    """`torch.nn.Softmax(dim)` computed by anysoftmax."""

    def __init__(self, dim: int | None = None, *, backend: str | None = None) -> None:
        super().__init__(dim)
        self.backend = backend

    def __setstate__(self, state):
        super().__setstate__(state)
        if not hasattr(self, "backend"):
            self.backend = None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return softmax(input, self.dim, _stacklevel=5, backend=self.backend)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", backend={self.backend!r}" if self.backend else "")


class LogSoftmax(torch.nn.LogSoftmax):
    """`torch.nn.LogSoftmax(dim)` computed by anysoftmax."""

    def __init__(self, dim: int | None = None, *, backend: str | None = None) -> None:
        super().__init__(dim)
        self.backend = backend

    def __setstate__(self, state):
        super().__setstate__(state)
        if not hasattr(self, "backend"):
            self.backend = None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return log_softmax(input, self.dim, _stacklevel=5, backend=self.backend)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", backend={self.backend!r}" if self.backend else "")
