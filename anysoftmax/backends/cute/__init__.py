"""`cute`: softmax kernels in NVIDIA's CuTe DSL for sm_90+ GPUs (docs/cute.md). Importing it never imports
the DSL (it loads when a kernel is first compiled), so it is cheap and safe without the `cute` extra."""

from .backend import CuteBackend

__all__ = ["CuteBackend"]
