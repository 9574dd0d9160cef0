"""Reading a GPU's properties for the occupancy model (CUDA and HIP), and a compiled kernel's."""

from __future__ import annotations

import re
from functools import lru_cache

import torch

from .occupancy import CUDA_RESERVED_SHARED, DeviceProps, KernelResources, programs_per_sm

def is_cdna(arch: str) -> bool:
    """True for an AMD CDNA architecture name such as 'gfx942:sramecc+:xnack-' (accumulation VGPRs
    usable as general-purpose ones)."""
    return arch.split(":")[0] in ("gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950")


@lru_cache(maxsize=None)
def device_props(index: int) -> DeviceProps:
    """Properties of GPU `index`, queried once per process."""
    from triton.runtime import driver

    p = driver.active.utils.get_device_properties(index)
    tp = torch.cuda.get_device_properties(index)
    hip = torch.version.hip is not None
    arch = getattr(tp, "gcnArchName", "") if hip else ""
    return DeviceProps(name=tp.name, multiprocessor_count=p["multiprocessor_count"],
                       max_num_regs=p["max_num_regs"], max_shared_mem=p["max_shared_mem"],
                       warp_size=p.get("warpSize", tp.warp_size if hasattr(tp, "warp_size") else 32),
                       max_threads_per_sm=p.get("max_threads_per_sm", tp.max_threads_per_multi_processor),
                       is_hip=hip, is_cdna=hip and is_cdna(arch),
                       shared_mem_per_sm=getattr(tp, "shared_memory_per_multiprocessor", 0),
                       reserved_shared_per_program=CUDA_RESERVED_SHARED if not hip and tp.major >= 8 else 0)


def device_index(device: torch.device) -> int:
    """The index of a CUDA/ROCm `device` (the current one where it names none)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def sgprs(compiled) -> int:
    """Scalar registers per wave of a kernel compiled for AMD (0 elsewhere): its amdgcn `.sgpr_count`."""
    asm = getattr(compiled, "asm", None)
    text = asm.get("amdgcn", "") if isinstance(asm, dict) else ""
    m = re.search(r"^\s*\.sgpr_count:\s*(\d+)", text, re.MULTILINE)
    return int(m.group(1)) if m else 0


def compiled_programs_per_sm(kernel, index: int, *args, **kwargs) -> int:
    """Programs per SM of GPU `index` that `kernel` compiled for these arguments (constexprs and
    `num_warps` in `kwargs`) holds: compiled once with `kernel.warmup` under its first-launch lock."""
    from .._triton_common.launcher import launch_lock

    with launch_lock(kernel):
        compiled = kernel.warmup(*args, grid=(1,), **kwargs)
    compiled._init_handles()
    res = KernelResources(n_regs=compiled.n_regs, shared_mem=compiled.metadata.shared,
                          num_warps=kwargs["num_warps"], n_sgprs=sgprs(compiled))
    return programs_per_sm(device_props(index), res)
