"""anysoftmax: one fused softmax on NVIDIA, AMD and Ascend accelerators, one conformance suite."""

from .api import log_softmax, softmax
from .core import (BackendUnavailableError, SoftmaxSpec, UnsupportedRequestError, get_backend, list_backends,
                   register)

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailableError", "SoftmaxSpec", "UnsupportedRequestError", "__version__", "get_backend",
    "list_backends", "log_softmax", "register", "softmax",
]
