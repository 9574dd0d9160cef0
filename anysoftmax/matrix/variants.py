"""The matrix's `variants:` axis: which member of the fused family (`core.variant`) a cell runs.

    variants:
      - plain                                    # a preset, by name (PRESETS)
      - {causal: bottom_right}                   # a mapping: named after its contents
      - name: megatron                           # or named
        scale: 0.125
        mask: {kind: bool, shape: [b, 1, sq, sk], density: 0.3}
        empty_rows: zero
      - {sinks: {shape: [h, 1, 1]}}

A mapping's keys: `name`, `scale` (finite), `softcap` (> 0), `causal` (true/top_left,
bottom_right, false), `mask` ({kind: bool | additive, shape, density}), `sinks` (true: one
logit per row; or {shape}), `empty_rows` (zero, nan, uniform). Operand shapes are lists of
sizes or symbols resolved against each cell's shape, aligned right as torch broadcasts:
`sk`, `sq`, `h`, `b` name the last, second-to-last, third- and fourth-to-last dims (scores
[B, H, Sq, Sk]); `d0`, `d1`, ... name dims by position; an integer is a literal size.

Operands are drawn fresh from the cell's seed (`matrix.operands`). A bool mask excludes about
`density` of its positions and keeps at least one position in each of its rows, unless the
variant sets `empty_rows`: then about one row in ten (at least one) is excluded entirely, so
the policy is exercised (causal and a mask together may still empty a row: the policy then
applies, default zero). An additive mask is fresh `randn` with about `density` of its entries
at the dtype's `finfo.min` (HF's convention).

Decided here: a key or value that is wrong everywhere is a `ConfigError` (all of them at once,
with the key path); a variant that cannot apply to one cell (causal over a dim that is not the
last, a symbol the cell's rank does not have, a mask that does not broadcast) makes that cell
*skipped* with the reason, and a variant that applies to none of its entry's shapes is a
`ConfigError` (a typo, not a smaller matrix).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..config import is_int
from ..core.variant import BOTTOM_RIGHT, CAUSAL_NONE, EMPTY_ROWS, TOP_LEFT, causal_name

PLAIN_NAME = "plain"
VARIANT_KEYS = ("name", "scale", "softcap", "causal", "mask", "sinks", "empty_rows")
MASK_KEYS = ("kind", "shape", "density")
SINKS_KEYS = ("shape",)
MASK_KINDS = ("bool", "additive")
CAUSAL_VALUES = "true, false, top_left, bottom_right"
SYMBOLS = ("b", "h", "sq", "sk")  # 4th-, 3rd-, 2nd-to-last and last dim
_FROM_END = {"sk": 1, "sq": 2, "h": 3, "b": 4}
_POSITION = re.compile(r"^d(\d+)$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+=-]*$")
DEFAULT_DENSITY = {"bool": 0.3, "additive": 0.2}


class NotApplicable(Exception):
    """A variant that cannot run on one cell's shape and dim; the message is the skip reason."""


@dataclass(frozen=True)
class MaskSpec:
    """A mask operand to draw: `kind` bool (True = excluded) or additive, its `shape` (symbols
    or sizes; None: the cell's shape) and `density` (bool: fraction excluded; additive:
    fraction at finfo.min)."""

    kind: str
    shape: tuple | None = None
    density: float = 0.3


@dataclass(frozen=True)
class VariantSpec:
    """One entry of `variants:`. Plain data (it travels in a `Cell` to worker processes)."""

    name: str = PLAIN_NAME
    scale: float | None = None
    softcap: float | None = None
    causal: str = CAUSAL_NONE
    mask: MaskSpec | None = None
    sinks: bool = False
    sinks_shape: tuple | None = None  # None: one sink per row (the input's shape, 1 in dim)
    empty_rows: str | None = None  # None: not asked (the default "zero"; no row emptied on purpose)

    @property
    def is_plain(self) -> bool:
        return self.kwargs_free() == PLAIN.kwargs_free()

    def kwargs_free(self) -> tuple:
        """Everything but the name."""
        return (self.scale, self.softcap, self.causal, self.mask, self.sinks, self.sinks_shape, self.empty_rows)

    @property
    def policy(self) -> str:
        """The `empty_rows` value the call passes."""
        return self.empty_rows or "zero"

    @property
    def has_empty_rows(self) -> bool:
        """True when rows may be empty (a bool mask or causal)."""
        return self.causal != CAUSAL_NONE or (self.mask is not None and self.mask.kind == "bool")

    def describe(self) -> str:
        """'scale=0.125, mask=bool[b, 1, sq, sk]@0.3, empty_rows=zero' ('plain' when plain)."""
        return ", ".join(_parts(self, long=True)) or PLAIN_NAME

    def as_dict(self) -> dict:
        """JSON form (report.json); `from_dict` reads it back."""
        d = {"name": self.name}
        for key in ("scale", "softcap", "empty_rows"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if self.causal != CAUSAL_NONE:
            d["causal"] = self.causal
        if self.mask is not None:
            d["mask"] = {"kind": self.mask.kind, "density": self.mask.density,
                         **({"shape": list(self.mask.shape)} if self.mask.shape is not None else {})}
        if self.sinks:
            d["sinks"] = {"shape": list(self.sinks_shape)} if self.sinks_shape is not None else True
        return d

    @classmethod
    def from_dict(cls, d: dict | None) -> "VariantSpec":
        if not d:
            return PLAIN
        mask = d.get("mask")
        sinks = d.get("sinks", False)
        return cls(name=d["name"], scale=d.get("scale"), softcap=d.get("softcap"),
                   causal=d.get("causal", CAUSAL_NONE),
                   mask=None if mask is None else MaskSpec(mask["kind"], _tuple(mask.get("shape")), mask["density"]),
                   sinks=bool(sinks), sinks_shape=_tuple(sinks.get("shape")) if isinstance(sinks, dict) else None,
                   empty_rows=d.get("empty_rows"))


def _tuple(v):
    return None if v is None else tuple(v)


PLAIN = VariantSpec()
_ATT_MASK = ("b", 1, "sq", "sk")  # one mask per batch element, broadcast over heads (Megatron)

# Named variants a matrix or `anysoftmax bench --variants` can name. Scores are [B, H, Sq, Sk]:
# scale 0.125 = head_dim 64; softcap 50 = Gemma2's attention cap.
PRESETS: dict[str, VariantSpec] = {v.name: v for v in (
    PLAIN,
    VariantSpec("scale", scale=0.125),
    VariantSpec("mask", mask=MaskSpec("bool", _ATT_MASK, 0.3)),
    VariantSpec("additive", mask=MaskSpec("additive", _ATT_MASK, 0.2)),
    VariantSpec("causal", causal=TOP_LEFT),
    VariantSpec("causal-bottom-right", causal=BOTTOM_RIGHT),
    VariantSpec("softcap", softcap=50.0),
    VariantSpec("sinks", sinks=True, sinks_shape=("h", 1, 1)),
    VariantSpec("megatron", scale=0.125, mask=MaskSpec("bool", _ATT_MASK, 0.3), empty_rows="zero"),
    VariantSpec("gemma2", scale=0.125, softcap=50.0, mask=MaskSpec("additive", _ATT_MASK, 0.2)),
    VariantSpec("gpt-oss", scale=0.125, causal=TOP_LEFT, sinks=True, sinks_shape=("h", 1, 1)),
)}


# ---------------------------------------------------------------- YAML

def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _shape_text(shape: tuple | None, default: str) -> str:
    return default if shape is None else "[" + ", ".join(map(str, shape)) + "]"


def _parts(v: VariantSpec, long: bool) -> list[str]:
    """The variant's steps as text: long for `describe` ('scale=0.125'), short for a name
    made from its keys ('scale0.125')."""
    eq = "=" if long else ""
    parts = []
    if v.scale is not None:
        parts.append(f"scale{eq}{v.scale:g}")
    if v.softcap is not None:
        parts.append(f"softcap{eq}{v.softcap:g}")
    if v.mask is not None:
        shape = _shape_text(v.mask.shape, "") if long else ""
        parts.append(f"mask={v.mask.kind}{shape}@{v.mask.density:g}" if long else f"mask-{v.mask.kind}{v.mask.density:g}")
    if v.causal != CAUSAL_NONE:
        parts.append(f"causal={v.causal}" if long else "causal" if v.causal == TOP_LEFT else "causal-br")
    if v.sinks:
        parts.append(f"sinks={_shape_text(v.sinks_shape, 'row')}" if long else "sinks")
    if v.empty_rows is not None:
        parts.append(f"empty_rows={v.empty_rows}" if long else f"empty-{v.empty_rows}")
    return parts


def _auto_name(v: VariantSpec) -> str:
    """A mapping without `name`: named after its contents, e.g. 'scale0.125+causal-br'."""
    return "+".join(_parts(v, long=False)) or PLAIN_NAME


def _shape(c, where: str, value) -> tuple | None:
    if not isinstance(value, list):
        c.error(where, f"expected a list of sizes or symbols ({', '.join(SYMBOLS)}, d0, d1, ...), got {value!r}")
        return None
    out = []
    for i, s in enumerate(value):
        if is_int(s) and s >= 1:
            out.append(s)
        elif isinstance(s, str) and (s in SYMBOLS or _POSITION.match(s)):
            out.append(s)
        else:
            c.error(f"{where}[{i}]", f"unknown size {s!r}; allowed: a positive integer, {', '.join(SYMBOLS)} "
                                     f"(dims counted from the end) or d0, d1, ... (dims by position)")
            return None
    return tuple(out)


def _mask(c, where: str, value) -> MaskSpec | None:
    if not isinstance(value, dict):
        c.error(where, f"expected a mapping with keys {', '.join(MASK_KEYS)}, e.g. "
                       "{kind: bool, shape: [b, 1, sq, sk], density: 0.3}")
        return None
    c.keys(where, value, MASK_KEYS)
    kind = value.get("kind")
    if kind not in MASK_KINDS:
        c.error(f"{where}.kind", f"{'missing' if kind is None else f'unknown kind {kind!r}'}; allowed: "
                                 f"{', '.join(MASK_KINDS)} (bool: True = excluded; additive: added to the logits)")
        return None
    shape = _shape(c, f"{where}.shape", value["shape"]) if "shape" in value else None
    density = value.get("density", DEFAULT_DENSITY[kind])
    if not _number(density) or not 0 < density < 1:
        c.error(f"{where}.density", f"expected a number strictly between 0 and 1, got {density!r}")
        return None
    return MaskSpec(kind, shape, float(density))


def _mapping(c, where: str, value: dict) -> VariantSpec | None:
    c.keys(where, value, VARIANT_KEYS)
    ok = True

    def bad(key, msg):
        nonlocal ok
        c.error(f"{where}.{key}", msg)
        ok = False

    scale = value.get("scale")
    if scale is not None and (not _number(scale) or not math.isfinite(scale)):
        bad("scale", f"expected a finite number, got {scale!r}")
    softcap = value.get("softcap")
    if softcap is not None and (not _number(softcap) or not math.isfinite(softcap) or softcap <= 0):
        bad("softcap", f"expected a number > 0, got {softcap!r}")
    causal = CAUSAL_NONE
    if "causal" in value:
        try:
            causal = causal_name(value["causal"])
        except ValueError:
            bad("causal", f"unknown value {value['causal']!r}; allowed: {CAUSAL_VALUES}")
    mask = None
    if "mask" in value:
        mask = _mask(c, f"{where}.mask", value["mask"])
        ok = ok and mask is not None
    sinks, sinks_shape = value.get("sinks", False), None
    if isinstance(sinks, dict):
        c.keys(f"{where}.sinks", sinks, SINKS_KEYS)
        if "shape" not in sinks:
            bad("sinks", "a sinks mapping needs `shape` (or write `sinks: true` for one logit per row)")
        else:
            sinks_shape = _shape(c, f"{where}.sinks.shape", sinks["shape"])
            ok = ok and sinks_shape is not None
        sinks = True
    elif not isinstance(sinks, bool):
        bad("sinks", f"expected true, false or {{shape: [...]}}, got {sinks!r}")
    empty = value.get("empty_rows")
    if empty is not None and empty not in EMPTY_ROWS:
        bad("empty_rows", f"unknown value {empty!r}; allowed: {', '.join(EMPTY_ROWS)}")
    if not ok:
        return None
    spec = VariantSpec("", None if scale is None else float(scale), None if softcap is None else float(softcap),
                       causal, mask, bool(sinks), sinks_shape, empty)
    if empty is not None and not spec.has_empty_rows:
        c.error(f"{where}.empty_rows", "no row can be empty without a bool mask or causal: drop empty_rows, "
                                       "or add mask: {kind: bool, ...} or causal")
        return None
    name = value.get("name", _auto_name(spec))
    if not isinstance(name, str) or not _NAME.match(name):
        c.error(f"{where}.name", f"expected a name of letters, digits and _ . + = - (it is part of cell ids), "
                                 f"got {name!r}")
        return None
    return VariantSpec(name, *spec.kwargs_free())


def check_variants(c, where: str, value) -> tuple[VariantSpec, ...]:
    """The `variants:` list (schema's checker `c` collects the errors): preset names or mappings."""
    def item(w, v):
        if isinstance(v, str):
            if v not in PRESETS:
                c.error(w, f"unknown variant {v!r}; allowed: a preset ({', '.join(PRESETS)}) or a mapping with "
                           f"keys {', '.join(VARIANT_KEYS)}")
                return None
            return PRESETS[v]
        if isinstance(v, dict):
            return _mapping(c, w, v)
        c.error(w, f"expected a preset name or a mapping with keys {', '.join(VARIANT_KEYS)}, got {v!r}")
        return None

    specs: list[VariantSpec] = []
    names = c.distinct(where, value, "expected a non-empty list of variants, e.g. [plain, {scale: 0.125}]",
                       lambda w, v: _named(item(w, v), specs), lambda v: f"variant {_label(v)!r}")
    return tuple(s for s in specs if s.name in names)


def _named(spec: VariantSpec | None, into: list) -> str | None:
    # `distinct` compares names (two variants may not share one: cell ids would collide).
    if spec is None:
        return None
    if spec.name not in {s.name for s in into}:
        into.append(spec)
    return spec.name


def _label(v) -> str:
    return v if isinstance(v, str) else str(v.get("name", v)) if isinstance(v, dict) else repr(v)


# ---------------------------------------------------------------- one cell

def _resolve_size(sym, shape: tuple[int, ...], what: str) -> int:
    ndim = len(shape)
    if is_int(sym):
        return sym
    pos = ndim - _FROM_END[sym] if sym in _FROM_END else int(_POSITION.match(sym).group(1))
    if not 0 <= pos < ndim:
        raise NotApplicable(f"{what}: symbol {sym!r} names no dim of a {ndim}-d input {list(shape)}")
    return shape[pos]


def resolve_shape(symbols: tuple, shape: tuple[int, ...], what: str,
                  target: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Operand sizes of `symbols` on an input of `shape`; NotApplicable when a symbol has no
    dim there or the result does not broadcast to `target` (default: `shape`; aligned right,
    as torch broadcasts)."""
    target = shape if target is None else target
    sizes = tuple(_resolve_size(s, shape, what) for s in symbols)
    if len(sizes) > len(target) or any(s not in (1, n) for s, n in zip(reversed(sizes), reversed(target))):
        raise NotApplicable(f"{what} {list(symbols)} = {list(sizes)} does not broadcast to {list(target)}")
    return sizes


@dataclass(frozen=True)
class Resolved:
    """A variant on one cell: its operands' concrete shapes (None when absent)."""

    mask_shape: tuple[int, ...] | None
    sinks_shape: tuple[int, ...] | None


def resolve(spec: VariantSpec, shape: tuple[int, ...], dim: int) -> Resolved:
    """The variant's operand shapes on a cell of `shape` reduced over `dim`; NotApplicable with
    the reason when it cannot apply there."""
    ndim = len(shape)
    d = dim % max(ndim, 1)
    if spec.causal != CAUSAL_NONE and (ndim < 2 or d != ndim - 1):
        raise NotApplicable(f"variant {spec.name!r}: causal needs the softmax over the last dim of an input with at "
                            f"least 2 dims; this cell reduces dim {dim} of {list(shape)}")
    mask_shape = sinks_shape = None
    if spec.mask is not None:
        mask_shape = shape if spec.mask.shape is None else resolve_shape(spec.mask.shape, shape,
                                                                         f"variant {spec.name!r}: mask shape")
        md = d - (ndim - len(mask_shape))
        if spec.mask.kind == "bool" and (md < 0 or mask_shape[md] == 1) and spec.empty_rows is None \
                and shape and shape[d] > 1:
            raise NotApplicable(f"variant {spec.name!r}: a bool mask {list(mask_shape)} with size 1 in the reduced "
                                f"dim {dim} excludes whole rows; set empty_rows to say what they give")
    if spec.sinks:
        row = tuple(1 if i == d else s for i, s in enumerate(shape))
        sinks_shape = row if spec.sinks_shape is None else resolve_shape(
            spec.sinks_shape, shape, f"variant {spec.name!r}: sinks shape (one logit per row: size 1 in dim {dim})",
            row)
    return Resolved(mask_shape, sinks_shape)


def applies(spec: VariantSpec, shape: tuple[int, ...], dim: int) -> str | None:
    """None when `spec` can run on (shape, dim), else the reason it cannot."""
    try:
        resolve(spec, shape, dim)
    except NotApplicable as exc:
        return str(exc)
    return None
