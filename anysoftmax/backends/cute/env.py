"""The CuTe DSL toolchain and the GPU here (docs/cute.md), and importing the DSL so that it compiles for that
GPU, or for sm_90a where there is none (CI)."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from functools import lru_cache

from ...config import install_hint

ARCH_ENV = "CUTE_DSL_ARCH"
DUMP_ENV = "CUTE_DSL_DUMP_DIR"
# The architecture compiled for when no GPU is visible (CI): Hopper's, with its `a` features.
DEFAULT_ARCH = "sm_90a"
MIN_CAPABILITY = (9, 0)


def _importable(module: str) -> bool:
    """True when `module` can be found without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def dsl_missing(check_import: bool = True) -> str | None:
    """None when the CuTe DSL is installed (and, with `check_import`, imports), else what is missing
    and how to install it."""
    if not _importable("cutlass"):
        return f"nvidia-cutlass-dsl is not installed ({install_hint('cute')})"
    if check_import:
        try:
            import_dsl()
        except Exception as exc:  # a broken install: reported as the reason, never raised from a probe
            return f"nvidia-cutlass-dsl does not import: {type(exc).__name__}: {exc} ({install_hint('cute')})"
    return None


def tvm_ffi_available() -> bool:
    """True when the TVM-FFI calling convention can be used (apache-tvm-ffi importable)."""
    return _importable("tvm_ffi")


@lru_cache(maxsize=None)
def gpu(index: int) -> tuple[str, tuple[int, int]]:
    """GPU `index`'s name and compute capability (queried once per process)."""
    import torch

    p = torch.cuda.get_device_properties(index)
    return p.name, (p.major, p.minor)


def _sm(capability: tuple[int, int]) -> str:
    return f"sm_{capability[0]}{capability[1]}"


def device_missing() -> str | None:
    """None when an sm_90+ NVIDIA GPU is visible, else why not."""
    import torch

    if not torch.cuda.is_available():
        return "needs an NVIDIA GPU of compute capability 9.0 or newer (sm_90+); none is visible " \
               "(torch.cuda.is_available() is False)"
    if torch.version.hip is not None:
        return "needs an NVIDIA GPU (sm_90+); this is a ROCm build of torch"
    found = [gpu(i) for i in range(torch.cuda.device_count())]
    if not any(capability >= MIN_CAPABILITY for _, capability in found):
        names = ", ".join(f"{name} ({_sm(capability)})" for name, capability in found)
        return f"needs an sm_90+ GPU (thread-block clusters); this machine has {names}"
    return None


def capable(device) -> str | None:
    """None when CUDA device `device` (a torch.device) can run the kernels, else why not."""
    import torch

    if not torch.cuda.is_available():
        return device_missing()
    index = device.index if device.index is not None else torch.cuda.current_device()
    name, capability = gpu(index)
    if capability < MIN_CAPABILITY:
        return f"GPU {index} ({name}) is {_sm(capability)}; the cute kernels need sm_90+"
    return None


@lru_cache(maxsize=None)
def import_dsl():
    """Import `cutlass.cute` (once) and return it, $CUTE_DSL_ARCH set first unless the user set it
    (this GPU's, with its `a` features, or sm_90a: without a GPU the DSL cannot detect one)."""
    if ARCH_ENV not in os.environ:
        os.environ[ARCH_ENV] = _detected_arch()
    # Kept PTX/cubin files (compile_kernel(keep=True)) go to a scratch folder, not the working directory.
    if DUMP_ENV not in os.environ:  # (the DSL needs the folder to exist)
        os.environ[DUMP_ENV] = os.path.join(tempfile.gettempdir(), f"anysoftmax-cute-{os.getpid()}")
        os.makedirs(os.environ[DUMP_ENV], exist_ok=True)
    import cutlass.cute as cute

    return cute


def _detected_arch() -> str:
    import torch

    if torch.cuda.is_available() and torch.version.hip is None:
        capability = gpu(torch.cuda.current_device())[1]
        if capability >= MIN_CAPABILITY:
            return _sm(capability) + "a"
    return DEFAULT_ARCH


def compile_arch() -> str:
    """The architecture kernels are compiled for in this process ($CUTE_DSL_ARCH once imported)."""
    import_dsl()
    return os.environ.get(ARCH_ENV, DEFAULT_ARCH)
