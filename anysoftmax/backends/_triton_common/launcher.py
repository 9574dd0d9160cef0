"""Launching a plan: the process-wide state the shared kernels need, and launchers bound once
per request.

State kept here, and why:
* row counters per (device, stream): the kernels that count arrivals per row (`KernelPlan.counted`)
  leave them zeroed, so they are allocated once and reused (no memset launch per call);
* one lock per kernel, held only around a launcher's first launch: Triton compiles a
  specialization on first launch without a lock of its own, so two threads launching a new
  shape at once would compile it twice. Later launches take no lock. Under the interpreter every
  launch shares one lock (it patches `triton.language` globally while a kernel runs).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import warnings
from collections import OrderedDict
from dataclasses import replace

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


# Set ANYSOFTMAX_FAST_LAUNCH=0 to launch through Triton's JIT entry point on every call.
FAST_LAUNCH = os.environ.get("ANYSOFTMAX_FAST_LAUNCH", "1") != "0"


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


def fast_state(compiled_kernels: list, tails: list, grid: int, index, stream_of, static: tuple,
               values: tuple = PLAIN_SCALARS) -> tuple:
    """What a bound launcher's fast path holds after its first launch: the calls
    (`_fast_calls`, each with its arguments after the pointers for the plain call's floats
    joined once here), Triton's runtime knobs, the launch hooks seen then and the lists that
    say whether they are inactive (`_hook_calls`), and `stream_of(index)` giving the current
    raw stream. `values`: the floats after the integers (none for a kernel that takes none, such
    as `merge_kernel`). benchmarks/hit_path_cpu.py builds one around a no-op launch."""
    from triton import knobs

    hooks = knobs.runtime
    enter, leave = hooks.launch_enter_hook, hooks.launch_exit_hook
    calls = [(fn, before, after, tail, (*static, *values, *tail))
             for fn, before, after, tail in _fast_calls(compiled_kernels, tails, grid)]
    return calls, hooks, stream_of, index, enter, leave, _hook_calls(enter), _hook_calls(leave)


def _constexpr_tails(kernel, n_positional: int, metas: list) -> list | None:
    # Triton's launcher takes every parameter in declaration order, constexprs included (it
    # skips them): ours come last, after the tensors and integers.
    names = getattr(kernel, "arg_names", None)
    if names is None:
        return None
    rest = names[n_positional:]
    if not all(n in meta for meta in metas for n in rest):
        return None
    return [tuple(meta[n] for n in rest) for meta in metas]


def _positional_order(kernel, pointers: tuple, static: dict) -> bool:
    # The fast path passes (pointers, integers, floats) positionally: valid when the kernel's
    # signature declares its runtime arguments in that order, checked by name once per bind.
    return runtime_params(kernel) == (*pointers, *static, *VALUE_NAMES)


_native_warned: set = set()


def native_for(compiled: list, first, grid: int, pointers: dict, ints: dict, floats: dict, used: list) -> tuple:
    """(launcher, reason): `native_launch.make`'s launcher of `compiled` (launched by Triton's
    CUDA launcher from tensors on `first`'s device), or None and why not; a user who named
    `native` is warned once per reason."""
    try:
        if any(type(c.run).__name__ != "CudaLauncher" for c in compiled):
            raise native_launch.NativeUnavailable("the kernels are not launched by Triton's CUDA launcher")
        native_launch.module()
        if not native_launch.follows_torch_stream(first):
            raise native_launch.NativeUnavailable("TVM-FFI does not see torch's current stream here")
        return native_launch.make(compiled, grid, first.device.index or 0, pointers, ints, floats, used), None
    except native_launch.NativeUnavailable as exc:
        reason = str(exc)
        if native_launch.EXPLICIT and reason not in _native_warned:
            _native_warned.add(reason)
            warnings.warn(f"ANYSOFTMAX_LAUNCHER=native: using Triton's launcher ({reason})", RuntimeWarning,
                          stacklevel=3)
        return None, reason


def native_state(plan: KernelPlan, compiled: list, tensors: tuple, named_static: dict) -> tuple:
    """(launcher, reason): `native_for`'s launcher for a bound launcher whose first launch
    compiled `compiled` from `tensors` (as `bind`'s launch takes them), and why there is none
    (None when there is one).

    Its arguments are the tensors as given (None where the request has no such operand), then
    the scratch pair where the plan takes one, then optionally the floats; which argument each
    pointer reads is worked out here through the plan's own substitutions (`plan.tensors`,
    `plan.head`), so it reads what Triton's launcher would be given."""
    n = len(tensors)
    indices = plan.tensors(tuple(None if t is None else i for i, t in enumerate(tensors)))
    if plan.split or plan.backward:
        indices, n = plan.head(indices, n, n + 1), n + 2
    read = set(indices)
    floats = {name: (j, v) for j, (name, v) in enumerate(zip(VALUE_NAMES, PLAIN_SCALARS))}
    return native_for(compiled, tensors[0], plan.grid, dict(zip(plan.pointer_names(), indices)), named_static,
                      floats, [i in read for i in range(n)])


def _cooperative_refused(exc: Exception) -> bool:
    return "cooperative" in str(exc).lower()


def interpreter_quiet():
    """numpy's floating-point warnings off for an interpreted launch: the interpreter evaluates
    the kernels with numpy, and the kernels compute lanes outside a row or masked out as
    -inf - (-inf) (NaN) and log(0) (-inf) by design, then discard or select them; numpy would
    warn "invalid value encountered in subtract" on every ordinary call. The results are what
    the conformance suite checks."""
    import numpy

    return numpy.errstate(invalid="ignore", divide="ignore")


def bind(plan: KernelPlan, layout: RowLayout, log: bool, out_dtype: torch.dtype):
    """A function `run(tensors, values=PLAIN_SCALARS)` launching `plan` on tensors laid out as
    `layout`: `tensors` as `plan.tensors` lists them (forward: x, y, mask, sinks, p_sink;
    backward: y, dy, dx, x, mask, p_sink, dsinks; None for an absent operand), `values` the
    per-call floats (`plan.scalars`). Constexprs, options and integer arguments are worked out
    once here; a call allocates the split scratch (if any) and launches. After the first
    (compiling) launch, compiled kernels launch through `_fast_calls`, or with
    the native launcher through one C++ call (`native_state`; $ANYSOFTMAX_LAUNCHER).

    A cooperative plan is launched as a cooperative grid (the driver refuses one whose programs
    cannot all be resident at once, instead of letting the row barrier spin forever: MPS SM
    limits, green contexts); when refused, this launcher falls back to the plan's two-launch
    form (statistics, then normalisation), which waits on nothing.

    Arguments are bound by the kernel's parameter names (`KernelPlan.arguments`); the fast path
    passes them positionally only after checking the signature's order by name."""
    kernel = plan.kernel()
    opts = plan.launch_options()
    metas = [{**plan.constexprs(layout, log, out_dtype, p), **opts} for p in plan.phases()]
    named_static = plan.static_args(layout)
    pointer_names = plan.pointer_names()
    static = tuple(named_static.values())
    needs_scratch = plan.split or plan.backward
    scratch = scratch_maker(plan, layout, out_dtype) if needs_scratch else None
    grid = (plan.grid,)
    lock = launch_lock(kernel)
    interpreted = lock is _interpreter_lock
    native = native_launch.LAUNCHER == "native"
    state = {"compiled": False, "fast": None, "fallback": None, "native": None,
             "native_reason": "not launched yet" if native else "ANYSOFTMAX_LAUNCHER is triton"}
    as_kernel_takes = plan.tensors

    def head_of(tensors):
        tensors = as_kernel_takes(tensors)
        return plan.head(tensors, *scratch(tensors[0].device))

    if not needs_scratch:
        head_of = as_kernel_takes  # noqa: F811  (the pointers are the tensors: one call less)

    def by_name(head, values) -> dict:
        return {**dict(zip(pointer_names, head)), **named_static, **dict(zip(VALUE_NAMES, values))}

    def first_launch(tensors, head, values) -> None:
        compiled = [kernel[grid](**by_name(head, values), **meta) for meta in metas]
        state["compiled"] = True
        if FAST_LAUNCH and not interpreted and _positional_order(kernel, pointer_names, named_static) \
                and all(c is not None and hasattr(c, "packed_metadata") for c in compiled):
            tails = _constexpr_tails(kernel, len(head) + len(static) + len(values), metas)
            if tails is not None:
                from triton.runtime.driver import driver

                state["fast"] = fast_state(compiled, tails, plan.grid, head[0].device.index,
                                           driver.active.get_current_stream, static)
                if native:
                    fn, state["native_reason"] = native_state(plan, compiled, tensors, named_static)
                    # (the compiled kernels kept alive: Triton unloads a kernel's module when its
                    # CompiledKernel goes, and the native launcher holds only the raw function)
                    state["native"] = None if fn is None else (fn, head[0].device, compiled)
        if native and state["fast"] is None:
            state["native_reason"] = "no fast path (interpreted, ANYSOFTMAX_FAST_LAUNCH=0, or not Triton's launcher)"

    def native_call(tensors, values):
        fn, device, _ = state["native"]
        if needs_scratch:
            tensors = (*tensors, *scratch(device))
        return fn(*tensors) if values is PLAIN_SCALARS else fn(*tensors, *values)

    def launch(tensors, values=PLAIN_SCALARS):
        fast = state["fast"]
        if fast is not None:
            calls, hooks, stream_of, index, enter, leave, enter_calls, leave_calls = fast
            # (Launch hooks, e.g. profilers, need Triton's own path, which builds their metadata.)
            if hooks.launch_enter_hook is enter and hooks.launch_exit_hook is leave and not enter_calls \
                    and not leave_calls:
                if state["native"] is not None:  # (set only when the native launcher was chosen and built)
                    return native_call(tensors, values)
                # Raw addresses: the request was validated (tensors on this device), so the
                # launcher's per-pointer driver query is skipped.
                ptrs = [t.data_ptr() for t in head_of(tensors)]
                stream = stream_of(index)
                if values is PLAIN_SCALARS:
                    for fn, before, after, _, rest in calls:
                        fn(*before, stream, *after, *ptrs, *rest)
                else:
                    for fn, before, after, tail, _ in calls:
                        fn(*before, stream, *after, *ptrs, *static, *values, *tail)
                return
        head = head_of(tensors)
        if state["compiled"] and not interpreted:
            args = by_name(head, values)
            for meta in metas:
                kernel[grid](**args, **meta)
            return
        with lock:  # a first launch compiles: one thread at a time per kernel
            if interpreted:
                with interpreter_quiet():
                    first_launch(tensors, head, values)
            else:
                first_launch(tensors, head, values)

    launch.state = state  # (tests and benchmarks/hit_path_cpu.py stand a recorder in for Triton's launcher)
    if not plan.cooperative:
        return launch

    def run(tensors, values=PLAIN_SCALARS) -> None:
        fallback = state["fallback"]
        if fallback is not None:
            fallback(tensors, values)
            return
        try:
            launch(tensors, values)
        except RuntimeError as exc:
            if not _cooperative_refused(exc):
                raise
            options = {k: v for k, v in plan.options.items() if k != "launch_cooperative_grid"}
            state["fallback"] = bind(replace(plan, cooperative=False, options=options), layout, log, out_dtype)
            state["fallback"](tensors, values)

    return run
