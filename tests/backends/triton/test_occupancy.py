"""The occupancy model as a pure function, with the property sets of four real GPUs."""

import pytest

from anysoftmax.backends.triton.device import is_cdna
from anysoftmax.backends.triton.occupancy import KernelResources, persistent_programs, programs_per_sm
from helpers.gpus import A100_SXM, H100_SXM, MI250X, MI300X


def seed_cuda_rule(dev, k):
    # The tutorial's CUDA rule, verbatim: NUM_REGS // (n_regs * WARP_SIZE * num_warps),
    # then the shared-memory cap.
    occ = dev.max_num_regs // (k.n_regs * dev.warp_size * k.num_warps)
    return min(occ, dev.max_shared_mem // k.shared_mem) if k.shared_mem else occ


def seed_hip_rule(dev, k):
    gprs = dev.max_num_regs * (2 if dev.is_cdna else 1)
    occ = min(gprs // dev.warp_size // k.n_regs, dev.max_threads_per_sm // dev.warp_size) // k.num_warps
    return min(occ, dev.max_shared_mem // k.shared_mem) if k.shared_mem else occ


@pytest.mark.parametrize("dev", [H100_SXM, A100_SXM], ids=["H100", "A100"])
@pytest.mark.parametrize("n_regs,smem,warps", [(32, 0, 8), (64, 1024, 8), (128, 0, 4), (255, 16384, 16),
                                               (40, 200000, 4), (96, 0, 8)])
def test_cuda_matches_seed_rule_within_thread_limit(dev, n_regs, smem, warps):
    k = KernelResources(n_regs, smem, warps)
    expected = seed_cuda_rule(dev, KernelResources(-(-n_regs // 8) * 8, smem, warps))
    expected = min(expected, dev.max_threads_per_sm // (dev.warp_size * warps))
    assert programs_per_sm(dev, k) == max(expected, 1)


def test_cuda_h100_numbers():
    # 32 regs x 32 lanes x 8 warps = 8192 regs per program: 65536 / 8192 = 8 programs,
    # and 8 x 8 warps = 64 warps = the SM's 2048 threads.
    assert programs_per_sm(H100_SXM, KernelResources(32, 0, 8)) == 8
    # 128 regs: 65536 / (128*32*8) = 2.
    assert programs_per_sm(H100_SXM, KernelResources(128, 0, 8)) == 2
    # Shared memory caps: 232448 // 100000 = 2 although registers would allow 4.
    assert programs_per_sm(H100_SXM, KernelResources(64, 100000, 8)) == 2
    assert persistent_programs(H100_SXM, KernelResources(128, 0, 8), 10**6) == 264
    assert persistent_programs(H100_SXM, KernelResources(128, 0, 8), 100) == 100


def test_registers_rounded_to_allocation_granule():
    # The bf16 column-split kernel compiled for sm_90: 84 registers, 8 warps. Allocated as 88:
    # 65536 // (88 * 32 * 8) = 2 programs (the unrounded 84 would claim 3).
    assert programs_per_sm(H100_SXM, KernelResources(84, 512, 8)) == 2
    assert seed_cuda_rule(H100_SXM, KernelResources(84, 512, 8)) == 3
    # Already a multiple of 8: unchanged.
    assert programs_per_sm(H100_SXM, KernelResources(64, 0, 8)) == 4


def test_seed_cuda_rule_overcounts_where_threads_limit():
    # 16 regs, 4 warps: the seed claims 65536 / (16*32*4) = 32 programs = 4096 threads,
    # twice what an SM holds. The model caps at 2048 / 128 = 16.
    k = KernelResources(16, 0, 4)
    assert seed_cuda_rule(H100_SXM, k) == 32
    assert programs_per_sm(H100_SXM, k) == 16


def test_a100_smem_cap():
    assert programs_per_sm(A100_SXM, KernelResources(32, 80000, 4)) == 2  # 166912 // 80000


@pytest.mark.parametrize("dev", [MI300X, MI250X], ids=["MI300X", "MI250X"])
@pytest.mark.parametrize("n_regs,smem,warps", [(32, 0, 8), (64, 1024, 4), (128, 0, 4), (256, 32768, 8), (20, 0, 2)])
def test_hip_matches_seed_rule(dev, n_regs, smem, warps):
    k = KernelResources(n_regs, smem, warps)
    assert programs_per_sm(dev, k) == max(seed_hip_rule(dev, KernelResources(-(-n_regs // 8) * 8, smem, warps)), 1)


def test_hip_cdna_doubles_registers():
    k = KernelResources(128, 0, 4)
    # CDNA: 2*65536 / 64 lanes / 128 regs = 16 waves (under the 2048/64 = 32 cap) -> 4 programs.
    assert programs_per_sm(MI300X, k) == 4
    from dataclasses import replace
    rdna_like = replace(MI300X, is_cdna=False)
    assert programs_per_sm(rdna_like, k) == 2
    # Few registers: the wave cap (2048/64 = 32 waves) binds: 32 // 8 warps = 4.
    assert programs_per_sm(MI300X, KernelResources(16, 0, 8)) == 4
    assert persistent_programs(MI300X, k, 10**6) == 304 * 4
    assert persistent_programs(MI250X, k, 10**6) == 110 * 4


def test_at_least_one_program():
    assert programs_per_sm(H100_SXM, KernelResources(255, 300000, 32)) == 1
    assert persistent_programs(H100_SXM, KernelResources(32, 0, 8), 0) == 1


@pytest.mark.parametrize("arch,cdna", [("gfx942:sramecc+:xnack-", True), ("gfx90a", True), ("gfx908", True),
                                       ("gfx1100", False), ("gfx906", False), ("", False)])
def test_is_cdna(arch, cdna):
    assert is_cdna(arch) is cdna


def test_cuda_shared_memory_per_sm_and_per_program_reserve():
    # An H100 SM holds 228 KiB of shared memory (233472 bytes) for all its programs, 1 KiB of
    # which each resident program reserves for the system (sm_80 and later); 227 KiB
    # (232448, `max_shared_mem`) is one program's limit. A pipelined split kernel with two
    # 16 KiB stages (32784 bytes compiled for sm_90, few registers) fits 6, not 232448 // 32784 = 7:
    # a cooperative grid sized by 7 is refused by the driver.
    k = KernelResources(40, 32784, 4)
    assert programs_per_sm(H100_SXM, k) == 233472 // (32784 + 1024) == 6
    # One stage of 16 KiB: 13, where the per-program limit alone gives 14.
    assert programs_per_sm(H100_SXM, KernelResources(16, 16400, 4)) == 13
    # A100: 164 KiB per SM, 1 KiB reserved per program.
    assert programs_per_sm(A100_SXM, KernelResources(40, 32784, 4)) == 167936 // (32784 + 1024) == 4
    # MI300X: 64 KiB of LDS per CU, none reserved.
    assert programs_per_sm(MI300X, KernelResources(40, 32784, 4)) == 1
    assert programs_per_sm(MI300X, KernelResources(40, 16400, 4)) == 3
