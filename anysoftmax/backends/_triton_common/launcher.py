"""The one launch engine: a Triton kernel bound by name to one request (`bind_kernel`; plans: `bind`).
The first launch compiles through Triton's JIT entry point under the kernel's lock; later ones call
Triton's low-level launcher or the native one with only addresses, stream and per-call values."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable, NamedTuple

import torch

from ...core.layout import RowLayout
from . import native_launch
from .interpreted_launch import interpreted
from .plan import PLAIN_SCALARS, VALUE_NAMES, KernelPlan, runtime_params

# (device, stream) -> counters, least recently used first; bounded (streams made on the fly).
_counters: OrderedDict = OrderedDict()
_counters_lock = threading.Lock()
MAX_COUNTER_STREAMS = 64

_launch_locks: dict = {}
_launch_locks_lock = threading.Lock()
_interpreter_lock = threading.Lock()

# Set ANYSOFTMAX_FAST_LAUNCH=0 to launch through Triton's JIT entry point on every call.
FAST_LAUNCH = os.environ.get("ANYSOFTMAX_FAST_LAUNCH", "1") != "0"


def launch_lock(kernel) -> threading.Lock:
    """The lock around a first launch (compile) of `kernel`; under the interpreter one lock for
    every launch (it patches `triton.language` globally while a kernel runs)."""
    if interpreted(kernel):
        return _interpreter_lock
    with _launch_locks_lock:
        return _launch_locks.setdefault(kernel, threading.Lock())


def _raw_stream(device: torch.device) -> int:
    # The current stream's handle without building a torch.cuda.Stream object.
    return torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else torch.cuda.current_device())


def row_counters(device: torch.device, n_rows: int) -> torch.Tensor:
    """Zeroed (arrived, departed) int32 counters for `n_rows` rows, one buffer per (device, stream)
    (launches on different streams may overlap), grown when needed: the kernels leave them zero."""
    n = max(2 * n_rows, 2)
    key = (str(device), _raw_stream(device) if device.type == "cuda" else 0)
    with _counters_lock:
        buf = _counters.get(key)
        if buf is None or buf.numel() < n:
            buf = torch.zeros(max(n, 2 * (buf.numel() if buf is not None else 0)), dtype=torch.int32, device=device)
            _counters[key] = buf
        _counters.move_to_end(key)
        while len(_counters) > MAX_COUNTER_STREAMS:
            # Safe to drop: the caching allocator hands a block freed on a stream back only to
            # allocations on that same stream, which run after the kernels queued there.
            _counters.popitem(last=False)
        return buf


def per_stream(make):
    """`get(device)`: `make(device)` kept per current stream of `device` (launches on one run in order)."""
    kept: dict = {}

    def get(device: torch.device):
        stream = _raw_stream(device) if device.type == "cuda" else 0
        got = kept.get(stream)
        if got is None:
            if len(kept) >= MAX_COUNTER_STREAMS:
                kept.clear()
            got = kept[stream] = make(device)
        return got
    return get


def device_guard(device: torch.device):
    """Context making a CUDA/ROCm `device` current (Triton launches there) where it is not already."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


@dataclass(frozen=True)
class Binding:
    """A kernel bound by name to one request: all a launch needs but the call's tensors and
    per-call values (the fast path needs the signature's order: pointers, integers, floats)."""

    kernel: Any
    grid: int
    pointer_names: tuple
    # The call's arguments (tensors, None where absent, then the scratch) -> the kernel's pointers
    # in `pointer_names` order; it must only pick (the fast path maps positions through it).
    pointers: Callable
    ints: dict  # integer arguments by name (a per-call one's value here is only a placeholder)
    metas: tuple  # one launch per entry (PHASEs): its constexprs and launch options
    floats: tuple = ()  # names of the per-call float arguments
    values: tuple = ()  # their values when a call gives none
    per_call: tuple = ()  # integers given per call (the sharded kernel's epoch), adjacent in `ints`


class FastPath(NamedTuple):
    """What a bound launcher's later calls use (`bind_kernel`)."""

    calls: list  # (launch, before, after, constexpr tail, the arguments after the pointers joined)
    hooks: Any  # Triton's runtime knobs, read per call
    enter: Any  # the launch hooks seen when set up, and the lists saying they are inactive (`_hook_calls`)
    leave: Any
    enter_calls: list
    leave_calls: list
    stream_of: Callable  # device index -> the current raw stream
    device: torch.device
    index: int | None
    addresses: Callable  # the call's arguments -> the kernel's pointers (`_address_reader`)
    native: Callable | None  # the native launcher, where chosen and built
    pick: Callable | None  # the addresses of every argument -> the kernel's pointers (`_picker`)


@functools.lru_cache(maxsize=None)
def _forwards_varargs(launcher_type) -> bool:
    """Whether a CUDA launcher's `__call__` forwards to its extension's `launch` in `_fast_calls`' order."""
    import inspect

    params = list(inspect.signature(launcher_type.__call__).parameters.values())[1:]
    return [p.name for p in params[:5]] == ["gridX", "gridY", "gridZ", "stream", "function"] and \
        len(params) == 6 and params[5].kind is inspect.Parameter.VAR_POSITIONAL


def _fast_calls(compiled_kernels: list, tails: list, grid: int) -> list:
    """[(launch, before, after, constexpr tail)]: `launch(*before, stream, *after, *pointers, *integers,
    *floats, *tail)` is `kernel[grid](...)` minus its binding, key and cache lookup (tens of µs); valid
    for one request (same integers and 16-byte pointer alignment: the memo key guarantees both)."""
    calls = []
    for k, tail in zip(compiled_kernels, tails):
        run = k.run
        direct = getattr(run, "launch", None)
        # Triton's CUDA launcher's own __call__ only allocates scratch (none here), then calls
        # its extension function with this argument order: called directly.
        if type(run).__name__ == "CudaLauncher" and direct is not None and _forwards_varargs(type(run)) and \
                not getattr(run, "global_scratch_size", 1) and not getattr(run, "profile_scratch_size", 1) \
                and getattr(run, "num_ctas", 1) == 1:
            calls.append((direct, (grid, 1, 1), (k.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                                                  k.packed_metadata, None, None, None), tuple(tail)))
        else:
            calls.append((run, (grid, 1, 1), (k.function, k.packed_metadata, None, None, None), tuple(tail)))
    return calls


def _hook_calls(hook) -> list:
    # The list a launch hook is checked by per call, empty while inactive: a HookChain's own
    # `calls` (changed in place), [] for no hook, a non-empty list for any other (always active).
    if hook is None:
        return []
    calls = getattr(hook, "calls", None)
    return calls if isinstance(calls, list) else [True]


def _constexpr_tails(kernel, n_positional: int, metas) -> list | None:
    # Triton's launcher takes every parameter in declaration order, constexprs included (it
    # skips them): ours come last, after the tensors and integers.
    names = getattr(kernel, "arg_names", None)
    if names is None:
        return None
    rest = names[n_positional:]
    if not all(n in meta for meta in metas for n in rest):
        return None
    return [tuple(meta[n] for n in rest) for meta in metas]


_native_warned: set = set()
_address = torch.Tensor.data_ptr


def _address_reader(index: tuple, n_args: int) -> Callable:
    """`f(args) -> the kernel's pointers`: the address of `args[i]` for each `i` of `index`, each
    tensor read once; one or two by name (pick-then-map costs twice that), all in one `map`."""
    read = sorted(set(index))
    positions = [read.index(i) for i in index]
    order = itemgetter(*positions) if len(positions) > 1 else (lambda p, i=positions[0]: (p[i],))
    if len(read) == 1:
        i = read[0]
        return lambda a: order((_address(a[i]),))
    if len(read) == 2:
        i, j = read
        return lambda a: order((_address(a[i]), _address(a[j])))
    if read == list(range(n_args)):  # (every argument read)
        if tuple(index) == tuple(read):
            return lambda a: tuple(map(_address, a))
        return lambda a: order(tuple(map(_address, a)))
    live = itemgetter(*read)
    return lambda a: order(tuple(map(_address, live(a))))


def _picker(index: tuple) -> Callable | None:
    """`f(addresses of every argument) -> the kernel's pointers`; None where some argument is absent."""
    if None in index:
        return None
    if len(index) == 1:
        i = index[0]
        return lambda a: (a[i],)
    return itemgetter(*index)


def accepted_tensors(args: tuple, index: tuple) -> list[bool]:
    """Per argument position of a bound launch, whether later calls may pass a tensor there: read by
    the kernel (`index`) or a tensor when bound (a None there was specialised away)."""
    read = set(index)
    return [i in read or a is not None for i, a in enumerate(args)]


def _native(b: Binding, compiled: list, args: tuple, index: tuple) -> tuple:
    """(launcher, reason): `native_launch.make`'s, or None and why (warned if `native` was named)."""
    try:
        if any(type(c.run).__name__ != "CudaLauncher" for c in compiled):
            raise native_launch.NativeUnavailable("the kernels are not launched by Triton's CUDA launcher")
        native_launch.module()
        # (the first operand may be absent: a sharded select has no logits; the scratch is on the device)
        tensor = next(a for a in args if a is not None)
        if not native_launch.follows_torch_stream(tensor):
            raise native_launch.NativeUnavailable("TVM-FFI does not see torch's current stream here")
        floats = {name: (j, v) for j, (name, v) in enumerate(zip(b.floats, b.values))}
        return native_launch.make(compiled, b.grid, tensor.device.index or 0, dict(zip(b.pointer_names, index)),
                                  b.ints, floats, accepted_tensors(args, index), per_call=b.per_call), None
    except native_launch.NativeUnavailable as exc:
        reason = str(exc)
        if native_launch.EXPLICIT and reason not in _native_warned:
            _native_warned.add(reason)
            warnings.warn(f"ANYSOFTMAX_LAUNCHER=native: using Triton's launcher ({reason})", RuntimeWarning,
                          stacklevel=4)
        return None, reason


def bind_kernel(b: Binding, *, scratch=None, replan=None, device: torch.device | None = None, guard=None):
    """`launch(args, values=b.values, per_call=())`: `b.kernel` once per entry of `b.metas` on the current
    stream; `args` the call's tensors (None where absent), `scratch(device)` appended; `per_call`: the
    per-call integers (default `b.ints`' placeholders). Fast path while no launch hook is active.
    `replan()`: the launcher when the driver refuses a cooperative grid (MPS, green contexts);
    `guard(device)` around each launch (default `device_guard` where several GPUs are visible).
    `launch.prime(compiled, args, stream_of=None)`: a first launch's set-up after compiling (tests)."""
    kernel, grid, metas, default = b.kernel, (b.grid,), b.metas, b.values
    lock = launch_lock(kernel)
    interpreting = lock is _interpreter_lock
    native = native_launch.LAUNCHER == "native"
    ints = tuple(b.ints.values())
    names = tuple(b.ints)
    at = names.index(b.per_call[0]) if b.per_call else len(names)
    if names[at:at + len(b.per_call)] != b.per_call:
        raise ValueError(f"per-call integers {b.per_call} are not adjacent in {names}")
    ints_before, ints_after = ints[:at], ints[at + len(b.per_call):]
    # (what a call passing no per-call integers launches with: the binding's placeholders)
    per_call_default = ints[at:at + len(b.per_call)]
    n_positional = len(b.pointer_names) + len(ints) + len(b.floats)
    positional = runtime_params(kernel) == (*b.pointer_names, *names, *b.floats)
    no_fast = "no fast path (interpreted, ANYSOFTMAX_FAST_LAUNCH=0, or not Triton's launcher)"
    fast_possible = FAST_LAUNCH and positional
    state = {"compiled": None, "fast": None, "fallback": None,
             "native_reason": "ANYSOFTMAX_LAUNCHER is triton" if not native else
             "not launched yet" if fast_possible and not interpreting else no_fast}

    def device_of(args) -> torch.device:
        # (the first operand's; the bound device where a call leaves it absent)
        return args[0].device if args[0] is not None else device

    def primed(compiled: list, args: tuple, stream_of) -> None:
        state["compiled"] = compiled  # (kept alive: the native launcher holds only raw functions)
        tails = None
        if fast_possible and all(c is not None and hasattr(c, "packed_metadata") for c in compiled):
            tails = _constexpr_tails(kernel, n_positional, metas)
        if tails is None:
            state["native_reason"] = no_fast
            return
        from triton import knobs

        if stream_of is None:
            from triton.runtime.driver import driver

            stream_of = driver.active.get_current_stream
        index = b.pointers(tuple(None if a is None else i for i, a in enumerate(args)))
        via = None
        if native:
            via, state["native_reason"] = _native(b, compiled, args, index)
        hooks = knobs.runtime
        enter, leave = hooks.launch_enter_hook, hooks.launch_exit_hook
        # Each call with its arguments after the pointers joined once for the default floats.
        calls = [(fn, before, after, tail, (*ints, *default, *tail))
                 for fn, before, after, tail in _fast_calls(compiled, tails, b.grid)]
        device = device_of(args)
        state["fast"] = FastPath(calls, hooks, enter, leave, _hook_calls(enter), _hook_calls(leave), stream_of,
                                 device, device.index, _address_reader(index, len(args)), via, _picker(index))

    def launch(args, values=default, per_call=()):
        fast = state["fast"]
        if fast is not None:
            calls, hooks, enter, leave, enter_calls, leave_calls, stream_of, device, index, addresses, via, _ = fast
            if hooks.launch_enter_hook is enter and hooks.launch_exit_hook is leave and not enter_calls \
                    and not leave_calls:
                if scratch is not None:
                    args = (*args, *scratch(device))
                if via is not None:
                    if per_call_default:  # (the native launcher then takes every float and integer)
                        return via(*args, *values, *(per_call or per_call_default))
                    return via(*args) if values is default else via(*args, *values)
                # Raw addresses: the request was validated (tensors on this device), so the
                # launcher's per-pointer driver query is skipped.
                ptrs = addresses(args)
                stream = stream_of(index)
                if values is default and not per_call:
                    for fn, before, after, _, rest in calls:
                        fn(*before, stream, *after, *ptrs, *rest)
                else:
                    for fn, before, after, tail, _ in calls:
                        fn(*before, stream, *after, *ptrs, *ints_before, *(per_call or per_call_default), *ints_after,
                           *values, *tail)
                return None
        if scratch is not None:
            args = (*args, *scratch(device_of(args)))
        kw = {**dict(zip(b.pointer_names, b.pointers(args))), **b.ints, **dict(zip(b.floats, values)),
              **dict(zip(b.per_call, per_call))}
        if interpreting:  # (compiles nothing: no fast path follows)
            import numpy

            # The kernels compute masked lanes as -inf - (-inf) and log(0) by design, then discard them.
            with lock, numpy.errstate(invalid="ignore", divide="ignore"):
                for meta in metas:
                    kernel[grid](**kw, **meta)
        elif state["compiled"] is not None:  # (no fast path, or a launch hook is active)
            for meta in metas:
                kernel[grid](**kw, **meta)
        else:
            with lock:  # a first launch compiles: one thread at a time per kernel
                primed([kernel[grid](**kw, **meta) for meta in metas], args, None)
        return None

    run = launch
    if replan is not None:
        def run(args, values=default, per_call=()):
            fallback = state["fallback"]
            if fallback is not None:
                return fallback(args, values, per_call)
            try:
                return launch(args, values, per_call)
            except RuntimeError as exc:
                if "cooperative" not in str(exc).lower():
                    raise
            state["fallback"] = replan()
            return state["fallback"](args, values, per_call)

    if guard is None and device is not None and device.type != "cpu" \
            and not (device.type == "cuda" and torch.cuda.device_count() == 1):
        guard = device_guard  # (none where no other device can be current: no per-call check)
    if guard is not None:
        unguarded = run

        def run(args, values=default, per_call=()):
            with guard(device):
                return unguarded(args, values, per_call)

    def launch_at(addresses: tuple, tensors: tuple) -> bool:
        fast = state["fast"]
        if fast is None or fast.pick is None or state["fallback"] is not None:
            return False
        calls, hooks, enter, leave, enter_calls, leave_calls, stream_of, _, index, _, via, pick = fast
        if hooks.launch_enter_hook is not enter or hooks.launch_exit_hook is not leave or enter_calls \
                or leave_calls:
            return False
        if via is not None:
            via(*addresses, *tensors)
            return True
        ptrs = pick((*addresses, *map(_address, tensors)))
        stream = stream_of(index)
        for fn, before, after, _, rest in calls:
            fn(*before, stream, *after, *ptrs, *rest)
        return True

    at = launch_at
    if guard is not None:
        def at(addresses: tuple, tensors: tuple) -> bool:
            with guard(device):
                return launch_at(addresses, tensors)

    def prime(compiled: list, args: tuple, stream_of=None) -> None:
        primed(compiled, args if scratch is None else (*args, *scratch(device_of(args))), stream_of)

    run.binding, run.state, run.prime = b, state, prime
    if scratch is None and not b.per_call and not b.floats:
        # `run.at(addresses, tensors) -> bool`: a fast-path launch whose first arguments' addresses
        # were read (and proved: aligned, on this device) by the caller, the rest given as tensors
        # (at least one: the native launcher reads the current stream through it); False, with
        # nothing launched, where the fast path is not active (then call `run` with tensors).
        run.at = at
    return run


def scratch_maker(plan: KernelPlan, layout: RowLayout, out_dtype: torch.dtype):
    """`make(device) -> (stats, counts)`: a launch's scratch (placeholders for a whole-row backward)."""
    acc = torch.float64 if out_dtype == torch.float64 else torch.float32
    n_stats = plan.stats_numel(layout)
    counter_groups = plan.groups(layout) if plan.counted else 0
    if n_stats or counter_groups:
        # (a counters buffer since replaced in `row_counters` (grown, evicted) stays this launcher's own, zeroed)
        return per_stream(lambda device: (torch.empty(max(n_stats, 1), dtype=acc, device=device),
                                          row_counters(device, counter_groups)))

    @functools.lru_cache(maxsize=None)
    def placeholders(device) -> tuple:
        return torch.empty(1, dtype=acc, device=device), torch.zeros(2, dtype=torch.int32, device=device)
    return placeholders


def bind(plan: KernelPlan, layout: RowLayout, log: bool, out_dtype: torch.dtype, device=None, guard=None):
    """`bind_kernel`'s launcher of `plan` on tensors laid out as `layout`: `launch(tensors as
    `plan.tensors` takes them, values=PLAIN_SCALARS)`; a refused cooperative plan falls back to two."""
    n = 7 if plan.backward else 6
    needs_scratch = plan.split or plan.backward  # (`plan.head` appends the scratch)
    opts = plan.launch_options()
    binding = Binding(plan.kernel(), plan.grid, plan.pointer_names(),
                      (lambda a: plan.head(plan.tensors(a[:n]), *a[n:])) if needs_scratch else plan.tensors,
                      plan.static_args(layout),
                      tuple({**plan.constexprs(layout, log, out_dtype, p), **opts} for p in plan.phases()),
                      VALUE_NAMES, PLAIN_SCALARS)
    replan = functools.partial(bind, plan.non_cooperative(), layout, log, out_dtype) if plan.cooperative else None
    return bind_kernel(binding, scratch=scratch_maker(plan, layout, out_dtype) if needs_scratch else None,
                       replan=replan, device=device, guard=guard)
