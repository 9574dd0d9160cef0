"""Occupancy model: how many persistent programs to launch, pure (docs/kernels.md: its rules, and why the
cooperative split kernels need every program resident)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceProps:
    """What the occupancy model needs to know about a GPU."""

    name: str
    multiprocessor_count: int
    max_num_regs: int  # 32-bit registers per SM (CUDA) / general-purpose VGPR budget (HIP)
    max_shared_mem: int  # bytes of shared memory one program may use (the opt-in maximum)
    warp_size: int
    max_threads_per_sm: int
    is_hip: bool = False
    is_cdna: bool = False
    shared_mem_per_sm: int = 0  # bytes of shared memory (LDS) the SM (CU) holds; 0: max_shared_mem
    reserved_shared_per_program: int = 0  # bytes the hardware reserves per resident program


@dataclass(frozen=True)
class KernelResources:
    """What the compiled kernel uses: registers per thread, shared memory per program, warps."""

    n_regs: int
    shared_mem: int
    num_warps: int
    n_sgprs: int = 0  # CDNA scalar registers per wave, when known (0: not counted)


# Registers per thread allocated at a time (CUDA: 256 a warp; CDNA: 8 VGPRs). sm_90's bf16
# column-split kernel uses 84: unrounded, 3 programs of 8 warps an H100 SM; it holds 2 (88).
REGISTER_GRANULE = 8
# CDNA's scalar registers (SGPRs) per SIMD, a wave's rounding granule and the reserved ones (VCC,
# flat scratch, XNACK, trap), fitted to gfx942's own occupancy for the fused-family kernels
# (86-106 SGPRs: 7 waves at 86, 6 at 104-106, where VGPRs alone allow 8).
CDNA_SGPRS_PER_SIMD, CDNA_SGPR_GRANULE, CDNA_SGPR_RESERVED = 800, 16, 16


def programs_per_sm(dev: DeviceProps, k: KernelResources) -> int:
    """Resident programs one SM/CU can hold (at least 1: a launch always makes progress)."""
    n_regs = -(-max(k.n_regs, 1) // REGISTER_GRANULE) * REGISTER_GRANULE
    if dev.is_hip:
        gprs = dev.max_num_regs * (2 if dev.is_cdna else 1)  # CDNA: accumulation VGPRs serve as general ones
        max_waves = dev.max_threads_per_sm // dev.warp_size
        waves = gprs // dev.warp_size // n_regs
        if dev.is_cdna and k.n_sgprs:
            sgprs = -(-(k.n_sgprs + CDNA_SGPR_RESERVED) // CDNA_SGPR_GRANULE) * CDNA_SGPR_GRANULE
            waves = min(waves, CDNA_SGPRS_PER_SIMD // sgprs * 4)  # per SIMD -> per CU (4 SIMDs)
        occ = min(waves, max_waves) // k.num_warps
    else:
        occ = dev.max_num_regs // (n_regs * dev.warp_size * k.num_warps)
        occ = min(occ, dev.max_threads_per_sm // (dev.warp_size * k.num_warps))
    if k.shared_mem > 0:
        per_program = k.shared_mem + dev.reserved_shared_per_program
        occ = min(occ, (dev.shared_mem_per_sm or dev.max_shared_mem) // per_program)
    return max(occ, 1)


def persistent_programs(dev: DeviceProps, k: KernelResources, n_work: int) -> int:
    """Programs to launch for `n_work` independent pieces: fill every SM, never exceed the work."""
    return max(1, min(dev.multiprocessor_count * programs_per_sm(dev, k), n_work))


# CUDA's reserve per program: cudaDevAttrReservedSharedMemoryPerBlock on sm_80 and later.
CUDA_RESERVED_SHARED = 1024
