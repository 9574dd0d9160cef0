"""Row states of a softmax whose dim is sharded across ranks: each rank's log-sum-exp per row
(and, when a bool mask can empty rows, whether it kept anything), gathered in one collective,
then merged on every rank into the global log-denominator.

The merge also gives `rest`: the log of everything outside this rank's shard (the other ranks'
rows and the sinks). A local fused softmax with `rest` as its sink *is* this rank's shard of
the global softmax — exp(z_j) / (exp(rest) + Σ_local exp(z_k)) — in one kernel pass.
`rest` is a log-sum-exp of the other ranks' states, never exp(G) − exp(lse_local): no
cancellation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .collective import gather_states

# Row lengths travel as two floats (n >> 20, n & (2**20 - 1)): exact in float32 up to 2**44.
_SPLIT = 2**20


def _local_lse(x: torch.Tensor, dim: int, *, scale, mask, softcap, backend) -> torch.Tensor:
    """log Σ_j exp(z_j) over this shard's kept positions (no sinks: they count once, in the
    global merge), z = softcap(scale · x) + additive mask, bool mask True = excluded; float32
    for 16/32-bit x, float64 for float64; -inf for rows with nothing kept; x's shape without
    `dim`. Differentiable: `anysoftmax.logsumexp`, on the chosen backend."""
    from ..torchop.pieces import logsumexp

    return logsumexp(x, dim, scale=scale, mask=mask, softcap=softcap, backend=backend)


@dataclass(frozen=True)
class RowStates:
    """The merged states, each shaped as x with size 1 in `dim`, in the accumulation dtype."""

    lse: torch.Tensor  # log of the global denominator (every rank's kept exp(z), plus the sinks)
    rest: torch.Tensor  # log of the part outside this rank's shard (other ranks and the sinks)
    empty: torch.Tensor | None  # bool: rows no rank kept anything of (None: no bool mask)
    length: torch.Tensor | None  # the global row length (a 0-dim tensor), when asked for


def exchange(x: torch.Tensor, dim: int, *, scale, mask, softcap, sinks, backend, rank: int, world: int,
             group, want_length: bool = False) -> RowStates:
    """Compute this shard's row states, gather every rank's (the forward's one collective:
    [world, rows (+ rows kept flags) (+ 2)] floats), merge them."""
    with torch.no_grad():
        local = _local_lse(x, dim, scale=scale, mask=mask, softcap=softcap, backend=backend)
        acc, rows = local.dtype, local.numel()
        parts = [local.reshape(-1)]
        bool_mask = mask is not None and mask.dtype == torch.bool
        if bool_mask:
            parts.append((~mask).expand(x.shape).any(dim).reshape(-1).to(acc))
        if want_length:
            n = x.shape[dim]
            parts.append(torch.tensor([n // _SPLIT, n % _SPLIT], dtype=acc, device=x.device))
        every = gather_states(torch.cat(parts), world, group)
        keep_shape = tuple(1 if d == dim else s for d, s in enumerate(x.shape))
        lses = every[:, :rows]
        terms = [lses]
        if sinks is not None:
            terms.append(sinks.detach().to(acc).expand(keep_shape).reshape(1, rows))
        lse = torch.logsumexp(torch.cat(terms), 0)
        others = lses.clone()
        others[rank] = -math.inf  # (logsumexp over -inf terms is exact: -inf, never NaN)
        rest = torch.logsumexp(torch.cat([others] + terms[1:]), 0)
        empty = (every[:, rows:2 * rows].sum(0) == 0).reshape(keep_shape) if bool_mask else None
        length = None
        if want_length:
            counts = every[:, -2:].to(torch.float64)
            length = (counts[:, 0] * _SPLIT + counts[:, 1]).sum()
        return RowStates(lse.reshape(keep_shape), rest.reshape(keep_shape), empty, length)
