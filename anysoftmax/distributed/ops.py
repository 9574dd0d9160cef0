"""The sharded functions as torch operators with fakes (dynamo cannot trace collectives), autograd and vmap rules
(docs/semantics.md, "A dim sharded across ranks"): the all-gather path, never `one_read` (its epochs are per call)."""

from __future__ import annotations

from typing import Optional

import torch

from ..core.reference import row_shape
from ..core.request import SHARDED, SHARDED_LSE
from ..dispatch import FusedArgs
from ..torchop.batching import front
from ..torchop.ops import fresh
from . import calls
from .collective import group_of, group_rank_and_size
from .functions import (NO_DOUBLE_BACKWARD, Call, logsumexp_backward, logsumexp_forward, softmax_backward,
                        softmax_forward)

_Tensor = torch.Tensor
_SOFTMAX = {False: "anysoftmax.distributed.softmax", True: "anysoftmax.distributed.log_softmax"}
_LSE = "anysoftmax.distributed.logsumexp"


def _bool(mask) -> bool:
    return mask is not None and mask.dtype == torch.bool


def _prepare(who, direction, x, dim, dtype, log, keepdim, group, scale, mask, softcap, sinks, empty_rows, backend):
    x, c, checked = calls.prepare(who, direction, x, dim, dtype, log, keepdim, group_of(group), scale, mask, False,
                                  softcap, sinks, empty_rows, backend)
    return x, c._replace(eager=False), checked  # (eager False: the all-gather path, never one_read)


def _backward_call(dim, log, scale, softcap, keepdim, backend, group) -> Call:
    g = group_of(group)
    rank, world = group_rank_and_size(g, "anysoftmax.distributed (backward)")
    return Call(dim, log, scale, softcap, "zero", keepdim, backend, g, rank, world, False)


# ---- softmax, log_softmax ---------------------------------------------------------------------

@torch.library.custom_op("anysoftmax::sharded_softmax", mutates_args=())
def softmax_op(x: _Tensor, mask: Optional[_Tensor], sinks: Optional[_Tensor], dim: int, dtype: Optional[torch.dtype],
               log: bool, scale: Optional[float], softcap: Optional[float], empty_rows: str, backend: Optional[str],
               group: str) -> tuple[_Tensor, _Tensor, _Tensor]:
    """(this rank's shard of the softmax / log_softmax over `dim`, sharded across the group named
    `group` (`collective.group_name`); the global lse; the rows empty on every rank)."""
    x, c, checked = _prepare(_SOFTMAX[log], SHARDED, x, dim, dtype, log, False, group, scale, mask, softcap, sinks,
                             empty_rows, backend)
    if checked.no_rows:  # (nothing to compute: the fake's empty outputs; x is converted already)
        return _softmax_fake(x, mask, sinks, dim, None, log, scale, softcap, empty_rows, backend, group)
    y, st = softmax_forward(x, mask, sinks, c)
    lse = st.lse if sinks is not None else x.new_empty(0, dtype=checked.acc)
    empty = st.empty if _bool(mask) else x.new_empty(0, dtype=torch.bool)
    return fresh(y, lse, empty, inputs=(x, mask, sinks))


@softmax_op.register_fake
def _softmax_fake(x, mask, sinks, dim, dtype, log, scale, softcap, empty_rows, backend, group):
    checked = calls.check(_SOFTMAX[log], x, dim, dtype, log, FusedArgs(scale, mask, False, softcap, sinks, empty_rows))
    rows = row_shape(x.shape, checked.dim)
    return (x.new_empty(x.shape, dtype=checked.cast or x.dtype),
            x.new_empty(rows if sinks is not None else (0,), dtype=checked.acc),
            x.new_empty(rows if _bool(mask) else (0,), dtype=torch.bool))


@torch.library.custom_op("anysoftmax::sharded_softmax_backward", mutates_args=())
def softmax_backward_op(gy: _Tensor, y: _Tensor, x: Optional[_Tensor], mask: Optional[_Tensor],
                        sinks: Optional[_Tensor], lse: _Tensor, empty: _Tensor, dim: int, log: bool,
                        scale: Optional[float], softcap: Optional[float],
                        group: str) -> tuple[_Tensor, _Tensor, _Tensor]:
    """(dx, dmask, dsinks) of `softmax_op` (`functions.softmax_backward`); `dim` normalised."""
    c = _backward_call(dim, log, scale, softcap, False, None, group)
    if any(s == 0 for d, s in enumerate(y.shape) if d != dim % y.dim()):  # (no rows: zero gradients)
        return tuple(t.zero_() for t in _grads_fake(y, mask, sinks))
    dx, dmask, dsinks = softmax_backward(gy, y, x, mask, sinks, lse if sinks is not None else None,
                                         empty if _bool(mask) else None, c)
    return fresh(dx, y.new_empty(0) if dmask is None else dmask, y.new_empty(0) if dsinks is None else dsinks,
                  inputs=(gy, y, x, mask, sinks, lse, empty))


def _grads_fake(ref: _Tensor, mask, sinks) -> tuple[_Tensor, _Tensor, _Tensor]:
    # A backward operator's (dx, dmask, dsinks): a placeholder where there is no such gradient.
    floating_mask = mask is not None and mask.dtype.is_floating_point
    return (ref.new_empty(ref.shape), mask.new_empty(mask.shape) if floating_mask else ref.new_empty(0),
            ref.new_empty(0) if sinks is None else sinks.new_empty(sinks.shape))


@softmax_backward_op.register_fake
def _softmax_backward_fake(gy, y, x, mask, sinks, lse, empty, dim, log, scale, softcap, group):
    return _grads_fake(y, mask, sinks)


def _softmax_setup(ctx, inputs, output):
    x, mask, sinks, dim, dtype, log, scale, softcap, empty_rows, backend, group = inputs
    y, lse, empty = output
    # (softcap's derivative reads x as the forward read it: after dtype=)
    xs = None if softcap is None else x if dtype is None else x.to(dtype)
    ctx.save_for_backward(y, xs, mask, sinks, lse, empty)
    ctx.args = (dim % x.dim(), log, scale, softcap, group)
    ctx.x_dtype = x.dtype


def _softmax_grad(ctx, gy, _lse, _empty):
    y, x, mask, sinks, lse, empty = ctx.saved_tensors
    dx, dmask, dsinks = softmax_backward_op(gy, y, x, mask, sinks, lse, empty, *ctx.args)
    return (dx.to(ctx.x_dtype), _operand_grad(ctx, 1, mask, dmask), _operand_grad(ctx, 2, sinks, dsinks),
            None, None, None, None, None, None, None, None)


def _operand_grad(ctx, index: int, operand, grad):
    wanted = ctx.needs_input_grad[index] and operand is not None and operand.dtype.is_floating_point
    return grad if wanted else None


def _refuse(ctx, *grads):
    raise RuntimeError(NO_DOUBLE_BACKWARD)


def _no_context(ctx, inputs, output):
    pass


softmax_op.register_autograd(_softmax_grad, setup_context=_softmax_setup)
softmax_backward_op.register_autograd(_refuse, setup_context=_no_context)


# ---- logsumexp --------------------------------------------------------------------------------

@torch.library.custom_op("anysoftmax::sharded_logsumexp", mutates_args=())
def logsumexp_op(x: _Tensor, mask: Optional[_Tensor], sinks: Optional[_Tensor], dim: int, scale: Optional[float],
                 softcap: Optional[float], keepdim: bool, backend: Optional[str],
                 group: str) -> tuple[_Tensor, _Tensor, _Tensor]:
    """(the global logsumexp of a dim sharded across `group`; `rest`, the log of everything
    outside this shard (with sinks or more than one rank); the rows empty on every rank)."""
    x, c, checked = _prepare(_LSE, SHARDED_LSE, x, dim, None, False, keepdim, group, scale, mask, softcap, sinks,
                             "zero", backend)
    if checked.no_rows:  # (nothing to compute: the fake's empty outputs)
        return _logsumexp_fake(x, mask, sinks, dim, scale, softcap, keepdim, backend, group)
    out, st = logsumexp_forward(x, mask, sinks, c)
    return fresh(out, st.rest if _has_rest(sinks, c.world) else x.new_empty(0, dtype=checked.acc),
                  st.empty if _bool(mask) else x.new_empty(0, dtype=torch.bool), inputs=(x, mask, sinks))


def _has_rest(sinks, world: int) -> bool:
    return sinks is not None or world > 1


@logsumexp_op.register_fake
def _logsumexp_fake(x, mask, sinks, dim, scale, softcap, keepdim, backend, group):
    checked = calls.check(_LSE, x, dim, None, False, FusedArgs(scale, mask, False, softcap, sinks, "zero"))
    rows = row_shape(x.shape, checked.dim)
    _, world = group_rank_and_size(group_of(group), _LSE)
    squeezed = tuple(s for d, s in enumerate(x.shape) if d != checked.dim)
    return (x.new_empty(rows if keepdim else squeezed, dtype=checked.acc),
            x.new_empty(rows if _has_rest(sinks, world) else (0,), dtype=checked.acc),
            x.new_empty(rows if _bool(mask) else (0,), dtype=torch.bool))


@torch.library.custom_op("anysoftmax::sharded_logsumexp_backward", mutates_args=())
def logsumexp_backward_op(g: _Tensor, x: _Tensor, mask: Optional[_Tensor], sinks: Optional[_Tensor], out: _Tensor,
                          rest: _Tensor, empty: _Tensor, dim: int, scale: Optional[float], softcap: Optional[float],
                          keepdim: bool, backend: Optional[str], group: str) -> tuple[_Tensor, _Tensor, _Tensor]:
    """(dx, dmask, dsinks) of `logsumexp_op` from its result `out`; `dim` normalised."""
    c = _backward_call(dim, False, scale, softcap, keepdim, backend, group)
    dx, dmask, dsinks = logsumexp_backward(g, x, mask, sinks, out, rest if _has_rest(sinks, c.world) else None,
                                           empty if _bool(mask) else None, c)
    return fresh(dx, x.new_empty(0) if dmask is None else dmask, x.new_empty(0) if dsinks is None else dsinks,
                  inputs=(g, x, mask, sinks, out, rest, empty))


@logsumexp_backward_op.register_fake
def _logsumexp_backward_fake(g, x, mask, sinks, out, rest, empty, dim, scale, softcap, keepdim, backend, group):
    return _grads_fake(x, mask, sinks)


def _logsumexp_setup(ctx, inputs, output):
    x, mask, sinks, dim, scale, softcap, keepdim, backend, group = inputs
    out, rest, empty = output
    ctx.save_for_backward(x, mask, sinks, out, rest, empty)
    ctx.args = (dim % x.dim(), scale, softcap, keepdim, backend, group)


def _logsumexp_grad(ctx, g, _rest, _empty):
    x, mask, sinks, out, rest, empty = ctx.saved_tensors
    dx, dmask, dsinks = logsumexp_backward_op(g, x, mask, sinks, out, rest, empty, *ctx.args)
    return (dx, _operand_grad(ctx, 1, mask, dmask), _operand_grad(ctx, 2, sinks, dsinks),
            None, None, None, None, None, None)


logsumexp_op.register_autograd(_logsumexp_grad, setup_context=_logsumexp_setup)
logsumexp_backward_op.register_autograd(_refuse, setup_context=_no_context)


# ---- vmap: a batch dim is one more row dim ----------------------------------------------------

def _sample_dim(who: str, dim: int, ndim: int) -> int:
    """`dim` of a sample of rank `ndim` as a dim of the batched tensor (batch dim in front)."""
    if ndim == 0:
        raise ValueError(f"{who}: x must have at least one dim (the sharded one), got a 0-dim tensor")
    if not -ndim <= dim < ndim:
        raise IndexError(f"{who}: dim={dim} is out of range for a tensor of {ndim} dims")
    return dim % ndim + 1


def _grad_dims(mask, sinks) -> tuple:
    # The batch dims of a backward operator's (dx, dmask, dsinks): placeholders have none.
    return 0, 0 if mask is not None and not _bool(mask) else None, 0 if sinks is not None else None


@softmax_op.register_vmap
def _softmax_vmap(info, in_dims, x, mask, sinks, dim, dtype, log, scale, softcap, empty_rows, backend, group):
    n, (xd, md, sd) = info.batch_size, in_dims[:3]
    ndim = x.dim() - (xd is not None)
    out = softmax_op(front(x, xd, n, ndim), front(mask, md, n, ndim), front(sinks, sd, n, ndim),
                     _sample_dim(_SOFTMAX[log], dim, ndim), dtype, log, scale, softcap, empty_rows, backend, group)
    return out, (0, 0 if sinks is not None else None, 0 if _bool(mask) else None)


@softmax_backward_op.register_vmap
def _softmax_backward_vmap(info, in_dims, gy, y, x, mask, sinks, lse, empty, dim, log, scale, softcap, group):
    n, (gd, yd, xd, md, sd, ld, ed) = info.batch_size, in_dims[:7]
    ndim = y.dim() - (yd is not None)
    dx, dmask, dsinks = softmax_backward_op(
        front(gy, gd, n, ndim), front(y, yd, n, ndim), front(x, xd, n, ndim), front(mask, md, n, ndim),
        front(sinks, sd, n, ndim), front(lse, ld, n, ndim) if sinks is not None else lse,  # (else placeholders)
        front(empty, ed, n, ndim) if _bool(mask) else empty, _sample_dim(_SOFTMAX[log], dim, ndim), log, scale,
        softcap, group)
    return (dx, dmask, dsinks), _grad_dims(mask, sinks)


@logsumexp_op.register_vmap
def _logsumexp_vmap(info, in_dims, x, mask, sinks, dim, scale, softcap, keepdim, backend, group):
    n, (xd, md, sd) = info.batch_size, in_dims[:3]
    ndim = x.dim() - (xd is not None)
    _, world = group_rank_and_size(group_of(group), _LSE)
    out = logsumexp_op(front(x, xd, n, ndim), front(mask, md, n, ndim), front(sinks, sd, n, ndim),
                       _sample_dim(_LSE, dim, ndim), scale, softcap, keepdim, backend, group)
    return out, (0, 0 if _has_rest(sinks, world) else None, 0 if _bool(mask) else None)


@logsumexp_backward_op.register_vmap
def _logsumexp_backward_vmap(info, in_dims, g, x, mask, sinks, out, rest, empty, dim, scale, softcap, keepdim,
                             backend, group):
    n, (gd, xd, md, sd, od, rd, ed) = info.batch_size, in_dims[:7]
    ndim = x.dim() - (xd is not None)
    _, world = group_rank_and_size(group_of(group), _LSE)
    gb, ob = (front(t, d, n, t.dim() - (d is not None)) for t, d in ((g, gd), (out, od)))
    dx, dmask, dsinks = logsumexp_backward_op(
        gb, front(x, xd, n, ndim), front(mask, md, n, ndim), front(sinks, sd, n, ndim), ob,
        front(rest, rd, n, ndim) if _has_rest(sinks, world) else rest,
        front(empty, ed, n, ndim) if _bool(mask) else empty, _sample_dim(_LSE, dim, ndim), scale, softcap, keepdim,
        backend, group)
    return (dx, dmask, dsinks), _grad_dims(mask, sinks)
