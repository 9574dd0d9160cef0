"""Reading a GPU's properties for the occupancy model (CUDA and HIP)."""

from __future__ import annotations

from functools import lru_cache

import torch

from .occupancy import DeviceProps

# CDNA architectures (accumulation VGPRs usable as general-purpose ones).
CDNA_ARCHS = ("gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950")


def is_cdna(arch: str) -> bool:
    """True for an AMD CDNA architecture name such as 'gfx942:sramecc+:xnack-'."""
    return arch.split(":")[0] in CDNA_ARCHS


@lru_cache(maxsize=None)
def device_props(index: int) -> DeviceProps:
    """Properties of GPU `index`, queried once per process."""
    from triton.runtime import driver

    p = driver.active.utils.get_device_properties(index)
    tp = torch.cuda.get_device_properties(index)
    hip = torch.version.hip is not None
    arch = getattr(tp, "gcnArchName", "") if hip else ""
    return DeviceProps(
        name=tp.name,
        multiprocessor_count=p["multiprocessor_count"],
        max_num_regs=p["max_num_regs"],
        max_shared_mem=p["max_shared_mem"],
        warp_size=p.get("warpSize", tp.warp_size if hasattr(tp, "warp_size") else 32),
        max_threads_per_sm=p.get("max_threads_per_sm", tp.max_threads_per_multi_processor),
        is_hip=hip,
        is_cdna=hip and is_cdna(arch),
    )
