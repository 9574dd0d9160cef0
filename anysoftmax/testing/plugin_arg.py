"""`--plugin MODULE[:ATTR]`, as the conformance command and the fuzzer's command take it, and
the usage error both report with exit status 2."""

from __future__ import annotations

import importlib


class UsageError(Exception):
    """A bad argument: exit status 2, the message naming it."""


def load_plugin(spec: str) -> None:
    """Import `MODULE` (which registers its backends, e.g. with `anysoftmax.register(...)` at
    import), or `MODULE:ATTR` and register ATTR: a backend class (instantiated), a factory or a
    backend object."""
    from ..core import registry

    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise UsageError(f"--plugin {spec}: cannot import {module_name!r}: {type(exc).__name__}: {exc}") from None
    if not attr:
        return
    obj = getattr(module, attr, None)
    if obj is None:
        raise UsageError(f"--plugin {spec}: module {module_name!r} has no attribute {attr!r}")
    backend = obj() if isinstance(obj, type) or (callable(obj) and not isinstance(obj, registry.Backend)) else obj
    try:
        registry.register(backend)
    except TypeError as exc:
        raise UsageError(f"--plugin {spec}: {exc}") from None
