"""A request's key: the only cache key (dispatch's memo; backends derive their plans' from it). What it holds:
docs/backends.md ("How a call flows")."""

from __future__ import annotations

import functools
import operator

import torch

from .. import config
from ..config import overrides_key
from . import registry
from .spec import SoftmaxSpec

# Bytes of pointer divisibility the compilers specialise on (Triton vectorises a 16-byte aligned
# pointer, CuTe's vector width is capped at 16 bytes); Wave checks its alignment on every call.
ALIGN_BYTES = 16
_ALIGN_MASK = ALIGN_BYTES - 1

FWD, BWD, FUSED_FWD, FUSED_BWD = "fwd", "bwd", "fused_fwd", "fused_bwd"
LSE = "lse"  # logsumexp keys as a fused forward
LSE_SQUEEZED = "lse_squeezed"  # logsumexp with keepdim=False: its launcher allocates the result without dim
# merge_states: by its first operands' layouts, the rest proved by a guard; or by every layout
MERGE, MERGE_EXACT = "merge", "merge_exact"
SHARDED, SHARDED_LSE = "sharded", "sharded_lse"  # anysoftmax.distributed's requests

_Tensor = torch.Tensor
_TENSOR_ONLY = frozenset((_Tensor,))  # (`issuperset(map(type, ...))`: every one a tensor, in a C loop)
_tuple = tuple
_address = torch.Tensor.data_ptr
_reduce, _or = functools.reduce, operator.or_
# The registry generation and the count of active tuning overrides, read in place (one-element
# lists updated on change): a function call each would be most of a key's cost.
_generation = registry.current_generation
_overrides_active = config.active_overrides


def _process_state() -> tuple:
    # The state part of a key while some tuning override is active (else the generation alone).
    return (_generation[0], overrides_key())


def alignment(t) -> int:
    """`t`'s address modulo `ALIGN_BYTES` (0 for None and for fake tensors: planned as aligned)."""
    return 0 if t is None or type(t) is not _Tensor else t.data_ptr() & _ALIGN_MASK


def _operand(t):
    # An operand's part of the key: layout, dtype, device and alignment (None when absent).
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & _ALIGN_MASK)


def request_key(direction: str, x, dim, dtype=None, backend=None, log: bool = False, grad=None, fused=None,
                saved=None, p_sink=None):
    """The key of one call, or None when an argument is not of an exact type (validated every call).
    `x`: the input (forward) or output (backward); `saved`, `p_sink`: what a fused backward reads.
    merge_states passes its partials as `x`, its lses as `dim`, `out` as `grad`, `lse_out` as `saved`."""
    if type(x) is not _Tensor:
        if direction is MERGE:
            return _merge_key(x, dim, backend, grad, saved)
        return _exact_merge_key(x, dim, backend, grad, saved) if direction is MERGE_EXACT else None
    if type(dim) is not int:
        return None
    # One tuple literal per form (no concatenation): this is the whole per-call cost of a hit.
    if fused is None:
        if grad is None:
            return (direction, x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & _ALIGN_MASK, dim, dtype, backend,
                    log, _generation[0] if not _overrides_active[0] else _process_state())
        if type(grad) is not _Tensor:
            return None
        return (direction, x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & _ALIGN_MASK, dim, dtype, backend,
                log, _generation[0] if not _overrides_active[0] else _process_state(), grad.shape, grad.stride(),
                grad.dtype, grad.device, grad.data_ptr() & _ALIGN_MASK)
    m, s = fused.mask, fused.sinks
    if (m is not None and type(m) is not _Tensor) or (s is not None and type(s) is not _Tensor) \
            or type(fused.causal) not in (bool, str) or type(fused.empty_rows) is not str \
            or (grad is not None and type(grad) is not _Tensor) or (saved is not None and type(saved) is not _Tensor) \
            or (p_sink is not None and type(p_sink) is not _Tensor):
        return None
    return (direction, x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & _ALIGN_MASK, dim, dtype, backend, log,
            _generation[0] if not _overrides_active[0] else _process_state(), _operand(grad), _operand(m),
            _operand(s), fused.scale is None if type(fused.scale) is not _Tensor else _operand(fused.scale),
            fused.softcap is None, fused.causal, fused.empty_rows, _operand(saved), _operand(p_sink))


def forward_key(x, dim, dtype, backend, log):
    """`request_key(FWD, x, dim, dtype, backend, log)` with no branch: the plain forward's hit path."""
    if type(x) is not _Tensor or type(dim) is not int:
        return None
    return (FWD, x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & _ALIGN_MASK, dim, dtype, backend, log,
            _generation[0] if not _overrides_active[0] else _process_state())


def _merge_key(outputs, lses, backend, out, lse_out):
    # merge_states, where torch's layout guard is usable: the first partial's and lse's layouts, K
    # and every alignment; the other layouts are proved by the entry's guard, in C.
    if type(outputs) not in (list, _tuple) or type(lses) not in (list, _tuple) or not outputs or not lses \
            or (out is not None and type(out) is not _Tensor) or (lse_out is not None and type(lse_out) is not _Tensor):
        return None
    if (_guard_state[0] if _guard_state else _guard_maker()) is None:
        return _exact_merge_key(outputs, lses, backend, out, lse_out)
    first, first_lse = outputs[0], lses[0]
    if type(first) is not _Tensor or type(first_lse) is not _Tensor:
        return None
    try:
        # Every operand aligned (the common case) is one 0: the addresses ORed in C loops; else
        # each one's alignment.
        aligns = _reduce(_or, map(_address, lses), _reduce(_or, map(_address, outputs))) & _ALIGN_MASK
        if aligns:
            aligns = _tuple(map(_ALIGN_MASK.__and__, (*map(_address, outputs), *map(_address, lses))))
    except (TypeError, RuntimeError):  # an operand that is no tensor, or has no storage (a torch.func
        return None                    # transform's): validated, or sent to the operator, on every call
    return (MERGE, len(outputs), first.shape, first.stride(), first.dtype, first.device, first_lse.shape,
            first_lse.stride(), first_lse.dtype, aligns, backend,
            _generation[0] if not _overrides_active[0] else _process_state(),
            None if out is None else _operand(out), None if lse_out is None else _operand(lse_out))


def _exact_merge_key(outputs, lses, backend, out, lse_out):
    # merge_states by every partial's and lse's layout and alignment, then the optional outputs.
    if type(outputs) not in (list, _tuple) or type(lses) not in (list, _tuple) \
            or (out is not None and type(out) is not _Tensor) or (lse_out is not None and type(lse_out) is not _Tensor):
        return None
    if not (_TENSOR_ONLY.issuperset(map(type, outputs)) and _TENSOR_ONLY.issuperset(map(type, lses))):
        return None
    # (`_operand` written out: a call per tensor would be a third of the key's cost at K = 8)
    try:
        return (MERGE_EXACT,
                _tuple([(t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & _ALIGN_MASK) for t in outputs]),
                _tuple([(t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & _ALIGN_MASK) for t in lses]),
                backend, _generation[0] if not _overrides_active[0] else _process_state(), _operand(out),
                _operand(lse_out))
    except RuntimeError:  # an operand without storage (a torch.func transform's): sent to the operator
        return None


def forward_proof(x, dim, dtype, backend, log):
    """`proves(x, dim, dtype, backend, log) -> bool`: whether a plain forward call has this very
    request's key (`forward_key`), checked without building it: the same dim, dtype, backend, log
    and process state, x's layout through torch's tensor guard and its address as aligned. None
    where x is not a plain tensor with storage or torch has no usable guard."""
    make = _guard_maker()
    if make is None or type(x) is not _Tensor or type(dim) is not int:
        return None
    try:
        align = x.data_ptr() & _ALIGN_MASK
    except RuntimeError:  # (no storage: a torch.func transform's)
        return None
    state = _generation[0] if not _overrides_active[0] else _process_state()
    same = make((x,))

    def proves(t, d, dt, b, lg) -> bool:
        # (the guard checks the type: a subclass, or anything but a tensor, is refused)
        try:
            return type(d) is int and d == dim and dt is dtype and b == backend and lg is log \
                and (_generation[0] if not _overrides_active[0] else _process_state()) == state and same(t) \
                and _address(t) & _ALIGN_MASK == align
        except (TypeError, RuntimeError):  # (not a tensor, or no storage: the key path decides)
            return False
    return proves


def merge_proof(outputs, lses, backend, out, lse_out):
    """`proves(outputs, lses, backend, out, lse_out)`: the addresses of (*outputs, *lses) (read once,
    for the launch) when a call is this very request, else None, checked without building its key
    (K, backend, process state, which outputs are given, every operand's layout through torch's
    tensor guard, every address aligned). None where the operands are not all plain aligned
    tensors or torch has no usable guard."""
    make = _guard_maker()
    if make is None or type(outputs) not in (list, _tuple) or type(lses) not in (list, _tuple) \
            or len(outputs) != len(lses) or not outputs:
        return None
    given = [t for t in (out, lse_out) if t is not None]
    tensors = (*outputs, *lses, *given)
    if not _TENSOR_ONLY.issuperset(map(type, tensors)):
        return None
    try:
        if _reduce(_or, map(_address, tensors)) & _ALIGN_MASK:
            return None
    except RuntimeError:  # (no storage: a torch.func transform's)
        return None
    k, state, has_out, has_lse = len(outputs), _generation[0] if not _overrides_active[0] else _process_state(), \
        out is not None, lse_out is not None
    same = make(tensors)
    kinds = (list, _tuple)

    def proves(o, l_, b, y, z) -> tuple | None:
        # (K and the containers first: the guard's positions are the remembered ones only then)
        if type(o) not in kinds or type(l_) not in kinds or len(o) != k or len(l_) != k or b != backend \
                or (y is not None) is not has_out or (z is not None) is not has_lse \
                or (_generation[0] if not _overrides_active[0] else _process_state()) != state:
            return None
        try:
            given_now = () if y is None and z is None else [t for t in (y, z) if t is not None]
            if not same(*o, *l_, *given_now):
                return None
            addresses = (*map(_address, o), *map(_address, l_))
            return None if _reduce(_or, map(_address, given_now), _reduce(_or, addresses)) & _ALIGN_MASK \
                else addresses
        except (TypeError, RuntimeError):  # (not a tensor, or no storage: the key path decides)
            return None
    return proves


def layout_guard(tensors):
    """`same(*others) -> bool`: whether `others` match `tensors` position by position (type, dtype,
    device, shape, strides, grad requirement, dispatch state), checked in C by torch.compile's
    tensor guard; None where this torch has no guard that passes `_guard_maker`'s probe."""
    make = _guard_maker()
    return None if make is None else make(tensors)


def _tensor_guard(tensors):
    from torch._C._dynamo.guards import TensorGuards

    # Every size and stride given as a static value: the guard checks them all (None would leave
    # that dim unchecked, as for torch.compile's dynamic dims).
    return TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                        dynamic_dims_strides=[list(t.stride()) for t in tensors]).check


_guard_state: list = []  # [the guard maker or None], decided on first use


def _guard_maker():
    """`_tensor_guard`, once a probe has shown that it tells layouts, dtypes and devices apart;
    None where it fails or is missing (a private torch API: merge_states then keys every operand)."""
    if _guard_state:
        return _guard_state[0]
    try:
        same = _tensor_guard((torch.empty(2, 3),))
        ok = same(torch.empty(2, 3)) is True and not any(
            same(t) for t in (torch.empty(3, 3), torch.empty(3, 2).t(), torch.empty(2, 3, dtype=torch.float64),
                              torch.empty(2, 3, device="meta")))
    except Exception:  # (any failure of a private API means: not usable here)
        ok = False
    _guard_state.append(_tensor_guard if ok else None)
    return _guard_state[0]


def plan_key(spec: SoftmaxSpec, direction: str, *operands, extra: tuple = ()) -> tuple:
    """What a backend's plan for this request depends on: the spec's `kernel_key()`, the direction,
    the operands' alignments (tensors, or ints), the active tuning overrides, and `extra`: facts of
    the process the backend plans from (its compile target)."""
    aligns = tuple(a if type(a) is int else alignment(a) for a in operands)
    return (spec.kernel_key(), direction, aligns, overrides_key(), extra)
