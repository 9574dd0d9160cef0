"""Where configuration lives: package data, read with `importlib.resources`.

Shipped inside the wheel:
* device matrices: `anysoftmax/configs/<name>.yaml`;
* tuning tables: `anysoftmax/backends/<backend>/tuning.yaml`, beside the code they tune;
* device profiles: `anysoftmax/backends/<backend>/profiles.yaml` (Ascend).

`$ANYSOFTMAX_CONFIG_DIR` overrides any of them file by file: `<dir>/<name>.yaml` for a matrix,
`<dir>/tuning/<backend>.yaml` for a tuning table, `<dir>/devices/<backend>.yaml` for profiles;
a file missing there falls back to the shipped one.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

ENV_CONFIG_DIR = "ANYSOFTMAX_CONFIG_DIR"


ENV_RESULTS_DIR = "ANYSOFTMAX_RESULTS_DIR"
ENV_CACHE_DIR = "ANYSOFTMAX_CACHE_DIR"
# Set by `bash run.sh matrix` to its command: what it did not install, it adds through
# ANYSOFTMAX_EXTRAS, so that is what a missing extra's reason should say there.
ENV_RUN_SH = "ANYSOFTMAX_RUN_SH"


def install_hint(extra: str) -> str:
    """How to add the extra `extra` here: `pip install 'anysoftmax[extra]'`, or under run.sh
    (which makes its own .venv) `ANYSOFTMAX_EXTRAS=extra bash run.sh <command>`."""
    command = os.environ.get(ENV_RUN_SH, "").strip()
    if command:
        return f"ANYSOFTMAX_EXTRAS={extra} bash run.sh {command}"
    return f"pip install 'anysoftmax[{extra}]'"


def results_dir() -> Path:
    """Where commands write results unless told otherwise (`anysoftmax matrix` without
    `--out`: `<results>/matrix/<name>/`): $ANYSOFTMAX_RESULTS_DIR, else
    `$XDG_DATA_HOME/anysoftmax/results` (`~/.local/share/anysoftmax/results`): never the
    current folder. `bash run.sh` sets it to the clone's `out/`."""
    env = os.environ.get(ENV_RESULTS_DIR)
    if env:
        return Path(env).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data).expanduser() / "anysoftmax" / "results"


def cache_dir(name: str) -> Path:
    """The folder of one compiled-artifact cache (not created here): `$ANYSOFTMAX_CACHE_DIR/name`
    if set, else `$XDG_CACHE_HOME/anysoftmax/name` (`~/.cache/anysoftmax/name`)."""
    env = os.environ.get(ENV_CACHE_DIR)
    if env:
        return Path(env).expanduser() / name
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "anysoftmax" / name


def is_int(v) -> bool:
    """True for an int that is not a bool (YAML's `true` must not pass as 1)."""
    return isinstance(v, int) and not isinstance(v, bool)


def _override_dir() -> Path | None:
    env = os.environ.get(ENV_CONFIG_DIR)
    return Path(env) if env else None


def shipped_matrices() -> Path:
    """The folder of device matrices shipped in the package (a real directory: the package is
    installed unzipped, as pip always does)."""
    return Path(str(resources.files("anysoftmax") / "configs"))


def matrix_path(name: str) -> Path:
    """The device matrix called `name` ('h100' -> configs/h100.yaml), override first."""
    over = _override_dir()
    if over is not None and (over / f"{name}.yaml").is_file():
        return over / f"{name}.yaml"
    return shipped_matrices() / f"{name}.yaml"


def matrix_names() -> list[str]:
    """Names of the shipped device matrices (and any in the override folder)."""
    names = {p.stem for p in shipped_matrices().glob("*.yaml")}
    over = _override_dir()
    if over is not None and over.is_dir():
        names |= {p.stem for p in over.glob("*.yaml")}
    return sorted(names)


def backend_data_path(backend: str, kind: str) -> Path:
    """`kind` = "tuning" or "profiles" of `backend`: the override file when there is one, else
    the package data beside the backend's code."""
    over = _override_dir()
    if over is not None:
        sub = "tuning" if kind == "tuning" else "devices"
        candidate = over / sub / f"{backend}.yaml"
        if candidate.is_file():
            return candidate
    return Path(str(resources.files(f"anysoftmax.backends.{backend}") / f"{kind}.yaml"))


def read_yaml_mapping(path: Path) -> dict:
    """A YAML file whose top level must be a mapping; errors name the file."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} not found (package data missing from this install?)") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return data


@lru_cache(maxsize=None)
def load_tuning(backend: str) -> dict:
    """The tuning table of `backend` as a dict (cached: read once per process)."""
    return read_yaml_mapping(backend_data_path(backend, "tuning"))


# Overrides active anywhere right now: while zero (always, outside tests and sweeps),
# `overrides_key()` is one read of this list.
active_overrides = [0]
_instances: list = []


def overrides_key() -> tuple:
    """Every active tuning override as a hashable key: memoised plans and launchers derived
    from tuning tables include it, so a `with override(...)` block gets its own."""
    if not active_overrides[0]:
        return ()
    return tuple((o.table, o.key()) for o in _instances if o.active())


class Overrides:
    """Thread-local replacements of a tuning table's values, as a context manager:
    `with overrides(max_tile_elems=64): ...` (tests lower thresholds so rare paths run)."""

    def __init__(self, table: str):
        self.table = table
        self._local = threading.local()
        _instances.append(self)

    def active(self) -> dict:
        """The values replaced in this thread now."""
        return getattr(self._local, "values", None) or {}

    def key(self) -> tuple:
        """The active overrides as a hashable key (for caches of plans derived from the table)."""
        values = getattr(self._local, "values", None)
        return tuple(sorted((k, repr(v)) for k, v in values.items())) if values else ()

    @contextmanager
    def __call__(self, **values):
        known = set(load_tuning(self.table))
        unknown = set(values) - known
        if unknown:
            raise KeyError(f"unknown {self.table} tuning key(s) {sorted(unknown)}; known: {sorted(known)}")
        old = getattr(self._local, "values", None)
        self._local.values = {**(old or {}), **values}
        active_overrides[0] += 1
        try:
            yield
        finally:
            active_overrides[0] -= 1
            self._local.values = old
