"""`cute`: softmax kernels written in NVIDIA's CuTe DSL (`nvidia-cutlass-dsl`) for sm_90+ GPUs,
splitting long rows over thread-block clusters (distributed shared memory, cluster barrier).

Importing this package never imports the DSL (it loads when a kernel is first compiled), so it
is cheap and safe without the `cute` extra.

Modules, one job each: `env` (packages, GPU, compile target), `plan` (request -> kernel key,
pure), `kernels` (the DSL kernels), `compiler` (cute.compile, cached), `launch` (per-call
binding to torch tensors), `cubin` (reading compiled kernels' resources), `backend` (the Backend).
"""

from .backend import CuteBackend

__all__ = ["CuteBackend"]
