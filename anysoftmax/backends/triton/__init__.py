"""`triton`: persistent Triton kernels on NVIDIA (CUDA) and AMD (ROCm/HIP) GPUs."""

from .backend import TritonBackend

__all__ = ["TritonBackend"]
