"""The conformance kit: every shipped case, run on one backend, as a list of named checks.

`conformance_checks(name, device=..., quick=...)` builds the checks (plain forward cases,
long rows, repeated calls, gradients, the fused family, logsumexp and merge_states with their
gradients, bad input, the backend protocol);
`run_checks` runs them and collects a `KitReport`; `check_backend` does both for a backend
object (registered for the run if it is not already) and raises `AssertionError` naming every
failed case. The project's own conformance tests and the pytest plugin run the same checks.

A check passes, is skipped (the backend declared a refusal: `supports()` returned a reason, or
the request is fused and the backend does not declare `fused = True`) or fails (a wrong
result, a crash, a refusal that the API did not raise, an error that does not name its
argument). A run in which every check was refused fails too: nothing was proven.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from ..core import registry
from ..core.spec import SoftmaxSpec, dtype_name
from .cases import (CASES, LOGSUMEXP_CASES, LONG_ROW_CASES, LONG_VARIANT_CASES, SPLIT_CASES, VARIANT_CASES, Case,
                    SplitCase, VariantCase)
from .checks import (check_backward, check_forward, check_logsumexp, check_logsumexp_backward, check_merge_backward,
                     check_merge_split, declared_refusal)
from .poison import poisoned_allocations
from .target import default_device, registered

# The quick run: one case of each kind of layout, special values, dtype= and the fused steps,
# in float32 and bfloat16 (float16 where a case is only float16).
QUICK_CASES = ("seed-1823x781", "rank3-dim1", "transposed-2d-dim0", "step-sliced", "expanded-rows", "cols-3d",
               "specials", "n1", "zero-dim", "empty-rows", "dtype-fp16-to-fp32", "long-specials", "long-dead-head",
               "row-4097", "rows-4097", "channels-last")
QUICK_VARIANTS = ("scale-softcap", "bool-mask-full-empty-zero", "additive-mask", "causal-bottom-right-empty-uniform",
                  "sinks-masked-rows", "everything", "dim0-mask-sinks", "long-causal-mask-sinks",
                  "bool-mask-nothing-excluded", "softcap-nan-excluded", "fused-row-1100", "row-scale")
QUICK_DTYPES = (torch.float32, torch.bfloat16)
QUICK_PIECES = ("lse-specials", "lse-everything", "lse-gpt-oss", "split-3-uneven", "split-with-empty-segments",
                "split-masked-and-specials", "split-11-many", "split-strided",
                "split-float64-lses", "split-into-out")
# Gradients: the layouts that matter to a backward kernel (dx's layout follows y's), on
# finite data (`compare_backward` checks finite gradients; the fused cases cover NaN rows).
# Small inputs: the Triton interpreter runs every program in turn, and a 1823-row case costs
# seconds there (the forward checks keep it).
BACKWARD_CASES = ("rank2-dim1", "rank3-dim0", "rank4-dim2", "transposed-2d", "step-sliced-dim0", "expanded-cols",
                  "cols-dim0-odd", "n1", "zero-dim", "long-2d", "long-cols", "large-magnitude-fp32")
# Repeated calls of one request with new data: the second call takes the memoised launcher
# (a stale pointer or a reused output buffer shows here).
REPEAT_CASES = ("rank2-dim1", "transposed-3d", "cols-3d", "long-2d")
# Gradients of the pieces ops (autograd in torch ops from the backend's forward): special
# values, empty and sink-only rows, NaN logits a mask excludes; for merge_states, -inf partials
# whose outputs are NaN. The quick run keeps the first of each.
LOGSUMEXP_BACKWARD_CASES = ("lse-softcap-nan-excluded", "lse-everything", "lse-specials", "lse-sinks-masked-rows",
                            "lse-rank3-dim1")
MERGE_BACKWARD_CASES = ("split-masked-and-specials", "split-float64-lses", "split-with-empty-segments")


COMPUTING = ("forward", "repeat", "backward", "fused", "fused-backward", "logsumexp", "logsumexp-backward", "merge",
             "merge-backward")  # kinds that run a softmax


@dataclass(frozen=True)
class Check:
    """One named check. `run(seed)` returns None when it ran and matched, or the declared
    refusal (skip); it raises AssertionError (or the backend's exception) on failure."""

    name: str
    kind: str  # protocol, bad-input, or one of COMPUTING
    run: Callable[[int], str | None] = field(repr=False, compare=False)


@dataclass
class KitReport:
    """What `run_checks` found: passed check names, skipped ones by reason, failed ones with
    their error."""

    backend: str
    device: str
    seed: int
    passed: list[str] = field(default_factory=list)
    skipped: dict[str, list[str]] = field(default_factory=dict)
    failed: list[tuple[str, str]] = field(default_factory=list)
    computed: int = 0  # passed checks that ran a softmax (not protocol or bad-input checks)
    fuzz: object = None  # the `fuzz.FuzzReport` of `check_backend(..., fuzz=N)`

    @property
    def ok(self) -> bool:
        """True when nothing failed and at least one check computed a softmax and matched."""
        return not self.failed and self.computed > 0 and (self.fuzz is None or self.fuzz.ok)

    def summary(self) -> str:
        n_skip = sum(map(len, self.skipped.values()))
        return (f"anysoftmax conformance of {self.backend!r} on {self.device}: {len(self.passed)} passed, "
                f"{len(self.failed)} failed, {n_skip} skipped (seed {self.seed})")

    def text(self) -> str:
        """The full report: the summary, every failure with its error, each skip reason once."""
        lines = [self.summary()]
        if self.failed:
            lines.append(f"failed ({len(self.failed)}):")
            lines += [f"  {name}: {error}" for name, error in self.failed]
        if self.skipped:
            lines.append("skipped, by the backend's declared reason:")
            for reason, names in self.skipped.items():
                lines.append(f"  {len(names)} × {reason}")
                lines.append(f"      e.g. {names[0]}")
        if not self.computed and not self.failed:
            lines.append("nothing was checked: every case was refused, so nothing is proven")
        if self.failed:
            lines.append(f"replay: check_backend(..., seed={self.seed}) or anysoftmax conformance ... "
                         f"--seed {self.seed}")
        if self.fuzz is not None:
            lines.append(self.fuzz.text())
        return "\n".join(lines)


def _gen(seed: int, name: str) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}/{name}".encode()))


def _to(device: str, kwargs: dict) -> dict:
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}


def _ops():
    return ((False, "softmax"), (True, "log_softmax"))


def _dtypes(case, quick: bool) -> tuple:
    if not quick:
        return case.dtypes
    picked = tuple(d for d in case.dtypes if d in QUICK_DTYPES)
    return picked or case.dtypes[:1]


def _plain(case: Case, backend: str, device: str, log: bool, dtype, kind: str) -> Callable[[int], str | None]:
    def run(seed: int) -> str | None:
        gen = _gen(seed, f"{kind}/{case.name}/{dtype}/{log}")
        x = case.make(gen, dtype).to(device)
        if kind == "backward":
            return check_backward(x, case.dim, backend=backend, log=log, dtype=case.out_dtype, seed=seed)
        if kind == "repeat":
            return _check_repeat(x, case.make(gen, dtype).to(device), case.dim, backend, log, case.out_dtype)
        return check_forward(x, case.dim, backend=backend, log=log, dtype=case.out_dtype)
    return run


def _check_repeat(x1, x2, dim, backend, log, dtype) -> str | None:
    """Two calls of one request (same layout, new data): both results right after both ran,
    in two different buffers."""
    from .compare import compare
    from .checks import api_function, named_failure

    spec, reason = declared_refusal(backend, x1, dim, dtype, log)
    if reason is not None:
        return check_forward(x1, dim, backend=backend, log=log, dtype=dtype)
    fn = api_function(log)
    with poisoned_allocations(), named_failure(spec):
        y1 = fn(x1, dim, dtype=dtype, backend=backend)
        y2 = fn(x2, dim, dtype=dtype, backend=backend)
    if y1.numel() and y1.untyped_storage().data_ptr() == y2.untyped_storage().data_ptr():
        raise AssertionError(f"{spec.describe()}: two calls returned the same output buffer")
    for i, (x, y) in enumerate(((x1, y1), (x2, y2)), 1):
        result = compare(y, x, spec)
        assert result.ok, f"{spec.describe()}, call {i} of 2: {result.detail}"
    return None


def _fused(case: VariantCase, backend: str, device: str, log: bool, dtype, kind: str) -> Callable[[int], str | None]:
    def run(seed: int) -> str | None:
        gen = _gen(seed, f"{kind}/{case.name}/{dtype}/{log}")
        x = case.make(gen, dtype)
        kwargs = _to(device, case.kwargs(gen, x))
        x = x.to(device)
        if kind == "fused-backward":
            return check_backward(x, case.dim, backend=backend, log=log, fused=kwargs, seed=seed)
        return check_forward(x, case.dim, backend=backend, log=log, fused=kwargs)
    return run


def _logsumexp(case: VariantCase, backend: str, device: str, dtype, kind: str) -> Callable[[int], str | None]:
    def run(seed: int) -> str | None:
        gen = _gen(seed, f"{kind}/{case.name}/{dtype}")
        x = case.make(gen, dtype)
        kwargs = _to(device, case.kwargs(gen, x))
        if kind == "logsumexp-backward":
            return check_logsumexp_backward(x.to(device), case.dim, backend=backend, fused=kwargs, seed=seed)
        return check_logsumexp(x.to(device), case.dim, backend=backend, fused=kwargs)
    return run


def _merge(case: SplitCase, backend: str, device: str, dtype, kind: str) -> Callable[[int], str | None]:
    def run(seed: int) -> str | None:
        x = case.make(_gen(seed, f"{kind}/{case.name}/{dtype}"), dtype).to(device)
        if kind == "merge-backward":
            return check_merge_backward(x, case.bounds(x.shape[-1]), backend=backend, lse_dtype=case.lse_dtype,
                                        seed=seed)
        return check_merge_split(x, case.bounds(x.shape[-1]), backend=backend, lse_dtype=case.lse_dtype,
                                 layout=case.layout)
    return run


def _name(kind: str, op: str, case, dtype) -> str:
    return f"{kind} {op} {case.name} {dtype_name(dtype)}"


def _protocol(backend: str, device: str) -> Callable[[int], str | None]:
    """The attributes and answers every backend owes the registry (`core.registry.Backend`)."""
    def run(seed: int) -> str | None:
        b = registry.get_backend(backend)
        problems = []
        if not isinstance(b.name, str) or not b.name:
            problems.append(f"name must be a non-empty str, got {b.name!r}")
        devices = getattr(b, "devices", None)
        if not isinstance(devices, (tuple, list)) or not devices or not all(isinstance(d, str) for d in devices):
            problems.append(f"devices must be a non-empty tuple of torch device types (or '*'), got {devices!r}")
        if isinstance(getattr(b, "priority", None), bool) or not isinstance(getattr(b, "priority", None), int):
            problems.append(f"priority must be an int, got {getattr(b, 'priority', None)!r}")
        available = b.is_available()
        if available is not None and not isinstance(available, str):
            problems.append(f"is_available() must return None or a reason (str), got {available!r}")
        probe = replace(SoftmaxSpec.from_tensor(torch.empty(2, 3, device="meta"), 1), device=torch.device(device))
        answer = b.supports(probe)
        if answer is not None and not isinstance(answer, str):
            problems.append(f"supports(spec) must return None or a reason (str), got {answer!r}")
        assert not problems, "; ".join(problems)
        return None
    return run


# (name, call(backend, device) that must raise, the exception type, a word its message names)
def _bad_inputs():
    import anysoftmax

    def plain(make):
        """A softmax call whose arguments `make(device)` builds (on the device under test: an
        operand on another device would fail for that reason instead)."""
        def call(backend, device):
            args = {"input": torch.randn(3, 5, device=device), "dim": 1, **make(device)}
            anysoftmax.softmax(args.pop("input"), args.pop("dim"), backend=backend, **args)
        return call

    def backward_grad(backend, device):
        y = torch.softmax(torch.randn(3, 5, device=device), 1)
        anysoftmax.softmax_backward(y, torch.randn(3, 4, device=device), 1, backend=backend)

    def bool_mask(shape, d):
        return torch.zeros(shape, dtype=torch.bool, device=d)

    return [
        ("dim out of range", plain(lambda d: {"dim": 2}), IndexError, "dim"),
        ("dim not an int", plain(lambda d: {"dim": 1.0}), TypeError, "dim"),
        ("integer input without dtype=", plain(lambda d: {"input": torch.arange(6, device=d).reshape(2, 3)}),
         TypeError, "dtype"),
        ("complex input", plain(lambda d: {"input": torch.randn(2, 3, dtype=torch.complex64, device=d),
                                           "dtype": torch.float32}), TypeError, "dtype"),
        ("dtype= not floating", plain(lambda d: {"dtype": torch.int32}), TypeError, "dtype"),
        ("input not a tensor", plain(lambda d: {"input": [[1.0, 2.0]]}), TypeError, "Tensor"),
        ("mask that does not broadcast", plain(lambda d: {"mask": bool_mask((4, 5), d)}), ValueError, "mask"),
        ("integer mask", plain(lambda d: {"mask": torch.zeros(3, 5, dtype=torch.int32, device=d)}), TypeError,
         "mask"),
        ("sinks with the reduced dim", plain(lambda d: {"sinks": torch.zeros(3, 5, device=d)}), ValueError, "sinks"),
        ("softcap <= 0", plain(lambda d: {"softcap": 0.0}), ValueError, "softcap"),
        ("scale not finite", plain(lambda d: {"scale": float("inf")}), ValueError, "scale"),
        ("unknown empty_rows", plain(lambda d: {"mask": bool_mask((3, 5), d), "empty_rows": "ones"}), ValueError,
         "empty_rows"),
        ("causal over a non-last dim", plain(lambda d: {"dim": 0, "causal": True}), ValueError, "causal"),
        ("backward grad of another shape", backward_grad, ValueError, "grad"),
    ]


def _bad_input(call, backend: str, device: str, exc_type, word: str) -> Callable[[int], str | None]:
    def run(seed: int) -> str | None:
        try:
            call(backend, device)
        except exc_type as exc:
            if word not in str(exc):
                raise AssertionError(f"{type(exc).__name__} does not name {word!r}: {exc}") from None
            return None
        except Exception as exc:  # the wrong kind of error: a user cannot catch what was promised
            raise AssertionError(f"expected {exc_type.__name__} naming {word!r}, got {type(exc).__name__}: "
                                 f"{exc}") from None
        raise AssertionError(f"accepted without an error (expected {exc_type.__name__} naming {word!r})")
    return run


def conformance_checks(backend: str, *, device: str = "cpu", quick: bool = False) -> list[Check]:
    """Every check of the kit for the registered backend `backend` on `device` ("cpu",
    "cuda", "cuda:1", "npu", ...): see the module docstring. `quick` keeps one case of each
    kind in float32 and bfloat16."""
    plain = [c for c in CASES + LONG_ROW_CASES if not quick or c.name in QUICK_CASES]
    variants = [c for c in VARIANT_CASES + LONG_VARIANT_CASES if not quick or c.name in QUICK_VARIANTS]
    by_name = {c.name: c for c in CASES + LONG_ROW_CASES}
    checks = [Check("protocol (name, devices, priority, is_available, supports)", "protocol",
                    _protocol(backend, device))]
    for log, op in _ops():
        for c in plain:
            checks += [Check(_name("forward", op, c, d), "forward", _plain(c, backend, device, log, d, "forward"))
                       for d in _dtypes(c, quick)]
    for log, op in _ops():
        for name in REPEAT_CASES if not quick else REPEAT_CASES[:2]:
            c = by_name[name]
            checks += [Check(_name("repeat", op, c, d), "repeat", _plain(c, backend, device, log, d, "repeat"))
                       for d in _dtypes(c, True)]
    for log, op in _ops():
        for name in BACKWARD_CASES if not quick else BACKWARD_CASES[:4]:
            c = by_name[name]
            checks += [Check(_name("backward", op, c, d), "backward", _plain(c, backend, device, log, d, "backward"))
                       for d in _dtypes(c, quick)]
    for kind in ("fused", "fused-backward"):
        for log, op in _ops():
            for c in variants:
                checks += [Check(_name(kind, op, c, d), kind, _fused(c, backend, device, log, d, kind))
                           for d in _dtypes(c, quick)]
    # Softmax in pieces: run where the backend declares the ops, a declared refusal elsewhere.
    lse_cases = [c for c in LOGSUMEXP_CASES if not quick or c.name in QUICK_PIECES]
    checks += [Check(_name("logsumexp", "logsumexp", c, d), "logsumexp", _logsumexp(c, backend, device, d, "logsumexp"))
               for c in lse_cases for d in _dtypes(c, quick)]
    lse_by_name = {c.name: c for c in LOGSUMEXP_CASES}
    checks += [Check(_name("logsumexp-backward", "logsumexp", c, d), "logsumexp-backward",
                     _logsumexp(c, backend, device, d, "logsumexp-backward"))
               for c in (lse_by_name[n] for n in LOGSUMEXP_BACKWARD_CASES[:1 if quick else None])
               for d in _dtypes(c, True)]
    split_cases = [c for c in SPLIT_CASES if not quick or c.name in QUICK_PIECES]
    checks += [Check(_name("merge", "merge_states", c, d), "merge", _merge(c, backend, device, d, "merge"))
               for c in split_cases for d in _dtypes(c, quick)]
    split_by_name = {c.name: c for c in SPLIT_CASES}
    checks += [Check(_name("merge-backward", "merge_states", c, d), "merge-backward",
                     _merge(c, backend, device, d, "merge-backward"))
               for c in (split_by_name[n] for n in MERGE_BACKWARD_CASES[:1 if quick else None])
               for d in _dtypes(c, True)]
    checks += [Check(f"bad-input {name}", "bad-input", _bad_input(call, backend, device, exc, word))
               for name, call, exc, word in _bad_inputs()]
    return checks


def run_checks(checks: list[Check], backend: str, device: str, seed: int) -> KitReport:
    """Run `checks`, collecting each outcome (a failure never stops the run)."""
    report = KitReport(backend, device, seed)
    for check in checks:
        try:
            refusal = check.run(seed)
        except AssertionError as exc:
            report.failed.append((check.name, str(exc) or "assertion failed"))
            continue
        except Exception as exc:  # the backend crashed: a failure of that case, named
            report.failed.append((check.name, f"{type(exc).__name__}: {exc}"))
            continue
        if refusal is None:
            report.passed.append(check.name)
            report.computed += check.kind in COMPUTING
        else:
            report.skipped.setdefault(refusal, []).append(check.name)
    return report


def check_backend(backend, *, device: str | None = None, quick: bool = False, seed: int | None = None,
                  fuzz: int = 0) -> KitReport:
    """Run the shipped conformance cases on `backend` (a backend object, or the name of a
    registered one) and return the `KitReport`; raise `AssertionError` with the report's text
    when a case failed, when the backend is not available here, or when every case was refused.

    `device`: where the inputs live (default: the first accelerator the backend serves that is
    present, else "cpu"). `quick`: one case of each kind, float32 and bfloat16 (seconds).
    `seed`: the data (default: random; the report prints it, and the same seed replays it).
    `fuzz`: after the cases, that many random calls of the call-sequence fuzzer
    (`anysoftmax.testing.fuzz`, needs hypothesis), replayed by the same seed.
    """
    seed = random.SystemRandom().randrange(2**31) if seed is None else int(seed)
    with registered(backend) as name:
        obj = registry.get_backend(name)
        device = device or default_device(obj)
        reason = registry.unavailable_reason(name)
        if reason is not None:
            raise AssertionError(f"anysoftmax conformance of {name!r}: the backend is not available here: {reason}")
        report = run_checks(conformance_checks(name, device=device, quick=quick), name, device, seed)
        if fuzz:
            from .fuzz import run_fuzz

            report.fuzz = run_fuzz(name, calls=fuzz, seed=seed, device=device, print_fn=None)
    if not report.ok:
        raise AssertionError(report.text())
    return report
