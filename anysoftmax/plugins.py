"""Where backends come from: the built-in ones and those of the `anysoftmax.backends`
entry-point group, loaded on first use of the registry (not at `import anysoftmax`), and the
one process-wide switch they need before any kernel is defined (Triton's CPU interpreter)."""

from __future__ import annotations

import logging

from .core import registry

log = logging.getLogger("anysoftmax")

ENTRY_POINT_GROUP = "anysoftmax.backends"


def load_plugins() -> None:
    """Register the built-in backends, then every backend of the `anysoftmax.backends`
    entry-point group (a callable returning a backend, or a backend object). A plugin that
    fails to load is logged and skipped: it must not take the registry down."""
    from . import backends  # noqa: F401  (registers the built-in backends)
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            # A class is instantiated (a class object itself passes the Backend protocol's
            # attribute check); another callable is a factory; anything else is the backend.
            backend = obj() if isinstance(obj, type) or (callable(obj) and not isinstance(obj, registry.Backend)) else obj
            registry.register(backend)
        except Exception as exc:  # a broken third-party package is reported, not fatal
            log.warning("anysoftmax: backend entry point %r (%s) failed to load: %s: %s",
                        ep.name, ep.value, type(exc).__name__, exc)


registry.add_loader(load_plugins)


def use_interpreter_if_needed() -> str | None:
    """Ask the registered backends whether Triton must run through its CPU interpreter here
    (every backend that runs Triton kernels says `needs_interpreter()`: no device of its own),
    and if so set TRITON_INTERPRET=1 before any kernel is defined, unless the user set it.
    Returns a line saying what was done, or None. Importing backends defines no kernel. Without
    the `triton` package there is no interpreter to switch on: nothing is done (the backends'
    reasons name the extra to install)."""
    triton_family = [b for b in registry.registered().values() if hasattr(b, "needs_interpreter")]
    if not triton_family or not all(b.needs_interpreter() for b in triton_family):
        return None
    from .backends._triton_common.interpreter import triton_missing, use_interpreter_if_no_device

    if triton_missing() is not None:
        return None
    return use_interpreter_if_no_device()


__all__ = ["ENTRY_POINT_GROUP", "load_plugins", "use_interpreter_if_needed"]
