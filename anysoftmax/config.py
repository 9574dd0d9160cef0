"""Where configuration lives: the repository's `configs/` folder, or $ANYSOFTMAX_CONFIG_DIR."""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import yaml


def is_int(v) -> bool:
    """True for an int that is not a bool (YAML's `true` must not pass as 1)."""
    return isinstance(v, int) and not isinstance(v, bool)


def config_dir() -> Path:
    """The folder holding device matrices and tuning tables."""
    env = os.environ.get("ANYSOFTMAX_CONFIG_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "configs"


@lru_cache(maxsize=None)
def load_tuning(name: str) -> dict:
    """The tuning table `configs/tuning/<name>.yaml` as a dict (cached; read once)."""
    path = config_dir() / "tuning" / f"{name}.yaml"
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"tuning table {path} not found: install anysoftmax from its repository "
            f"(pip install -e .) or set ANYSOFTMAX_CONFIG_DIR to a copy of its configs/ folder") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return data


class Overrides:
    """Thread-local replacements of a tuning table's values, as a context manager:
    `with overrides(max_tile_elems=64): ...` (tests lower thresholds so rare paths run)."""

    def __init__(self, table: str):
        self.table = table
        self._local = threading.local()

    def active(self) -> dict:
        """The values replaced in this thread now."""
        return getattr(self._local, "values", None) or {}

    def key(self) -> tuple:
        """The active overrides as a hashable key (for caches of plans derived from the table)."""
        return tuple(sorted((k, repr(v)) for k, v in self.active().items()))

    @contextmanager
    def __call__(self, **values):
        known = set(load_tuning(self.table))
        unknown = set(values) - known
        if unknown:
            raise KeyError(f"unknown {self.table} tuning key(s) {sorted(unknown)}; known: {sorted(known)}")
        old = getattr(self._local, "values", None)
        self._local.values = {**(old or {}), **values}
        try:
            yield
        finally:
            self._local.values = old
