"""From a request to a launcher: validation, backend selection and the one request memo.

    api (public functions) ─┐
    ops (torch operators)  ─┴→ dispatch → core.registry → backend (plans) → launcher → kernel

Every call computes its key (`core.request.request_key`: direction, every operand's shape,
strides, dtype, device and pointer alignment, the live fused keywords, dim, dtype, log, backend
choice, registry generation, tuning overrides) and looks it up in one memo. A miss validates the
call (`core.spec.SoftmaxSpec`), selects a backend (`core.registry.select`) and asks it for a
launcher bound to the request; so a repeated request costs a key, a dict lookup and the launch
itself: no validation, no selection and no environment read (`$ANYSOFTMAX_BACKEND` is read when
a request is first seen; `refresh()` forgets the memo, e.g. after changing it). A fused request
that normalises to the plain softmax (e.g. `empty_rows` without a mask) takes the plain path.

Backends come from `anysoftmax.plugins`, loaded on first use of the registry.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import torch

from . import plugins  # noqa: F401  (registers the backends' loader with the registry)
from .core import registry
from .core.cache import BoundedDict
from .core.layout import new_output
from .core.reference import backward_from_output, fused_backward
from .core.request import BWD, FUSED_BWD, FUSED_FWD, FWD, Request, forward_key, request_key
from .core.spec import SoftmaxSpec, check_backward_args
from .core.variant import Operands, runtime_values

# request key -> entry: forward f(x) -> y; backward f(y, grad) -> dx; fused forward and
# backward (launcher, plain), `plain` when the request normalised to the plain softmax.
_memo: BoundedDict = BoundedDict(maxsize=8192)
_lookup = _memo._data.get  # the hit path's one lookup
# The registry generation the memo was filled under.
_state = {"generation": -1}
# Memo hits (tests read it). That a hit validates nothing, selects nothing and reads no
# environment is measured by tests/test_layers.py, which watches the calls themselves.
stats = {"hits": 0}


def refresh() -> None:
    """Forget every memoised request (they are re-validated and re-selected on their next
    call) and re-read $ANYSOFTMAX_BACKEND."""
    _memo.clear()
    _state["generation"] = registry.generation()


def _fresh() -> None:
    # Load the backends (the first request of a process), then drop the memo if the registry
    # changed since it was filled: memoised selections are stale. A miss computes its key
    # again after this, so the key holds the generation its launcher was selected under.
    registry.registered()
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
    hit = _lookup(forward_key(x, dim, dtype, backend, log))
    if hit is not None:
        stats["hits"] += 1
        return hit(x)
    _fresh()
    prepared, spec = prepare(x, dim, dtype, log)
    chosen = select(spec, backend)
    if spec.numel == 0:
        return torch.empty(spec.shape, dtype=spec.out_dtype, device=x.device)
    request = Request.build(request_key(FWD, x, dim, dtype, backend, log), spec, FWD, backend, prepared)
    launcher = _forward_launcher(chosen, prepared, spec)
    if request.key is not None and prepared is x:  # (a narrowing dtype= converts x on every call)
        _memo.put(request.key, launcher)
    return launcher(prepared)


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
    hit = _lookup(request_key(BWD, y, dim, None, backend, log, grad))
    if hit is not None:
        stats["hits"] += 1
        return hit(y, grad)
    _fresh()
    spec = check_backward_args(y, grad, dim, log)
    chosen = select(spec, backend, "bwd")
    if spec.numel == 0:
        return torch.empty(spec.shape, dtype=y.dtype, device=y.device)
    spec = replace(spec, in_dtype=y.dtype, out_dtype=y.dtype)
    request = Request.build(request_key(BWD, y, dim, None, backend, log, grad), spec, BWD, backend, y, grad)
    launcher = _backward_launcher(chosen, y, spec)
    if request.key is not None:
        _memo.put(request.key, launcher)
    return launcher(y, grad)


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
    hit = _lookup(request_key(FUSED_FWD, x, dim, dtype, backend, log, None, a))
    if hit is not None:
        stats["hits"] += 1
        launcher, plain = hit
        prepared = x
    else:
        _fresh()
        prepared, spec = prepare_fused(x, dim, dtype, log, a)
        chosen = select(spec, backend)
        if spec.numel == 0:
            return _empty_outputs(spec, x.device, a.sinks is not None)
        request = Request.build(request_key(FUSED_FWD, x, dim, dtype, backend, log, None, a), spec, FUSED_FWD,
                                backend, prepared, a.mask, a.sinks)
        plain = request.plain  # (a backend's plain launcher takes x alone)
        launcher = _forward_launcher(chosen, prepared, spec) if plain else _fused_launcher(chosen, prepared, spec)
        if request.key is not None and prepared is x:
            _memo.put(request.key, (launcher, plain))
    if plain:  # (no scale or softcap: the key says they are absent)
        return launcher(prepared), None
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
    saved = x if a.softcap is not None else None
    hit = _lookup(request_key(FUSED_BWD, y, dim, None, backend, log, grad, a, saved, p_sink))
    if hit is not None:
        stats["hits"] += 1
        launcher, plain = hit
    else:
        _fresh()
        check_backward_args(y, grad, dim, log)
        spec, _ = SoftmaxSpec.from_request(y, dim, log=log, fused=a.as_kwargs(), op="softmax_backward", arg="y")
        if a.softcap is not None and (not isinstance(x, torch.Tensor) or x.shape != y.shape):
            raise ValueError("softmax_backward: a softcap gradient needs the forward's input x, of the output's shape")
        if a.sinks is not None and p_sink is None:
            raise ValueError("softmax_backward: a sinks gradient needs the forward's per-row sink shares (p_sink)")
        chosen = select(spec, backend, "bwd")
        if spec.numel == 0:
            dx = torch.empty(spec.shape, dtype=y.dtype, device=y.device)
            return dx, (torch.empty_like(p_sink) if p_sink is not None else None)
        spec = replace(spec, in_dtype=y.dtype, out_dtype=y.dtype)
        request = Request.build(request_key(FUSED_BWD, y, dim, None, backend, log, grad, a, saved, p_sink), spec,
                                FUSED_BWD, backend, y, grad, a.mask, a.sinks, saved, p_sink)
        plain = request.plain  # (a backend's plain launcher takes (y, grad) alone)
        launcher = _backward_launcher(chosen, y, spec) if plain else _fused_backward_launcher(chosen, y, spec)
        if request.key is not None:
            _memo.put(request.key, (launcher, plain))
    if plain:
        return launcher(y, grad), None
    scale, cap = runtime_values(a.scale, a.softcap)
    return launcher(grad, y, x, Operands(a.mask, a.sinks, scale, cap), p_sink)


__all__ = ["FusedArgs", "backward", "backward_fused", "forward", "forward_fused", "new_output", "prepare",
           "prepare_fused", "refresh", "select", "stats"]
