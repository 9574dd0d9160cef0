"""The backend under test: the device its checks run on, and its registration for the duration
of a check (the kit's and the fuzzer's)."""

from __future__ import annotations

import contextlib

import torch

from ..core import registry


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
