"""Settings of the `triton_ascend` backend, lowest precedence first: `tuning.yaml`, a device profile of
`profiles.yaml`, `override(...)`, the environment (docs/environment.md). Every value is checked when read; an
error names the setting, where its value came from and what is allowed."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from ...config import Overrides, backend_data_path, is_int, load_tuning, read_yaml_mapping

ENV_GRID = "ANYSOFTMAX_ASCEND_GRID"
ENV_UB_BYTES = "ANYSOFTMAX_ASCEND_UB_BYTES"
ENV_PROFILE = "ANYSOFTMAX_ASCEND_PROFILE"
VECTOR_CORES = "vector_cores"  # grid value: one program per vector core
TUNING = "anysoftmax/backends/triton_ascend/tuning.yaml"
DEVICES = "anysoftmax/backends/triton_ascend/profiles.yaml"


@dataclass(frozen=True)
class Settings:
    """The resolved settings; `sources` says where each value came from (for error messages)."""

    grid: int | str  # a positive int, or VECTOR_CORES
    ub_bytes: int
    multibuffer: bool
    vector_bytes: int
    tile_acc_copies: int
    online_acc_copies: int
    profile: dict | None  # the selected device profile, its key under "name"
    sources: Mapping[str, str]

    def source(self, key: str) -> str:
        return self.sources.get(key, TUNING)


@lru_cache(maxsize=None)
def load_profiles() -> dict:
    """Device profiles of `profiles.yaml`, by name (read once)."""
    path = backend_data_path("triton_ascend", "profiles")
    profiles = read_yaml_mapping(path).get("profiles")
    if not isinstance(profiles, dict):
        raise ValueError(f"{path}: expected a `profiles:` mapping of profile name -> settings")
    return {str(name): dict(p) for name, p in profiles.items()}


# Temporarily replace settings (this thread only), e.g. `override(ub_bytes=1024)`.
override = Overrides("triton_ascend")


def current() -> Settings:
    """The settings in force now (table, profile, overrides and environment)."""
    return resolve(load_tuning("triton_ascend"), override.active(), os.environ, load_profiles())


def _env_value(text: str) -> int | str:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return text  # validated (and refused unless allowed) below


def resolve(table: Mapping, overrides: Mapping, env: Mapping[str, str], profiles: Mapping) -> Settings:
    """Combine the sources in precedence order and validate the result (pure; ValueError)."""
    values: dict = {}
    sources: dict[str, str] = {}

    def put(key, value, source):
        values[key] = value
        sources[key] = source

    for key, value in table.items():
        put(key, value, f"`{key}` in {TUNING}")
    if "profile" in overrides:
        put("profile", overrides["profile"], "override(profile=...)")
    if env.get(ENV_PROFILE, "").strip():
        put("profile", env[ENV_PROFILE].strip(), f"${ENV_PROFILE}")
    profile = None
    if values.get("profile") is not None:
        name = str(values["profile"])
        if name not in profiles:
            raise ValueError(f"triton_ascend: profile={name!r} from {sources['profile']} is not a device profile; "
                             f"allowed: {', '.join(sorted(profiles))} (the keys of {DEVICES}) or null")
        profile = {"name": name, **profiles[name]}
        for key in ("grid", "ub_bytes"):
            if key in profile:
                put(key, profile[key], f"device profile {name!r} in {DEVICES}")
    for key, value in overrides.items():
        put(key, value, f"override({key}=...)")
    for key, name in (("grid", ENV_GRID), ("ub_bytes", ENV_UB_BYTES)):
        if env.get(name, "").strip():
            put(key, _env_value(env[name]), f"${name}")
    return _validated(values, sources, profile)


def _require(ok: bool, key: str, values: Mapping, sources: Mapping, allowed: str) -> None:
    if not ok:
        raise ValueError(f"triton_ascend: {key}={values.get(key)!r} from {sources.get(key, TUNING)} is not allowed; "
                         f"allowed: {allowed}")


def _validated(values: dict, sources: dict, profile: dict | None) -> Settings:
    grid, vb, ub = values.get("grid"), values.get("vector_bytes"), values.get("ub_bytes")
    _require((is_int(grid) and grid >= 1) or grid == VECTOR_CORES, "grid", values, sources,
             f"a positive integer (launches are capped at 65535 programs and at the work items) or {VECTOR_CORES!r}")
    _require(is_int(vb) and vb >= 1 and vb & (vb - 1) == 0, "vector_bytes", values, sources,
             "a positive power of two (32 on Atlas A2)")
    _require(is_int(ub) and ub >= vb, "ub_bytes", values, sources,
             f"an integer >= vector_bytes ({vb}): the unified buffer must hold at least one vector")
    _require(isinstance(values.get("multibuffer"), bool), "multibuffer", values, sources, "true or false")
    copies = values.get("acc_copies")
    _require(isinstance(copies, dict) and all(is_int(copies.get(k)) and copies[k] >= 1 for k in ("tile", "online")),
             "acc_copies", values, sources, "a mapping {tile: int >= 1, online: int >= 1}")
    return Settings(grid=grid, ub_bytes=ub, multibuffer=values["multibuffer"], vector_bytes=vb,
                    tile_acc_copies=copies["tile"], online_acc_copies=copies["online"], profile=profile,
                    sources=dict(sources))
