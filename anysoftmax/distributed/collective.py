"""The two collectives of the sharded softmax, over a `torch.distributed` group: a gather of
each rank's row states (forward) and a sum of one float per row (backward). Contiguous tensors
only, so gloo (CPU) and NCCL (GPU) both take them."""

from __future__ import annotations

import torch
import torch.distributed as dist


def group_rank_and_size(group, who: str) -> tuple[int, int]:
    """(this rank's index in `group`, the group's size); `group` None is the default group."""
    if not dist.is_available():
        raise RuntimeError(f"{who}: torch.distributed is not available in this torch build")
    if not dist.is_initialized():
        raise RuntimeError(f"{who}: torch.distributed is not initialised: call "
                           f"torch.distributed.init_process_group() first (group={group!r})")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"{who}: this process is not a member of group={group!r}")
    return rank, dist.get_world_size(group)


# all_gather_single replaces all_gather_into_tensor in recent torch (same arguments).
_gather_single = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)


def gather_states(state: torch.Tensor, world: int, group) -> torch.Tensor:
    """[world, K] of every rank's `state` ([K], the same K on every rank), in rank order."""
    state = state.contiguous()
    if world == 1:
        return state.unsqueeze(0)
    out = torch.empty((world, state.numel()), dtype=state.dtype, device=state.device)
    if _gather_single is not None:
        _gather_single(out.view(-1), state, group=group)
    else:  # older torch: the list form
        dist.all_gather(list(out.unbind(0)), state, group=group)
    return out


def sum_rows(t: torch.Tensor, world: int, group) -> torch.Tensor:
    """`t` summed over the ranks of `group` (in place on a contiguous copy)."""
    t = t.contiguous()
    if world > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t
