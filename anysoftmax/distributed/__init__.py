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
one all-reduce of one float per row (none for logsumexp); no double backward (it raises).
torch.func and torch.compile(fullgraph=True) go through the operators of `ops.py`. Every
rank must call with the same dtype, rows and keywords, and backpropagate through its result;
`TORCH_DISTRIBUTED_DEBUG=DETAIL` makes torch check that the ranks' collectives agree. Works with
gloo (CPU tensors) and NCCL (one GPU per rank). A group of one rank without sinks runs the
local op itself (its shard is the whole dim: no exchange, x read once). docs/semantics.md states
the contract.

`sample` and `logprobs` are `anysoftmax.sampling`'s over a vocabulary sharded the same way
(`sampling.py`; docs/sampling.md): every rank gets the same global ids, through two small
collectives, never the logits.
"""

from __future__ import annotations

import torch

from ..core.request import SHARDED, SHARDED_LSE
from ..torchop.api import log_softmax as _local_log_softmax, softmax as _local_softmax
from ..torchop.pieces import logsumexp as _local_logsumexp
from . import ops
from .autograd import FuncShardedLogsumexp, FuncShardedSoftmax, ShardedLogsumexp, ShardedSoftmax
from .calls import prepare, refuse_causal
from .collective import group_name
from .functions import logsumexp_forward, softmax_forward
from .sampling import logprobs, sample

__all__ = ["log_softmax", "logprobs", "logsumexp", "sample", "softmax"]


def _graph(x, mask, sinks) -> bool:
    # Without a gradient to record, the forward runs without the autograd.Function (its apply
    # costs host time a small call waits on).
    return torch.is_grad_enabled() and (x.requires_grad or (mask is not None and mask.requires_grad)
                                        or (sinks is not None and sinks.requires_grad))


def _softmax(who, log, x, dim, group, dtype, scale, mask, causal, softcap, sinks, empty_rows, backend):
    if torch.compiler.is_compiling():  # the operator (dynamo cannot trace collectives); its fake validates
        refuse_causal(who, causal)
        return ops.compiled_softmax(x, dim, dtype, log, scale, mask, softcap, sinks, empty_rows, backend,
                                    group_name(group))
    x, c, checked = prepare(who, SHARDED, x, dim, dtype, log, False, group, scale, mask, causal, softcap, sinks,
                            empty_rows, backend)
    if checked.no_rows:  # no rows on any rank (they agree on the rows): nothing to exchange
        return x.new_empty(x.shape)
    if c.world == 1 and sinks is None:  # the shard is the whole dim: the local op, one read of x
        local = _local_log_softmax if log else _local_softmax
        return local(x, c.dim, scale=scale, mask=mask, softcap=softcap, empty_rows=c.empty_rows, backend=backend)
    if not c.eager:  # (torch.func, forward AD, tensor subclasses)
        return FuncShardedSoftmax.apply(x, mask, sinks, c)[0]
    return ShardedSoftmax.apply(x, mask, sinks, c) if _graph(x, mask, sinks) else softmax_forward(x, mask, sinks, c)[0]


def softmax(x: torch.Tensor, dim: int, *, group=None, dtype: torch.dtype | None = None, scale: float | None = None,
            mask: torch.Tensor | None = None, causal: bool | str = False, softcap: float | None = None,
            sinks: torch.Tensor | None = None, empty_rows: str = "zero", backend: str | None = None) -> torch.Tensor:
    """This rank's shard of the softmax over `dim`, sharded across `group` (None: the default
    group); the fused keywords as in `anysoftmax.softmax` (module docstring: what a shard means)."""
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
    """The log of the global fused softmax's denominator per row (sinks included), on every
    rank: float32 for 16/32-bit x, float64 for float64; -inf for rows a bool mask leaves empty
    on every rank (their sink s with sinks, as `anysoftmax.logsumexp`). Its gradient is the
    global softmax (no collective in the backward)."""
    who = "anysoftmax.distributed.logsumexp"
    if torch.compiler.is_compiling():
        refuse_causal(who, causal)
        return ops.compiled_logsumexp(x, dim, scale, mask, softcap, sinks, keepdim, backend, group_name(group))
    x, c, checked = prepare(who, SHARDED_LSE, x, dim, None, False, keepdim, group, scale, mask, causal, softcap, sinks,
                            "zero", backend)
    if checked.no_rows:
        shape = tuple(1 if d == c.dim else s for d, s in enumerate(x.shape)) if keepdim else \
            tuple(s for d, s in enumerate(x.shape) if d != c.dim)
        return x.new_empty(shape, dtype=checked.acc)
    if c.world == 1 and sinks is None:
        return _local_logsumexp(x, c.dim, scale=scale, mask=mask, softcap=softcap, keepdim=keepdim, backend=backend)
    if not c.eager:
        return FuncShardedLogsumexp.apply(x, mask, sinks, c)[0]
    return ShardedLogsumexp.apply(x, mask, sinks, c) if _graph(x, mask, sinks) else \
        logsumexp_forward(x, mask, sinks, c)[0]
