"""`SamplingSpec`: one validated sampling request, whatever computes it.

Logits ``[..., V]``: the rows are every dim but the last, V (the vocabulary) the last; float16,
bfloat16, float32 or float64. Each keyword is a Python number or a tensor:

* a tensor with one value per row: shape ``logits.shape[:-1]``, ``[rows]`` or
  ``logits.shape[:-1] + (1,)``, on the logits' device;
* a 0-dim tensor: one value for every row (a 0-dim CPU tensor beside accelerator logits is read
  as a number: it lives on the host).

Errors name the argument: ValueError for a negative temperature (or one that is not finite),
``top_p`` outside (0, 1], ``min_p`` outside [0, 1], a negative ``top_k``, a per-row tensor of
the wrong size or device, a seed or offset outside the 64-bit range, logits without a vocabulary;
TypeError for integer (or bool, complex) logits, a bool where a number is expected (never taken
for 0/1), a float ``top_k``/seed/offset, an integer-typed temperature/top_p/min_p tensor.

The *values* of per-row tensors are checked where that costs no host synchronisation: on the
CPU. On an accelerator reading them would synchronise (and break CUDA-graph capture), so a row
with an out-of-range value there gives NaN probabilities, NaN log-probabilities and token id -1
(`invalid_keyword_rows`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from ..core.spec import FLOAT_DTYPES, dtype_name

INT64_MIN, UINT64_END = -2**63, 2**64

# The keywords' defaults: each one switches its step off.
TEMPERATURE_OFF, TOP_K_OFF, TOP_P_OFF, MIN_P_OFF = 1.0, 0, 1.0, 0.0


def _temperature_ok(t):
    if isinstance(t, torch.Tensor):
        return torch.isfinite(t) & (t >= 0)
    return math.isfinite(t) and t >= 0


# name -> (integer?, the values allowed (elementwise on tensors), how to say it)
_RULES = {
    "temperature": (False, _temperature_ok, "must be finite and >= 0 (0: greedy)"),
    "top_k": (True, lambda k: k >= 0, "must be >= 0 (0: off)"),
    "top_p": (False, lambda p: (p > 0) & (p <= 1) if isinstance(p, torch.Tensor) else 0 < p <= 1,
              "must be in (0, 1] (1: off)"),
    "min_p": (False, lambda m: (m >= 0) & (m <= 1) if isinstance(m, torch.Tensor) else 0 <= m <= 1,
              "must be in [0, 1] (0: off)"),
    "seed": (True, None, "is taken modulo 2**64: an int in [-2**63, 2**64)"),
    "offset": (True, None, "is taken modulo 2**64: an int in [-2**63, 2**64)"),
}


def _per_row_shapes(batch_shape: tuple[int, ...], rows: int) -> set[tuple[int, ...]]:
    return {batch_shape, (rows,), batch_shape + (1,)}


def _as_int64(op: str, name: str, value: int) -> int:
    """An int of the 64-bit range as the signed int64 with the same bits."""
    if not INT64_MIN <= value < UINT64_END:
        raise ValueError(f"{op}: {name} {_RULES[name][2]}, got {value}")
    return value - UINT64_END if value >= 2**63 else value


def _number(op: str, name: str, value):
    integer, ok, rule = _RULES[name]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral if integer else numbers.Real):
        kind = "an int" if integer else "a float"
        raise TypeError(f"{op}: {name} must be {kind} or a tensor with one value per row, got "
                        f"{type(value).__name__} {value!r}")
    if integer:
        value = int(value)
        if ok is None:
            return _as_int64(op, name, value)
    else:
        value = float(value)
    if not ok(value):
        raise ValueError(f"{op}: {name} {rule}, got {value}")
    return min(value, 2**63 - 1) if integer else value  # (a top_k beyond int64 is off, as any >= V)


def _keyword(op: str, name: str, value, batch_shape: tuple[int, ...], rows: int, device: torch.device):
    """A validated keyword: a Python number, a 0-dim tensor or a flat [rows] tensor on `device`."""
    if not isinstance(value, torch.Tensor):
        return _number(op, name, value)
    integer, ok, rule = _RULES[name]
    if value.dtype == torch.bool or value.is_complex() or value.is_floating_point() == integer:
        kind = "an integer" if integer else "a floating"
        raise TypeError(f"{op}: {name} must have {kind} dtype, got {value.dtype}")
    if value.dim() == 0 and value.device.type == "cpu" and device.type != "cpu":
        return _number(op, name, value.item())  # a host scalar: reading it synchronises nothing
    if value.device != device:
        raise ValueError(f"{op}: {name} is on {value.device} but logits are on {device}; per-row tensors must be "
                         f"on the logits' device")
    if value.dim() and tuple(value.shape) not in _per_row_shapes(batch_shape, rows):
        raise ValueError(f"{op}: {name} has shape {list(value.shape)}; one value per row of logits needs "
                         f"shape {list(batch_shape)} or [{rows}] ({rows} rows), or a 0-dim tensor for all rows")
    value = value.reshape(-1) if value.dim() else value
    value = value.to(torch.int64) if integer else value
    if ok is not None and device.type == "cpu" and value.numel():
        bad = ~ok(value)
        if bool(bad.any()):  # CPU values: reading them is free
            first = value[bad][0].item() if value.dim() else value.item()
            raise ValueError(f"{op}: {name} {rule}, got {first} (in a per-row tensor)")
    return value


@dataclass(frozen=True, eq=False)
class SamplingSpec:
    """One sampling request (`anysoftmax.sampling.probs`, `sample`, `logprobs`), validated.

    Keywords hold their off values when not given (temperature 1, top_k 0, top_p 1, min_p 0);
    a tensor keyword is 0-dim (every row) or flat ``[rows]`` on `device`. `seed` is None (draw
    one from the device's default generator at each call), an int in the signed 64-bit range
    (the same bits as the unsigned value given), a 0-dim int64 tensor, or one int64 per row.
    """

    op: str
    batch_shape: tuple[int, ...]
    vocab: int
    dtype: torch.dtype
    device: torch.device
    temperature: float | torch.Tensor = TEMPERATURE_OFF
    top_k: int | torch.Tensor = TOP_K_OFF
    top_p: float | torch.Tensor = TOP_P_OFF
    min_p: float | torch.Tensor = MIN_P_OFF
    seed: int | torch.Tensor | None = None
    offset: int | torch.Tensor = 0

    @property
    def rows(self) -> int:
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
        integer = _RULES[name][0]
        dtype = dtype or (torch.int64 if integer else self.compute_dtype)
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
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"{op}: logits must be a torch.Tensor, got {type(logits).__name__}")
        if logits.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{op}: logits dtype {logits.dtype} is not supported; allowed: "
                            f"{', '.join(map(dtype_name, FLOAT_DTYPES))}")
        if logits.dim() == 0 or logits.shape[-1] == 0:
            raise ValueError(f"{op}: logits need a vocabulary: a last dim of size >= 1, got shape "
                             f"{list(logits.shape)}")
        batch_shape, device = tuple(logits.shape[:-1]), logits.device
        rows = math.prod(batch_shape)
        given = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, offset=offset)
        fields = {name: _keyword(op, name, value, batch_shape, rows, device) for name, value in given.items()
                  if value is not None}
        return cls(op=op, batch_shape=batch_shape, vocab=logits.shape[-1], dtype=logits.dtype, device=device,
                   **fields)


def invalid_keyword_rows(spec: SamplingSpec, device: torch.device | None = None) -> torch.Tensor:
    """``[rows, 1]`` bool: rows whose per-row keyword values are out of range (only possible for
    accelerator tensors, whose values are not read on the host)."""
    bad = torch.zeros((spec.rows, 1), dtype=torch.bool, device=device or spec.device)
    for name in ("temperature", "top_k", "top_p", "min_p"):
        if isinstance(getattr(spec, name), torch.Tensor):
            bad |= ~_RULES[name][1](spec.column(name, device))
    return bad


def check_ids(op: str, spec: SamplingSpec, ids) -> torch.Tensor:
    """`logprobs`' ids as ``[rows, K]`` int64 (shape ``logits.shape[:-1] + (K,)``, or ``[rows, K]``).
    Values outside [0, V) raise on the CPU; on an accelerator they give NaN (not read there)."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{op}: ids must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise TypeError(f"{op}: ids must have an integer dtype, got {ids.dtype}")
    if ids.device != spec.device:
        raise ValueError(f"{op}: ids are on {ids.device} but logits are on {spec.device}")
    if ids.dim() < 1 or tuple(ids.shape[:-1]) not in {spec.batch_shape, (spec.rows,)}:
        raise ValueError(f"{op}: ids have shape {list(ids.shape)}; they need shape {list(spec.batch_shape)} + [K] "
                         f"(K ids per row of logits)")
    ids = ids.reshape(spec.rows, ids.shape[-1]).to(torch.int64)
    if spec.device.type == "cpu" and ids.numel():
        bad = (ids < 0) | (ids >= spec.vocab)
        if bool(bad.any()):
            raise ValueError(f"{op}: ids must be in [0, {spec.vocab}) (the vocabulary), got "
                             f"{ids[bad][0].item()}")
    return ids


def check_top_n(op: str, spec: SamplingSpec, top_n) -> int:
    if isinstance(top_n, bool) or not isinstance(top_n, numbers.Integral):
        raise TypeError(f"{op}: top_n must be an int, got {type(top_n).__name__}")
    if not 0 <= top_n <= spec.vocab:
        raise ValueError(f"{op}: top_n must be in [0, {spec.vocab}] (the vocabulary size), got {top_n}")
    return int(top_n)
