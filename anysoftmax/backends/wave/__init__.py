"""`wave`: Wave (tkw) softmax kernels compiled by IREE; AMD GPUs, and NVIDIA as an opt-in
validation path (ANYSOFTMAX_WAVE_ON_CUDA=1).

Importing this package never imports wave_lang or iree (they load on first use), so it is
cheap and safe without the `wave` extra.

Modules, one job each: `target` (chip, wave size, flags, detection), `fusion` (a request in
the form the kernel computes it, and its operands' index arithmetic), `kernel` (the tkw kernel,
its key and row plan), `cuda_mlir` (MLIR rewrite for CUDA), `compiler` (Wave's MLIR and .vmfb
bytes), `diskcache` (.vmfb files), `runtime` (iree.runtime calls of the asynchronous entry
point), `env` (packages, versions, the cache location), `backend` (the Backend), `aot`
(ahead-of-time compilation command, `--variants`).
"""

from .backend import WaveBackend

__all__ = ["WaveBackend"]
