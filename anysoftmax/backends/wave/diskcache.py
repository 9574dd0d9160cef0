"""The on-disk cache of compiled kernels (.vmfb files), under `env.cache_dir()`:
``<toolchain>-k<kernel digest>/<target>/<kernel name>.vmfb``, e.g.
``wave3.9.1-iree3.9.0-k1a2b3c4d5e6/cuda-sm_80/softmax_n781_float32-float32.vmfb``. The kernel digest
hashes the sources that decide the compiled code (an edit never serves a stale kernel); a fused
kernel's name carries its steps and a digest of its key (operand layouts and dtypes included); M is
dynamic, so every row count shares a file. `python -m anysoftmax.backends.wave.aot` fills it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from functools import lru_cache
from pathlib import Path

from .env import cache_dir, toolchain_tag
from .kernel import KernelKey

# The modules whose text decides the compiled code.
_DIGEST_SOURCES = ("kernel.py", "fusion.py", "cuda_mlir.py", "compiler.py", "target.py")


@lru_cache(maxsize=None)
def kernel_digest() -> str:
    """12 hex digits of SHA-256 over the kernel-defining sources."""
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for name in _DIGEST_SOURCES:
        h.update(name.encode())
        h.update((here / name).read_bytes())
    return h.hexdigest()[:12]


def kernel_name(key: KernelKey) -> str:
    """'log_softmax_n781_float16-float32'; a fused kernel's steps and key digest appended."""
    op = "log_softmax" if key.log else "softmax"
    stem = f"{op}_n{key.n}_{key.in_dtype}-{key.out_dtype}"
    if key.spec.is_plain:
        return stem
    # repr of the key: shapes, strides, dtypes and names only, stable across processes.
    digest = hashlib.sha256(repr(key.request).encode()).hexdigest()[:12]
    return f"{stem}_{key.fusion.describe()}-r{digest}"


def vmfb_path(key: KernelKey) -> Path:
    """Where the .vmfb of `key` lives."""
    return cache_dir() / f"{toolchain_tag()}-k{kernel_digest()}" / key.target.name / f"{kernel_name(key)}.vmfb"


def load(key: KernelKey) -> bytes | None:
    """The cached .vmfb of `key`, None when absent."""
    try:
        return vmfb_path(key).read_bytes()
    except FileNotFoundError:
        return None


def store(key: KernelKey, data: bytes) -> Path:
    """Write the .vmfb of `key` atomically (a concurrent reader sees all of it or nothing)."""
    path = vmfb_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".vmfb")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def has_kernels(target_name: str) -> bool:
    """True when the cache holds any kernel for this target and toolchain (runtime-only use)."""
    folder = cache_dir() / f"{toolchain_tag()}-k{kernel_digest()}" / target_name
    return folder.is_dir() and any(folder.glob("*.vmfb"))
