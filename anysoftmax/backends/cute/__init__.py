"""`cute`: softmax kernels in NVIDIA's CuTe DSL (`nvidia-cutlass-dsl`) for sm_90+ GPUs, a long row
split over a thread-block cluster (docs/cute.md). Importing it never imports the DSL (it loads
when a kernel is first compiled), so it is cheap and safe without the `cute` extra.
"""

from .backend import CuteBackend

__all__ = ["CuteBackend"]
