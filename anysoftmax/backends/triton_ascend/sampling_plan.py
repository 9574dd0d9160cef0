"""The sampler's plan on the NPU (`SamplingPlan` of `_triton_common/sampling.py`), pure: blocks
sized by the unified buffer (UB) one tile may use (`planning.tile_budget`; the per-element costs
below are estimates: docs/ascend.md), the NPU's fixed grid, no runs pre-pass. The same plan on
every device the backend serves, so the interpreter and CUDA runs test the NPU's launches.
"""

from __future__ import annotations

import functools

from ...core.layout import cdiv, next_power_of_2
from .._triton_common.sampling import SamplingPlan
from . import planning
from .settings import Settings

# UB bytes per chunk element of the scan: the logits (up to 4 bytes), z, its column index, and
# the float32/int32 temporaries of the chunk's sum, selection and candidate positions.
SCAN_BYTES = 32
# UB bytes per candidate of the select's [chunks, slots] block: z, its key, its weight, its id,
# the validity and selection masks, with a temporary.
SELECT_BYTES = 24
# UB bytes per element of a select loop's tile (the general path): each of the 16 cut points
# (`sampling_kernels.CUTS`) holds a comparison and a masked weight per element.
TILE_BYTES = 16 * 12
MAX_CHUNK = 4096
MAX_SELECT = 4096  # candidates the select holds: chunks (to a power of two) x slots
# Slots per chunk: the select's top-k ranking compares every pair of up to `slots` candidates
# ([slots, slots] in the UB), so 64 at most; at least 16 (top-k bounds up to 8 from candidates).
MIN_SLOTS, MAX_SLOTS = 16, 64
MIN_TILE = 64


@functools.lru_cache(maxsize=1024)
def sampling_plan(rows: int, vocab: int, programs: int, budget: int) -> SamplingPlan:
    """The plan for `rows` rows of `vocab` logits on `programs` programs with `budget` UB bytes a
    tile (memoised: a request's launchers are keyed by their plan)."""
    chunk = max(16, min(MAX_CHUNK, next_power_of_2(vocab), planning.floor_pow2(budget // SCAN_BYTES)))
    groups = next_power_of_2(cdiv(vocab, chunk))
    select = min(MAX_SELECT, planning.floor_pow2(budget // SELECT_BYTES))
    slots = min(MAX_SLOTS, max(MIN_SLOTS, planning.floor_pow2(max(1, select // groups))))
    tile = max(MIN_TILE, min(1024, planning.floor_pow2(budget // TILE_BYTES)))
    items = max(1, rows * cdiv(vocab, chunk))
    # runs=False: the runs pre-pass needs tl.atomic_add and tl.sort, not verified on the NPU.
    return SamplingPlan(chunk=chunk, slots=slots, grid=planning.grid_size(programs, items), num_warps=4,
                        select_warps=4, tile=tile, runs=False)


def plan_for(rows: int, vocab: int, s: Settings, programs: int) -> SamplingPlan:
    """`sampling_plan` under settings `s` (its UB budget) on `programs` programs."""
    return sampling_plan(rows, vocab, programs, planning.tile_budget(s))
