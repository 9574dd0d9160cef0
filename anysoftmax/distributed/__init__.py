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
mask), never the rows; on NVIDIA GPUs the softmax and log_softmax exchange those states inside
one kernel instead, through symmetric memory, reading the shard once (`one_read`). Backward:
one all-reduce of one float per row (none for logsumexp). Every
rank must call with the same dtype, rows and keywords, and backpropagate through its result;
`TORCH_DISTRIBUTED_DEBUG=DETAIL` makes torch check that the ranks' collectives agree. Works with
gloo (CPU tensors) and NCCL (one GPU per rank). A group of one rank without sinks runs the
local op itself (its shard is the whole dim: no exchange, x read once). docs/semantics.md states
the contract.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..core.cache import BoundedDict
from ..core.request import SHARDED, SHARDED_LSE, request_key
from ..core.spec import SoftmaxSpec
from ..core.variant import runtime_values
from ..dispatch import FusedArgs
from ..torchop.api import log_softmax as _local_log_softmax, softmax as _local_softmax
from ..torchop.pieces import _plain_eager, logsumexp as _local_logsumexp
from .collective import group_rank_and_size
from .functions import Call, ShardedLogsumexp, ShardedSoftmax, logsumexp_forward, softmax_forward

__all__ = ["log_softmax", "logsumexp", "softmax"]


class _Checked(NamedTuple):
    """What validating a request leaves, for every call of it (scale's and softcap's values
    are the call's, checked on every call; the group's rank and size are the group's)."""

    dim: int  # normalised
    cast: torch.dtype | None  # dtype= to convert x to first
    empty_rows: str  # normalised ("zero" where no row can be empty)
    no_rows: bool  # (not `spec.n_rows`: an empty shard has rows all the same, and must take part)
    acc: torch.dtype


# request key -> _Checked: a repeated request is not validated again.
_memo: BoundedDict = BoundedDict(maxsize=1024)
_lookup = _memo._data.get


def _check(who: str, x, dim, dtype, log: bool, a: FusedArgs) -> _Checked:
    spec, _ = SoftmaxSpec.from_request(x, dim, dtype, log=log, fused=a.as_kwargs())
    if not spec.shape:
        raise ValueError(f"{who}: x must have at least one dim (the sharded one), got a 0-dim tensor")
    no_rows = any(s == 0 for d, s in enumerate(spec.shape) if d != spec.dim)
    return _Checked(spec.dim, None if spec.out_dtype == x.dtype else spec.out_dtype, spec.variant.empty_rows,
                    no_rows, spec.acc_dtype)


def _graph(x, mask, sinks) -> bool:
    # Without a gradient to record, the forward runs without the autograd.Function (its apply
    # costs host time a small call waits on).
    return torch.is_grad_enabled() and (x.requires_grad or (mask is not None and mask.requires_grad)
                                        or (sinks is not None and sinks.requires_grad))


def _call(who, direction, x, dim, dtype, log, keepdim, group, scale, mask, causal, softcap, sinks, empty_rows,
          backend):
    rank, world = group_rank_and_size(group, who)
    if causal not in (False, None):
        raise ValueError(f"{who}: causal={causal!r} is not supported over a sharded dim (a shard does not know its "
                         f"keys' global positions); pass the shard of a bool mask instead")
    a = FusedArgs(scale, mask, False, softcap, sinks, empty_rows)
    key = request_key(direction, x, dim, dtype, backend, log, None, a)
    checked = _lookup(key)
    if checked is None:
        checked = _check(who, x, dim, dtype, log, a)
        if key is not None:
            _memo.put(key, checked)
    s, c = runtime_values(scale, softcap)
    if checked.cast is not None:
        x = x.to(checked.cast)  # torch's dtype=: convert first
    return x, Call(checked.dim, log, None if scale is None else s, None if softcap is None else c, checked.empty_rows,
                   keepdim, backend, group, rank, world, _plain_eager(x, mask, sinks, gradients=False)), checked


def softmax(x: torch.Tensor, dim: int, *, group=None, dtype: torch.dtype | None = None, scale: float | None = None,
            mask: torch.Tensor | None = None, causal: bool | str = False, softcap: float | None = None,
            sinks: torch.Tensor | None = None, empty_rows: str = "zero", backend: str | None = None) -> torch.Tensor:
    """This rank's shard of the softmax over `dim`, sharded across `group` (None: the default
    group); the fused keywords as in `anysoftmax.softmax` (module docstring: what a shard means)."""
    x, c, checked = _call("anysoftmax.distributed.softmax", SHARDED, x, dim, dtype, False, False, group, scale, mask,
                          causal, softcap, sinks, empty_rows, backend)
    if checked.no_rows:  # no rows on any rank (they agree on the rows): nothing to exchange
        return x.new_empty(x.shape)
    if c.world == 1 and sinks is None:  # the shard is the whole dim: the local op, one read of x
        return _local_softmax(x, c.dim, scale=scale, mask=mask, softcap=softcap, empty_rows=c.empty_rows,
                              backend=backend)
    return ShardedSoftmax.apply(x, mask, sinks, c) if _graph(x, mask, sinks) else softmax_forward(x, mask, sinks, c)[0]


def log_softmax(x: torch.Tensor, dim: int, *, group=None, dtype: torch.dtype | None = None,
                scale: float | None = None, mask: torch.Tensor | None = None, causal: bool | str = False,
                softcap: float | None = None, sinks: torch.Tensor | None = None, empty_rows: str = "zero",
                backend: str | None = None) -> torch.Tensor:
    """This rank's shard of the log-softmax over `dim`, sharded across `group`; as `softmax`."""
    x, c, checked = _call("anysoftmax.distributed.log_softmax", SHARDED, x, dim, dtype, True, False, group, scale,
                          mask, causal, softcap, sinks, empty_rows, backend)
    if checked.no_rows:
        return x.new_empty(x.shape)
    if c.world == 1 and sinks is None:
        return _local_log_softmax(x, c.dim, scale=scale, mask=mask, softcap=softcap, empty_rows=c.empty_rows,
                                  backend=backend)
    return ShardedSoftmax.apply(x, mask, sinks, c) if _graph(x, mask, sinks) else softmax_forward(x, mask, sinks, c)[0]


def logsumexp(x: torch.Tensor, dim: int, *, group=None, scale: float | None = None, mask: torch.Tensor | None = None,
              causal: bool | str = False, softcap: float | None = None, sinks: torch.Tensor | None = None,
              keepdim: bool = False, backend: str | None = None) -> torch.Tensor:
    """The log of the global fused softmax's denominator per row (sinks included), on every
    rank: float32 for 16/32-bit x, float64 for float64; -inf for rows a bool mask leaves empty
    on every rank. Its gradient is the global softmax (no collective in the backward)."""
    x, c, checked = _call("anysoftmax.distributed.logsumexp", SHARDED_LSE, x, dim, None, False, keepdim, group, scale,
                          mask, causal, softcap, sinks, "zero", backend)
    if checked.no_rows:
        shape = tuple(1 if d == c.dim else s for d, s in enumerate(x.shape)) if keepdim else \
            tuple(s for d, s in enumerate(x.shape) if d != c.dim)
        return x.new_empty(shape, dtype=checked.acc)
    if c.world == 1 and sinks is None:
        return _local_logsumexp(x, c.dim, scale=scale, mask=mask, softcap=softcap, keepdim=keepdim, backend=backend)
    return ShardedLogsumexp.apply(x, mask, sinks, c) if _graph(x, mask, sinks) else \
        logsumexp_forward(x, mask, sinks, c)[0]
