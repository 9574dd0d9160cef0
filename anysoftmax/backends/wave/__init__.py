"""`wave`: Wave (tkw) softmax kernels compiled by IREE for AMD GPUs (docs/wave.md). Importing it never
imports wave_lang or iree (they load on first use), so it is cheap and safe without the `wave` extra."""

from .backend import WaveBackend

__all__ = ["WaveBackend"]
