"""Opt-in: serve an unmodified model's softmax calls with anysoftmax (`enable()`, `use()`; docs/usage.md,
"The override")."""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings

import torch

from .. import dispatch
from ..core import registry
from ..core.errors import BackendUnavailableError

DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA", "npu": "PrivateUse1", "xpu": "XPU"}
# The warning torch gives when enable() replaces its kernels (TORCH_WARN_ONCE prefixes it with
# "Warning only once for all operators, ...").
OVERRIDE_WARNING = r"(?s).*Overriding a previously registered kernel for the same operator"

_state_lock = threading.Lock()
_active: dict = {}  # "lib", "backend", "devices", "depth" while enabled
_inside = threading.local()  # set while anysoftmax serves a call in this thread
calls = {"forward": 0, "backward": 0, "reentrant": 0}  # served, served, decomposed (tests read them)


def _forward(log_form: bool, x, dim: int, half_to_float: bool) -> torch.Tensor:
    out_dtype = torch.float32 if half_to_float else None
    return dispatch.forward(x, dim, out_dtype, _active.get("backend"), log_form)


def _backward(log_form: bool, grad, output, dim: int, input_dtype: torch.dtype) -> torch.Tensor:
    dx = dispatch.backward(output, grad, dim, log=log_form, backend=_active.get("backend"))
    return dx if dx.dtype == input_dtype else dx.to(input_dtype)


# aten op -> (the `calls` counter, anysoftmax's implementation)
_SERVED = {"_softmax": ("forward", functools.partial(_forward, False)),
           "_log_softmax": ("forward", functools.partial(_forward, True)),
           "_softmax_backward_data": ("backward", functools.partial(_backward, False)),
           "_log_softmax_backward_data": ("backward", functools.partial(_backward, True))}


def _impl(name: str):
    # The kernel registered for aten's `name`: anysoftmax's, or torch's decomposition for a softmax
    # anysoftmax itself triggers (this thread is inside a served call).
    counter, serve = _SERVED[name]

    def impl(*args):
        if getattr(_inside, "on", False):
            from torch._decomp import decompositions

            calls["reentrant"] += 1
            return getattr(decompositions, name)(*args)
        _inside.on = True
        try:
            out = serve(*args)
        finally:
            _inside.on = False
        calls[counter] += 1
        return out

    return impl


def served_devices(backend: str | None) -> tuple[str, ...]:
    """Device types the override routes to anysoftmax for `backend` (see the module doc)."""
    if backend is not None:
        devices = tuple(registry.get_backend(backend).devices)
        return ("cpu", "cuda") if "*" in devices else devices
    found = []
    for status in registry.list_backends():
        if status.available and "*" not in status.devices:
            found += [d for d in status.devices if d not in found]
    return tuple(found)


def device_present(device_type: str) -> bool:
    """True when a device of `device_type` ("cpu", "cuda", "npu", "xpu") is visible here."""
    if device_type == "cpu":
        return True
    module = getattr(torch, device_type, None)  # torch.npu exists once torch_npu is imported
    try:
        return module is not None and bool(module.is_available())
    except Exception:  # a broken driver stack: nothing is served there either
        return False


def _warn_if_nothing_served(backend: str | None, devices: tuple[str, ...], stacklevel: int) -> None:
    # An override that routes no device present here (automatic backends on a CPU-only machine)
    # would look like success while torch's softmax runs unchanged.
    if any(device_present(d) for d in devices):
        return
    served = ", ".join(devices) if devices else "no device (no accelerator backend is available)"
    warnings.warn(
        f"anysoftmax.enable/use(backend={backend!r}): serves {served}, and none is present here, so torch's own "
        f"softmax runs every call; to route CPU tensors, name a backend that runs them and devices=('cpu',), e.g. "
        f"anysoftmax.use(backend='torch', devices=('cpu',))", RuntimeWarning, stacklevel=stacklevel)


def enable(backend: str | None = None, devices: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Route torch's softmax ops on the served devices through anysoftmax; returns the device
    types served (called again while on, it replaces the choice). A named backend must run here
    (BackendUnavailableError, or ValueError when it runs no tensor of a type in `devices`); a
    RuntimeWarning when no served device type is present here."""
    return _enable(backend, devices, stacklevel=4)  # (warnings name the caller's line)


def _enable(backend, devices, stacklevel: int, warn: bool = True) -> tuple[str, ...]:
    chosen = registry.get_backend(backend) if backend is not None else None  # unknown names fail here
    devices = tuple(devices) if devices is not None else served_devices(backend)
    unknown = [d for d in devices if d not in DISPATCH_KEYS]
    if unknown:
        raise ValueError(f"anysoftmax.enable: device type(s) {unknown} cannot be overridden; "
                         f"allowed: {', '.join(DISPATCH_KEYS)}")
    if chosen is not None:
        _check_runs(chosen, devices)
    if warn:
        _warn_if_nothing_served(backend, devices, stacklevel)
    with _state_lock:
        _disable_locked()
        lib = torch.library.Library("aten", "IMPL")
        # Replacing torch's kernels is what enable() is for: torch's warning about it (which would
        # read as an error) is silenced, here only.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=OVERRIDE_WARNING, category=UserWarning)
            for device in devices:
                for name in _SERVED:
                    lib.impl(name, _impl(name), DISPATCH_KEYS[device])
        _active.update(lib=lib, backend=backend, devices=devices)
    return devices


def _check_runs(chosen, devices: tuple[str, ...]) -> None:
    # Refused before anything is registered: every call of the model would fail later, far from the cause.
    call = f"anysoftmax.enable/use(backend={chosen.name!r}, devices={devices!r})"
    reason = registry.unavailable_reason(chosen.name)
    if reason is not None:
        raise BackendUnavailableError(f"{call}: backend {chosen.name!r} is not available here: {reason}")
    for device in devices:
        reason = registry.device_refusal(chosen, device)
        if reason is not None:
            raise ValueError(f"{call}: {chosen.name!r} cannot run {device} tensors here: {reason}")


def _disable_locked() -> None:
    lib = _active.pop("lib", None)
    if lib is not None:
        lib._destroy()  # torch's own kernels are current again
    _active.clear()


def disable() -> None:
    """Undo `enable()`: torch's own softmax kernels serve every call again."""
    with _state_lock:
        _disable_locked()


def enabled() -> tuple[str, ...]:
    """The device types served now (empty when the override is off)."""
    return tuple(_active.get("devices", ()))


@contextlib.contextmanager
def use(backend: str | None = None, devices: tuple[str, ...] | None = None):
    """`enable(backend, devices)` for a `with` block; the state before it is restored after it."""
    before = dict(_active)
    _enable(backend, devices, stacklevel=5)
    try:
        yield enabled()
    finally:
        if before.get("lib") is not None:  # (warned when it was enabled)
            _enable(before.get("backend"), before.get("devices"), stacklevel=5, warn=False)
        else:
            disable()
