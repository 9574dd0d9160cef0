"""Softmax, log_softmax and logsumexp over a dim sharded across the ranks of a `torch.distributed` group
(docs/semantics.md, "A dim sharded across ranks"); `sample` and `logprobs` likewise (docs/sampling.md)."""

from __future__ import annotations

import torch

from ..core.reference import row_shape
from ..core.request import SHARDED, SHARDED_LSE
from ..torchop.api import log_softmax as _local_log_softmax, softmax as _local_softmax
from ..torchop.grad_mode import plain_eager
from ..torchop.lse_merge import logsumexp as _local_logsumexp
from . import ops
from .autograd import EagerShardedLogsumexp, EagerShardedSoftmax, ShardedLogsumexp, ShardedSoftmax
from .calls import prepare, refuse_causal
from .collective import group_name
from .functions import logsumexp_forward, softmax_forward
from .sampling import logprobs, sample

__all__ = ["log_softmax", "logprobs", "logsumexp", "sample", "softmax"]


def _softmax(who, log, x, dim, group, dtype, scale, mask, causal, softcap, sinks, empty_rows, backend):
    if torch.compiler.is_compiling():  # the operator (dynamo cannot trace collectives); its fake validates
        refuse_causal(who, causal)
        return ops.softmax_op(x, mask, sinks, dim, dtype, log, scale, softcap, empty_rows, backend,
                              group_name(group))[0]
    x, c, checked = prepare(who, SHARDED, x, dim, dtype, log, False, group, scale, mask, causal, softcap, sinks,
                            empty_rows, backend)
    if checked.no_rows:  # no rows on any rank (they agree on the rows): nothing to exchange
        return x.new_empty(x.shape)
    if c.world == 1 and sinks is None:  # the shard is the whole dim: the local op, one read of x
        local = _local_log_softmax if log else _local_softmax
        return local(x, c.dim, scale=scale, mask=mask, softcap=softcap, empty_rows=c.empty_rows, backend=backend)
    if not c.eager:  # (torch.func, forward AD, tensor subclasses)
        return ShardedSoftmax.apply(x, mask, sinks, c)[0]
    # Without a gradient to record, no autograd.Function (its apply costs host time a small call waits on).
    return (softmax_forward if plain_eager(x, mask, sinks) else EagerShardedSoftmax.apply)(x, mask, sinks, c)[0]


def softmax(x: torch.Tensor, dim: int, *, group=None, dtype: torch.dtype | None = None, scale: float | None = None,
            mask: torch.Tensor | None = None, causal: bool | str = False, softcap: float | None = None,
            sinks: torch.Tensor | None = None, empty_rows: str = "zero", backend: str | None = None) -> torch.Tensor:
    """This rank's shard of the softmax over `dim`, sharded across `group` (None: the default one)."""
    return _softmax("anysoftmax.distributed.softmax", False, x, dim, group, dtype, scale, mask, causal, softcap, sinks,
                    empty_rows, backend)


def log_softmax(x: torch.Tensor, dim: int, *, group=None, dtype: torch.dtype | None = None,
                scale: float | None = None, mask: torch.Tensor | None = None, causal: bool | str = False,
                softcap: float | None = None, sinks: torch.Tensor | None = None, empty_rows: str = "zero",
                backend: str | None = None) -> torch.Tensor:
    """This rank's shard of the log-softmax over `dim`, sharded across `group`; as `softmax`."""
    return _softmax("anysoftmax.distributed.log_softmax", True, x, dim, group, dtype, scale, mask, causal, softcap,
                    sinks, empty_rows, backend)


def logsumexp(x: torch.Tensor, dim: int, *, group=None, scale: float | None = None, mask: torch.Tensor | None = None,
              causal: bool | str = False, softcap: float | None = None, sinks: torch.Tensor | None = None,
              keepdim: bool = False, backend: str | None = None) -> torch.Tensor:
    """The log of the global fused softmax's denominator per row (sinks included), on every rank,
    as `anysoftmax.logsumexp`: -inf (s with sinks) for rows a bool mask leaves empty on every rank."""
    who = "anysoftmax.distributed.logsumexp"
    if torch.compiler.is_compiling():
        refuse_causal(who, causal)
        return ops.logsumexp_op(x, mask, sinks, dim, scale, softcap, keepdim, backend, group_name(group))[0]
    x, c, checked = prepare(who, SHARDED_LSE, x, dim, None, False, keepdim, group, scale, mask, causal, softcap, sinks,
                            "zero", backend)
    if checked.no_rows:
        shape = row_shape(x.shape, c.dim) if keepdim else tuple(s for d, s in enumerate(x.shape) if d != c.dim)
        return x.new_empty(shape, dtype=checked.acc)
    if c.world == 1 and sinks is None:
        return _local_logsumexp(x, c.dim, scale=scale, mask=mask, softcap=softcap, keepdim=keepdim, backend=backend)
    if not c.eager:
        return ShardedLogsumexp.apply(x, mask, sinks, c)[0]
    return (logsumexp_forward if plain_eager(x, mask, sinks) else EagerShardedLogsumexp.apply)(x, mask, sinks, c)[0]
