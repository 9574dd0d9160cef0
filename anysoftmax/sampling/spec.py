"""`SamplingSpec`: one validated sampling request, whatever computes it. What is taken and the
errors (naming the argument): docs/sampling.md, "Semantics". The values of per-row tensors are
checked on the CPU only: on an accelerator reading them would synchronise (and break CUDA-graph
capture), so a row with an out-of-range value there is invalid instead (`invalid_keyword_rows`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from dataclasses import dataclass

import torch

from ..core.spec import FLOAT_DTYPES, dtype_name

INT64_MIN, UINT64_END = -2**63, 2**64

# name -> (integer?, the values allowed (a number, or elementwise on a tensor), how to say it)
_RULES = {
    "temperature": (False, lambda t: (t >= 0) & (t < math.inf), "must be finite and >= 0 (0: greedy)"),
    "top_k": (True, lambda k: k >= 0, "must be >= 0 (0: off)"),
    "top_p": (False, lambda p: (p > 0) & (p <= 1), "must be in (0, 1] (1: off)"),
    "min_p": (False, lambda m: (m >= 0) & (m <= 1), "must be in [0, 1] (0: off)"),
    "seed": (True, None, "is taken modulo 2**64: an int in [-2**63, 2**64)"),
    "offset": (True, None, "is taken modulo 2**64: an int in [-2**63, 2**64)"),
}


def _number(op: str, name: str, value):
    integer, ok, rule = _RULES[name]
    given = type(value)
    # (int and float themselves first: the numbers ABCs' isinstance costs ~0.5 us a keyword)
    if not (given is int or given is float and not integer) and \
            (given is bool or not isinstance(value, numbers.Integral if integer else numbers.Real)):
        kind = "an int" if integer else "a float"
        raise TypeError(f"{op}: {name} must be {kind} or a tensor with one value per row, got "
                        f"{type(value).__name__} {value!r}")
    if integer:
        value = value if given is int else int(value)
        if ok is None:  # (seed, offset: the signed int64 with the bits of an int of the 64-bit range)
            if not INT64_MIN <= value < UINT64_END:
                raise ValueError(f"{op}: {name} {rule}, got {value}")
            return value - UINT64_END if value >= 2**63 else value
    else:
        value = value if given is float else float(value)
    if not ok(value):
        raise ValueError(f"{op}: {name} {rule}, got {value}")
    return min(value, 2**63 - 1) if integer else value  # (a top_k beyond int64 is off, as any >= V)


def _number_reader(op: str, name: str):
    """`_number(op, name, value)` for each call's value of keyword `name` given as a number: a
    float its rule allows (for top_k, seed, offset: an int of the signed 64-bit range, never
    negative) returned as it is, anything else through `_number` (which converts it or raises
    naming the argument)."""
    integer, ok, _ = _RULES[name]
    slow = functools.partial(_number, op, name)
    if integer:
        return lambda v: v if type(v) is int and 0 <= v < 2**63 else slow(v)
    return lambda v: v if type(v) is float and ok(v) else slow(v)


# A small per-row tensor on the CPU is checked as Python numbers (one `tolist`): cheaper than
# the few torch ops of the elementwise rules, which larger ones use.
PYTHON_CHECK_MAX = 64


def _check_values(op: str, name: str, value: torch.Tensor) -> None:
    """Raise when a CPU tensor of keyword `name` holds a value its rule refuses."""
    _, ok, rule = _RULES[name]
    if value.numel() <= PYTHON_CHECK_MAX:
        values = value.tolist()
        for v in values if isinstance(values, list) else (values,):
            if not ok(v):
                raise ValueError(f"{op}: {name} {rule}, got {v} (in a per-row tensor)")
        return
    bad = ~ok(value)
    if bool(bad.any()):
        first = value[bad][0].item() if value.dim() else value.item()
        raise ValueError(f"{op}: {name} {rule}, got {first} (in a per-row tensor)")


def _keyword_reader(op: str, name: str, value, batch_shape: tuple[int, ...], rows: int, device: torch.device):
    """Check the form of keyword `name` (a number, or a tensor's dtype, device and shape: what
    `form_key` holds) and return the function that validates and normalises each value of that
    form: to a Python number, a 0-dim tensor or a flat [rows] tensor on `device`."""
    if not isinstance(value, torch.Tensor):
        return _number_reader(op, name)
    integer, ok, rule = _RULES[name]
    if value.dtype == torch.bool or value.is_complex() or value.is_floating_point() == integer:
        kind = "an integer" if integer else "a floating"
        raise TypeError(f"{op}: {name} must have {kind} dtype, got {value.dtype}")
    if value.dim() == 0 and value.device.type == "cpu" and device.type != "cpu":
        return lambda v: _number(op, name, v.item())  # a host scalar: reading it synchronises nothing
    if value.device != device:
        raise ValueError(f"{op}: {name} is on {value.device} but logits are on {device}; per-row tensors must be "
                         f"on the logits' device")
    if value.dim() and tuple(value.shape) not in {batch_shape, (rows,), batch_shape + (1,)}:
        raise ValueError(f"{op}: {name} has shape {list(value.shape)}; one value per row of logits needs "
                         f"shape {list(batch_shape)} or [{rows}] ({rows} rows), or a 0-dim tensor for all rows")
    # What each call does, decided here: torch calls that return their input still cost ~1 us.
    flatten = value.dim() > 1
    cast = integer and value.dtype != torch.int64
    # Only CPU values are read: reading an accelerator's would synchronise (see the module).
    check = ok is not None and device.type == "cpu" and value.numel() > 0

    def read(v: torch.Tensor) -> torch.Tensor:
        if flatten:
            v = v.reshape(-1)
        if cast:
            v = v.to(torch.int64)
        if check:
            _check_values(op, name, v)
        return v
    return read


@dataclass(frozen=True, eq=False)
class SamplingSpec:
    """One sampling request (`anysoftmax.sampling.probs`, `sample`, `logprobs`), validated: a
    tensor keyword is 0-dim (every row) or flat ``[rows]`` on `device`; `seed` is None (drawn at
    each call), an int in the signed 64-bit range (the bits of the value given), a 0-dim int64
    tensor, or one int64 per row."""

    op: str
    batch_shape: tuple[int, ...]
    vocab: int
    dtype: torch.dtype
    device: torch.device
    temperature: float | torch.Tensor = 1.0  # (each keyword's default switches its step off)
    top_k: int | torch.Tensor = 0
    top_p: float | torch.Tensor = 1.0
    min_p: float | torch.Tensor = 0.0
    seed: int | torch.Tensor | None = None
    offset: int | torch.Tensor = 0

    @functools.cached_property
    def rows(self) -> int:
        """The number of rows (every dim of the logits but the last); computed once."""
        return math.prod(self.batch_shape)

    @property
    def compute_dtype(self) -> torch.dtype:
        """float64 for float64 logits, float32 otherwise (the draw is exact in either)."""
        return torch.float64 if self.dtype == torch.float64 else torch.float32

    @property
    def per_row_seed(self) -> bool:
        """True when `seed` holds one value per row: the row's position then does not enter its draw."""
        return isinstance(self.seed, torch.Tensor) and self.seed.dim() == 1

    def column(self, name: str, device: torch.device | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Keyword `name` as a ``[rows, 1]`` tensor on `device` (default: the request's), in
        `dtype` (default: int64 for top_k/seed/offset, the compute dtype for the others). Builds
        numbers with a fill (no host-to-device copy)."""
        device = self.device if device is None else device
        dtype = dtype or (torch.int64 if _RULES[name][0] else self.compute_dtype)
        value = getattr(self, name)
        if not isinstance(value, torch.Tensor):
            return torch.full((self.rows, 1), value, dtype=dtype, device=device)
        value = value.to(device=device, dtype=dtype)
        return value.reshape(-1, 1).expand(self.rows, 1) if value.dim() == 0 else value.reshape(self.rows, 1)

    def describe(self) -> str:
        def show(v):
            return f"tensor{list(v.shape)}" if isinstance(v, torch.Tensor) else repr(v)
        keys = ", ".join(f"{n}={show(getattr(self, n))}" for n in ("temperature", "top_k", "top_p", "min_p"))
        return (f"{self.op}(logits {list(self.batch_shape) + [self.vocab]} {dtype_name(self.dtype)}, {keys}, "
                f"device={self.device})")

    @classmethod
    def from_request(cls, op: str, logits, *, temperature=None, top_k=None, top_p=None, min_p=None, seed=None,
                     offset=0) -> "SamplingSpec":
        """Validate `logits` and the keywords of `op` (errors name the argument; see the module)."""
        values = (temperature, top_k, top_p, min_p, seed, offset)
        return SpecForm(op, logits, values).spec(values)


# The keywords in the order `SpecForm` and `form_key` take their values.
KEYWORDS = ("temperature", "top_k", "top_p", "min_p", "seed", "offset")
NUMBER = "number"  # a keyword's form in `form_key` when it is no tensor (its value is checked per call)


def form_key(logits, values: tuple) -> tuple | None:
    """What fixes a request's `SpecForm`: the logits' dtype, shape and device and each keyword's
    form (None, `NUMBER`, or a tensor's dtype, shape and device), `values` in `KEYWORDS` order
    (a prefix of it); None when `logits` is no tensor. Metadata only: nothing is read."""
    if not isinstance(logits, torch.Tensor):
        return None
    # (one comprehension, plain numbers tested first: a call per keyword costs ~0.1 us each)
    return (logits.dtype, logits.shape, logits.device,
            *[NUMBER if type(v) is float or type(v) is int else None if v is None else
              (v.dtype, v.shape, v.device) if isinstance(v, torch.Tensor) else NUMBER for v in values])


class SpecForm:
    """The form of a request (see `form_key`), checked once: the logits and each keyword's type,
    dtype, device and shape. `spec(values)` checks one call's values of that form (numbers in
    Python, a CPU tensor's values on the host, nothing of an accelerator's) and returns its
    `SamplingSpec`: all the validation a repeated request costs."""

    def __init__(self, op: str, logits, values: tuple):
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"{op}: logits must be a torch.Tensor, got {type(logits).__name__}")
        if logits.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{op}: logits dtype {logits.dtype} is not supported; allowed: "
                            f"{', '.join(map(dtype_name, FLOAT_DTYPES))}")
        if logits.dim() == 0 or logits.shape[-1] == 0:
            raise ValueError(f"{op}: logits need a vocabulary: a last dim of size >= 1, got shape "
                             f"{list(logits.shape)}")
        batch_shape, device = tuple(logits.shape[:-1]), logits.device
        template = SamplingSpec(op=op, batch_shape=batch_shape, vocab=logits.shape[-1], dtype=logits.dtype,
                                device=device)
        rows = template.rows  # (cached in its fields: every spec of this form has its value)
        self.readers = tuple((i, name, _keyword_reader(op, name, value, batch_shape, rows, device))
                             for i, (name, value) in enumerate(zip(KEYWORDS, values)) if value is not None)
        self.fields = dict(vars(template))
        self.defaults = tuple(self.fields[name] for name in KEYWORDS)

    def read(self, values: tuple) -> list:
        """The checked keyword values of one call of this form (`values` in `KEYWORDS` order, a
        prefix of it), every keyword in `KEYWORDS` order, its off value where not given: what
        `SamplingSpec` holds in those fields. Raises as `SamplingSpec.from_request` does."""
        checked = list(self.defaults)
        for i, _, read in self.readers:
            checked[i] = read(values[i])
        return checked

    def spec(self, values: tuple) -> SamplingSpec:
        """The request of these keyword `values` (`KEYWORDS` order), validated (see the class)."""
        fields = dict(self.fields)
        fields.update(zip(KEYWORDS, self.read(values)))
        # Filled in place rather than through the frozen dataclass's __init__ (its per-field
        # object.__setattr__ costs ~3 us a call); the fields are the checked values all the same.
        spec = object.__new__(SamplingSpec)
        spec.__dict__.update(fields)
        return spec


def form_of(spec: SamplingSpec) -> SamplingSpec:
    """`spec` with each tensor keyword replaced by an empty meta tensor of its dtype and shape:
    what a request's form holds (`sampling.api`'s runners), keeping no call's tensors alive."""
    meta = {name: torch.empty(v.shape, dtype=v.dtype, device="meta") for name in KEYWORDS
            if isinstance(v := getattr(spec, name), torch.Tensor)}
    return dataclasses.replace(spec, **meta) if meta else spec


def invalid_keyword_rows(spec: SamplingSpec, device: torch.device | None = None) -> torch.Tensor:
    """``[rows, 1]`` bool: rows whose per-row keyword values are out of range (only possible for
    accelerator tensors, whose values are not read on the host)."""
    bad = torch.zeros((spec.rows, 1), dtype=torch.bool, device=device or spec.device)
    for name in ("temperature", "top_k", "top_p", "min_p"):
        if isinstance(getattr(spec, name), torch.Tensor):
            bad |= ~_RULES[name][1](spec.column(name, device))
    return bad


def ids_reader(op: str, spec: SamplingSpec, ids):
    """Check the form of `logprobs`' ids (a tensor's dtype, device and shape) and return the
    function that reads each call's ids of that form as ``[rows, K]`` int64, checking their
    values on the CPU (an accelerator's are not read: out-of-range ids give NaN there)."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{op}: ids must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise TypeError(f"{op}: ids must have an integer dtype, got {ids.dtype}")
    if ids.device != spec.device:
        raise ValueError(f"{op}: ids are on {ids.device} but logits are on {spec.device}")
    if ids.dim() < 1 or tuple(ids.shape[:-1]) not in {spec.batch_shape, (spec.rows,)}:
        raise ValueError(f"{op}: ids have shape {list(ids.shape)}; they need shape {list(spec.batch_shape)} + [K] "
                         f"(K ids per row of logits)")
    shape, vocab = (spec.rows, ids.shape[-1]), spec.vocab
    reshape, cast = tuple(ids.shape) != shape, ids.dtype != torch.int64
    check = spec.device.type == "cpu" and ids.numel() > 0

    def read(given: torch.Tensor) -> torch.Tensor:
        flat = given.reshape(shape) if reshape else given
        flat = flat.to(torch.int64) if cast else flat
        if check:
            bad = [i for row in flat.tolist() for i in row if not 0 <= i < vocab] if flat.numel() <= PYTHON_CHECK_MAX \
                else flat[(flat < 0) | (flat >= vocab)].tolist()
            if bad:
                raise ValueError(f"{op}: ids must be in [0, {vocab}) (the vocabulary), got {bad[0]}")
        return flat
    return read


def check_ids(op: str, spec: SamplingSpec, ids) -> torch.Tensor:
    """`logprobs`' ids as ``[rows, K]`` int64 (shape ``logits.shape[:-1] + (K,)``, or ``[rows, K]``).
    Values outside [0, V) raise on the CPU; on an accelerator they give NaN (not read there)."""
    return ids_reader(op, spec, ids)(ids)


def check_top_n(op: str, spec: SamplingSpec, top_n) -> int:
    if isinstance(top_n, bool) or not isinstance(top_n, numbers.Integral):
        raise TypeError(f"{op}: top_n must be an int, got {type(top_n).__name__}")
    if not 0 <= top_n <= spec.vocab:
        raise ValueError(f"{op}: top_n must be in [0, {spec.vocab}] (the vocabulary size), got {top_n}")
    return int(top_n)
