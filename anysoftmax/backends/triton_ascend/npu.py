"""Host glue for Ascend NPUs: finding triton-ascend, CANN and torch_npu, the device and its cores.
torch_npu is imported only once triton-ascend and CANN were found: without CANN its import breaks
(its `torch.backends` entry point breaks `import torch` unless TORCH_DEVICE_BACKEND_AUTOLOAD=0).
triton-ascend launches on the current NPU: `device_guard` makes the tensor's device current."""

from __future__ import annotations

import importlib
import importlib.util
import os
import warnings
from functools import lru_cache

import torch

from . import install

ENV_ON_CUDA = "ANYSOFTMAX_ASCEND_ON_CUDA"


def crosscheck_on_cuda() -> bool:
    """True when $ANYSOFTMAX_ASCEND_ON_CUDA=1: the NPU launch is cross-checked on CUDA tensors."""
    return os.environ.get(ENV_ON_CUDA, "").strip() == "1"


def _triton_is_ascend() -> bool:
    # triton-ascend installs as `triton` with triton/backends/ascend (older: huawei). Located
    # without importing it: the interpreter is decided before `triton` is imported.
    spec = importlib.util.find_spec("triton")
    root = os.path.dirname(spec.origin) if spec is not None and spec.origin else None
    return root is not None and any(os.path.isdir(os.path.join(root, "backends", name))
                                    for name in ("ascend", "huawei"))


@lru_cache(maxsize=1)
def missing_reason() -> str | None:
    """Why Ascend NPUs cannot be used here, or None (checked once per process)."""
    missing = []
    problem = install.triton_problem()
    if problem is None and not _triton_is_ascend():
        problem = f"the `triton` package has no Ascend backend (triton/backends/ascend); reinstall: {install.FIX}"
    if problem is not None:
        missing.append(problem)
    home = os.environ.get("ASCEND_HOME_PATH", "")
    if not home or not os.path.isdir(home):
        missing.append("CANN not found ($ASCEND_HOME_PATH is not set to the toolkit: "
                       "install CANN and source its set_env.sh)")
    if importlib.util.find_spec("torch_npu") is None:
        missing.append("torch_npu is not installed")
    if missing:
        return "; ".join(missing) + f"; {install.INSTALL_ORDER}"
    try:
        import_torch_npu()
    except Exception as exc:  # a broken CANN/torch_npu install raises many kinds of errors
        return f"import torch_npu failed: {type(exc).__name__}: {exc}; {install.INSTALL_ORDER}"
    if not torch.npu.is_available():
        return "torch_npu is installed but no NPU is visible (torch.npu.is_available() is False)"
    note = install.version_note(install.installed_versions([install.DIST, "torch-npu"]))
    if note is not None:
        warnings.warn(f"triton_ascend: {note}; other versions are allowed but untested", stacklevel=2)
    return None


def import_torch_npu():
    """Import torch_npu (registers the `npu` device and `torch.npu`) and return it."""
    return importlib.import_module("torch_npu")


def device_index(device: torch.device) -> int:
    """The NPU index of `device` (the current NPU for a bare 'npu')."""
    import_torch_npu()
    return device.index if device.index is not None else torch.npu.current_device()


@lru_cache(maxsize=None)
def vector_cores(index: int) -> int:
    """Vector cores of NPU `index`, as triton-ascend reports them (queried once per device)."""
    from triton.runtime import driver

    props = driver.active.utils.get_device_properties(index)
    count = int(props.get("num_vectorcore", 0))
    if count < 1:
        raise RuntimeError(f"triton-ascend reported no vector cores for NPU {index}: {props}")
    return count


def device_guard(device: torch.device):
    """Context making `device` current for a launch (CUDA and CPU: `_triton_common.launcher.device_guard`)."""
    if device.type == "npu":
        import_torch_npu()
        return torch.npu.device(device)
    from .._triton_common.launcher import device_guard as launch_guard

    return launch_guard(device)
