"""The call-sequence fuzzer: random sequences of calls through every public entry, each result
against the float64 reference (a hypothesis state machine).

    from anysoftmax.testing import fuzz_backend
    report = fuzz_backend("triton", calls=500, seed=1)     # AssertionError with a repro on failure

    python -m anysoftmax.testing.fuzz --backend triton --calls 2000 --device cuda --seed 1 --json out.json
    anysoftmax conformance NAME --fuzz 500 --seed 1        # the kit's cases, then 500 fuzzed calls

What it draws (see docs/testing.md): a request (entry, shape incl. 0-dim, empty, one-element and
odd sizes, dim, dtype, dtype=, the fused keywords with broadcast masks and sinks, every default
keyword absent or passed at its default), then steps on the requests drawn so far: the same
request again with operands that differ only in address, alignment, storage offset or strides
(the memoised launcher must not care), backward through autograd, `softmax_backward` or torch's
`_softmax_backward_data` under `anysoftmax.use`, double backward (small float64), and bad input
that must raise TypeError/ValueError/IndexError naming its argument. Every result is checked
against `testing.compare`, outputs are NaN-poisoned (`poisoned_allocations`), inputs must come
back unmodified, outputs must not alias inputs, and earlier results must not change later.

A refusal (`UnsupportedRequestError`) skips its step. The run is replayed by its seed (printed
at the start and in every failure), and a failure is shrunk by hypothesis to the shortest
sequence of steps that still fails, which the report prints.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import sys
import time
import zlib
from dataclasses import MISSING, dataclass, field, fields

import torch

from .compare import compare, compare_backward, compare_fused_backward, compare_mask_gradient
from ..core.errors import UnsupportedRequestError
from ..core.spec import SoftmaxSpec
from .poison import poisoned_allocations

ENTRIES = ("softmax", "log_softmax", "override", "nn", "megatron", "torch_npu")
LAYOUTS = ("contiguous", "offset", "transposed", "strided", "fresh")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
# Keywords whose default may be passed explicitly (their true defaults), beside being absent.
DEFAULTS = {"scale": None, "mask": None, "causal": False, "softcap": None, "sinks": None, "empty_rows": "zero",
            "dtype": None}
STEPS_PER_EXAMPLE = 12
HISTORY = 6  # earlier outputs re-checked after every call (a reused output buffer shows here)
SEQUENCE_SHOWN = STEPS_PER_EXAMPLE  # a failure's report lists its sequence's checked steps
SEQUENCE_HEADER = "checked steps of this sequence, the failing one last:"
# A failure that rests on state earlier sequences left in the backend (a memo keyed without the
# layout) may pass or run on when hypothesis replays its steps, which hypothesis reports as flaky.
NOT_REPLAYED = ("a failure that did not fail alike when its steps were replayed (it rests on state earlier calls "
                "left in the backend)")


# ---- what is drawn ------------------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    """One request as drawn: plain values only, so that the shrunk repro reads as the call.
    `mask` is (kind, broadcast shape) or None; `sinks` a broadcast shape or None;
    `defaults` the keywords passed explicitly at their default value."""

    entry: str
    shape: tuple
    dim: int
    dtype: str
    out_dtype: str | None = None
    scale: float | None = None
    softcap: float | None = None
    causal: bool | str = False
    mask: tuple | None = None
    sinks: tuple | None = None
    empty_rows: str = "zero"
    defaults: tuple = ()

    def __repr__(self) -> str:
        # Only what differs from the field defaults: the shrunk repro stays short and runnable.
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                 if f.default is MISSING or getattr(self, f.name) != f.default]
        return f"Call({', '.join(shown)})"



def _row_shape(shape: tuple, dim: int) -> tuple:
    return tuple(1 if d == dim % len(shape) else s for d, s in enumerate(shape)) if shape else ()


def _broadcasts(st, shape: tuple):
    """Shapes that broadcast to `shape`: itself, without leading dims, size 1 in the first
    dim, the last two dims only, a scalar."""
    options = [shape, shape[1:], tuple(1 if i == 0 else s for i, s in enumerate(shape)), ()]
    if len(shape) >= 2:
        options.append((1,) * (len(shape) - 2) + shape[-2:])
    return st.sampled_from(list(dict.fromkeys(options)))


def _sink_shapes(shape: tuple, dim: int) -> list:
    """Sinks shapes for x's `shape`: one per row (size 1 in `dim`), without leading dims, or
    one sink for every row."""
    row = _row_shape(shape, dim)
    return list(dict.fromkeys([row, row[1:], (1,) * len(row), ()]))


def _shapes(st):
    size = st.sampled_from([0, 1, 2, 3, 5, 7, 16, 33])
    last = st.sampled_from([0, 1, 2, 3, 7, 16, 17, 64, 130, 300])
    return st.integers(0, 4).flatmap(
        lambda r: st.tuples(*([size] * max(r - 1, 0) + ([last] if r else [])))).filter(
        lambda s: math.prod(s) <= 4096)


def call_strategy(st):
    """A hypothesis strategy of `Call`s (every entry, every keyword)."""
    @st.composite
    def draw_call(draw):
        entry = draw(st.sampled_from(ENTRIES))
        if entry == "megatron":
            shape = draw(st.tuples(st.sampled_from([1, 2]), st.sampled_from([1, 3]), st.sampled_from([1, 4, 5]),
                                   st.sampled_from([1, 4, 5, 33])))
        elif entry == "torch_npu":
            shape = draw(_shapes(st).filter(lambda s: len(s) >= 1))
        else:
            shape = draw(_shapes(st))
        nd = len(shape)
        dim = -1 if entry in ("megatron", "torch_npu") else draw(st.integers(-max(nd, 1), max(nd, 1) - 1))
        dtype = draw(st.sampled_from(list(DTYPES)))
        kw = {}
        defaults = set()
        if entry in ("softmax", "log_softmax", "override"):
            widen = {"float16": "float32", "bfloat16": "float32", "float32": "float64"}.get(dtype)
            kw["out_dtype"] = draw(st.sampled_from([None, widen] if widen else [None]))
        last = nd >= 1 and dim % nd == nd - 1
        if entry in ("softmax", "log_softmax"):
            # Which keywords take a non-default value (often one alone: a keyword that
            # normalises away must still take a working path).
            live = draw(st.sets(st.sampled_from(("scale", "softcap", "causal", "mask", "sinks", "empty_rows")))) \
                if draw(st.booleans()) else set()
            kw.update(scale=None, softcap=None, causal=False, mask=None, sinks=None, empty_rows="zero")
            if "scale" in live:
                kw["scale"] = draw(st.sampled_from([0.5, -1.3, 2.0, 0.125, 1.0]))
            if "softcap" in live:
                kw["softcap"] = draw(st.sampled_from([1.0, 5.0, 30.0]))
            if "causal" in live and nd >= 2 and last:
                kw["causal"] = draw(st.sampled_from([True, "top_left", "bottom_right"]))
            if "mask" in live:
                kw["mask"] = (draw(st.sampled_from(["bool", "additive", "bool-empty"])), draw(_broadcasts(st, shape)))
            if "sinks" in live:
                kw["sinks"] = draw(st.sampled_from(_sink_shapes(shape, dim)))
            if "empty_rows" in live:
                kw["empty_rows"] = draw(st.sampled_from(["nan", "uniform"]))
            values = {**kw, "dtype": kw["out_dtype"]}
            defaults = {k for k in DEFAULTS if values[k] == DEFAULTS[k] and draw(st.booleans())}
        elif entry in ("megatron", "torch_npu"):
            kw["scale"] = draw(st.sampled_from([None, 0.5, 2.0]))
            square = nd >= 2 and (entry == "torch_npu" or shape[-1] == shape[-2])
            causal = square and draw(st.booleans())
            kw["causal"], kw["mask"] = causal, None
            if not causal and draw(st.booleans()):
                kind = "bool-empty" if draw(st.booleans()) else "bool"
                options = [shape, (1,) * (nd - 2) + shape[-2:]] if nd >= 2 else [shape]
                if entry == "megatron":
                    options = [(shape[0], 1) + shape[2:], (1, 1) + shape[2:]]
                kw["mask"] = (kind, draw(st.sampled_from(options)))
            kw["empty_rows"] = "uniform" if entry == "torch_npu" and kw["mask"] is not None else "zero"
        elif entry == "override":
            defaults = {"dtype"} if kw["out_dtype"] is None and draw(st.booleans()) else set()
        return Call(entry=entry, shape=shape, dim=dim, dtype=dtype, defaults=tuple(sorted(defaults)), **kw)
    return draw_call()


# ---- operands -------------------------------------------------------------------------------

def _values(call: Call, gen: torch.Generator) -> torch.Tensor:
    """x as float64 values on the CPU: normal, sometimes large, with the odd +-inf."""
    x = torch.randn(call.shape, generator=gen, dtype=torch.float64) * 3
    if x.numel() and torch.rand((), generator=gen) < 0.1:
        x.view(-1)[int(torch.randint(x.numel(), (), generator=gen))] = -math.inf
    return x.to(DTYPES[call.dtype])


def place(t: torch.Tensor, layout: str, device, gen: torch.Generator) -> torch.Tensor:
    """`t`'s values in a new tensor on `device` laid out as `layout`: contiguous; "offset" (one
    element past a fresh buffer's start: the data pointer is not 16-byte aligned); "transposed"
    (a transposed buffer's view); "strided" (every other element); "fresh" (a new buffer of
    another size, so a new address)."""
    shape = tuple(t.shape)
    n = max(t.numel(), 1)
    if layout == "offset" or (layout in ("transposed", "strided") and len(shape) < 1):
        skip = int(torch.randint(1, 4, (), generator=gen))
        buf = torch.empty(n + skip, dtype=t.dtype, device=device)
        out = buf[skip:skip + t.numel()].view(shape)
    elif layout == "transposed" and len(shape) >= 2:
        out = torch.empty(shape[:-2] + (shape[-1], shape[-2]), dtype=t.dtype, device=device).transpose(-1, -2)
    elif layout in ("transposed", "strided"):
        out = torch.empty(shape[:-1] + (2 * shape[-1],), dtype=t.dtype, device=device)[..., ::2]
    elif layout == "fresh":
        out = torch.empty(n + 64, dtype=t.dtype, device=device)[32:32 + t.numel()].view(shape)
    else:
        out = torch.empty(shape, dtype=t.dtype, device=device)
    return out.copy_(t.to(device))


@dataclass
class Operands:
    """A call's tensors on the device (x, mask, sinks) and the equivalent `anysoftmax.softmax`
    keywords (what the reference is computed from)."""

    x: torch.Tensor
    mask: torch.Tensor | None
    sinks: torch.Tensor | None
    fused: dict


def operands(call: Call, seed: int, layout: str, device) -> Operands:
    gen = torch.Generator().manual_seed(seed)
    x = place(_values(call, gen), layout, device, gen)
    mask = sinks = None
    if call.mask is not None:
        kind, shape = call.mask
        if kind == "additive":
            m = torch.randn(shape, generator=gen, dtype=torch.float64)
            if m.numel() and torch.rand((), generator=gen) < 0.3:
                m.view(-1)[0] = -math.inf
            m = m.to(DTYPES[call.dtype] if call.dtype != "bfloat16" else torch.float32)
        else:
            # "bool-empty" excludes most positions: whole rows empty (the `empty_rows` policy)
            m = torch.rand(shape, generator=gen) < (0.3 if kind == "bool" else 0.85)
        mask = place(m, layout, device, gen)
    if call.sinks is not None:
        sinks = place(torch.randn(call.sinks, generator=gen, dtype=torch.float64).to(torch.float32), layout, device,
                      gen)
    fused = {}
    if call.entry in ("megatron", "torch_npu"):
        fused["scale"] = 1.0 if call.scale is None else call.scale
    elif call.scale is not None:
        fused["scale"] = call.scale
    for k in ("softcap", "empty_rows"):
        if getattr(call, k) != DEFAULTS[k]:
            fused[k] = getattr(call, k)
    if call.causal is not False:
        fused["causal"] = call.causal
    if mask is not None:
        fused["mask"] = mask
    if sinks is not None:
        fused["sinks"] = sinks
    return Operands(x, mask, sinks, fused)


# ---- the calls ------------------------------------------------------------------------------

def forward(call: Call, ops: Operands, backend: str, device, requires_grad: bool = False):
    """(y, the x given to the entry) of `call` through its entry."""
    import anysoftmax
    import anysoftmax.nn
    x = ops.x.detach().requires_grad_() if requires_grad else ops.x
    out_dtype = None if call.out_dtype is None else DTYPES[call.out_dtype]
    if call.entry in ("softmax", "log_softmax"):
        fn = anysoftmax.log_softmax if call.entry == "log_softmax" else anysoftmax.softmax
        kw = dict(ops.fused)
        kw.update({k: DEFAULTS[k] for k in call.defaults})
        if out_dtype is not None:
            kw["dtype"] = out_dtype
        return fn(x, call.dim, backend=backend, **kw), x
    if call.entry == "override":
        f = torch.nn.functional.softmax
        kw = {"dtype": out_dtype} if out_dtype is not None or "dtype" in call.defaults else {}
        with _override(backend, device):
            return f(x, call.dim, **kw), x
    if call.entry == "nn":
        return anysoftmax.nn.Softmax(call.dim, backend=backend)(x), x
    if call.entry == "megatron":
        from ..compat.megatron import FusedScaleMaskSoftmax
        half = call.dtype != "bfloat16"
        module = FusedScaleMaskSoftmax(half, not half, "causal" if call.causal else "padding", True, None, True,
                                       call.scale, backend=backend)
        return module(x, ops.mask), x
    from ..compat.torch_npu import npu_scaled_masked_softmax
    args = (x, ops.mask) if call.scale is None else (x, ops.mask, call.scale)
    return npu_scaled_masked_softmax(*args, fixed_triu_mask=bool(call.causal), backend=backend), x


@contextlib.contextmanager
def _override(backend: str, device):
    """torch's softmax ops served by `backend` for `device`'s type (torch warns that a kernel is
    replaced each time: expected here)."""
    import warnings

    import anysoftmax
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
        with anysoftmax.use(backend=backend, devices=(torch.device(device).type,)):
            yield


def spec_of(call: Call, ops: Operands) -> SoftmaxSpec:
    out_dtype = None if call.out_dtype is None else DTYPES[call.out_dtype]
    spec, _ = SoftmaxSpec.from_request(ops.x, call.dim, out_dtype, log=call.entry == "log_softmax", fused=ops.fused)
    return spec


def _storages(*tensors) -> set:
    return {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor) and t.numel()}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool((a.eq(b) | (a.isnan() & b.isnan())).all())


class FuzzFailure(AssertionError):
    """A wrong result, a crash or an unclear error of one fuzzed step."""


# ---- the state machine ------------------------------------------------------------------------

def _machine(ctx: "_Run"):
    """The RuleBasedStateMachine class for one run (`ctx`: backend, device, budget, counters)."""
    from hypothesis import strategies as st
    from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, rule

    calls_st = call_strategy(st)
    seeds = st.integers(0, 2**31 - 1)

    class SoftmaxCalls(RuleBasedStateMachine):
        requests = Bundle("requests")

        def __init__(self):
            super().__init__()
            self.history: list[tuple[int, torch.Tensor, torch.Tensor]] = []
            self.step = 0
            self.steps: list[str] = []

        # -- bookkeeping
        def _spend(self) -> bool:
            """False once the budget is spent (then steps do nothing, unless a failure is being
            shrunk: its replays must run)."""
            if ctx.made >= ctx.budget and not ctx.failing:
                return False
            ctx.made += 1
            self.step += 1
            return True

        @contextlib.contextmanager
        def _checked(self, what: str):
            # The checked steps of this sequence go with its failure, whether or not hypothesis
            # replays and shrinks it (a failure that rests on state left by earlier sequences,
            # a backend's own memo, may not replay alike: hypothesis then reports no steps).
            self.steps.append(what)
            try:
                yield
            except FuzzFailure as exc:
                self._failed(exc)
                raise
            except UnsupportedRequestError:
                ctx.skipped += not ctx.failing
            except Exception as exc:
                failure = FuzzFailure(f"{what}: {type(exc).__name__}: {exc}")
                self._failed(failure)
                raise failure from exc

        def _failed(self, failure: FuzzFailure):
            ctx.failing = True
            failure.add_note(self._sequence())
            ctx.last_failure = _failure_texts(failure)[0]

        def _sequence(self) -> str:
            return SEQUENCE_HEADER + "\n" + "\n".join(
                f"  {i}. {what}" for i, what in enumerate(self.steps[-SEQUENCE_SHOWN:], 1))

        def _remember(self, y: torch.Tensor):
            for step, kept, copy in self.history:
                if not _same(kept, copy):
                    raise FuzzFailure(f"the result of step {step} changed after a later call (an output buffer "
                                      f"reused or written by another call)")
            if y.numel():
                self.history = (self.history + [(self.step, y, y.detach().clone())])[-HISTORY:]

        def _forward(self, call: Call, seed: int, layout: str):
            ops = operands(call, seed, layout, ctx.device)
            spec = spec_of(call, ops)
            what = f"forward {call!r} with {layout} operands (data seed {seed}): {spec.describe()}"
            with self._checked(what):
                before = [t.clone() for t in (ops.x, ops.mask, ops.sinks) if t is not None]
                with poisoned_allocations():
                    y, _ = forward(call, ops, ctx.backend, ctx.device)
                after = [t for t in (ops.x, ops.mask, ops.sinks) if t is not None]
                if not all(_same(a, b) if a.dtype.is_floating_point else torch.equal(a, b)
                           for a, b in zip(after, before)):
                    raise FuzzFailure(f"{what}: the call modified its input")
                if _storages(y) & _storages(*after):
                    raise FuzzFailure(f"{what}: the output shares memory with an input")
                result = compare(y, ops.x, spec, device="cpu", mask=ops.mask, sinks=ops.sinks)
                if not result.ok:
                    raise FuzzFailure(f"{what}: {result.detail}")
                self._remember(y)
                ctx.checked += not ctx.failing

        # -- rules
        @initialize(target=requests, call=calls_st, seed=seeds)
        def first_request(self, call, seed):
            if self._spend():
                self._forward(call, seed, "contiguous")
            return call

        @rule(target=requests, call=calls_st, seed=seeds)
        def new_request(self, call, seed):
            if self._spend():
                self._forward(call, seed, "contiguous")
            return call

        @rule(call=requests, seed=seeds, layouts=st.lists(st.sampled_from(LAYOUTS), min_size=1, max_size=4))
        def same_request_other_layouts(self, call, seed, layouts):
            """The request again, once per layout: only the operands' address, alignment,
            storage offset or strides change (and the data, from `seed`)."""
            for i, layout in enumerate(layouts):
                if self._spend():
                    self._forward(call, seed + i, layout)

        @rule(call=requests, seed=seeds, layout=st.sampled_from(LAYOUTS),
              route=st.sampled_from(["autograd", "softmax_backward", "override"]))
        def backward(self, call, seed, layout, route):
            if not self._spend():
                return
            ops = operands(call, seed, layout, ctx.device)
            spec = spec_of(call, ops)
            if not spec.is_plain or spec.out_dtype != spec.in_dtype:
                route = "autograd"  # softmax_backward and torch's op take the plain softmax, dx in y's dtype
            what = f"backward ({route}) of {call!r} with {layout} operands (data seed {seed}): {spec.describe()}"
            with self._checked(what):
                self._backward(call, ops, spec, seed, layout, route, what)

        def _backward(self, call, ops, spec, seed, layout, route, what):
            import anysoftmax
            gen = torch.Generator().manual_seed(seed + 1)
            if ops.x.numel() == 0:
                return
            # finite inputs: a NaN row's gradient is NaN, which the plain comparison refuses
            ops.x = ops.x.masked_fill(torch.isinf(ops.x), 0.5)
            wants_mask = ops.mask is not None and ops.mask.dtype.is_floating_point and call.entry != "megatron"
            if route == "autograd":
                if call.entry in ("softmax", "log_softmax"):
                    if ops.sinks is not None:
                        ops.sinks = ops.fused["sinks"] = ops.sinks.detach().clone().requires_grad_()
                    if wants_mask:
                        ops.mask = ops.fused["mask"] = ops.mask.detach().clone().requires_grad_()
                with poisoned_allocations():
                    y, xg = forward(call, ops, ctx.backend, ctx.device, requires_grad=True)
                    g = place(torch.randn(y.shape, generator=gen, dtype=torch.float64).to(y.dtype), layout,
                              ctx.device, gen)
                    wants = [xg] + [t for t in (ops.sinks, ops.mask) if t is not None and t.requires_grad]
                    grads = torch.autograd.grad(y, wants, g)
                y = y.detach()
                dx = grads[0]
            else:
                with poisoned_allocations():
                    y, _ = forward(call, ops, ctx.backend, ctx.device)
                    y = place(y.detach(), layout, ctx.device, gen)
                    g = place(torch.randn(y.shape, generator=gen, dtype=torch.float64).to(y.dtype), layout,
                              ctx.device, gen)
                    if route == "softmax_backward":
                        dx = anysoftmax.softmax_backward(y, g, call.dim, log=spec.log, backend=ctx.backend)
                    else:
                        with _override(ctx.backend, ctx.device):
                            op = torch._log_softmax_backward_data if spec.log else torch._softmax_backward_data
                            dx = op(g, y, call.dim, y.dtype)
                grads = (dx,)
            if _storages(dx) & _storages(y, g, ops.x):
                raise FuzzFailure(f"{what}: the gradient shares memory with an operand")
            if spec.is_plain:
                result = compare_backward(dx, y, g, spec)
            else:
                ds = grads[1] if ops.sinks is not None else None
                result = compare_fused_backward(dx, y, g, ops.x, spec, ops.mask, ops.sinks, ds)
                if result.ok and ops.mask is not None and ops.mask.requires_grad:
                    result = compare_mask_gradient(grads[-1], y, g, ops.x, spec, ops.mask, ops.sinks)
            if not result.ok:
                raise FuzzFailure(f"{what}: {result.detail}")
            ctx.checked += not ctx.failing

        @rule(call=requests, seed=seeds)
        def double_backward(self, call, seed):
            """gradgradcheck in float64 on a small request of the same keywords."""
            if math.prod(call.shape) > 24 or call.entry not in ("softmax", "log_softmax", "nn", "torch_npu"):
                return
            if not self._spend():
                return
            import dataclasses
            small = dataclasses.replace(call, dtype="float64", out_dtype=None)
            if small.entry == "log_softmax" or small.empty_rows == "nan":
                # -inf / NaN outputs have no numerical derivative: no exclusions there
                small = dataclasses.replace(small, mask=None if small.mask and small.mask[0] != "additive" else
                                            small.mask, causal=False, empty_rows="zero")
            ops = operands(small, seed, "contiguous", ctx.device)
            ops.x = torch.where(torch.isinf(ops.x), torch.zeros_like(ops.x), ops.x)
            if ops.mask is not None and ops.mask.dtype.is_floating_point:
                ops.mask = ops.fused["mask"] = torch.where(torch.isinf(ops.mask), -2.0, ops.mask)
            if small.entry == "torch_npu" and ops.mask is not None:
                return
            what = f"double backward of {small!r} (data seed {seed})"
            with self._checked(what):
                def f(x_):
                    o = Operands(x_, ops.mask, ops.sinks, ops.fused)
                    return forward(small, o, ctx.backend, ctx.device)[0]
                x = ops.x.detach().requires_grad_()
                if not torch.autograd.gradgradcheck(f, (x,), raise_exception=False):
                    raise FuzzFailure(f"{what}: gradgradcheck failed (second derivatives differ from numerical)")
                ctx.checked += not ctx.failing

        @rule(call=requests, kind=st.sampled_from(["dim", "mask", "dtype", "grad"]))
        def bad_input(self, call, kind):
            if not self._spend():
                return
            what = f"bad input ({kind}) on {call!r}"
            with self._checked(what):
                _bad_call(call, kind, ctx.backend, ctx.device, what)

    return SoftmaxCalls


_EXPECTED = {"dim": (IndexError, "dim"), "mask": (ValueError, "mask"), "dtype": (TypeError, "dtype"),
             "grad": (ValueError, "grad")}


def _bad_call(call: Call, kind: str, backend: str, device, what: str) -> None:
    """A call with one bad argument: it must raise the expected type naming the argument."""
    import anysoftmax
    exc_type, word = _EXPECTED[kind]
    shape = call.shape or (3,)
    x = torch.randn(shape, device=device)
    try:
        if kind == "dim":
            anysoftmax.softmax(x, len(shape), backend=backend)
        elif kind == "mask":
            bad = torch.zeros(shape[:-1] + (shape[-1] + 2,), dtype=torch.bool, device=device)
            if call.entry == "torch_npu":
                from ..compat.torch_npu import npu_scaled_masked_softmax
                npu_scaled_masked_softmax(x, bad, backend=backend)
            else:
                anysoftmax.softmax(x, -1, mask=bad, backend=backend)
        elif kind == "dtype":
            anysoftmax.softmax(torch.arange(math.prod(shape), device=device).reshape(shape), -1, backend=backend)
        else:
            y = torch.softmax(x, -1)
            anysoftmax.softmax_backward(y, torch.randn(shape[:-1] + (shape[-1] + 2,), device=device), -1,
                                        backend=backend)
    except exc_type as exc:
        if word not in str(exc):
            raise FuzzFailure(f"{what}: {type(exc).__name__} does not name {word!r}: {exc}") from None
        return
    except UnsupportedRequestError:
        raise FuzzFailure(f"{what}: a bad argument reached the backend (UnsupportedRequestError) instead of "
                          f"{exc_type.__name__} naming {word!r}") from None
    except Exception as exc:
        raise FuzzFailure(f"{what}: expected {exc_type.__name__} naming {word!r}, got {type(exc).__name__}: "
                          f"{exc}") from None
    raise FuzzFailure(f"{what}: accepted without an error (expected {exc_type.__name__} naming {word!r})")


# ---- running it ----------------------------------------------------------------------------------

@dataclass
class _Run:
    backend: str
    device: str
    budget: int
    made: int = 0
    checked: int = 0
    skipped: int = 0
    failing: bool = False
    last_failure: str = ""  # the failure seen last, with its sequence's checked steps


@dataclass
class FuzzReport:
    """What one fuzz run found: calls made, checked (ran and matched), skipped (refused), the
    failure (the shrunk repro) if any, and the seed that replays the run."""

    backend: str
    device: str
    seed: int
    budget: int
    calls: int = 0
    checked: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    def replay(self) -> str:
        return (f"replay: fuzz_backend({self.backend!r}, calls={self.budget}, seed={self.seed}) or "
                f"anysoftmax conformance {self.backend} --fuzz {self.budget} --seed {self.seed}")

    def summary(self) -> str:
        return (f"anysoftmax fuzz of {self.backend!r} on {self.device}: {self.calls} calls, {self.checked} checked, "
                f"{self.skipped} refused, {len(self.failures)} failed in {self.seconds:.1f} s (seed {self.seed})")

    def text(self) -> str:
        lines = [self.summary()]
        for failure in self.failures:
            lines.append("failed:\n" + failure)
        if self.failures:
            lines.append(self.replay())
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"backend": self.backend, "device": self.device, "device_name": _device_name(self.device),
                "seed": self.seed, "budget": self.budget, "calls": self.calls, "checked": self.checked,
                "skipped": self.skipped, "failures": self.failures, "seconds": round(self.seconds, 2)}


def _device_name(device: str) -> str:
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(dev)
    return dev.type


def _failure_texts(exc: BaseException) -> list[str]:
    """One text per distinct failure: the exception with hypothesis's shrunk steps (its notes);
    hypothesis groups distinct failures (and a flaky one's attempts) in an ExceptionGroup."""
    notes = [str(n) for n in getattr(exc, "__notes__", [])]
    subs = getattr(exc, "exceptions", None)
    if subs:
        # (a group's own notes, e.g. the steps of a failure that did not replay alike, go with
        # each of its failures)
        return ["\n".join([t, *notes]) for sub in subs for t in _failure_texts(sub)]
    from hypothesis.errors import Flaky

    if isinstance(exc, Flaky):
        return ["\n".join([f"{NOT_REPLAYED}: {type(exc).__name__}: {exc}", *notes])]
    return ["\n".join([f"{type(exc).__name__}: {exc}", *notes])]


def _reported(texts: list[str], last_failure: str) -> list[str]:
    """The failures to report. hypothesis's flaky error for a failure that did not fail alike on
    replay is that failure again when another text holds it; alone, the failure seen last (with
    its checked steps) stands for it."""
    failed = [t for t in texts if not t.startswith(NOT_REPLAYED)]
    if failed:
        return failed
    return [f"{last_failure}\n({NOT_REPLAYED})"] if last_failure else texts


@contextlib.contextmanager
def _shrink_limit(seconds: float):
    """Hypothesis shrinks for up to 5 minutes; through the Triton interpreter a step costs up to
    a second, so a run caps it (the shortest repro found by then is reported)."""
    from hypothesis.internal.conjecture import engine

    before = getattr(engine, "MAX_SHRINKING_SECONDS", None)
    if before is not None:
        engine.MAX_SHRINKING_SECONDS = seconds
    try:
        yield
    finally:
        if before is not None:
            engine.MAX_SHRINKING_SECONDS = before


def run_fuzz(backend: str, *, calls: int = 200, seed: int | None = None, device: str = "cpu",
             print_fn=print, shrink_seconds: float = 60.0) -> FuzzReport:
    """Fuzz the registered backend `backend` with `calls` calls on `device`; return the report
    (a failure is recorded, not raised). Prints the replay seed first; a failure is shrunk for
    at most `shrink_seconds`."""
    try:
        from hypothesis import HealthCheck, Phase, settings
        from hypothesis import seed as hyp_seed
        from hypothesis.reporting import with_reporter
        from hypothesis.stateful import run_state_machine_as_test
    except ImportError:
        raise ImportError("the anysoftmax fuzzer needs hypothesis: pip install 'anysoftmax[test]'") from None
    if not isinstance(calls, int) or isinstance(calls, bool) or calls < 1:
        raise ValueError(f"fuzz: calls must be a positive int, got {calls!r}")
    seed = random.SystemRandom().randrange(2**31) if seed is None else int(seed)
    report = FuzzReport(backend, str(device), seed, calls)
    if print_fn:
        print_fn(f"anysoftmax fuzz: {calls} calls of backend {backend!r} on {device}, seed {seed} "
                 f"(replay with seed={seed})")
    ctx = _Run(backend, device, calls)
    start = time.perf_counter()
    for round_ in range(64):  # rounds until the budget is spent (each a seeded hypothesis run)
        left = calls - ctx.made
        if left <= 0:
            break
        machine = _machine(ctx)
        machine = hyp_seed(zlib.crc32(f"{seed}/{round_}".encode()))(machine)
        conf = settings(max_examples=max(1, left // (STEPS_PER_EXAMPLE // 2)), stateful_step_count=STEPS_PER_EXAMPLE,
                        deadline=None, database=None, suppress_health_check=list(HealthCheck), print_blob=False,
                        phases=(Phase.generate, Phase.shrink))
        made_before = ctx.made
        try:
            # hypothesis's own messages (its shrinking-time warning) stay out of the report's
            # output; the shrunk steps come back as the exception's notes.
            with _shrink_limit(shrink_seconds), with_reporter(lambda *_: None):
                run_state_machine_as_test(machine, settings=conf)
        except BaseException as exc:  # noqa: BLE001 (KeyboardInterrupt included: report, then re-raise)
            if isinstance(exc, KeyboardInterrupt):
                raise
            report.failures += [f"{text}\n(seed {seed})"
                                for text in _reported(_failure_texts(exc), ctx.last_failure)]
            break
        if ctx.made == made_before:
            break
    report.calls, report.checked, report.skipped = min(ctx.made, calls), ctx.checked, ctx.skipped
    report.seconds = time.perf_counter() - start
    if print_fn:
        print_fn(report.text())
    return report


def fuzz_backend(backend, *, calls: int = 200, seed: int | None = None, device: str | None = None,
                 print_fn=print, shrink_seconds: float = 60.0) -> FuzzReport:
    """Fuzz `backend` (a backend object, or a registered name) with `calls` random calls (see the
    module docstring) and return the `FuzzReport`; raise `AssertionError` with the report's
    text, the shrunk repro and the replay seed when a call failed."""
    from ..core import registry
    from .target import default_device, registered

    with registered(backend) as name:
        device = device or default_device(registry.get_backend(name))
        report = run_fuzz(name, calls=calls, seed=seed, device=device, print_fn=print_fn,
                          shrink_seconds=shrink_seconds)
    if not report.ok:
        raise AssertionError(report.text())
    return report


def main(argv: list[str] | None = None) -> int:
    """`python -m anysoftmax.testing.fuzz`: exit 0 when nothing failed, 1 on a failure."""
    parser = argparse.ArgumentParser(
        prog="python -m anysoftmax.testing.fuzz",
        description="Fuzz one backend with random call sequences through every public entry, against the "
                    "float64 reference. triton_ascend on CUDA tensors runs only as the NPU launch's cross-check: "
                    "set ANYSOFTMAX_ASCEND_ON_CUDA=1 (and --device cuda). Without a GPU the Triton backends run "
                    "through the interpreter (TRITON_INTERPRET=1) on cpu tensors.")
    parser.add_argument("--backend", required=True, help="a registered backend (see `anysoftmax backends`)")
    parser.add_argument("--calls", type=int, default=200, help="the budget of calls (default 200)")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, npu (default: the backend's first "
                                                       "device present, else cpu)")
    parser.add_argument("--seed", type=int, default=None, help="replay seed (default: random, printed)")
    parser.add_argument("--plugin", action="append", metavar="MODULE[:ATTR]", help="import/register a plugin first")
    parser.add_argument("--json", metavar="OUT", help="write a JSON summary (backend, device name, calls, "
                                                      "failures, seed, time) to OUT")
    args = parser.parse_args(argv)
    from ..plugins import use_interpreter_if_needed
    from .target import load_plugin

    note = use_interpreter_if_needed()
    if note:
        print(note)
    for plugin in args.plugin or []:
        load_plugin(plugin)
    from ..core import registry
    from .target import default_device
    device = args.device or default_device(registry.get_backend(args.backend))
    report = run_fuzz(args.backend, calls=args.calls, seed=args.seed, device=device)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report.as_dict(), fh, indent=2)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
