"""The fused family (`scale`, `mask`, `causal`, `softcap`, `sinks`, `empty_rows`; docs/semantics.md)
validated (`build`) and described (`Variant`: its operands' metadata, never the tensors, so it is hashable)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

MASK_NONE, MASK_BOOL, MASK_ADDITIVE = "none", "bool", "additive"
CAUSAL_NONE, TOP_LEFT, BOTTOM_RIGHT = "none", "top_left", "bottom_right"
EMPTY_ROWS = ("zero", "nan", "uniform")

_CAUSAL_NAMES = {False: CAUSAL_NONE, None: CAUSAL_NONE, True: TOP_LEFT, TOP_LEFT: TOP_LEFT,
                 BOTTOM_RIGHT: BOTTOM_RIGHT, CAUSAL_NONE: CAUSAL_NONE}


@dataclass(frozen=True)
class OperandMeta:
    """A broadcast operand as a kernel reads it: its own shape, its strides broadcast to the
    input's shape (0 on broadcast dims: never materialised) and its dtype."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]  # of the broadcast view, one per input dim
    dtype: torch.dtype

    @classmethod
    def of(cls, t: torch.Tensor, shape: tuple[int, ...]) -> "OperandMeta":
        """The metadata of `t` read as broadcast to `shape` (which it must broadcast to)."""
        return cls(tuple(t.shape), broadcast_strides(tuple(t.shape), tuple(t.stride()), shape), t.dtype)


def row_shape(shape: tuple[int, ...], dim: int) -> tuple[int, ...]:
    """`shape` with size 1 in `dim` (a per-row statistic with keepdim; () for a 0-dim input)."""
    return tuple(1 if d == dim else s for d, s in enumerate(shape))


def broadcast_strides(shape: tuple[int, ...], strides: tuple[int, ...], to: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a tensor of `shape`/`strides` expanded to `to` (as `Tensor.expand`: 0 where
    a size-1 or missing dim is broadcast), from metadata alone (it runs on traced tensors too)."""
    lead = len(to) - len(shape)
    return tuple(0 if d < lead or (shape[d - lead] == 1 and size != 1) else strides[d - lead]
                 for d, size in enumerate(to))


@dataclass(frozen=True)
class Variant:
    """One member of the fused family; `Variant()` is the plain softmax."""

    scale: float | None = None
    softcap: float | None = None
    mask: OperandMeta | None = None
    mask_kind: str = MASK_NONE
    causal: str = CAUSAL_NONE
    sinks: OperandMeta | None = None
    empty_rows: str = "zero"
    row_scale: OperandMeta | None = None  # a tensor scale's layout (`scale` is then None, or its values)

    @property
    def is_plain(self) -> bool:
        """True when nothing but the plain softmax is asked for."""
        return self == PLAIN

    @property
    def has_empty_rows(self) -> bool:
        """True when rows may be left empty (a bool mask or causal): `empty_rows` applies."""
        return self.mask_kind == MASK_BOOL or self.causal != CAUSAL_NONE

    def key(self) -> tuple:
        """Everything a compiled kernel depends on (not the values of `scale` and `softcap`)."""
        return (self.scale is not None, self.softcap is not None, self.mask_kind, self.mask, self.causal,
                self.sinks, self.empty_rows if self.has_empty_rows else "zero", self.row_scale)

    def with_values(self, scale, softcap: float) -> "Variant":
        """This variant with one call's `scale` / `softcap` values, for the formulas (a row scale's
        tensor in `scale`); absent steps stay absent."""
        return replace(self, scale=None if self.scale is None and self.row_scale is None else scale,
                       softcap=None if self.softcap is None else softcap)

    def values(self) -> tuple[float, float]:
        """(scale, softcap) as kernel arguments: 1.0 where absent (unused then)."""
        return (1.0 if self.scale is None else self.scale, 1.0 if self.softcap is None else self.softcap)

    def describe(self) -> str:
        """The variant's non-default parts, e.g. 'scale=0.125, mask=bool[8, 1, 64, 64], causal=top_left'."""
        parts = []
        if self.row_scale is not None:
            parts.append(f"scale=per-row{list(self.row_scale.shape)}")
        elif self.scale is not None:
            parts.append(f"scale={self.scale:g}")
        if self.softcap is not None:
            parts.append(f"softcap={self.softcap:g}")
        if self.mask is not None:
            parts.append(f"mask={self.mask_kind}{list(self.mask.shape)}")
        if self.causal != CAUSAL_NONE:
            parts.append(f"causal={self.causal}")
        if self.sinks is not None:
            parts.append(f"sinks{list(self.sinks.shape)}")
        if self.has_empty_rows:
            parts.append(f"empty_rows={self.empty_rows}")
        return ", ".join(parts)


PLAIN = Variant()


class Operands(NamedTuple):
    """The tensors and values of one fused call: `mask` and `sinks` as the caller gave them (None
    when absent), `scale` (a row scale's tensor) and `softcap` (1.0 where absent)."""

    mask: torch.Tensor | None
    sinks: torch.Tensor | None
    scale: float | torch.Tensor
    softcap: float


NO_OPERANDS = Operands(None, None, 1.0, 1.0)


def _is_symbolic(value) -> bool:
    # A float (or int) torch.compile traces as a symbol: its value is known only when the
    # compiled graph runs, where the operator receiving it validates it.
    return isinstance(value, (torch.SymFloat, torch.SymInt))


def _finite_float(name: str, value) -> float:
    """`value` as a float: what `F.scaled_dot_product_attention`'s `scale` takes (a Python or
    NumPy real number, a one-element tensor that needs no gradient), never a bool; finite."""
    if _is_symbolic(value):
        return value
    if isinstance(value, torch.Tensor) and value.dtype != torch.bool and value.numel() == 1 \
            and not value.requires_grad:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # (NumPy's bool is no Real)
        kind = "bool" if isinstance(value, torch.Tensor) and value.dtype == torch.bool else type(value).__name__
        raise TypeError(f"softmax: {name} must be a float, got {kind}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"softmax: {name} must be finite, got {value}")
    return value


def is_row_scale(scale) -> bool:
    """True when `scale` is a tensor of one value per row (a 0-dim tensor is a number)."""
    return isinstance(scale, torch.Tensor) and scale.dim() > 0


def check_row_scale(scale: torch.Tensor, x_shape: tuple[int, ...], device: torch.device, dim: int) -> None:
    """Raise unless the row scale `scale` is floating, on the input's device and broadcasts
    against the input with size 1 in the normalised `dim` (metadata only: torch.compile traces it)."""
    if not scale.dtype.is_floating_point:
        raise TypeError(f"softmax: scale dtype {scale.dtype} is not supported: a float, or a floating tensor "
                        f"with one value per row")
    _check_broadcast("scale", scale, row_shape(x_shape, dim), device,
                     f"a tensor scale broadcasts against the input with size 1 in dim {dim}: one value per row")


def _positive_cap(value) -> float:
    value = _finite_float("softcap", value)
    if not _is_symbolic(value) and value <= 0:
        raise ValueError(f"softmax: softcap must be > 0, got {value}")
    return value


def causal_name(causal) -> str:
    """Normalise `causal`: False/None -> "none", True -> "top_left", or the form's name."""
    try:
        return _CAUSAL_NAMES[causal]
    except (KeyError, TypeError):
        raise ValueError(f"softmax: causal must be False, True, 'top_left' or 'bottom_right', got {causal!r}") from None


def _check_broadcast(name: str, t, shape: tuple[int, ...], device: torch.device, rule: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"softmax: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device != device:
        raise ValueError(f"softmax: {name} is on {t.device} but the input is on {device}; both must be on one device")
    if t.dim() > len(shape) or any(s not in (1, n) for s, n in zip(reversed(t.shape), reversed(shape))):
        raise ValueError(f"softmax: {name} of shape {list(t.shape)} does not broadcast to {list(shape)} ({rule})")


def _sinks_hint(sinks, x_shape: tuple[int, ...], dim: int) -> str:
    """'; sinks of one logit per head of [B, H, S, S] scores are [H, 1, 1]' when a 1-D `sinks`
    has the length of a dim other than the reduced one: broadcasting aligns the trailing dims,
    so such a vector lines up with the keys, not the heads."""
    if not isinstance(sinks, torch.Tensor) or sinks.dim() != 1:
        return ""
    n = sinks.shape[0]
    for axis, size in enumerate(x_shape[:-1]):
        if axis != dim and size == n:
            shape = [n] + [1] * (len(x_shape) - 1 - axis)
            return (f"; for one logit per index of dim {axis} (size {n}), give sinks of shape {shape}: "
                    f"sinks.view({', '.join(map(str, shape))})")
    return ""


def build(x_shape: tuple[int, ...], device: torch.device, dim: int, *, scale=None, mask=None, causal=False,
          softcap=None, sinks=None, empty_rows: str = "zero") -> tuple[Variant, Operands]:
    """Validate the fused keywords of a request (`dim` normalised): (`Variant`, `Operands`)."""
    row_scale = None
    if is_row_scale(scale):
        check_row_scale(scale, x_shape, device, dim)
        row_scale, row_values, scale = OperandMeta.of(scale, x_shape), scale, None
    elif scale is not None:
        scale = _finite_float("scale", scale)
    if softcap is not None:
        softcap = _positive_cap(softcap)
    if not isinstance(empty_rows, str) or empty_rows not in EMPTY_ROWS:
        raise ValueError(f"softmax: empty_rows must be one of {', '.join(map(repr, EMPTY_ROWS))}, got {empty_rows!r}")
    form = causal_name(causal)
    ndim = len(x_shape)
    if form != CAUSAL_NONE and (ndim < 2 or dim != ndim - 1):
        raise ValueError(f"softmax: causal={causal!r} needs the softmax over the last dim of an input with at "
                         f"least 2 dims (queries, keys); got dim={dim} of a {ndim}-dim input")
    mask_meta, kind = None, MASK_NONE
    if mask is not None:
        _check_broadcast("mask", mask, x_shape, device, "mask must broadcast to the input")
        if mask.dtype == torch.bool:
            kind = MASK_BOOL
        elif mask.dtype.is_floating_point:
            kind = MASK_ADDITIVE
        else:
            raise TypeError(f"softmax: mask dtype {mask.dtype} is not supported: a bool mask (True = excluded) or a "
                            f"floating mask (added to the logits)")
        mask_meta = OperandMeta.of(mask, x_shape)
    sink_meta = None
    if sinks is not None:
        _check_broadcast("sinks", sinks, row_shape(x_shape, dim), device,
                         f"sinks broadcast against the input with size 1 in dim {dim}: one logit per row"
                         f"{_sinks_hint(sinks, x_shape, dim)}")
        if not sinks.dtype.is_floating_point:
            raise TypeError(f"softmax: sinks dtype {sinks.dtype} is not floating")
        sink_meta = OperandMeta.of(sinks, x_shape)
    if kind != MASK_BOOL and form == CAUSAL_NONE:
        empty_rows = "zero"  # no row can be empty
    variant = Variant(scale, softcap, mask_meta, kind, form, sink_meta, empty_rows, row_scale)
    values = variant.values()
    return variant, Operands(mask, sinks, values[0] if row_scale is None else row_values, values[1])


def keep_mask(shape: tuple[int, ...], variant: Variant, mask: torch.Tensor | None,
              device: torch.device | str | None = None) -> torch.Tensor | None:
    """The positions (bool, `shape`) the bool mask `mask` and causal keep, or None for all of them."""
    device = device if device is not None else (mask.device if mask is not None else "cpu")
    keep = ~mask.to(device).expand(shape) if variant.mask_kind == MASK_BOOL else None
    if variant.causal != CAUSAL_NONE:
        sq, sk = shape[-2], shape[-1]
        shift = sk - sq if variant.causal == BOTTOM_RIGHT else 0
        i = torch.arange(sq, device=device).unsqueeze(1)
        j = torch.arange(sk, device=device).unsqueeze(0)
        tri = (j <= i + shift).expand(shape)
        keep = tri if keep is None else keep & tri
    return keep


def runtime_values(scale, softcap) -> tuple[float, float]:
    """(scale, softcap) as one call's kernel arguments (1.0 where absent), validated on every call
    (a memoised request skips `build`); while tracing a number may be a symbol: the operator checks it."""
    if torch.compiler.is_compiling():
        return _traced_value("scale", scale), _traced_value("softcap", softcap)
    if scale is None:
        s = 1.0
    elif (type(scale) is float and math.isfinite(scale)) or is_row_scale(scale):  # (row scale: checked once)
        s = scale
    else:
        s = _finite_float("scale", scale)
    if softcap is None:
        c = 1.0
    elif type(softcap) is float and math.isfinite(softcap) and softcap > 0:
        c = softcap
    else:
        c = _positive_cap(softcap)
    return s, c


def _traced_value(name: str, value):
    if value is None:
        return 1.0
    if type(value) in (float, int) or _is_symbolic(value) or is_row_scale(value):
        return value
    return _positive_cap(value) if name == "softcap" else _finite_float(name, value)
