"""The Wave toolchain on this machine: which packages are installed, their versions, where
compiled kernels are cached, and how to import Wave so that it never writes to ~/.wave.

Compiling needs `wave-lang` (which brings `iree-base-compiler`); running needs only
`iree-base-runtime`, so a machine can run kernels compiled elsewhere. The `wave` extra pins the
three versions known to work together: Wave's MLIR only compiles with the IREE it pins.
"""

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
    """Root of the Wave kernel cache (not created here): ``$ANYSOFTMAX_CACHE_DIR/wave`` if set,
    else ``$XDG_CACHE_HOME/anysoftmax/wave`` (``~/.cache/anysoftmax/wave``); never Wave's ~/.wave."""
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
    except (ImportError, ValueError):  # a parent package missing or half-installed
        return False


def runtime_missing() -> str | None:
    """None when iree.runtime can be imported, else what is missing and how to install it."""
    if not _importable("iree.runtime"):
        return f"iree-base-runtime is not installed (needed to run Wave kernels): {install_hint('wave')}"
    return None


def compiler_missing() -> str | None:
    """None when Wave and the IREE compiler can be imported, else what is missing and how to install it."""
    if not _importable("wave_lang"):
        return f"wave-lang is not installed (needed to compile Wave kernels): {install_hint('wave')}"
    if not _importable("iree.compiler"):
        return f"iree-base-compiler is not installed (needed to compile Wave kernels): {install_hint('wave')}"
    return None


def require(reason: str | None) -> None:
    """Raise `BackendUnavailableError(reason)` when `reason` is not None."""
    if reason is not None:
        raise BackendUnavailableError(reason)


@lru_cache(maxsize=None)
def toolchain_tag() -> str:
    """'wave3.9.1-iree3.9.0': the versions a compiled kernel depends on (part of the cache key).

    A process with only the runtime cannot ask wave-lang for its version; it assumes the pinned
    one, so kernels compiled with the `wave` extra are found by runtime-only processes.
    """
    wave = installed_version("wave-lang") or PINS["wave-lang"]
    iree = (installed_version("iree-base-compiler") or installed_version("iree-base-runtime")
            or PINS["iree-base-compiler"])
    return f"wave{wave}-iree{iree}"


_import_lock = threading.Lock()


def import_wave() -> None:
    """Import wave_lang with its kernel cache off (compiled kernels go to anysoftmax's cache).

    Wave reads WAVE_CACHE_ON / WAVE_CACHE_DIR when it is first imported and otherwise writes
    to ~/.wave; the module flag is also cleared in case wave_lang was imported before us.
    """
    require(compiler_missing())
    with _import_lock:
        os.environ["WAVE_CACHE_ON"] = "0"
        if "WAVE_CACHE_DIR" not in os.environ:
            os.environ["WAVE_CACHE_DIR"] = str(cache_dir() / "wave-lang")
        import wave_lang.kernel.wave.cache as wave_cache

        wave_cache.WAVE_CACHE_ON = 0
