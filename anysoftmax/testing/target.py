"""Which backend a kit run checks, and where: a backend object registered for the run, a plugin
module loaded by name, the device a backend's checks run on by default. Shared by the kit, its
command line and the fuzzer."""

from __future__ import annotations

import contextlib
import importlib

import torch

from ..core import registry


class UsageError(Exception):
    """A bad argument: exit status 2, the message naming it."""


def load_plugin(spec: str) -> None:
    """Import `MODULE` (which registers its backends, e.g. with `anysoftmax.register(...)` at
    import), or `MODULE:ATTR` and register ATTR: a backend class (instantiated), a factory or a
    backend object."""
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


def default_device(backend) -> str:
    """The device a check of `backend` runs on when none is named: the first accelerator it
    serves that is present here, else the CPU (where the backend's own refusals say why not)."""
    devices = tuple(backend.devices)
    for kind in ("cuda", "npu", "xpu"):
        if kind in devices or ("*" in devices and kind == "cuda"):
            module = getattr(torch, kind, None)
            try:
                if module is not None and module.is_available():
                    return kind
            except Exception:  # a broken driver stack is not this backend's device
                continue
    return "cpu"


@contextlib.contextmanager
def registered(backend):
    """The name of `backend` (a backend object or a registered name), registered for the block
    when it is an object the registry does not hold; whatever held its name before comes
    back afterwards (a user's own registration is never removed)."""
    if isinstance(backend, str):
        yield registry.get_backend(backend).name
        return
    if not isinstance(backend, registry.Backend):
        raise TypeError(f"check_backend: {backend!r} is not a backend: it needs name, devices, priority, "
                        f"is_available(), supports(spec) and run(x, spec) (anysoftmax.core.registry.Backend)")
    before = registry.registered().get(backend.name)
    if before is backend:
        yield backend.name
        return
    registry.register(backend)
    try:
        yield backend.name
    finally:
        if before is None:
            registry.unregister(backend.name)
        else:
            registry.register(before)
