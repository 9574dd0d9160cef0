"""The Wave toolchain here (docs/wave.md): installed packages, their versions, the kernel cache's location, and
importing Wave so that it never writes to ~/.wave."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import threading
from functools import lru_cache
from pathlib import Path

from ... import config
from ...config import install_hint
from ...core.registry import BackendUnavailableError

# What `pip install 'anysoftmax[wave]'` installs (keep in step with pyproject.toml).
PINS = {"wave-lang": "3.9.1", "iree-base-compiler": "3.9.0", "iree-base-runtime": "3.9.0"}


def cache_dir() -> Path:
    """Root of the Wave kernel cache (`config.cache_dir`; not created here), never Wave's ~/.wave."""
    return config.cache_dir("wave")


def installed_version(dist: str) -> str | None:
    """Version of an installed distribution, None when it is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package half-installed
        return False


def runtime_missing() -> str | None:
    """None when iree.runtime can be imported, else what is missing and how to install it."""
    return None if _importable("iree.runtime") else \
        f"iree-base-runtime is not installed (needed to run Wave kernels): {install_hint('wave')}"


def compiler_missing() -> str | None:
    """None when Wave and the IREE compiler can be imported, else what is missing and how to install it."""
    for module, dist in (("wave_lang", "wave-lang"), ("iree.compiler", "iree-base-compiler")):
        if not _importable(module):
            return f"{dist} is not installed (needed to compile Wave kernels): {install_hint('wave')}"
    return None


@lru_cache(maxsize=None)
def toolchain_tag() -> str:
    """'wave3.9.1-iree3.9.0': the versions a compiled kernel depends on (part of the cache key); a
    runtime-only process assumes the pinned wave-lang, so it finds kernels compiled with the extra."""
    wave = installed_version("wave-lang") or PINS["wave-lang"]
    iree = (installed_version("iree-base-compiler") or installed_version("iree-base-runtime")
            or PINS["iree-base-compiler"])
    return f"wave{wave}-iree{iree}"


_import_lock = threading.Lock()


def import_wave() -> None:
    """Import wave_lang with its own kernel cache (~/.wave) off, the module flag cleared too in case
    it was imported before; BackendUnavailableError without the compiler."""
    reason = compiler_missing()
    if reason is not None:
        raise BackendUnavailableError(reason)
    with _import_lock:
        os.environ["WAVE_CACHE_ON"] = "0"
        os.environ.setdefault("WAVE_CACHE_DIR", str(cache_dir() / "wave-lang"))
        import wave_lang.kernel.wave.cache as wave_cache

        wave_cache.WAVE_CACHE_ON = 0
