"""Hardware-free core: the spec, the float64 reference, shape normalisation, the registry."""

from .reference import reference
from .backend import Backend
from .registry import (BackendStatus, BackendUnavailableError, UnsupportedRequestError,
                       get_backend, list_backends, register, select, unregister)
from .spec import FLOAT_DTYPES, TOLERANCES, SoftmaxSpec, Tolerance, dtype_name, parse_dtype

__all__ = [
    "Backend", "BackendStatus", "BackendUnavailableError", "FLOAT_DTYPES", "SoftmaxSpec",
    "TOLERANCES", "Tolerance", "UnsupportedRequestError", "dtype_name", "get_backend",
    "list_backends", "parse_dtype", "reference", "register", "select", "unregister",
]
