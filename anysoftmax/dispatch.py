"""From a call to a launcher: the one request memo, validation and backend selection (docs/backends.md,
"How a call flows"): a miss validates, selects and memoises; a hit costs the key, a lookup and the launch."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import NamedTuple

import torch

from . import plugins  # noqa: F401  (registers the backends' loader with the registry)
from .core import registry
from .core.cache import BoundedDict
from .core.lse_merge import (LOGSUMEXP, MERGE_STATES, MergeSpec, logsumexp_formula, logsumexp_request, lse_shape,
                             merge_into, row_shape)
from .core.request import (BWD, FUSED_BWD, FUSED_FWD, LSE, LSE_SQUEEZED, MERGE, MERGE_EXACT, forward_key,
                           forward_proof, layout_guard, merge_proof, request_key)
from .core.spec import SoftmaxSpec, check_backward_args
from .core.variant import NO_OPERANDS, Operands, runtime_values

# request key -> the launcher (plain forward: (launcher, its `forward_proof` or None); fused:
# (launcher, whether the request is plain); merge_states: `_merge_entry`'s tuple).
_memo: BoundedDict = BoundedDict(maxsize=8192)
_lookup = _memo.get  # the hit path's one lookup
_state = {"generation": -1}  # the registry generation the memo was filled under
# The (proof, launcher, its `addressed` form or None) of the last plain merge_states request that
# hit: a repeat of it (a decode step's merges, layer after layer) is proved by `merge_proof`, in
# place of its key and lookup.
_last_merge: list = [None]
# The (launcher, proof) of the last plain forward request that hit, likewise (`forward_proof`).
_last_forward: list = [None]
stats = {"hits": 0}  # (tests/test_layers.py checks that a hit validates, selects and reads nothing)


def refresh() -> None:
    """Forget every memoised request (re-validated and re-selected on its next call)."""
    _memo.clear()
    _last_merge[0] = None
    _last_forward[0] = None
    _state["generation"] = registry.generation()


def _fresh() -> None:
    # On a miss: load the backends, then drop the memo if the registry changed since it was filled.
    if _state["generation"] != registry.generation():
        refresh()


def prepare(x, dim, dtype=None, log: bool = False) -> tuple[torch.Tensor, SoftmaxSpec]:
    """Validate a request: (the input a backend receives, its spec). A narrowing `dtype=` rounds
    the input first, as torch does (the one host-side copy): backends never see a wider input."""
    return _narrowed(x, SoftmaxSpec.from_tensor(x, dim, dtype, log=log))


def _narrowed(x, spec: SoftmaxSpec) -> tuple[torch.Tensor, SoftmaxSpec]:
    if spec.needs_input_cast:
        x = x.to(spec.out_dtype)
        spec = replace(spec, in_dtype=x.dtype, strides=tuple(x.stride()))
    return x, spec


def forward(x, dim, dtype=None, backend=None, log: bool = False) -> torch.Tensor:
    """Softmax (log_softmax) of `x` along `dim` without autograd: the eager inference path."""
    last = _last_forward[0]
    if last is not None and last[1](x, dim, dtype, backend, log):
        # The last request that hit, again (its proof checked what its key holds): no key, no lookup.
        stats["hits"] += 1
        return last[0](x)
    key = forward_key(x, dim, dtype, backend, log)
    hit = _lookup(key)
    if hit is not None:
        stats["hits"] += 1
        if hit[1] is not None:
            _last_forward[0] = hit
        return hit[0](x)
    _fresh()
    prepared, spec = prepare(x, dim, dtype, log)
    chosen = registry.select(spec, backend)
    if spec.numel == 0:
        return torch.empty(spec.shape, dtype=spec.out_dtype, device=x.device)
    launcher = chosen.launcher(prepared, spec)
    if key is not None and prepared is x:  # (a narrowing dtype= converts x on every call)
        _memo.put(key, (launcher, forward_proof(x, dim, dtype, backend, log)))
    return launcher(prepared)


def backward(y: torch.Tensor, grad: torch.Tensor, dim: int, log: bool = False,
             backend: str | None = None) -> torch.Tensor:
    """Gradient of softmax (log_softmax with `log=True`) w.r.t. its input, from the forward
    output `y` and the output gradient `grad`: y * (grad - sum(y * grad)) along `dim`
    (log: grad - exp(y) * sum(grad)), in y's dtype."""
    key = request_key(BWD, y, dim, None, backend, log, grad)
    hit = _lookup(key)
    if hit is not None:
        stats["hits"] += 1
        return hit(y, grad)
    _fresh()
    spec = check_backward_args(y, grad, dim, log)
    chosen = registry.select(spec, backend, "bwd")
    if spec.numel == 0:
        return torch.empty(spec.shape, dtype=y.dtype, device=y.device)
    launcher = chosen.backward_launcher(y, replace(spec, in_dtype=y.dtype, out_dtype=y.dtype))
    if key is not None:
        _memo.put(key, launcher)
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
    return _narrowed(x, SoftmaxSpec.from_request(x, dim, dtype, log=log, fused=a.as_kwargs())[0])


def forward_fused(x, dim, dtype, backend, log: bool, a: FusedArgs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fused family without autograd: (y, p_sink: each row's sink share, None without sinks)."""
    key = request_key(FUSED_FWD, x, dim, dtype, backend, log, None, a)
    hit = _lookup(key)
    if hit is not None:
        stats["hits"] += 1
        launcher, plain = hit
        prepared = x
    else:
        _fresh()
        prepared, spec = prepare_fused(x, dim, dtype, log, a)
        chosen = registry.select(spec, backend)
        if spec.numel == 0:  # nothing to compute
            p = None if a.sinks is None else x.new_empty(row_shape(spec.shape, spec.dim), dtype=spec.acc_dtype)
            return x.new_empty(spec.shape, dtype=spec.out_dtype), p
        launcher, plain = chosen.launcher(prepared, spec), spec.is_plain  # (a plain launcher takes x alone)
        if key is not None and prepared is x:
            _memo.put(key, (launcher, plain))
    if plain:  # (no scale or softcap: the key says they are absent)
        return launcher(prepared), None
    scale, softcap = runtime_values(a.scale, a.softcap)
    return launcher(prepared, Operands(a.mask, a.sinks, scale, softcap))


def backward_fused(grad, y, x, dim, log: bool, a: FusedArgs, p_sink, backend=None):
    """Gradients of the fused family from its output `y`: (dx in y's dtype, per-row dsinks or None).
    `x` is the forward's input (read with softcap), `p_sink` its sink shares (with sinks)."""
    saved = x if a.softcap is not None else None
    key = request_key(FUSED_BWD, y, dim, None, backend, log, grad, a, saved, p_sink)
    hit = _lookup(key)
    if hit is not None:
        stats["hits"] += 1
        launcher, plain = hit
    else:
        _fresh()
        spec = check_backward_args(y, grad, dim, log, a.as_kwargs())
        if a.softcap is not None and (not isinstance(x, torch.Tensor) or x.shape != y.shape):
            raise ValueError("softmax_backward: a softcap gradient needs the forward's input x, of the output's shape")
        if a.sinks is not None and p_sink is None:
            raise ValueError("softmax_backward: a sinks gradient needs the forward's per-row sink shares (p_sink)")
        chosen = registry.select(spec, backend, "bwd")
        if spec.numel == 0:
            dx = torch.empty(spec.shape, dtype=y.dtype, device=y.device)
            return dx, (torch.empty_like(p_sink) if p_sink is not None else None)
        spec = replace(spec, in_dtype=y.dtype, out_dtype=y.dtype)
        plain = spec.is_plain  # (a plain launcher takes (y, grad) alone)
        launcher = chosen.backward_launcher(y, spec) if plain else chosen.fused_backward_launcher(y, spec)
        if key is not None:
            _memo.put(key, (launcher, plain))
    if plain:
        return launcher(y, grad), None
    scale, cap = runtime_values(a.scale, a.softcap)
    return launcher(grad, y, x, Operands(a.mask, a.sinks, scale, cap), p_sink)


# ---- softmax in pieces (core.lse_merge) ----------------------------------------------------------

def _logsumexp_formula(spec: SoftmaxSpec, keepdim: bool):
    # Zero-length rows are -inf (s with a sink), no rows an empty result: no kernel to launch.
    shape = None if keepdim else lse_shape(spec, False)

    def formula(x, ops: Operands):
        v = spec.variant.with_values(ops.scale, ops.softcap)
        out = logsumexp_formula(x, v, spec.dim, ops.mask, ops.sinks, spec.acc_dtype)
        return out if shape is None else out.view(shape)
    return formula


def logsumexp(x, dim, backend=None, keepdim=True, scale=None, mask=None, causal=False, softcap=None,
              sinks=None) -> torch.Tensor:
    """logsumexp in the accumulation dtype, no autograd, with keepdim or without `dim` (0-dim: 0-dim)."""
    # A call without fused keywords keys as a plain forward (no keywords to read): its hit path
    # costs what the softmax's does.
    plain = scale is None and mask is None and causal is False and softcap is None and sinks is None
    direction = LSE if keepdim else LSE_SQUEEZED
    key = request_key(direction, x, dim, None, backend) if plain else \
        request_key(direction, x, dim, None, backend, False, None, FusedArgs(scale, mask, causal, softcap, sinks))
    hit = _lookup(key)
    if hit is not None:
        stats["hits"] += 1
    else:
        _fresh()
        spec, _ = logsumexp_request(x, dim, scale=scale, mask=mask, causal=causal, softcap=softcap, sinks=sinks)
        if spec.needs_input_cast:
            raise TypeError(f"logsumexp: x dtype {x.dtype} is not floating")
        chosen = registry.select_op(LOGSUMEXP, spec, backend)
        hit = _logsumexp_formula(spec, keepdim) if spec.numel == 0 or x.dim() == 0 else \
            chosen.shaped_logsumexp_launcher(x, spec, Operands(mask, sinks, 1.0, 1.0), keepdim)
        if key is not None:
            _memo.put(key, hit)
    if plain or (scale is None and softcap is None and mask is None and sinks is None):
        return hit(x, NO_OPERANDS)
    s, c = runtime_values(scale, softcap)
    return hit(x, Operands(mask, sinks, s, c))


def _merge_entry(launcher, outputs, lses, backend, out, lse_out) -> tuple:
    # A MERGE key's entry: (launcher, the guard of the other operands' layouts, whether passing
    # the guard proves a call plain (no gradient wanted), the proof of a repeat of this very
    # request (`merge_proof`), kept in `_last_merge` once used).
    same = layout_guard((*outputs, *lses))
    plain = same is not None and all(type(t) is torch.Tensor and not t.requires_grad for t in (*outputs, *lses))
    proof = merge_proof(outputs, lses, backend, out, lse_out) if plain else None
    return launcher, same, plain, proof


def merge_states(outputs, lses, backend=None, out=None, lse_out=None, eager=None):
    """(out, lse) of merge_states, no autograd; written into `out` / `lse_out` (validated by the
    caller) when given. `eager(*outputs, *lses)`: whether the tensors may run here rather than
    through the operator (the caller checked the mode), asked unless the memoised guard proves
    it; None is returned when it says no."""
    last = _last_merge[0]
    if last is not None:
        addresses = last[0](outputs, lses, backend, out, lse_out)
        if addresses is not None:
            # The last plain request again (its proof checked every operand and read their
            # addresses, which the launch takes): no key, no lookup.
            stats["hits"] += 1
            if last[2] is not None:
                return last[2](addresses, outputs, lses, out, lse_out)
            return last[1](outputs, lses, out, lse_out)
    key = request_key(MERGE, outputs, lses, None, backend, False, out, None, lse_out)
    hit = _lookup(key)
    if hit is not None:
        launcher, same_layouts, plain, proof = hit
        if same_layouts is None or same_layouts(*outputs, *lses):
            if eager is not None and not plain and not eager(*outputs, *lses):
                return None
            stats["hits"] += 1
            if proof is not None:
                _last_merge[0] = (proof, launcher, getattr(launcher, "addressed", None))
            return launcher(outputs, lses, out, lse_out)
        if eager is not None and not eager(*outputs, *lses):
            return None
        eager = None  # (asked)
        # The entry was bound to operands laid out otherwise past the first partial and lse (the
        # key holds only theirs): this request keys every operand.
        key = request_key(MERGE_EXACT, outputs, lses, None, backend, False, out, None, lse_out)
        hit = _lookup(key)
        if hit is not None:
            stats["hits"] += 1
            return hit[0](outputs, lses, out, lse_out)
    if eager is not None and not eager(*outputs, *lses):
        return None
    _fresh()
    spec = MergeSpec.from_tensors(outputs, lses)
    chosen = registry.select_op(MERGE_STATES, spec, backend)
    # (nothing to merge, no rows or empty heads: the formula, no kernel to launch)
    launcher = partial(merge_into, spec) if spec.n_rows == 0 or spec.head_size == 0 else \
        chosen.merge_states_launcher(outputs, lses, spec)
    if key is not None:
        _memo.put(key, _merge_entry(launcher, outputs, lses, backend, out, lse_out) if key[0] is MERGE
                  else (launcher, None, False, None))
    return launcher(outputs, lses, out, lse_out)
