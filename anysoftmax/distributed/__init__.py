"""Softmax, log_softmax and logsumexp over a dim sharded across the ranks of a
`torch.distributed` group (a tensor-parallel vocabulary, a context-parallel row):

    import anysoftmax.distributed as asd
    y = asd.softmax(x_shard, -1)               # this rank's shard of softmax(cat(shards), -1)
    lse = asd.logsumexp(x_shard, -1, group=tp_group)

`x` is this rank's shard of a tensor split along `dim` across the group's ranks in rank order
(shards of any sizes, empty ones too); every other dim is the same on every rank (the rows).
The result is this rank's shard (logsumexp: every row's global value, on every rank). The fused
keywords mean what they mean for `anysoftmax.softmax`, per element of the shard (`mask` is this
rank's shard of the mask); `sinks` (the same on every rank) count once in the global
denominator; `causal` is refused (a shard does not know its keys' global positions); `empty_rows`
applies to rows a bool mask leaves empty on every rank, and "uniform" is 1/N with N the global
row length.

Forward: one all-gather of the row states (a float per row, and a kept flag per row with a bool
mask), never the rows; backward: one all-reduce of one float per row (none for logsumexp). Every
rank must call with the same dtype, rows and keywords, and backpropagate through its result;
`TORCH_DISTRIBUTED_DEBUG=DETAIL` makes torch check that the ranks' collectives agree. Works with
gloo (CPU tensors) and NCCL (one GPU per rank). docs/semantics.md states the contract.
"""

from __future__ import annotations

import torch

from ..core.spec import SoftmaxSpec
from .collective import group_rank_and_size
from .functions import Call, ShardedLogsumexp, ShardedSoftmax, logsumexp_forward, softmax_forward

__all__ = ["log_softmax", "logsumexp", "softmax"]


def _prepare(who: str, x, dim, dtype, causal, fused: dict, log: bool):
    if causal not in (False, None):
        raise ValueError(f"{who}: causal={causal!r} is not supported over a sharded dim (a shard does not know its "
                         f"keys' global positions); pass the shard of a bool mask instead")
    spec, ops = SoftmaxSpec.from_request(x, dim, dtype, log=log, fused=fused)
    if not spec.shape:
        raise ValueError(f"{who}: x must have at least one dim (the sharded one), got a 0-dim tensor")
    if spec.out_dtype != x.dtype:
        x = x.to(spec.out_dtype)  # torch's dtype=: convert first
    return x, spec, ops


def _graph(x, mask, sinks) -> bool:
    # Without a gradient to record, the forward runs without the autograd.Function (its apply
    # costs host time a small call waits on).
    return torch.is_grad_enabled() and (x.requires_grad or (mask is not None and mask.requires_grad)
                                        or (sinks is not None and sinks.requires_grad))


def _no_rows(x: torch.Tensor, dim: int) -> bool:
    # (not `spec.n_rows`: an empty shard has rows all the same, and must take part)
    return any(s == 0 for d, s in enumerate(x.shape) if d != dim)


def _call(who, x, dim, dtype, log, keepdim, group, scale, mask, causal, softcap, sinks, empty_rows, backend):
    rank, world = group_rank_and_size(group, who)
    fused = dict(scale=scale, mask=mask, softcap=softcap, sinks=sinks, empty_rows=empty_rows)
    x, spec, _ = _prepare(who, x, dim, dtype, causal, fused, log)
    v = spec.variant
    return x, Call(spec.dim, log, v.scale, v.softcap, v.empty_rows, keepdim, backend, group, rank, world), spec


def softmax(x: torch.Tensor, dim: int, *, group=None, dtype: torch.dtype | None = None, scale: float | None = None,
            mask: torch.Tensor | None = None, causal: bool | str = False, softcap: float | None = None,
            sinks: torch.Tensor | None = None, empty_rows: str = "zero", backend: str | None = None) -> torch.Tensor:
    """This rank's shard of the softmax over `dim`, sharded across `group` (None: the default
    group); the fused keywords as in `anysoftmax.softmax` (module docstring: what a shard means)."""
    x, c, spec = _call("anysoftmax.distributed.softmax", x, dim, dtype, False, False, group, scale, mask, causal,
                       softcap, sinks, empty_rows, backend)
    if _no_rows(x, c.dim):  # no rows on any rank (they agree on the rows): nothing to exchange
        return x.new_empty(x.shape)
    return ShardedSoftmax.apply(x, mask, sinks, c) if _graph(x, mask, sinks) else softmax_forward(x, mask, sinks, c)[0]


def log_softmax(x: torch.Tensor, dim: int, *, group=None, dtype: torch.dtype | None = None,
                scale: float | None = None, mask: torch.Tensor | None = None, causal: bool | str = False,
                softcap: float | None = None, sinks: torch.Tensor | None = None, empty_rows: str = "zero",
                backend: str | None = None) -> torch.Tensor:
    """This rank's shard of the log-softmax over `dim`, sharded across `group`; as `softmax`."""
    x, c, spec = _call("anysoftmax.distributed.log_softmax", x, dim, dtype, True, False, group, scale, mask, causal,
                       softcap, sinks, empty_rows, backend)
    if _no_rows(x, c.dim):
        return x.new_empty(x.shape)
    return ShardedSoftmax.apply(x, mask, sinks, c) if _graph(x, mask, sinks) else softmax_forward(x, mask, sinks, c)[0]


def logsumexp(x: torch.Tensor, dim: int, *, group=None, scale: float | None = None, mask: torch.Tensor | None = None,
              causal: bool | str = False, softcap: float | None = None, sinks: torch.Tensor | None = None,
              keepdim: bool = False, backend: str | None = None) -> torch.Tensor:
    """The log of the global fused softmax's denominator per row (sinks included), on every
    rank: float32 for 16/32-bit x, float64 for float64; -inf for rows a bool mask leaves empty
    on every rank. Its gradient is the global softmax (no collective in the backward)."""
    x, c, spec = _call("anysoftmax.distributed.logsumexp", x, dim, None, False, keepdim, group, scale, mask, causal,
                       softcap, sinks, "zero", backend)
    if _no_rows(x, c.dim):
        shape = tuple(1 if d == c.dim else s for d, s in enumerate(x.shape)) if keepdim else \
            tuple(s for d, s in enumerate(x.shape) if d != c.dim)
        return x.new_empty(shape, dtype=spec.acc_dtype)
    return ShardedLogsumexp.apply(x, mask, sinks, c) if _graph(x, mask, sinks) else \
        logsumexp_forward(x, mask, sinks, c)[0]
