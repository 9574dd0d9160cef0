"""Row states of a softmax whose dim is sharded across ranks: each rank's log-sum-exp per row
(with a bool mask, whether it kept anything), gathered in one collective and merged on every rank
into the global lse and `rest`, the log of everything outside this shard (other ranks, sinks): a
local fused softmax with `rest` as its sink *is* this rank's shard. `rest` is a log-sum-exp of
the other ranks' states, never exp(G) − exp(lse_local): no cancellation.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import dispatch
from ..torchop.lse_merge import logsumexp
from .collective import gather_states

# Row lengths travel as two floats (n >> 20, n & (2**20 - 1)): exact in float32 up to 2**44.
_SPLIT = 2**20


def _local_lse(x: torch.Tensor, mask, c) -> torch.Tensor:
    """This shard's logsumexp (keepdim) without the sinks, which count once, in the global merge."""
    if c.eager:
        return dispatch.logsumexp(x, c.dim, c.backend, scale=c.scale, mask=mask, softcap=c.softcap)
    return logsumexp(x, c.dim, scale=c.scale, mask=mask, softcap=c.softcap, keepdim=True, backend=c.backend)


class RowStates(NamedTuple):
    """The merged states, each shaped as x with size 1 in `dim`, in the accumulation dtype."""

    lse: torch.Tensor | None  # log of the global denominator (every rank's kept exp(z), plus the sinks)
    rest: torch.Tensor | None  # log of the part outside this shard (other ranks, sinks); None: one rank, no sinks
    empty: torch.Tensor | None  # bool: rows no rank kept anything of (None: no bool mask)
    length: torch.Tensor | None  # the global row length (a 0-dim tensor), when asked for


def _others(lses: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """log Σ over the ranks other than `rank` of [world, rows] states: [rows]. Two ranks: the
    other's row itself (a view, no op); the first or last rank: a slice; else one cat."""
    if world == 2:
        return lses[1 - rank]
    if rank == 0:
        others = lses[1:]
    elif rank == world - 1:
        others = lses[:-1]
    else:
        others = torch.cat((lses[:rank], lses[rank + 1:]))
    return torch.logsumexp(others, 0)


def exchange(x: torch.Tensor, mask, sinks, c, want_length: bool = False, want_lse: bool = True) -> RowStates:
    """This shard's row states for the call `c` (`functions.Call`), every rank's gathered (one
    collective) and merged; `lse` only when `want_lse`. Nothing here reads a value on the host (a
    sync between the collectives would serialise the ranks' streams), nor records a gradient."""
    dim, rank, world = c.dim, c.rank, c.world
    local = _local_lse(x, mask, c)
    acc, rows, keep_shape = local.dtype, local.numel(), local.shape
    bool_mask = mask is not None and mask.dtype == torch.bool
    s = None if sinks is None else sinks.detach().to(acc)
    parts = [local.reshape(-1)]
    if bool_mask:  # 1 where this shard keeps something of the row
        parts.append((~mask).expand(x.shape).any(dim).reshape(-1).to(acc))
    if want_length:  # (device fills, never a host list copied over)
        n = x.shape[dim]
        parts += [local.new_full((1,), n // _SPLIT), local.new_full((1,), n % _SPLIT)]
    every = gather_states(parts[0] if len(parts) == 1 else torch.cat(parts), world, c.group)
    if world == 1:  # nothing outside the shard but the sinks
        rest = None if s is None else s.expand(keep_shape)
    else:
        rest = _others(every[:, :rows], rank, world).view(keep_shape)
        if s is not None:  # (logaddexp of -inf and -inf is -inf: exact, never NaN)
            rest = torch.logaddexp(rest, s)
    lse = None if not want_lse else local if rest is None else torch.logaddexp(rest, local)
    empty = (every[:, rows:2 * rows].sum(0) == 0).view(keep_shape) if bool_mask else None
    length = None
    if want_length:
        counts = every[:, -2:].to(torch.float64)
        length = (counts[:, 0] * _SPLIT + counts[:, 1]).sum()
    return RowStates(lse, rest, empty, length)
