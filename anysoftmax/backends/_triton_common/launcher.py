"""The one launch engine: a Triton kernel bound by name to one request's operands (`Binding`,
`bind_kernel`), and a `KernelPlan` bound through it (`bind`).

Every shared kernel launches here: the softmax forward, backward and column kernels (`bind`),
logsumexp (`lse_rows`, `logsumexp`), merge_states (`merge_states`) and the sharded kernel
(`backends/triton/sharded.py`). A bound launcher's first launch goes through Triton's JIT entry
point (it compiles); later ones through Triton's low-level launcher (`_fast_calls`), or the native
launcher (`native_launch`, $ANYSOFTMAX_LAUNCHER), with only the tensors' addresses, the stream
and the per-call values assembled per call.

State kept here, and why:
* one lock per kernel, held only around a launcher's first launch: Triton compiles a
  specialization on first launch without a lock of its own, so two threads launching a new
  shape at once would compile it twice. Later launches take no lock. Under the interpreter every
  launch shares one lock (it patches `triton.language` globally while a kernel runs);
* row counters per (device, stream): the kernels that count arrivals per row (`KernelPlan.counted`,
  the sharded kernel) leave them zeroed, so they are allocated once and reused (no memset per call).
"""

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
from .plan import PLAIN_SCALARS, VALUE_NAMES, KernelPlan, runtime_params

# (device, stream) -> counters, least recently used first; bounded: a program that makes
# streams on the fly must not grow it forever.
_counters: OrderedDict = OrderedDict()
_counters_lock = threading.Lock()
MAX_COUNTER_STREAMS = 64

_launch_locks: dict = {}
_launch_locks_lock = threading.Lock()
_interpreter_lock = threading.Lock()

# Set ANYSOFTMAX_FAST_LAUNCH=0 to launch through Triton's JIT entry point on every call.
FAST_LAUNCH = os.environ.get("ANYSOFTMAX_FAST_LAUNCH", "1") != "0"


def launch_lock(kernel) -> threading.Lock:
    """The lock around a first launch (compile) of `kernel`; the one interpreter lock when
    kernels are interpreted."""
    if type(kernel).__name__ == "InterpretedFunction":
        return _interpreter_lock
    with _launch_locks_lock:
        return _launch_locks.setdefault(kernel, threading.Lock())


def _raw_stream(device: torch.device) -> int:
    # The current stream's handle without building a torch.cuda.Stream object.
    getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if getter is not None:
        return getter(device.index if device.index is not None else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


def row_counters(device: torch.device, n_rows: int) -> torch.Tensor:
    """Zeroed (arrived, departed) int32 counters for `n_rows` rows, reused across launches.

    The kernels that use them leave them zero again (the last program of a row resets
    them), so they are allocated and zeroed once per (device, stream) and grown when needed. One
    buffer per stream, because launches on different streams may overlap.
    """
    n = max(2 * n_rows, 2)
    stream = _raw_stream(device) if device.type == "cuda" else 0
    key = (str(device), stream)
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


def device_guard(device: torch.device):
    """Context making a CUDA/ROCm `device` current for a launch (Triton launches on the current
    device), entered only when it is not current already; nothing for other devices."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def _guard_for(device: torch.device | None, guard):
    """The device guard a launch needs, or None: a process that sees a single GPU (or runs on
    the CPU) never has another device current, so it skips the per-call check."""
    if guard is not None or device is None:
        return guard
    if device.type == "cpu" or (device.type == "cuda" and torch.cuda.device_count() == 1):
        return None
    return device_guard


def interpreter_quiet():
    """numpy's floating-point warnings off for an interpreted launch: the interpreter evaluates
    the kernels with numpy, and the kernels compute lanes outside a row or masked out as
    -inf - (-inf) (NaN) and log(0) (-inf) by design, then discard or select them; numpy would
    warn "invalid value encountered in subtract" on every ordinary call. The results are what
    the conformance suite checks."""
    import numpy

    return numpy.errstate(invalid="ignore", divide="ignore")


@dataclass(frozen=True)
class Binding:
    """A kernel bound by name to one request: all a launch needs but the call's tensors and
    per-call values. The kernel declares its runtime arguments as pointers, integers, floats
    (the fast path passes them positionally only where its signature says so, by name)."""

    kernel: Any
    grid: int
    pointer_names: tuple
    # The call's arguments (tensors, None for an absent operand, then the scratch) -> the kernel's
    # pointer arguments in `pointer_names` order, an absent operand stood in for by another.
    pointers: Callable
    ints: dict  # integer arguments by name (a per-call one's value here is only a placeholder)
    metas: tuple  # one launch per entry (PHASEs): its constexprs and launch options
    floats: tuple = ()  # names of the per-call float arguments
    values: tuple = ()  # their values when a call gives none
    per_call: tuple = ()  # integers given per call (the sharded kernel's epoch), adjacent in `ints`


class FastPath(NamedTuple):
    """What a bound launcher's later calls use (`bind_kernel`): Triton's low-level launches, the
    launch hooks seen when it was set up, and how to read the stream and the pointers."""

    calls: list  # (launch, before, after, constexpr tail, the arguments after the pointers joined)
    hooks: Any  # Triton's runtime knobs, read per call
    enter: Any  # the launch hooks seen then, and the lists saying they are inactive (`_hook_calls`)
    leave: Any
    enter_calls: list
    leave_calls: list
    stream_of: Callable  # device index -> the current raw stream
    device: torch.device
    index: int | None
    live: Callable  # the call's arguments -> its tensors the kernel reads (the request fixes which are None)
    order: Callable  # their addresses -> the kernel's pointers
    native: Callable | None  # the native launcher, where chosen and built


@functools.lru_cache(maxsize=None)
def _forwards_varargs(launcher_type) -> bool:
    """Whether a CUDA launcher's `__call__(gridX, gridY, gridZ, stream, function, *args)` hands
    its arguments to the extension as `launch(grids, stream, function, cooperative, pdl, global
    scratch, profile scratch, *args)`: the layout `_fast_calls` calls the extension with (Triton
    3.2-3.6). Later launchers take named metadata and the kernel's arguments as one tuple: they
    are called through `__call__` itself."""
    import inspect

    params = list(inspect.signature(launcher_type.__call__).parameters.values())[1:]
    return [p.name for p in params[:5]] == ["gridX", "gridY", "gridZ", "stream", "function"] and \
        len(params) == 6 and params[5].kind is inspect.Parameter.VAR_POSITIONAL


def _fast_calls(compiled_kernels: list, tails: list, grid: int) -> list:
    """[(launch, before, after, constexpr tail)] launching compiled kernels through Triton's
    low-level launcher as `launch(*before, stream, *after, *pointers, *integers, *floats, *tail)`,
    everything but the stream and the tensors bound here: what `kernel[grid](...)` does after
    its first call, minus the argument binding, specialization key, cache lookup and
    launch-metadata work that cost tens of microseconds of Python per call. Valid for one
    request: same integer arguments and the same 16-byte alignment of every pointer (the memo
    key guarantees both)."""
    calls = []
    for k, tail in zip(compiled_kernels, tails):
        run = k.run
        direct = getattr(run, "launch", None)
        # Triton's CUDA launcher's own __call__ only allocates scratch (none here), then calls
        # its extension function with this argument order: called directly, no Python frame
        # between the launcher and the extension.
        if type(run).__name__ == "CudaLauncher" and direct is not None and _forwards_varargs(type(run)) and \
                not getattr(run, "global_scratch_size", 1) and not getattr(run, "profile_scratch_size", 1) \
                and getattr(run, "num_ctas", 1) == 1:
            calls.append((direct, (grid, 1, 1), (k.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                                                  k.packed_metadata, None, None, None), tuple(tail)))
        else:
            calls.append((run, (grid, 1, 1), (k.function, k.packed_metadata, None, None, None), tuple(tail)))
    return calls


# A launch hook that is no HookChain: always active (a non-empty list, see `_hook_calls`).
_ACTIVE_HOOK = [True]


def _hook_calls(hook) -> list:
    """The list a launch hook is checked by on every call, empty while it is inactive: [] for
    no hook, a Triton HookChain's own `calls` (added to and removed from in place), a non-empty
    list for any other hook."""
    if hook is None:
        return []
    calls = getattr(hook, "calls", None)
    return calls if isinstance(calls, list) else _ACTIVE_HOOK


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


def _native(b: Binding, compiled: list, args: tuple, index: tuple) -> tuple:
    """(launcher, reason): `native_launch.make`'s launcher of `compiled`, called with the call's
    arguments as `launch` takes them (scratch included), then optionally the floats; or None
    and why not (a user who named `native` is warned once per reason)."""
    try:
        if b.per_call:
            raise native_launch.NativeUnavailable("per-call integer arguments (native launches fix the integers)")
        if any(type(c.run).__name__ != "CudaLauncher" for c in compiled):
            raise native_launch.NativeUnavailable("the kernels are not launched by Triton's CUDA launcher")
        native_launch.module()
        if not native_launch.follows_torch_stream(args[0]):
            raise native_launch.NativeUnavailable("TVM-FFI does not see torch's current stream here")
        floats = {name: (j, v) for j, (name, v) in enumerate(zip(b.floats, b.values))}
        read = set(index)
        return native_launch.make(compiled, b.grid, args[0].device.index or 0, dict(zip(b.pointer_names, index)),
                                  b.ints, floats, [i in read for i in range(len(args))]), None
    except native_launch.NativeUnavailable as exc:
        reason = str(exc)
        if native_launch.EXPLICIT and reason not in _native_warned:
            _native_warned.add(reason)
            warnings.warn(f"ANYSOFTMAX_LAUNCHER=native: using Triton's launcher ({reason})", RuntimeWarning,
                          stacklevel=4)
        return None, reason


def bind_kernel(b: Binding, *, scratch=None, replan=None, device: torch.device | None = None, guard=None):
    """A function `launch(args, values=b.values, per_call=())` launching `b.kernel` once per
    entry of `b.metas` on `b.grid` programs, on the current stream: `args` the call's tensors
    (None for an absent operand; `b.pointers` maps them), `values` the per-call floats,
    `per_call` the per-call integers. `scratch(device)`: tensors appended to `args` per call.

    The first launch binds every argument by name (`kernel[grid](**named)`, compiling under the
    kernel's lock); its compiled kernels are then launched through `_fast_calls` (or, with
    $ANYSOFTMAX_LAUNCHER=native, through one C++ call) while no launch hook is active: a
    profiler's hook needs Triton's own path, which builds its metadata. Interpreted, every launch
    goes through the JIT entry under the one interpreter lock.

    `replan()`: for a cooperative grid, the launcher to use instead when the driver refuses one
    (its programs cannot all be resident at once: MPS SM limits, green contexts), which waits
    on nothing. `device` (with `guard`, default `device_guard` where several GPUs are visible):
    made current around each launch. `launch.prime(compiled, args, stream_of=None)` does what a
    first launch does after compiling (tests and benchmarks/hit_path_cpu.py give it stand-ins
    for compiled kernels); `launch.state` holds what it set up, `launch.binding` is `b`."""
    kernel, grid, metas, default = b.kernel, (b.grid,), b.metas, b.values
    lock = launch_lock(kernel)
    interpreted = lock is _interpreter_lock
    native = native_launch.LAUNCHER == "native"
    ints = tuple(b.ints.values())
    names = tuple(b.ints)
    at = names.index(b.per_call[0]) if b.per_call else len(names)
    if names[at:at + len(b.per_call)] != b.per_call:
        raise ValueError(f"per-call integers {b.per_call} are not adjacent in {names}")
    ints_before, ints_after = ints[:at], ints[at + len(b.per_call):]
    n_positional = len(b.pointer_names) + len(ints) + len(b.floats)
    positional = runtime_params(kernel) == (*b.pointer_names, *names, *b.floats)
    no_fast = "no fast path (interpreted, ANYSOFTMAX_FAST_LAUNCH=0, or not Triton's launcher)"
    # (an interpreted launch compiles nothing: no fast path follows it)
    fast_possible = FAST_LAUNCH and positional
    state = {"compiled": None, "fast": None, "fallback": None,
             "native_reason": "ANYSOFTMAX_LAUNCHER is triton" if not native else
             "not launched yet" if fast_possible and not interpreted else no_fast}

    def named(args, values, per_call) -> dict:
        out = {**dict(zip(b.pointer_names, b.pointers(args))), **b.ints, **dict(zip(b.floats, values))}
        out.update(zip(b.per_call, per_call))
        return out

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
        device = args[0].device
        read = sorted(set(index))
        live = itemgetter(*read) if len(read) > 1 else (lambda a, i=read[0]: (a[i],))
        state["fast"] = FastPath(calls, hooks, enter, leave, _hook_calls(enter), _hook_calls(leave), stream_of,
                                 device, device.index, live, itemgetter(*map(read.index, index)), via)

    def launch(args, values=default, per_call=()):
        fast = state["fast"]
        if fast is not None:
            calls, hooks, enter, leave, enter_calls, leave_calls, stream_of, device, index, live, order, via = fast
            if hooks.launch_enter_hook is enter and hooks.launch_exit_hook is leave and not enter_calls \
                    and not leave_calls:
                if scratch is not None:
                    args = (*args, *scratch(device))
                if via is not None:  # (the native launcher, chosen and built)
                    return via(*args) if values is default else via(*args, *values)
                # Raw addresses: the request was validated (tensors on this device), so the
                # launcher's per-pointer driver query is skipped. Read in one C loop (`map`).
                ptrs = order(tuple(map(_address, live(args))))
                stream = stream_of(index)
                if values is default and not per_call:
                    for fn, before, after, _, rest in calls:
                        fn(*before, stream, *after, *ptrs, *rest)
                else:
                    for fn, before, after, tail, _ in calls:
                        fn(*before, stream, *after, *ptrs, *ints_before, *per_call, *ints_after, *values, *tail)
                return None
        if scratch is not None:
            args = (*args, *scratch(args[0].device))
        kw = named(args, values, per_call)
        if state["compiled"] is not None and not interpreted:  # (no fast path, or a launch hook is active)
            for meta in metas:
                kernel[grid](**kw, **meta)
            return None
        with lock:  # a first launch compiles: one thread at a time per kernel
            if interpreted:
                with interpreter_quiet():
                    for meta in metas:
                        kernel[grid](**kw, **meta)
                return None
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

    guard = _guard_for(device, guard)
    if guard is not None:
        unguarded = run

        def run(args, values=default, per_call=()):
            with guard(device):
                return unguarded(args, values, per_call)

    def prime(compiled: list, args: tuple, stream_of=None) -> None:
        primed(compiled, args if scratch is None else (*args, *scratch(args[0].device)), stream_of)

    run.binding, run.state, run.prime = b, state, prime
    return run


def scratch_maker(plan: KernelPlan, layout: RowLayout, out_dtype: torch.dtype):
    """A function `make(device) -> (stats, counts)`: the documented scratch of a launch, sized
    once here. `stats` holds the partial statistics (`plan.stats_numel`), `counts` the reused
    barrier counters. A plan that uses neither (whole-row backward: the kernel still takes both
    pointers) gets one small placeholder pair per device, allocated once."""
    acc = torch.float64 if out_dtype == torch.float64 else torch.float32
    n_stats = plan.stats_numel(layout)
    counter_groups = plan.groups(layout) if plan.counted else 0
    placeholders: dict = {}

    def make(device) -> tuple:
        if n_stats == 0 and counter_groups == 0:
            pair = placeholders.get(device)
            if pair is None:
                pair = placeholders[device] = (torch.empty(1, dtype=acc, device=device),
                                               torch.zeros(2, dtype=torch.int32, device=device))
            return pair
        return torch.empty(max(n_stats, 1), dtype=acc, device=device), row_counters(device, counter_groups)

    return make


def bind(plan: KernelPlan, layout: RowLayout, log: bool, out_dtype: torch.dtype, device=None, guard=None):
    """`bind_kernel`'s launcher of `plan` on tensors laid out as `layout`: `launch(tensors,
    values=PLAIN_SCALARS)`, `tensors` as `plan.tensors` lists them (forward: x, y, mask, sinks,
    p_sink; backward: y, dy, dx, x, mask, p_sink, dsinks; None for an absent operand), `values`
    the per-call floats (`plan.scalars`). A split or backward plan's scratch is allocated per
    call; a cooperative plan the driver refuses falls back to its two-launch form (statistics,
    then normalisation)."""
    n = 7 if plan.backward else 5
    needs_scratch = plan.split or plan.backward
    opts = plan.launch_options()
    binding = Binding(plan.kernel(), plan.grid, plan.pointer_names(),
                      (lambda a: plan.head(plan.tensors(a[:n]), *a[n:])) if needs_scratch else plan.tensors,
                      plan.static_args(layout),
                      tuple({**plan.constexprs(layout, log, out_dtype, p), **opts} for p in plan.phases()),
                      VALUE_NAMES, PLAIN_SCALARS)
    replan = functools.partial(bind, plan.non_cooperative(), layout, log, out_dtype) if plan.cooperative else None
    return bind_kernel(binding, scratch=scratch_maker(plan, layout, out_dtype) if needs_scratch else None,
                       replan=replan, device=device, guard=guard)
