"""Measured per-device selection tables (`configs/selection/<device>.yaml`): which backend the automatic choice
takes for a shape (docs/backends.md, "How the automatic choice is made")."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import torch

from ..config import ENV_CONFIG_DIR, read_yaml_mapping
from .spec import SoftmaxSpec, dtype_name

log = logging.getLogger("anysoftmax")
# Rows for the softmax forward, its backward, and logsumexp (`anysoftmax.logsumexp`: the backends
# that serve it run their forward kernels' statistics, but not equally fast).
DIRECTIONS = ("fwd", "bwd", "lse")
DIM_KINDS = ("last", "non-last")


def device_key(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'NVIDIA_H100_80GB_HBM3' (the results folders' spelling)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")


@dataclass(frozen=True)
class Rule:
    """One shape class of a table and the backend that serves it."""

    direction: str
    dtype: str
    dim: str
    n: tuple[int, int | None]
    rows: tuple[int, int | None]
    backend: str
    measured: dict
    index: int = 0  # position in the table (for explanations)

    def matches(self, direction: str, dtype: str, dim: str, n: int, rows: int) -> bool:
        return (self.direction == direction and self.dtype == dtype and self.dim == dim
                and _within(n, self.n) and _within(rows, self.rows))

    def describe(self) -> str:
        """'fwd float32 last n 49153..inf rows 1..inf -> cute'."""
        def span(r):
            return f"{r[0]}..{'inf' if r[1] is None else r[1]}"
        return f"{self.direction} {self.dtype} {self.dim} n {span(self.n)} rows {span(self.rows)} -> {self.backend}"


@dataclass(frozen=True)
class Table:
    device: str
    path: str
    rules: tuple[Rule, ...]

    def lookup(self, direction: str, dtype: str, dim: str, n: int, rows: int) -> Rule | None:
        """The first rule matching the request, None when none does."""
        return next((rule for rule in self.rules if rule.matches(direction, dtype, dim, n, rows)), None)


def _within(value: int, span: tuple[int, int | None]) -> bool:
    lo, hi = span
    return value >= lo and (hi is None or value <= hi)


def request_class(spec: SoftmaxSpec) -> tuple[str, str, int, int]:
    """(dtype, dim kind, n, rows) of a request: the coordinates rules are written in."""
    dims_after = spec.shape[spec.dim + 1:] if spec.shape else ()
    last = all(s == 1 for s in dims_after)
    return dtype_name(spec.out_dtype), "last" if last else "non-last", spec.n_cols, spec.n_rows


# ---------------------------------------------------------------- reading tables

class TableError(ValueError):
    """A selection table that does not say what this module expects (the message names the file)."""


def _span(value, what: str, path: str) -> tuple[int, int | None]:
    if (not isinstance(value, (list, tuple)) or len(value) != 2 or not isinstance(value[0], int)
            or not (value[1] is None or isinstance(value[1], int))):
        raise TableError(f"{path}: {what} must be [low, high] (integers, high may be null), got {value!r}")
    return int(value[0]), None if value[1] is None else int(value[1])


def parse_table(data: dict, path: str) -> Table:
    """A `Table` from the YAML document `data` read from `path` (errors name the file)."""
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise TableError(f"{path}: expected a mapping with a `rules` list")
    rules = []
    for i, r in enumerate(data["rules"]):
        where = f"{path}: rule {i}"
        if not isinstance(r, dict):
            raise TableError(f"{where}: expected a mapping, got {r!r}")
        missing = {"direction", "dtype", "dim", "n", "rows", "backend"} - set(r)
        if missing:
            raise TableError(f"{where}: missing {sorted(missing)}")
        if r["direction"] not in DIRECTIONS or r["dim"] not in DIM_KINDS:
            raise TableError(f"{where}: direction must be one of {DIRECTIONS} and dim one of {DIM_KINDS}")
        rules.append(Rule(r["direction"], str(r["dtype"]), r["dim"], _span(r["n"], "n", where),
                          _span(r["rows"], "rows", where), str(r["backend"]), dict(r.get("measured") or {}), i))
    return Table(str(data.get("device", "")), path, tuple(rules))


def _folders() -> list[Path]:
    # The override folder ($ANYSOFTMAX_CONFIG_DIR/selection) first, then the shipped one.
    over = os.environ.get(ENV_CONFIG_DIR)
    shipped = Path(str(resources.files("anysoftmax") / "configs" / "selection"))
    return [Path(over) / "selection", shipped] if over else [shipped]


def table_path(device: str) -> Path | None:
    """The table of device `device` (a name or its key), the override folder's first, or None."""
    name = f"{device_key(device)}.yaml"
    return next((folder / name for folder in _folders() if (folder / name).is_file()), None)


def table_names() -> list[str]:
    """The device names of every table there is: the override folder's, then the shipped ones."""
    names: list[str] = []
    for folder in _folders():
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else ():
            try:
                name = str(read_yaml_mapping(path).get("device") or path.stem)
            except Exception:  # an unreadable table is still named by its file
                name = path.stem
            if name not in names:
                names.append(name)
    return names


def resolve_name(text: str) -> str:
    """The device name of the table `text` names: the exact name or key, or a case-insensitive
    part of exactly one table's name ('H100'); ValueError naming the tables otherwise."""
    if table_path(text) is not None:
        return text
    names = table_names()
    hits = [n for n in names if text.lower() in n.lower() or text.lower() in device_key(n).lower()]
    if len(hits) == 1:
        return hits[0]
    shipped = ", ".join(repr(n) for n in names) or "none"
    if hits:
        raise ValueError(f"{text!r} matches several selection tables ({', '.join(map(repr, hits))}); "
                         f"give more of the name")
    raise ValueError(f"no selection table for {text!r}; tables: {shipped}")


@lru_cache(maxsize=64)
def _load(path: str, mtime: float) -> Table:
    return parse_table(read_yaml_mapping(Path(path)), path)


def load_table(device: str) -> Table | None:
    """The parsed table of `device` (re-read when the file changes), None when it has none."""
    path = table_path(device)
    return None if path is None else _load(str(path), path.stat().st_mtime)


@lru_cache(maxsize=16)
def _device_name(device_type: str, index: int | None) -> str:
    if device_type == "cpu":
        return "cpu"
    module = getattr(torch, device_type, None)
    if module is None or not module.is_available():
        return ""
    return module.get_device_name(index if index is not None else module.current_device())


def device_name(device) -> str:
    """The name tables are keyed by for a torch.device ('' when it cannot be queried)."""
    try:
        return _device_name(device.type, device.index)
    except Exception as exc:  # a device that cannot be queried has no table
        log.debug("anysoftmax: no device name for %s: %s", device, exc)
        return ""


def lookup(spec: SoftmaxSpec, direction: str = "fwd", device: str | None = None) -> tuple[Rule | None, Table | None]:
    """(the rule for `spec` or None, the table or None) in the table of its device or of `device`."""
    name = device if device is not None else device_name(spec.device)
    table = load_table(name) if name else None
    return (None if table is None else table.lookup(direction, *request_class(spec))), table
