"""From a request to a launch: validation, backend selection and the one request memo.

    api (public functions) ─┐
    ops (torch operators)  ─┴→ dispatch → core.registry → backend (plans) → launcher → kernel

A request is (shape, strides, dtypes, device, dim, log, backend choice, 16-byte alignment). The
first call of a request validates it (`core.spec.SoftmaxSpec`), selects a backend
(`core.registry.select`) and asks it for a launcher bound to that request; the launcher is
memoised, so a repeated request costs a key, a dict lookup and the launch itself: no
validation, no selection and no environment read (`$ANYSOFTMAX_BACKEND` is read when a request
is first seen; `refresh()` forgets every memo, e.g. after changing it).

The built-in backends and those of the `anysoftmax.backends` entry-point group are loaded on
first use of the registry, not at `import anysoftmax`.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import NamedTuple

import torch

from .config import overrides_key
from .core import registry
from .core.cache import BoundedDict
from .core.layout import new_output
from .core.reference import backward_from_output, fused_backward
from .core.spec import SoftmaxSpec
from .core.variant import Operands, runtime_values

log = logging.getLogger("anysoftmax")

ENTRY_POINT_GROUP = "anysoftmax.backends"

# Memoised requests -> bound launchers (forward: f(x) -> y; backward: f(y, grad) -> dx).
_forward: BoundedDict = BoundedDict(maxsize=4096)
_backward: BoundedDict = BoundedDict(maxsize=4096)
_forward_hits, _backward_hits = _forward._data.get, _backward._data.get  # the hit path's one lookup
# The same for the fused family: request -> (launcher, spec).
_fused: BoundedDict = BoundedDict(maxsize=4096)
_fused_backward: BoundedDict = BoundedDict(maxsize=4096)
# The registry generation the memos were filled under.
_state = {"generation": -1}
# Memo hits (a GPU test reads it). That a hit validates nothing, selects nothing and reads no
# environment is measured by tests/test_layers.py, which watches the calls themselves.
stats = {"hits": 0}


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


def refresh() -> None:
    """Forget every memoised request (they are re-validated and re-selected on their next
    call) and re-read $ANYSOFTMAX_BACKEND."""
    _forward.clear()
    _backward.clear()
    _fused.clear()
    _fused_backward.clear()
    _state["generation"] = registry.generation()


def _fresh() -> None:
    # The registry changed (register/unregister): memoised selections are stale.
    if _state["generation"] != registry.generation():
        refresh()


def prepare(x, dim, dtype=None, log: bool = False) -> tuple[torch.Tensor, SoftmaxSpec]:
    """Validate a request and return (the input a backend receives, its spec).

    When `dtype=` narrows, torch rounds the input to `dtype` first; that rounding is this one
    host-side copy, and backends only ever see inputs no wider than their output.
    """
    spec = SoftmaxSpec.from_tensor(x, dim, dtype, log=log)
    if spec.needs_input_cast:
        x = x.to(spec.out_dtype)
        spec = replace(spec, in_dtype=x.dtype, strides=tuple(x.stride()))
    return x, spec


def select(spec: SoftmaxSpec, backend: str | None, direction: str = "fwd"):
    """The backend for `spec` (explicit name, then $ANYSOFTMAX_BACKEND, then automatic: the
    device's selection table for `direction`, then priority)."""
    return registry.select(spec, backend, direction)


def _forward_launcher(chosen, x: torch.Tensor, spec: SoftmaxSpec):
    make = getattr(chosen, "launcher", None)
    if make is not None:
        return make(x, spec)
    run = chosen.run
    return lambda t: run(t, spec)


def forward(x, dim, dtype=None, backend=None, log: bool = False) -> torch.Tensor:
    """Softmax (log_softmax) of `x` along `dim` without autograd: the operators' implementation
    and the eager inference path."""
    if type(x) is torch.Tensor and type(dim) is int:
        key = (x.shape, x.stride(), x.dtype, x.device, dim, dtype, backend, log, x.data_ptr() & 15,
               registry.generation(), overrides_key())
        hit = _forward_hits(key)
        if hit is not None:
            stats["hits"] += 1
            return hit(x)
    else:
        key = None
    _fresh()
    prepared, spec = prepare(x, dim, dtype, log)
    chosen = select(spec, backend)
    if spec.numel == 0:
        return torch.empty(spec.shape, dtype=spec.out_dtype, device=x.device)
    launcher = _forward_launcher(chosen, prepared, spec)
    if key is not None and prepared is x:  # (a narrowing dtype= converts x on every call)
        _forward.put(key, launcher)
    return launcher(prepared)


def check_backward_args(y, grad, dim, log: bool = False) -> SoftmaxSpec:
    """Validate `softmax_backward`'s arguments (before anything runs) and return y's spec."""
    spec = SoftmaxSpec.from_tensor(y, dim, log=log)
    if not isinstance(grad, torch.Tensor):
        raise TypeError(f"softmax_backward: grad must be a torch.Tensor, got {type(grad).__name__}")
    if grad.shape != y.shape:
        raise ValueError(f"softmax_backward: grad shape {tuple(grad.shape)} must equal the output's shape "
                         f"{tuple(y.shape)}")
    if grad.device != y.device:
        raise ValueError(f"softmax_backward: grad is on {grad.device} but the output is on {y.device}; "
                         f"both must be on one device")
    if not grad.dtype.is_floating_point:
        raise TypeError(f"softmax_backward: grad dtype {grad.dtype} is not floating")
    return spec


def _backward_launcher(chosen, y: torch.Tensor, spec: SoftmaxSpec):
    make = getattr(chosen, "backward_launcher", None)
    if make is not None:
        return make(y, spec)
    run_backward = getattr(chosen, "run_backward", None)
    if run_backward is not None:
        return lambda y_, g: run_backward(y_, g, spec)
    # Torch's formula, accumulated in fp32 (fp64 for fp64) like the forward.
    dim = spec.dim if len(spec.shape) else 0
    return lambda y_, g: backward_from_output(y_, g, dim, spec.log, spec.acc_dtype).to(y_.dtype)


def backward(y: torch.Tensor, grad: torch.Tensor, dim: int, log: bool = False,
             backend: str | None = None) -> torch.Tensor:
    """Gradient of softmax (log_softmax with `log=True`) w.r.t. its input, from the forward
    output `y` and the output gradient `grad`: y * (grad - sum(y * grad)) along `dim`
    (log: grad - exp(y) * sum(grad)), in y's dtype."""
    if type(y) is torch.Tensor and type(grad) is torch.Tensor and type(dim) is int:
        key = (y.shape, y.stride(), y.dtype, y.device, dim, log, backend, y.data_ptr() & 15,
               grad.shape, grad.stride(), grad.dtype, grad.device, registry.generation(), overrides_key())
        hit = _backward_hits(key)
        if hit is not None:
            stats["hits"] += 1
            return hit(y, grad)
    else:
        key = None
    _fresh()
    spec = check_backward_args(y, grad, dim, log)
    chosen = select(spec, backend, "bwd")
    if spec.numel == 0:
        return torch.empty(spec.shape, dtype=y.dtype, device=y.device)
    spec = replace(spec, in_dtype=y.dtype, out_dtype=y.dtype)
    launcher = _backward_launcher(chosen, y, spec)
    if key is not None:
        _backward.put(key, launcher)
    return launcher(y, grad)


def use_interpreter_if_needed() -> str | None:
    """Ask the registered backends whether Triton must run through its CPU interpreter here
    (every backend that runs Triton kernels says `needs_interpreter()`: no device of its own),
    and if so set TRITON_INTERPRET=1 before any kernel is defined, unless the user set it.
    Returns a line saying what was done, or None. Importing backends defines no kernel."""
    triton_family = [b for b in registry.registered().values() if hasattr(b, "needs_interpreter")]
    if not triton_family or not all(b.needs_interpreter() for b in triton_family):
        return None
    from .backends._triton_common.interpreter import use_interpreter_if_no_device

    return use_interpreter_if_no_device()


# ---- the fused family (core.variant) --------------------------------------------------------

class FusedArgs(NamedTuple):
    """The fused keywords of one call, as the user gave them."""

    scale: object = None
    mask: object = None
    causal: object = False
    softcap: object = None
    sinks: object = None
    empty_rows: object = "zero"

    def as_kwargs(self) -> dict:
        return self._asdict()


def _operand_key(t):
    # What a launcher bound to a request depends on in an operand: its layout, dtype, device
    # and 16-byte alignment (Triton specialises pointers on it). The broadcast view's strides,
    # which kernels read, follow from (shape, stride) and the input's shape, also in the key.
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15)


def fused_request_key(x, dim, dtype, backend, log: bool, a: FusedArgs):
    """The memo key of a fused request: the raw form of `SoftmaxSpec.kernel_key()` (input
    layout, dim, dtypes, log, the operands' layouts, which steps are present, causal form,
    empty-row policy) plus what the launcher binds (alignment, backend choice, registry
    generation, tuning overrides). None when an argument is not of an exact type (then the
    request is validated, and its errors raised, on every call)."""
    m, s = a.mask, a.sinks
    if type(x) is not torch.Tensor or type(dim) is not int or (m is not None and type(m) is not torch.Tensor) \
            or (s is not None and type(s) is not torch.Tensor) or type(a.causal) not in (bool, str) \
            or type(a.empty_rows) is not str:
        return None
    return (x.shape, x.stride(), x.dtype, x.device, dim, dtype, backend, log, x.data_ptr() & 15, _operand_key(m),
            _operand_key(s), a.scale is None, a.softcap is None, a.causal, a.empty_rows, registry.generation(),
            overrides_key())


def prepare_fused(x, dim, dtype, log: bool, a: FusedArgs) -> tuple[torch.Tensor, SoftmaxSpec]:
    """Validate a fused request: (the input a backend receives, its spec with the variant)."""
    spec, _ = SoftmaxSpec.from_request(x, dim, dtype, log=log, fused=a.as_kwargs())
    if spec.needs_input_cast:
        x = x.to(spec.out_dtype)
        spec = replace(spec, in_dtype=x.dtype, strides=tuple(x.stride()))
    return x, spec


def _pair(result):
    return result if isinstance(result, tuple) else (result, None)


def _fused_launcher(chosen, x: torch.Tensor, spec: SoftmaxSpec):
    make = getattr(chosen, "launcher", None)
    if make is not None:
        return make(x, spec)
    run = chosen.run
    return lambda t, ops: _pair(run(t, spec, ops))


def _empty_outputs(spec: SoftmaxSpec, device, with_sinks: bool):
    y = torch.empty(spec.shape, dtype=spec.out_dtype, device=device)
    p = torch.empty(tuple(1 if d == spec.dim else s for d, s in enumerate(spec.shape)), dtype=spec.acc_dtype,
                    device=device) if with_sinks else None
    return y, p


def forward_fused(x, dim, dtype, backend, log: bool, a: FusedArgs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fused family without autograd: (y, p_sink), p_sink being each row's sink share in
    the accumulation dtype (None without sinks; the backward's dsinks needs it)."""
    key = fused_request_key(x, dim, dtype, backend, log, a)
    hit = _fused._data.get(key) if key is not None else None
    if hit is not None:
        stats["hits"] += 1
        launcher, spec = hit
        prepared = x
    else:
        _fresh()
        prepared, spec = prepare_fused(x, dim, dtype, log, a)
        chosen = select(spec, backend)
        if spec.numel == 0:
            return _empty_outputs(spec, x.device, a.sinks is not None)
        launcher = _fused_launcher(chosen, prepared, spec)
        if key is not None and prepared is x:
            _fused.put(key, (launcher, spec))
    scale, softcap = runtime_values(a.scale, a.softcap)
    return launcher(prepared, Operands(a.mask, a.sinks, scale, softcap))


def _fused_backward_launcher(chosen, y: torch.Tensor, spec: SoftmaxSpec):
    make = getattr(chosen, "fused_backward_launcher", None)
    if make is not None:
        return make(y, spec)
    v, dim, log, acc = spec.variant, spec.dim, spec.log, spec.acc_dtype

    def run(grad, y_, x, ops: Operands, p_sink):
        variant = replace(v, scale=None if v.scale is None else ops.scale,
                          softcap=None if v.softcap is None else ops.softcap)
        dx, ds, _ = fused_backward(grad, y_, x, variant, dim, log, ops.mask, p_sink, acc)
        return dx.to(y_.dtype), ds
    return run


def backward_fused(grad, y, x, dim, log: bool, a: FusedArgs, p_sink, backend=None):
    """Gradients of the fused family from its output `y`: (dx in y's dtype, per-row dsinks in
    the accumulation dtype or None). `x` is the forward's input (read with softcap only), `p_sink` the
    forward's sink shares (with sinks only)."""
    softcap = a.softcap is not None
    key = None
    if type(y) is torch.Tensor and type(grad) is torch.Tensor and (not softcap or type(x) is torch.Tensor):
        base = fused_request_key(y, dim, None, backend, log, a)
        if base is not None:
            key = (base, grad.shape, grad.stride(), grad.dtype, grad.device,
                   _operand_key(x) if softcap else None, _operand_key(p_sink))
    hit = _fused_backward._data.get(key) if key is not None else None
    if hit is not None:
        stats["hits"] += 1
        launcher = hit
    else:
        _fresh()
        spec = check_backward_args(y, grad, dim, log)
        spec, _ = SoftmaxSpec.from_request(y, dim, log=log, fused=a.as_kwargs())
        if softcap and (not isinstance(x, torch.Tensor) or x.shape != y.shape):
            raise ValueError("softmax_backward: a softcap gradient needs the forward's input x, of the output's shape")
        if a.sinks is not None and p_sink is None:
            raise ValueError("softmax_backward: a sinks gradient needs the forward's per-row sink shares (p_sink)")
        chosen = select(spec, backend, "bwd")
        if spec.numel == 0:
            dx = torch.empty(spec.shape, dtype=y.dtype, device=y.device)
            return dx, (torch.empty_like(p_sink) if p_sink is not None else None)
        spec = replace(spec, in_dtype=y.dtype, out_dtype=y.dtype)
        launcher = _fused_backward_launcher(chosen, y, spec)
        if key is not None:
            _fused_backward.put(key, launcher)
    scale, cap = runtime_values(a.scale, a.softcap)
    return launcher(grad, y, x, Operands(a.mask, a.sinks, scale, cap), p_sink)


__all__ = ["FusedArgs", "backward_fused", "forward_fused", "fused_request_key", "prepare_fused", "backward", "check_backward_args", "forward", "load_plugins", "new_output", "prepare", "refresh",
           "select", "stats", "use_interpreter_if_needed"]
