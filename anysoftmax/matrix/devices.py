"""Finding the devices a matrix entry names on this machine (or the reason they are missing)."""

from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
import sys

import torch


def accelerator_module(kind: str):
    """`torch.cuda` / `torch.npu`, or None with no such device support in this torch."""
    if kind == "npu" and "torch_npu" not in sys.modules:
        if importlib.util.find_spec("torch_npu") is None:
            return None
        import torch_npu  # noqa: F401  (adds torch.npu)
    return getattr(torch, kind, None)


def _missing(kind: str) -> str:
    if kind == "cuda":
        return "no CUDA GPU visible (torch.cuda.is_available() is False)"
    if kind == "npu":
        if importlib.util.find_spec("torch_npu") is None:
            return "no Ascend NPU: torch_npu is not installed"
        return "no Ascend NPU visible (torch.npu.is_available() is False)"
    return f"no {kind} device"


def device_name(device: str) -> str:
    """Human name of a concrete device: 'cpu (x86_64)', 'NVIDIA H100 80GB HBM3', ..."""
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return f"cpu ({platform.machine()}, {os.cpu_count()} cores)"
    return accelerator_module(kind).get_device_name(int(index or 0))


def locate(device: str, match: tuple[str, ...] = ()) -> tuple[list[str], str]:
    """The concrete devices an entry runs on, or ([], why it is skipped).

    "cuda" means every visible GPU (cells are spread over them), "cuda:1" that GPU only.
    `match` keeps the devices whose name contains one of its strings (case-insensitive).
    """
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return ["cpu"], ""
    try:
        mod = accelerator_module(kind)
        if mod is None or not mod.is_available():
            return [], _missing(kind)
        count = mod.device_count()
    except Exception as exc:  # a broken driver stack is a reason to skip, not to crash
        return [], f"{kind} devices cannot be queried: {type(exc).__name__}: {exc}"
    indices = range(count)
    if index:
        if int(index) >= count:
            return [], f"{device} is not present: {count} {kind} device(s) visible"
        indices = [int(index)]
    found = [f"{kind}:{i}" for i in indices]
    if match:
        names = {d: device_name(d) for d in found}
        found = [d for d in found if any(m.lower() in names[d].lower() for m in match)]
        if not found:
            seen = ", ".join(sorted(set(names.values())))
            return [], f"no visible {kind} device matches {list(match)} (found: {seen})"
    return found, ""


def environment() -> dict:
    """Versions and machine facts recorded in every report."""
    import anysoftmax

    env = {
        "anysoftmax": anysoftmax.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "host": platform.node(),
        "platform": platform.platform(),
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", ""),
    }
    try:
        import triton
        env["triton"] = triton.__version__
    except Exception as exc:
        env["triton"] = f"not importable ({type(exc).__name__})"
    if torch.cuda.is_available():
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        env["hip" if torch.version.hip else "cuda"] = torch.version.hip or torch.version.cuda
    try:
        root = os.path.dirname(os.path.dirname(os.path.abspath(anysoftmax.__file__)))
        env["commit"] = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True, timeout=5).stdout.strip()
    except Exception:
        pass
    return env
