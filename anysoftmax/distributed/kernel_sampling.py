"""`anysoftmax.distributed.sample(..., backend="triton")`: the Triton sampler's shard forms
(`scan_shard` on each rank, one all-gather of the workspaces' prefix, `select_shards` on every
rank) over a vocabulary sharded across a group (docs/sampling.md, "A sharded vocabulary").
The torch-ops path (`sampling.py`) serves unequal shard sizes, requests the Triton sampler
refuses, and rows the candidates cannot decide (id -2).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from ..core import registry
from ..core.backend import as_backend
from ..sampling.spec import SamplingSpec
from .collective import gather_states

KERNEL_BACKEND = "triton"
UNDECIDED = -2  # (select_shards: a row whose candidates cannot decide it needs the whole row)


class KernelDraw(NamedTuple):
    """The kernels' draw: `spec` with the seed every rank used, ids and log-probabilities [rows]."""

    spec: SamplingSpec
    ids: torch.Tensor
    logprobs: torch.Tensor


def refusal(spec: SamplingSpec, sizes: tuple[int, ...]) -> str | None:
    """Why the shard kernels cannot take `spec` over shards of `sizes` (None when they can)."""
    if len(set(sizes)) > 1:
        return f"the shard kernels need equal shard sizes, got {list(sizes)}"
    reason = registry.unavailable_reason(KERNEL_BACKEND)
    if reason is not None:
        return reason
    return as_backend(registry.get_backend(KERNEL_BACKEND)).supports_sampling(spec)


def agreed_seed(spec: SamplingSpec, world: int, group) -> SamplingSpec:
    """`spec` with its seed fixed before the scan (the scan's race keys need it): without one,
    each rank draws from its default generator (advancing it, as `sampling.sample` does) and
    every rank takes rank 0's, one small all-gather; a 0-dim seed keeps the batch's stream per row."""
    if spec.seed is not None:
        return spec
    mine = torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64, device=spec.device)
    return dataclasses.replace(spec, seed=gather_states(mine, world, group)[0, 0])


def draw(spec: SamplingSpec, logits_shard: torch.Tensor, vocab_start: int, vocab_total: int, world: int,
         group) -> KernelDraw:
    """Scan this rank's shard, all-gather the workspaces' shared prefix, select over every
    shard: ids (-1: an invalid row, `UNDECIDED`: a row needing the whole row) and their
    log-probabilities, the same on every rank. `refusal` must have said None."""
    from ..backends._triton_common import sampling as kernels

    spec = agreed_seed(spec, world, group)
    workspace, layout, plan = kernels.scan_shard(spec, logits_shard, vocab_start, vocab_total)
    gathered = gather_states(workspace[:layout.shard_words], world, group)
    ids, lp = kernels.select_shards(spec, gathered, world, vocab_total, plan, return_logprobs=True)
    return KernelDraw(spec, ids, lp)
