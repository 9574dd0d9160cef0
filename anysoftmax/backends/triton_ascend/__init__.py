"""`triton_ascend`: the shared persistent Triton kernels on Ascend NPUs through triton-ascend (docs/ascend.md)."""

from .backend import TritonAscendBackend

__all__ = ["TritonAscendBackend"]
