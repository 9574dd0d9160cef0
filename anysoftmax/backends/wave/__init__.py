"""`wave`: Wave (tkw) softmax kernels compiled by IREE; AMD GPUs, and NVIDIA as an opt-in
validation path (ANYSOFTMAX_WAVE_ON_CUDA=1).

Importing this package never imports wave_lang or iree (they load on first use), so it is
cheap and safe without the `wave` extra.

Modules, one job each: `target` (chip, wave size, flags, detection), `kernel` (the tkw kernel
and its row plan), `cuda_mlir` (MLIR rewrite for CUDA), `compiler` (.vmfb bytes), `diskcache`
(.vmfb files), `runtime` (iree.runtime launches), `env` (packages and versions), `backend`
(the Backend), `aot` (ahead-of-time compilation command).
"""

from .backend import WaveBackend

__all__ = ["WaveBackend"]
