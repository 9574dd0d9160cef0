"""Registration and selection of backends: ``backend=``, then $ANYSOFTMAX_BACKEND (never a silent fallback),
then `decide` (docs/backends.md, "How the automatic choice is made")."""

from __future__ import annotations

import difflib
import logging
import os
import threading
from dataclasses import dataclass, replace

import torch

from . import selection
from .backend import Backend, as_backend
from .errors import BackendUnavailableError, UnsupportedRequestError
from .lse_merge import LOGSUMEXP, MERGE_STATES, SOFTMAX
from .spec import SoftmaxSpec

log = logging.getLogger("anysoftmax")

ENV_BACKEND = "ANYSOFTMAX_BACKEND"


@dataclass(frozen=True)
class BackendStatus:
    """One row of `list_backends()`."""

    name: str
    available: bool
    reason: str  # why not available; "" when available
    devices: tuple[str, ...]
    note: str = ""  # how it runs here when that is worth knowing (e.g. through the Triton interpreter)


class BackendTable(list):
    """What `list_backends()` returns: a list of `BackendStatus` that prints as a table."""

    HEADER = ("backend", "available", "devices", "reason / note")

    def __repr__(self) -> str:
        cells = [self.HEADER] + [(b.name, "yes" if b.available else "no", ", ".join(b.devices), b.reason or b.note)
                                 for b in self]
        widths = [max(len(row[i]) for row in cells) for i in range(3)]
        return "\n".join(("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[3]).rstrip()
                         for row in cells)

    __str__ = __repr__


_lock = threading.Lock()
_given: dict[str, object] = {}  # name -> the object registered (what `registered()` returns)
_backends: dict[str, Backend] = {}  # name -> that object as a `Backend` (what selection returns)
# Changes to the set of backends since it was loaded (memoised selections keyed by it go stale);
# a one-element list that `core.request`'s key reads in place.
current_generation = [0]


def generation() -> int:
    """A number that changes whenever a backend is registered or removed."""
    _load_builtins()
    return current_generation[0]


def register(backend):
    """Add a backend (replacing one of the same name) and return it; a duck-typed one is wrapped once, here."""
    adapted = as_backend(backend)
    with _lock:
        _given[adapted.name] = backend
        _backends[adapted.name] = adapted
        current_generation[0] += 1
    return backend


def unregister(name: str) -> None:
    """Remove a backend (used by tests that register a deliberately broken one)."""
    with _lock:
        _given.pop(name, None)
        _backends.pop(name, None)
        current_generation[0] += 1


def registered() -> dict:
    """Name -> backend as registered, in registration order."""
    _load_builtins()
    with _lock:
        return dict(_given)


def did_you_mean(name: str, known) -> str:
    """' (did you mean 'triton'?)' for the known name closest to `name` (case ignored), or ''."""
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(str(name).lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def get_backend(name: str):
    """The backend called `name`, as registered; ValueError naming the known ones otherwise."""
    backends = registered()
    if name not in backends:
        raise ValueError(f"unknown backend {name!r}{did_you_mean(name, backends)}; "
                         f"known backends: {', '.join(backends)}")
    return backends[name]


def _adapted() -> list[Backend]:
    _load_builtins()
    with _lock:
        return list(_backends.values())


def _protocol(backend) -> Backend:
    # `backend` as a `Backend`: itself, else its adapter made at registration, else adapted now.
    if issubclass(type(backend), Backend):
        return backend
    with _lock:
        if _given.get(backend.name) is backend:
            return _backends[backend.name]
    return as_backend(backend)


def unavailable_reason(name: str) -> str | None:
    """Why the backend called `name` cannot run here (None when it can)."""
    return _availability(get_backend(name))


def _probe(what: str, call, *args):
    """`call(*args)`, or why it failed: a probe of a backend must never take the caller down."""
    try:
        return call(*args)
    except Exception as exc:
        return f"{what} failed: {type(exc).__name__}: {exc}"


def _availability(backend) -> str | None:
    return _probe("availability check", backend.is_available)


def list_backends() -> BackendTable:
    """Every registered backend with its availability here and the reason if not (a table)."""
    rows = BackendTable()
    for b in _adapted():
        reason = _availability(b)
        note = (_probe("status note", b.status_note) or "") if reason is None else ""
        rows.append(BackendStatus(b.name, reason is None, reason or "", tuple(b.devices), note))
    return rows


def fused_refusal(backend, spec: SoftmaxSpec) -> str | None:
    """Why `backend` cannot take a fused request (no `fused` or, for a tensor scale, `row_scale`), or None."""
    if spec.is_plain:
        return None
    b = _protocol(backend)
    if not b.fused:
        return (f"computes the plain softmax only (it does not declare the fused family, `fused = True`), "
                f"so it cannot apply {spec.variant.describe()}")
    return row_scale_refusal(b, spec)


def row_scale_refusal(backend, spec: SoftmaxSpec) -> str | None:
    """Why `backend` cannot take `spec`'s tensor scale (one value per row), or None."""
    if spec.variant.row_scale is None or _protocol(backend).row_scale:
        return None
    return "takes a number as scale only (it does not declare `row_scale = True`): no tensor scale"


def refusal(backend, spec: SoftmaxSpec) -> str | None:
    """Why `backend` does not serve `spec` (the fused-family gate, then its `supports`), or None."""
    return fused_refusal(backend, spec) or backend.supports(spec)


def op_refusal(backend, op: str, spec) -> str | None:
    """Why `backend` does not serve `op` ("softmax", "logsumexp" or "merge_states": `spec` a
    `MergeSpec`) for `spec`, or None: no kernel, the fused-family gate, then `supports[_<op>]`."""
    b = _protocol(backend)
    if op == LOGSUMEXP:
        return b.logsumexp_refusal or fused_refusal(b, spec) or b.supports_logsumexp(spec)
    if op == MERGE_STATES:
        return b.merge_states_refusal or b.supports_merge_states(spec)
    return refusal(b, spec)


# A small request of each floating dtype: a device type is one a backend runs when its
# `supports` takes any of them there (a backend may take 16-bit dtypes only, or refuse float64).
_PROBE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def device_refusal(backend, device_type: str) -> str | None:
    """Why `backend` runs no request on tensors of `device_type` here (its `supports` refuses a
    small request of every floating dtype there), or None (also for a device type torch cannot name)."""
    try:
        device = torch.device(device_type)
    except RuntimeError:  # e.g. "npu" without torch_npu: nothing of that type can exist here
        return None
    reasons = []
    for dtype in _PROBE_DTYPES:
        spec = replace(SoftmaxSpec.from_tensor(torch.empty(2, 8, dtype=dtype, device="meta"), -1), device=device)
        reasons.append(_probe("supports()", backend.supports, spec))
    return None if None in reasons else reasons[0]


def _by_priority(device_type: str) -> list[Backend]:
    return sorted((b for b in _adapted() if "*" in b.devices or device_type in b.devices), key=lambda b: -b.priority)


def _describe(op: str, spec) -> str:
    return spec.describe().replace("softmax(", "logsumexp(", 1) if op == LOGSUMEXP else spec.describe()


def _explicit(name: str, spec, op: str, source: str) -> Backend:
    # The backend `name` when it runs `op` on `spec` here, else the error naming it and why.
    try:
        chosen = _protocol(get_backend(name))
    except ValueError as exc:
        if source.startswith("from $"):
            raise ValueError(f"${ENV_BACKEND}={name!r}: {exc}") from None
        raise
    reason = _availability(chosen)
    if reason is not None:
        raise BackendUnavailableError(f"backend {name!r} ({source}) is not available: {reason}")
    reason = op_refusal(chosen, op, spec)
    if reason is not None:
        raise UnsupportedRequestError(f"backend {name!r} ({source}) does not support {_describe(op, spec)}: {reason}")
    return chosen


def select(spec, backend: str | None = None, direction: str | None = "fwd", op: str = SOFTMAX) -> Backend:
    """The backend for `op` on `spec`: explicit name, then $ANYSOFTMAX_BACKEND (both raising with
    the reason), then `decide` (`direction` picks the selection table's rows; None reads none)."""
    if backend is not None:
        if not isinstance(backend, str):
            raise TypeError(f"backend must be a backend name (str) or None, got {type(backend).__name__}")
        return _explicit(backend, spec, op, "requested explicitly")
    env = os.environ.get(ENV_BACKEND, "").strip()
    if env:
        return _explicit(env, spec, op, f"from ${ENV_BACKEND}")
    chosen, why = decide(spec, direction, refuses=lambda b, s: op_refusal(b, op, s), what=_describe(op, spec))
    if chosen is None:
        raise UnsupportedRequestError(why)
    return chosen


def select_op(op: str, spec, backend: str | None = None) -> Backend:
    """`select` for the pieces op `op` (logsumexp: the table's `lse` rows; merge_states: priority)."""
    return select(spec, backend, "lse" if op == LOGSUMEXP else None, op)


def runners(spec, op: str = SOFTMAX) -> list[str]:
    """The backends that run `op` on `spec` here, by priority (what the benchmarks time)."""
    return [b.name for b in _by_priority(spec.device.type)
            if _availability(b) is None and op_refusal(b, op, spec) is None]


def decide(spec, direction: str | None = "fwd", device_name: str | None = None, refuses=refusal,
           available=_availability, what: str | None = None) -> tuple[Backend | None, str]:
    """(backend, why) of the automatic choice for `spec`: the rule of the selection table (of
    `spec.device` or `device_name`) if its backend runs the request, else the first by priority
    that does; (None, why none can). `available`, `refuses`: why b cannot run here / the request."""
    candidates = _by_priority(spec.device.type)
    table_why = ""
    if direction is not None:
        measured, table_why = _from_table(spec, candidates, direction, device_name, refuses, available)
        if measured is not None:
            return measured, f"selection table: {table_why}"
    passed = []
    for b in candidates:
        reason = available(b) or refuses(b, spec)
        if reason is None:
            notes = "; ".join(filter(None, [table_why, "passed over: " + "; ".join(passed) if passed else ""]))
            return b, (f"priority {b.priority}, the first of {[c.name for c in candidates]} that runs it"
                       + (f" ({notes})" if notes else ""))
        log.debug("anysoftmax: passing over backend %r for %s: %s", b.name, what or spec.describe(), reason)
        passed.append(f"{b.name}: {reason}")
    return None, (f"no backend can run {what or spec.describe()}: "
                  + ("; ".join(passed) or f"none serves device type {spec.device.type!r}")
                  + (f" ({table_why})" if table_why else ""))


def _from_table(spec, candidates: list, direction: str, device_name: str | None, refuses,
                available) -> tuple[Backend | None, str]:
    # (the backend the selection table names for `spec` when it runs it, why); (None, why not)
    # sends the choice on to the priority order.
    try:
        rule, table = selection.lookup(spec, direction, device_name)
    except Exception as exc:  # a broken table must not take softmax down: priority decides
        log.warning("anysoftmax: selection table unusable for %s: %s", spec.device, exc)
        return None, f"selection table unusable: {exc}"
    if table is None:
        name = device_name or selection.device_name(spec.device)
        tables = ", ".join(repr(n) for n in selection.table_names()) or "none"
        return None, (f"no selection table for {name!r} (tables: {tables})" if name else
                      f"no selection table ({spec.device} is not visible here; tables: {tables}, "
                      f"--gpu-name NAME or a unique part of it, e.g. H100, reads one)")
    if rule is None:
        return None, f"{table.path}: no rule for this request"
    where = f"{table.path} rule {rule.index} ({rule.describe()})"
    chosen = next((b for b in candidates if b.name == rule.backend), None)
    reason = (f"backend {rule.backend!r} is not registered for device type {spec.device.type!r}" if chosen is None
              else available(chosen) or refuses(chosen, spec))
    if reason is not None:
        log.debug("anysoftmax: %s names %r for %s, passed over: %s", where, rule.backend, spec.describe(), reason)
        return None, f"{where} names {rule.backend!r}, passed over: {reason}"
    return chosen, f"{where}; measured {rule.measured}" if rule.measured else where


def explain(spec: SoftmaxSpec, direction: str = "fwd", device_name: str | None = None) -> tuple[str, str]:
    """(backend name, why) of the automatic choice for `spec` ("" when none runs it). For a device
    `device_name` that is not here, backends are judged by what they declare alone."""
    if device_name is not None and device_name != selection.device_name(spec.device):
        # (availability on a device that is not here is not knowable, so assumed)
        chosen, why = decide(spec, direction, device_name, refuses=fused_refusal, available=lambda b: None)
        why += "; on that device: its backends assumed available (not checkable here)"
    else:
        chosen, why = decide(spec, direction, device_name)
    return (chosen.name if chosen is not None else ""), why


_loader_lock = threading.RLock()
_loaders: list = []  # callables that register backends, run once on first use of the registry


def add_loader(load) -> None:
    """Run `load()` (which registers backends) before the registry is next read."""
    with _loader_lock:
        _loaders.append(load)


def _load_builtins() -> None:
    if not _loaders:
        return
    with _loader_lock:  # other threads wait until the backends are all registered
        before = current_generation[0]
        while _loaders:
            _loaders.pop(0)()
        # Loading precedes the first selection, so no memoised choice can be stale: it leaves the
        # generation as it was, and a key computed before it (a process's first call) holds.
        current_generation[0] = before
