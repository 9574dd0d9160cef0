"""Hardware-free core: the spec, the reference, comparison, shape normalisation, the registry."""

from .compare import Comparison, compare, compare_backward
from .reference import reference
from .backend import Backend
from .registry import (BackendStatus, BackendUnavailableError, UnsupportedRequestError,
                       get_backend, list_backends, register, select, unregister)
from .spec import FLOAT_DTYPES, TOLERANCES, SoftmaxSpec, Tolerance, dtype_name, parse_dtype

__all__ = [
    "Backend", "BackendStatus", "BackendUnavailableError", "Comparison", "FLOAT_DTYPES", "SoftmaxSpec",
    "TOLERANCES", "Tolerance", "UnsupportedRequestError", "compare", "compare_backward", "dtype_name", "get_backend",
    "list_backends", "parse_dtype", "reference", "register", "select", "unregister",
]
