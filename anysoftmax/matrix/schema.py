"""Reading and validating a device-matrix YAML file (`configs/*.yaml`) before anything runs.

A matrix file lists device entries; each entry is a device plus the cells to run on it. The
axis keys (`backends`, `shapes`, `dtypes`, `dims`, `ops`, `directions`, `variants`, `checks`,
`benchmark`) may stand at the top level, as the default of every entry, or inside an entry, for that entry
only. Every unknown key, unknown name or bad number is an error that names the file, the key
path and what is allowed; all errors of a file are reported together. Nothing is skipped
silently: a typo is an error, never a smaller matrix.

Shapes come in three forms::

    shapes:
      - [4096, 781]                              # one explicit shape (any rank)
      - {shape: [2, 3, 5], dims: [0, 1, 2]}      # explicit, with its own dims
      - {M: 4, N: {start: 256, stop: 12672, step: 128}}   # sweep of 2-D (M, N) shapes

In a sweep, `M` and `N` are each a size, a list of sizes, or a range: `{start, stop, step}`
(arithmetic) or `{start, stop, mul}` (geometric); `stop` is inclusive, so the example is the
Triton tutorial's N = 128·i for i = 2..99.

`variants` (default `[plain]`) names members of the fused family: presets or mappings, see
`matrix.variants` (and there, what happens when a variant cannot apply to a shape).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..config import is_int
from ..core.spec import DTYPE_NAMES, dtype_name, parse_dtype
from .resources import check_labels, check_resources
from .variants import PLAIN, VariantSpec, applies, check_variants

# logsumexp and merge_states: forward, plain cells (`matrix.lse_merge_cells`; a merge_states
# cell's shape is [K, ..., D]).
OPS = ("softmax", "log_softmax", "logsumexp", "merge_states")
DIRECTIONS = ("forward", "backward")
CHECKS = ("conformance", "benchmark")
DEVICE_TYPES = ("cpu", "cuda", "npu")
AXIS_KEYS = ("backends", "shapes", "dtypes", "dims", "ops", "directions", "variants", "checks", "benchmark")
TOP_KEYS = ("name", "description", "seed", "plugins", "ray", "devices") + AXIS_KEYS
ENTRY_KEYS = ("name", "device", "match", "properties", "resources", "labels") + AXIS_KEYS
BENCH_KEYS = ("warmup_ms", "rep_ms", "cpu")
RANGE_KEYS = ("start", "stop", "step", "mul")
MAX_SWEEP = 10_000  # values in one range: more is almost surely a typo (step 1 for 128)

# Axis defaults when neither the top level nor the entry sets the key (backends and shapes
# have none: a matrix must say what it runs).
DEFAULTS = {"dtypes": ["float32"], "dims": [-1], "ops": ["softmax"], "directions": ["forward"],
            "variants": ["plain"], "checks": ["conformance"], "benchmark": {}}


class ConfigError(ValueError):
    """A matrix file is invalid; `errors` holds one line per problem."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


@dataclass(frozen=True)
class ShapeCase:
    """One shape and the dims to reduce over it."""

    shape: tuple[int, ...]
    dims: tuple[int, ...]


@dataclass(frozen=True)
class BenchSettings:
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    cpu: bool = False  # time CPU cells too (wall clock; says nothing about a GPU kernel)


@dataclass(frozen=True)
class DeviceEntry:
    """A device and the cells to run on it."""

    name: str
    device: str  # torch device string: "cpu", "cuda" (every visible GPU), "cuda:1", "npu:0"
    match: tuple[str, ...]  # device-name substrings, one of which must match ("" = any)
    properties: dict
    backends: tuple[str, ...]
    shapes: tuple[ShapeCase, ...]
    dtypes: tuple[str, ...]
    ops: tuple[str, ...]
    directions: tuple[str, ...]
    checks: tuple[str, ...]
    benchmark: BenchSettings
    # Ray only (`--ray`): extra resources / node labels the entry's worker needs (pins hosts).
    resources: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    variants: tuple[VariantSpec, ...] = (PLAIN,)


@dataclass(frozen=True)
class MatrixConfig:
    name: str
    path: str
    seed: int
    plugins: tuple[str, ...]
    devices: tuple[DeviceEntry, ...]
    description: str = ""
    ray: str | None = None  # where to run: None (local workers), "auto" or a Ray address


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class _Checker:
    """Collects errors as '<file>: <key path>: <problem>'."""

    def __init__(self, path: str):
        self.path = path
        self.errors: list[str] = []

    def error(self, where: str, msg: str) -> None:
        self.errors.append(f"{self.path}: {where}: {msg}")

    def keys(self, where: str, mapping: dict, allowed: tuple[str, ...]) -> None:
        for k in mapping:
            if k not in allowed:
                self.error(f"{where}.{k}" if where else str(k),
                           f"unknown key {k!r}; allowed: {', '.join(allowed)}")

    def distinct(self, where: str, value, empty: str, item, twice) -> tuple:
        """A non-empty list of distinct items: `item(where_i, v)` checks one (None after it
        reported an error) and returns its canonical form; `twice(v)` names a repeat."""
        if not isinstance(value, list) or not value:
            self.error(where, empty)
            return ()
        out = []
        for i, v in enumerate(value):
            name = item(f"{where}[{i}]", v)
            if name is None:
                continue
            if name in out:
                self.error(f"{where}[{i}]", f"{twice(v)} is listed twice")
            else:
                out.append(name)
        return tuple(out)

    def choices(self, where: str, value, allowed: tuple[str, ...], normalise=None) -> tuple:
        """A non-empty list of distinct names, each one of `allowed`."""
        def item(w, v):
            if not isinstance(v, str) or v not in allowed:
                self.error(w, f"unknown value {v!r}; allowed: {', '.join(allowed)}")
                return None
            return normalise(v) if normalise else v
        return self.distinct(where, value, f"expected a non-empty list; allowed values: {', '.join(allowed)}",
                             item, repr)

    def size(self, where: str, v) -> int | None:
        if not is_int(v) or v < 0:
            self.error(where, f"a size must be a non-negative integer, got {v!r}")
            return None
        return v

    def sizes(self, where: str, v) -> list[int]:
        """A size, a list of sizes, or a range mapping."""
        if isinstance(v, list):
            return [s for i, s in enumerate(v) if self.size(f"{where}[{i}]", s) is not None]
        if isinstance(v, dict):
            return self.range(where, v)
        s = self.size(where, v)
        return [] if s is None else [s]

    def range(self, where: str, r: dict) -> list[int]:
        self.keys(where, r, RANGE_KEYS)
        start, stop = r.get("start"), r.get("stop")
        for key in ("start", "stop"):
            if key not in r:
                self.error(f"{where}", f"a range needs `{key}` (keys: start, stop, and step or mul)")
            else:
                self.size(f"{where}.{key}", r[key])
        if ("step" in r) == ("mul" in r):
            self.error(where, "a range needs exactly one of `step` (arithmetic) or `mul` (geometric)")
            return []
        if "step" in r and (not is_int(r["step"]) or r["step"] <= 0):
            self.error(f"{where}.step", f"step must be a positive integer, got {r['step']!r}")
            return []
        if "mul" in r and (not _is_number(r["mul"]) or r["mul"] <= 1):
            self.error(f"{where}.mul", f"mul must be a number greater than 1, got {r['mul']!r}")
            return []
        if not (is_int(start) and is_int(stop) and 0 <= start and 0 <= stop):
            return []
        if stop < start:
            self.error(where, f"stop ({stop}) is below start ({start})")
            return []
        if "mul" in r and start == 0:
            self.error(f"{where}.start", "a geometric range (mul) needs start >= 1")
            return []
        values, v = [], start
        while v <= stop:
            values.append(int(v))
            if len(values) > MAX_SWEEP:
                self.error(where, f"range gives more than {MAX_SWEEP} values; check step/mul")
                return []
            v = v + r["step"] if "step" in r else max(int(v * r["mul"]), int(v) + 1)
        return values

    def dims(self, where: str, v) -> tuple[int, ...]:
        def item(w, d):
            if not is_int(d):
                self.error(w, f"a dim must be an integer, got {d!r}")
                return None
            return d
        return self.distinct(where, v, "expected a non-empty list of integers (e.g. [-1])", item, lambda d: f"dim {d}")


def _check_dims_fit(c: _Checker, where: str, shape: tuple[int, ...], dims: tuple[int, ...], dims_where: str):
    ndim = len(shape)
    lo, hi = (-1, 0) if ndim == 0 else (-ndim, ndim - 1)
    for d in dims:
        if not lo <= d <= hi:
            c.error(dims_where, f"dim {d} is out of range for shape {list(shape)} at {where} "
                                f"(allowed: {lo}..{hi})")


def _shapes(c: _Checker, where: str, value, dims: tuple[int, ...], dims_where: str) -> tuple[ShapeCase, ...]:
    if not isinstance(value, list) or not value:
        c.error(where, "expected a non-empty list of shapes: [M, N], {shape: [...], dims: [...]} "
                       "or {M: ..., N: ...} sweeps")
        return ()
    cases: list[ShapeCase] = []
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        own_dims, own_where = dims, dims_where
        if isinstance(item, dict) and "dims" in item:
            own_dims, own_where = c.dims(f"{at}.dims", item["dims"]), f"{at}.dims"
        if isinstance(item, list):
            sizes = [c.size(f"{at}[{j}]", s) for j, s in enumerate(item)]
            shapes = [] if None in sizes else [tuple(sizes)]
        elif isinstance(item, dict) and "shape" in item:
            c.keys(at, item, ("shape", "dims"))
            raw = item["shape"]
            if not isinstance(raw, list):
                c.error(f"{at}.shape", f"expected a list of sizes, got {raw!r}")
                continue
            sizes = [c.size(f"{at}.shape[{j}]", s) for j, s in enumerate(raw)]
            shapes = [] if None in sizes else [tuple(sizes)]
        elif isinstance(item, dict):
            c.keys(at, item, ("M", "N", "dims"))
            if "M" not in item or "N" not in item:
                c.error(at, "a sweep needs both `M` (rows) and `N` (the reduced length); "
                            "or write {shape: [...]} for an explicit shape")
                continue
            ms, ns = c.sizes(f"{at}.M", item["M"]), c.sizes(f"{at}.N", item["N"])
            shapes = [(m, n) for m in ms for n in ns]
        else:
            c.error(at, f"expected a list of sizes or a mapping, got {item!r}")
            continue
        for s in shapes:
            _check_dims_fit(c, at, s, own_dims, own_where)
            cases.append(ShapeCase(s, own_dims))
    return tuple(cases)


def _bench(c: _Checker, where: str, value) -> BenchSettings:
    if not isinstance(value, dict):
        c.error(where, f"expected a mapping with keys {', '.join(BENCH_KEYS)}")
        return BenchSettings()
    c.keys(where, value, BENCH_KEYS)
    for key in ("warmup_ms", "rep_ms"):
        if key in value and (not _is_number(value[key]) or value[key] <= 0):
            c.error(f"{where}.{key}", f"must be a positive number of milliseconds, got {value[key]!r}")
    if "cpu" in value and not isinstance(value["cpu"], bool):
        c.error(f"{where}.cpu", f"must be true or false, got {value['cpu']!r}")
    ok = {k: v for k, v in value.items() if k in BENCH_KEYS}
    try:
        return BenchSettings(**ok)
    except TypeError:
        return BenchSettings()


def _device_string(c: _Checker, where: str, value) -> str:
    if not isinstance(value, str):
        c.error(where, f"expected a torch device string such as 'cpu', 'cuda', 'cuda:1', 'npu:0'; got {value!r}")
        return ""
    kind, _, index = value.partition(":")
    if kind not in DEVICE_TYPES:
        c.error(where, f"unknown device type {kind!r}; allowed: {', '.join(DEVICE_TYPES)} "
                       f"(optionally with ':index')")
    elif index and not index.isdigit():
        c.error(where, f"device index must be a non-negative integer, got {index!r}")
    elif kind == "cpu" and index:
        c.error(where, "the cpu device takes no index")
    return value


def _entry(c: _Checker, i: int, raw, top: dict, backend_names: tuple[str, ...], seen: set) -> DeviceEntry | None:
    at = f"devices[{i}]"
    if not isinstance(raw, dict):
        c.error(at, f"expected a mapping with keys {', '.join(ENTRY_KEYS)}")
        return None
    c.keys(at, raw, ENTRY_KEYS)
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        c.error(f"{at}.name", "every device entry needs a non-empty `name`")
    elif name in seen:
        c.error(f"{at}.name", f"duplicate entry name {name!r}")
    seen.add(name)
    if "device" not in raw:
        c.error(at, "missing `device` (a torch device string: cpu, cuda, cuda:N, npu:N)")
    device = _device_string(c, f"{at}.device", raw.get("device", "cpu"))
    match = raw.get("match", [])
    match = [match] if isinstance(match, str) else match
    if not isinstance(match, list) or not all(isinstance(m, str) and m for m in match):
        c.error(f"{at}.match", "expected a device-name substring or a list of them")
        match = []
    props = raw.get("properties", {})
    if not isinstance(props, dict) or not all(
            isinstance(k, str) and (isinstance(v, (str, bool)) or _is_number(v)) for k, v in props.items()):
        c.error(f"{at}.properties", "expected a mapping of names to numbers, strings or booleans")
        props = {}
    resources = check_resources(c, f"{at}.resources", raw.get("resources", {}))
    labels = check_labels(c, f"{at}.labels", raw.get("labels", {}))

    def axis(key):
        # The entry's own value wins, then the top level, then the default.
        if key in raw:
            return raw[key], f"{at}.{key}"
        if key in top:
            return top[key], key
        if key in DEFAULTS:
            return DEFAULTS[key], f"{key} (default)"
        c.error(at, f"no `{key}`: set it at the top level or in this entry")
        return None, key

    (backends, b_at), (dtypes, d_at) = axis("backends"), axis("dtypes")
    (dims, dims_at), (shapes, s_at) = axis("dims"), axis("shapes")
    (ops, o_at), (directions, r_at), (checks, k_at), (bench, bench_at) = (
        axis("ops"), axis("directions"), axis("checks"), axis("benchmark"))
    dims_t = c.dims(dims_at, dims) if dims is not None else ()
    (variants, v_at) = axis("variants")
    variants_t = check_variants(c, v_at, variants)
    checks_t = c.choices(k_at, checks, CHECKS) if checks is not None else ()
    if checks_t and "conformance" not in checks_t:
        c.error(k_at, "checks must include conformance: a speed is only reported for a result "
                      "proven right (allowed: [conformance] or [conformance, benchmark])")
    shapes_t = _shapes(c, s_at, shapes, dims_t, dims_at) if shapes is not None else ()
    _check_variants_apply(c, v_at, variants_t, shapes_t, at)
    return DeviceEntry(
        name=name if isinstance(name, str) else "", device=device, match=tuple(match), properties=dict(props),
        backends=c.choices(b_at, backends, provider_names(backend_names)) if backends is not None else (),
        shapes=shapes_t,
        dtypes=c.choices(d_at, dtypes, tuple(DTYPE_NAMES), lambda s: dtype_name(parse_dtype(s))),
        ops=c.choices(o_at, ops, OPS), directions=c.choices(r_at, directions, DIRECTIONS),
        checks=checks_t, benchmark=_bench(c, bench_at, bench), resources=resources, labels=labels,
        variants=variants_t,
    )


def _check_variants_apply(c: _Checker, where: str, variants: tuple[VariantSpec, ...], shapes: tuple[ShapeCase, ...],
                          entry_at: str) -> None:
    """A variant that applies to none of the entry's (shape, dim) is an error (one that misses
    some is not: those cells are skipped with the reason)."""
    pairs = [(case.shape, d) for case in shapes for d in case.dims]
    for v in variants:
        reasons = [applies(v, shape, d) for shape, d in pairs]
        if pairs and all(reasons):
            c.error(where, f"variant {v.name!r} applies to no shape of {entry_at}; e.g. {reasons[0]}")


def provider_names(backend_names: tuple[str, ...]) -> tuple[str, ...]:
    """What `backends:` may name: the registered backends, `auto` (anysoftmax's automatic
    choice) and the peers (`peer:torch`, ...; see `matrix.providers`)."""
    from .providers import AUTO, PEER_NAMES

    return tuple(backend_names) + (AUTO,) + PEER_NAMES


def import_plugins(plugins) -> None:
    """Import the modules named in a matrix's `plugins` (they register extra backends)."""
    for module in plugins:
        importlib.import_module(module)


def validate(data, path: str = "<config>", backend_names: tuple[str, ...] | None = None) -> MatrixConfig:
    """Check parsed YAML `data` and return the `MatrixConfig`; `ConfigError` lists every problem.

    Backend names are checked against the registry (after importing the file's `plugins`),
    unless `backend_names` is given.
    """
    c = _Checker(path)
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: top level: expected a mapping with keys {', '.join(TOP_KEYS)}"])
    c.keys("", data, TOP_KEYS)
    plugins = data.get("plugins", [])
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        c.error("plugins", "expected a list of importable module names")
        plugins = []
    for i, module in enumerate(plugins):
        try:
            importlib.import_module(module)
        except Exception as exc:  # a broken plugin is a config error, reported with the rest
            c.error(f"plugins[{i}]", f"cannot import {module!r}: {type(exc).__name__}: {exc}")
    if backend_names is None:
        from ..core.registry import registered
        backend_names = tuple(registered())
    seed = data.get("seed", 0)
    if not is_int(seed):
        c.error("seed", f"expected an integer, got {seed!r}")
        seed = 0
    name = data.get("name", Path(path).stem)
    if not isinstance(name, str) or not name or "/" in name:
        c.error("name", f"expected a non-empty name without '/', got {name!r}")
        name = Path(path).stem
    ray = data.get("ray")
    if ray is not None and (not isinstance(ray, str) or not ray):
        c.error("ray", f"expected 'auto', 'local' or a Ray address such as '10.0.0.1:6379', got {ray!r}")
        ray = None
    devices = data.get("devices")
    entries: list[DeviceEntry] = []
    if not isinstance(devices, list) or not devices:
        c.error("devices", "expected a non-empty list of device entries (name, device, ...)")
    else:
        seen: set = set()
        for i, raw in enumerate(devices):
            e = _entry(c, i, raw, data, backend_names, seen)
            if e is not None:
                entries.append(e)
    if c.errors:  # top-level values are checked once per entry that inherits them: report once
        raise ConfigError(list(dict.fromkeys(c.errors)))
    return MatrixConfig(name=name, path=path, seed=seed, plugins=tuple(plugins), devices=tuple(entries),
                        description=str(data.get("description", "")), ray=ray)


def load_config(path: str | Path, backend_names: tuple[str, ...] | None = None) -> MatrixConfig:
    """Parse and validate the matrix file at `path` (PyYAML `safe_load`)."""
    path = str(path)
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError([f"{path}: file not found"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {exc}"]) from None
    return validate(data, path, backend_names)
