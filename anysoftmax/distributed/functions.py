"""The sharded softmax, log_softmax and logsumexp without autograd: the forwards and backwards
that `autograd.py` and `ops.py` run. Each rank's sinks gradient is the whole one (sinks are
replicated); a floating mask's is this rank's part.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .. import dispatch
from ..core.lse_merge import lse_dtype
from ..core.reference import empty_row_value, prologue_chain
from ..torchop.api import log_softmax as _log_softmax, softmax as _softmax
from ..torchop.grad_mode import plain_eager
from . import one_read
from .collective import sum_rows
from .states import exchange

# Raised where a backward is differentiated: the replicated lse and sinks would need second
# derivatives summed over the ranks, so there is none (never a silently constant one).
NO_DOUBLE_BACKWARD = ("anysoftmax.distributed: no double backward (create_graph=True, or a derivative of a "
                      "derivative): differentiate the sharded softmax, log_softmax or logsumexp once")


class Call(NamedTuple):
    """The non-tensor arguments of one call, as validated by the public functions."""

    dim: int
    log: bool
    scale: float | None
    softcap: float | None
    empty_rows: str
    keepdim: bool
    backend: str | None
    group: object
    rank: int
    world: int
    eager: bool  # plain eager tensors and modes (`torchop.grad_mode.plain_eager`): local calls go straight to dispatch


def _local_softmax(x, c: Call, mask, sink, dtype=None) -> torch.Tensor:
    """The shard's local fused softmax (log_softmax with `c.log`), recording no gradient: straight
    to dispatch when `c.eager`, else through the public function. Empty rows stay "zero" locally: a
    row empty here may be kept on another rank (the caller applies the policy to rows empty everywhere)."""
    if c.eager:
        return dispatch.forward_fused(x, c.dim, dtype, c.backend, c.log,
                                      dispatch.FusedArgs(c.scale, mask, False, c.softcap, sink))[0]
    op = _log_softmax if c.log else _softmax
    return op(x, c.dim, dtype, scale=c.scale, mask=mask, softcap=c.softcap, sinks=sink, backend=c.backend)


def _chain(dz: torch.Tensor, x: torch.Tensor, c: Call, mask) -> torch.Tensor:
    """dz to dx: softcap's 1 - tanh² (read where a bool mask keeps: an excluded x may be NaN), scale."""
    keep = ~mask.expand(dz.shape) if mask is not None and mask.dtype == torch.bool else None
    return prologue_chain(dz, x, c.scale, c.softcap, keep)


def softmax_forward(x, mask, sinks, c: Call):
    """(this rank's shard of the global softmax / log_softmax, the row states), recording no
    gradient: one read of the shard where `one_read` takes the call, else the all-gather and a
    second read."""
    one = one_read.forward(x, mask, sinks, c)
    if one is not None:
        return one
    want_length = c.empty_rows == "uniform" and mask is not None and mask.dtype == torch.bool
    st = exchange(x, mask, sinks, c, want_length=want_length, want_lse=sinks is not None)
    y = _local_softmax(x, c, mask, st.rest)
    if st.empty is not None and c.empty_rows != "zero":
        if want_length:  # (a device tensor: torch.where, as masked_fill would read it on the host)
            n = st.length.to(torch.float64)
            value = -n.log() if c.log else 1.0 / n
            y = torch.where(st.empty, value.to(dtype=y.dtype), y)
        else:
            y = y.masked_fill(st.empty, empty_row_value(c.empty_rows, 1, c.log))
    return y, st


def logsumexp_forward(x, mask, sinks, c: Call):
    """(the global logsumexp per row, the row states), without autograd (as `softmax_forward`)."""
    st = exchange(x, mask, sinks, c)
    # A row no rank keeps anything of is -inf, or its sink s with sinks (the merge gives s there).
    out = st.lse if st.empty is None or sinks is not None else st.lse.masked_fill(st.empty, -math.inf)
    return (out if c.keepdim else out.squeeze(c.dim)), st


def softmax_backward(gy, y, x, mask, sinks, lse, empty, c: Call, needs=(True, True, True)):
    """(dx, dmask, dsinks) of the sharded softmax / log_softmax from `gy`, `y` and the row states
    (`lse` with sinks, `empty` with a bool mask; `x` with softcap); None where not in `needs` or
    without such a gradient. The one collective: one float per row."""
    acc = lse_dtype(y.dtype)
    g, yy = gy.to(acc), y.to(acc)
    excluded = None
    if mask is not None and mask.dtype == torch.bool:
        excluded = mask.expand(y.shape)
        g = g.masked_fill(excluded, 0.0)  # excluded outputs are constants
    total = sum_rows(g.sum(c.dim, keepdim=True) if c.log else (yy * g).sum(c.dim, keepdim=True), c.world, c.group)
    dz = g - yy.exp() * total if c.log else yy * (g - total)
    ds = -torch.exp(sinks.detach().to(acc) - lse) * total if sinks is not None and needs[2] else None
    if excluded is not None:
        dz = dz.masked_fill(excluded | empty, 0.0)
        if ds is not None:
            ds = ds.masked_fill(empty, 0.0)
    return _chain(dz, x, c, mask).to(y.dtype) if needs[0] else None, *_operand_grads(dz, ds, mask, sinks, needs)


def logsumexp_backward(g, x, mask, sinks, out, rest, empty, c: Call, needs=(True, True, True)):
    """(dx, dmask, dsinks) of the sharded logsumexp from `g` and its result `out` (read with sinks),
    as `softmax_backward`. No collective: d lse / d z is the local fused softmax with `rest` as its
    sink, computed in the accumulation dtype so that dx is rounded once."""
    acc = lse_dtype(x.dtype)
    g = g.to(acc) if c.keepdim else g.to(acc).unsqueeze(c.dim)
    c = c._replace(log=False, eager=plain_eager(x, mask, sinks, gradients=False))  # (this backward's modes)
    dz = g * _local_softmax(x.detach(), c, mask, rest, acc)
    ds = None
    if sinks is not None and needs[2]:
        lse = out if c.keepdim else out.unsqueeze(c.dim)
        ds = g * torch.exp(sinks.detach().to(acc) - lse)
    return _chain(dz, x, c, mask).to(x.dtype) if needs[0] else None, *_operand_grads(dz, ds, mask, sinks, needs)


def _operand_grads(dz, ds_rows, mask, sinks, needs):
    floating_mask = needs[1] and mask is not None and mask.dtype.is_floating_point
    return (dz.sum_to_size(mask.shape).to(mask.dtype) if floating_mask else None,
            None if ds_rows is None else ds_rows.sum_to_size(sinks.shape).to(sinks.dtype))
