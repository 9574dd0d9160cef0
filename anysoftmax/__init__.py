"""anysoftmax: one fused softmax on NVIDIA, AMD and Ascend accelerators, one conformance suite.

    import anysoftmax
    y = anysoftmax.softmax(x, dim=-1)              # torch.softmax's signature and results
    m = anysoftmax.nn.Softmax(dim=-1)              # a drop-in torch.nn.Module
    with anysoftmax.use():                         # an unmodified model's torch.softmax calls
        model(x)

Importing the package loads no backend: they are loaded on first use of the registry.
"""

from ._version import __version__
from .torchop.api import log_softmax, softmax, softmax_backward
from .core.errors import BackendUnavailableError, UnsupportedRequestError
from .core.registry import get_backend, list_backends, register, unregister
from .core.spec import SoftmaxSpec
from .dispatch import refresh
from .torchop.override import disable, enable, enabled, use
from .torchop.lse_merge import logsumexp, merge_states
from . import nn

__all__ = [
    "BackendUnavailableError", "SoftmaxSpec", "UnsupportedRequestError", "__version__", "disable", "enable",
    "enabled", "get_backend", "list_backends", "log_softmax", "logsumexp", "merge_states", "nn", "refresh", "register", "softmax",
    "softmax_backward", "unregister", "use",
]


# Subpackages loaded on first use (`anysoftmax.testing.check_backend(...)` after a bare `import
# anysoftmax`): importing the package leaves them unloaded.
_LAZY_SUBPACKAGES = ("distributed", "sampling", "testing")


def __getattr__(name: str):
    if name in _LAZY_SUBPACKAGES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_SUBPACKAGES))
