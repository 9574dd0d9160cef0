"""The collectives of the sharded softmax: a gather of each rank's row states (forward) and a sum of
one float per row (backward), on contiguous tensors only, so gloo (CPU) and NCCL (GPU) take them."""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist

try:  # (a name -> its group: what torch's functional collectives resolve groups with)
    from torch._C._distributed_c10d import _resolve_process_group
except ImportError:  # pragma: no cover - a torch built without distributed
    _resolve_process_group = None


def group_object(group):
    """`group` itself, the default group for None."""
    return dist.group.WORLD if group is None else group


# group -> (this rank's index, size): fixed for a group's life, so asked of torch.distributed
# once per group object (a re-initialised default group is a new object).
_ranks: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def group_rank_and_size(group, who: str) -> tuple[int, int]:
    """(this rank's index in `group`, the group's size); `group` None is the default group."""
    try:
        return _ranks[group_object(group)]
    except (KeyError, TypeError, AttributeError):  # (new; None: uninitialised; no torch.distributed)
        pass
    if not dist.is_available():
        raise RuntimeError(f"{who}: torch.distributed is not available in this torch build")
    if not dist.is_initialized():
        raise RuntimeError(f"{who}: torch.distributed is not initialised: call "
                           f"torch.distributed.init_process_group() first (group={group!r})")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"{who}: this process is not a member of group={group!r}")
    got = rank, dist.get_world_size(group)
    _ranks[group_object(group)] = got
    return got


def group_name(group) -> str:
    """`group` as an operator argument: its name ("" for None, the default group when the call runs)."""
    return "" if group is None else group.group_name


def group_of(name: str):
    """The group `group_name` named (None: the default group)."""
    return None if name == "" else _resolve_process_group(name)


# all_gather_single replaces all_gather_into_tensor in recent torch (same arguments).
_gather_single = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)

# Groups whose backend refused the tensor form (gloo of some torch versions): they take the
# list form from then on, so the choice is made once per group, never tried again per call.
_list_form_groups: "weakref.WeakSet" = weakref.WeakSet()


def gather_states(state: torch.Tensor, world: int, group) -> torch.Tensor:
    """[world, K] of every rank's `state` ([K] on every rank), in rank order: one collective into
    one new tensor (the list form of its views where the group's backend lacks the tensor form)."""
    state = state.contiguous()
    if world == 1:
        return state.unsqueeze(0)
    out = torch.empty((world, state.numel()), dtype=state.dtype, device=state.device)
    if _gather_single is not None and group_object(group) not in _list_form_groups:
        try:
            _gather_single(out.view(-1), state, group=group)
            return out
        except (RuntimeError, NotImplementedError) as exc:  # (refused before any rank sent anything)
            if "support" not in str(exc):
                raise
            _list_form_groups.add(group_object(group))
    dist.all_gather(list(out.unbind(0)), state, group=group)
    return out


def sum_rows(t: torch.Tensor, world: int, group) -> torch.Tensor:
    """`t` summed over the ranks of `group` (in place on a contiguous copy)."""
    t = t.contiguous()
    if world > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t


# group -> {this rank's shard size: every rank's sizes} along a sharded vocabulary (`sampling`):
# exchanged on the first call of each size, then checked in each call's first collective.
_shard_sizes: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def shard_sizes(size: int, world: int, group, device: torch.device) -> tuple[int, ...]:
    """Every rank's shard size in rank order: gathered on the first call with this `size`, then remembered."""
    known = _shard_sizes.get(group_object(group)) if world > 1 else {size: (size,)}
    if known is not None and size in known:
        return known[size]
    sizes = tuple(int(s) for s in gather_states(torch.tensor([size], dtype=torch.int64, device=device), world,
                                                     group)[:, 0].tolist())
    if min(sizes) > 0:
        _shard_sizes.setdefault(group_object(group), {})[size] = sizes
    return sizes


def forget_shard_sizes(group) -> None:
    """Drop the remembered sizes (every rank does, after a call found them changed)."""
    _shard_sizes.pop(group_object(group), None)
