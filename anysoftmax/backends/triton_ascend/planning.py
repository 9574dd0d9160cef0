"""Grid and tile arithmetic of `triton_ascend`, pure (docs/ascend.md): a fixed number of programs
(at most 65535, never more than the work items); a tile (input, output, `acc_copies` fp32 copies)
in the unified buffer, halved by multibuffer, else online sub-blocks; at least one 32-byte vector."""

from __future__ import annotations

from ...core.layout import cdiv, next_power_of_2
from .._triton_common.plan import KernelPlan, OnlinePlan, TilePlan
from .settings import VECTOR_CORES, Settings

MAX_PROGRAMS = 65535  # "coreDim ... can't be greater than UINT16_MAX"


def floor_pow2(n: int) -> int:
    """Largest power of two <= n (0 for n < 1)."""
    return 1 << (n.bit_length() - 1) if n >= 1 else 0


def tile_budget(s: Settings) -> int:
    """UB bytes one tile may use: all of it, or half with multibuffer (two tiles in flight)."""
    return s.ub_bytes // 2 if s.multibuffer else s.ub_bytes


def element_bytes(in_bytes: int, out_bytes: int, acc_bytes: int, acc_copies: int) -> int:
    """UB bytes one tile element costs: its input, its output and its live accumulator copies."""
    return in_bytes + out_bytes + acc_copies * acc_bytes


def min_block_n(s: Settings, in_bytes: int, out_bytes: int) -> int:
    """Narrowest tile: one vector of the narrowest dtype in it (8 fp32, 16 fp16/bf16 elements)."""
    return max(1, s.vector_bytes // min(in_bytes, out_bytes))


def resolve_programs(s: Settings, device_vector_cores: int | None = None) -> int:
    """Programs before clamping: `s.grid`, or the live device's (else profile's) vector cores."""
    if s.grid != VECTOR_CORES:
        return s.grid
    if device_vector_cores is not None:
        return device_vector_cores
    if s.profile is not None and s.profile.get("vector_cores"):
        return int(s.profile["vector_cores"])
    raise ValueError(f"triton_ascend: grid={VECTOR_CORES!r} from {s.source('grid')} needs a live NPU or a "
                     f"device profile with vector_cores (set $ANYSOFTMAX_ASCEND_PROFILE); "
                     f"allowed otherwise: a positive integer")


def grid_size(programs: int, n_work: int) -> int:
    """Programs actually launched: `programs`, capped by the 16-bit limit and by the work items."""
    if programs < 1:
        raise ValueError(f"triton_ascend: grid of {programs} programs; allowed: a positive integer")
    return max(1, min(programs, MAX_PROGRAMS, n_work))


def operand_bytes(spec) -> int:
    """UB bytes per tile element the fused family's operands add: the mask's element and, with
    softcap, one more accumulator copy (tanh keeps its argument and its exponential live)."""
    v = getattr(spec, "variant", None)
    if v is None or spec.is_plain:
        return 0
    mask = 0 if v.mask is None else 1 if v.mask_kind == "bool" else v.mask.dtype.itemsize
    return mask + (0 if v.softcap is None else spec.acc_dtype.itemsize)


def plan_rows(n_rows: int, n_cols: int, programs: int, in_bytes: int, out_bytes: int, acc_bytes: int,
              s: Settings, flat_rows: bool = True, extra_bytes: int = 0) -> KernelPlan:
    """Kernel, tile and grid for `n_rows` rows of `n_cols`; `extra_bytes`: `operand_bytes`. Rows not one
    (size, stride) dim (not `flat_rows`) take one a step; ValueError when no sub-block fits the UB."""
    budget = tile_budget(s)
    narrowest = min_block_n(s, in_bytes, out_bytes)
    block_n = max(next_power_of_2(n_cols), narrowest)
    tile_elems = floor_pow2(budget // (element_bytes(in_bytes, out_bytes, acc_bytes, s.tile_acc_copies)
                                       + extra_bytes))
    if block_n <= tile_elems:
        # Several rows per step fill the tile, but never so many that some program gets no rows.
        block_m = min(tile_elems // block_n, floor_pow2(cdiv(n_rows, programs))) if flat_rows else 1
        return TilePlan(block_m, block_n, grid_size(programs, cdiv(n_rows, block_m)))
    online_bytes = element_bytes(in_bytes, out_bytes, acc_bytes, s.online_acc_copies) + extra_bytes
    sub_block = min(floor_pow2(budget // online_bytes), block_n)
    if sub_block < narrowest:
        halved = " (halved by multibuffer)" if s.multibuffer else ""
        need = narrowest * online_bytes * (2 if s.multibuffer else 1)
        raise ValueError(
            f"triton_ascend: ub_bytes={s.ub_bytes} from {s.source('ub_bytes')} leaves {budget} bytes per tile{halved}, "
            f"less than one {s.vector_bytes}-byte vector of {narrowest} elements at {online_bytes} bytes each; "
            f"allowed: ub_bytes >= {need}")
    return OnlinePlan(1, sub_block, grid_size(programs, n_rows))
