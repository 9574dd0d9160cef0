"""`torch`: PyTorch's own softmax, the fallback on any device."""

from .backend import TorchBackend

__all__ = ["TorchBackend"]
