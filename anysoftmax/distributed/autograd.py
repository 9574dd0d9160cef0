"""The autograd Functions of the sharded softmax, log_softmax and logsumexp, for eager autograd and for
torch.func's transforms (vmap rules generated over `ops.py`'s operators, which wrapped tensors go through)."""

from __future__ import annotations

import torch
from torch._C._functorch import TransformType, get_interpreter_stack, is_functorch_wrapped_tensor, maybe_get_level

from ..torchop.grad_mode import eager_form, plain_eager
from . import ops
from .collective import group_name
from .functions import NO_DOUBLE_BACKWARD, logsumexp_backward, logsumexp_forward, softmax_backward, softmax_forward


def refuse_double_backward(*tensors) -> None:
    """Raise where this backward is itself differentiated: in eager mode, with `create_graph=True`
    and a tensor it reads requiring a gradient; under torch.func, where a reverse-mode level
    outside the one this backward serves is live (grad of grad, jacrev of jacrev)."""
    if not torch.is_grad_enabled():
        return
    stack = get_interpreter_stack()
    if not stack:  # (wrappers of a dead level here: a vjp called after its transform returned)
        if any(t is not None and t.requires_grad and not is_functorch_wrapped_tensor(t) for t in tensors):
            raise RuntimeError(NO_DOUBLE_BACKWARD)
        return
    own = max((maybe_get_level(t) for t in tensors if t is not None), default=-1)
    outer = [i.level() for i in stack if i.key() == TransformType.Grad and (own < 0 or i.level() < own)]
    if outer:
        raise RuntimeError(NO_DOUBLE_BACKWARD)


def _plain(*tensors) -> bool:
    # A backward's tensors are plain ones: the formulas run on them. torch.func's wrappers,
    # dead ones too (a vjp called after its transform returned: they have no storage), go
    # through the operators, which unwrap them.
    return plain_eager(*tensors, gradients=False) and not any(
        t is not None and is_functorch_wrapped_tensor(t) for t in tensors)


def _or_none(grad, wanted: bool):
    # An operator's placeholder (no such gradient), or an unwanted one: None for autograd.
    return grad if wanted and grad.numel() else None


def _backward(ctx, grad, formula, operator, tail: tuple):
    """A Function's backward: (dx, dmask, dsinks, None) by the formula on plain tensors, else the operator."""
    saved = ctx.saved_tensors
    refuse_double_backward(grad, *saved)
    needs = ctx.needs_input_grad
    with torch.no_grad():  # (differentiated nowhere: see refuse_double_backward)
        if _plain(grad, *saved):
            return (*formula(grad, *saved, ctx.c, needs[:3]), None)
        dx, dmask, dsinks = operator(grad, *saved, *tail)
    return dx if needs[0] else None, _or_none(dmask, needs[1]), _or_none(dsinks, needs[2]), None


def _functions(name: str, outputs, save, grad):
    """(eager, torch.func) Functions of one sharded op: apply(x, mask, sinks, call) -> (result, row
    states...), computed by `outputs`; `save(ctx, x, mask, sinks, c, *outputs)` keeps what
    `grad(ctx, g)` reads."""

    class Func(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x, mask, sinks, c):
            return outputs(x, mask, sinks, c)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.mark_non_differentiable(*(t for t in output[1:] if t is not None))
            save(ctx, *inputs, *output)

        @staticmethod
        def backward(ctx, g, *_):
            return grad(ctx, g)

    Func.__name__ = Func.__qualname__ = name
    return eager_form(Func), Func


def _softmax_outputs(x, mask, sinks, c):
    # (y, the global lse (with sinks), the rows empty on every rank (with a bool mask))
    if plain_eager(x, mask, sinks, gradients=False):
        y, st = softmax_forward(x, mask, sinks, c)
        return y, st.lse, st.empty
    return ops.softmax_op(x, mask, sinks, c.dim, None, c.log, c.scale, c.softcap, c.empty_rows, c.backend,
                          group_name(c.group))


def _softmax_save(ctx, x, mask, sinks, c, y, lse, empty):
    ctx.c = c
    ctx.save_for_backward(y, x if c.softcap is not None else None, mask, sinks, lse, empty)


def _softmax_grad(ctx, gy):
    c = ctx.c
    return _backward(ctx, gy, softmax_backward, ops.softmax_backward_op,
                     (c.dim, c.log, c.scale, c.softcap, group_name(c.group)))


def _logsumexp_outputs(x, mask, sinks, c):
    # (the global logsumexp, `rest` (the log of everything outside this shard), the rows empty
    # on every rank (with a bool mask))
    if plain_eager(x, mask, sinks, gradients=False):
        out, st = logsumexp_forward(x, mask, sinks, c)
        return out, st.rest, st.empty
    return ops.logsumexp_op(x, mask, sinks, c.dim, c.scale, c.softcap, c.keepdim, c.backend, group_name(c.group))


def _logsumexp_save(ctx, x, mask, sinks, c, out, rest, empty):
    ctx.c = c
    # (the result only with sinks, its one reader: the global lse of every row there)
    ctx.save_for_backward(x, mask, sinks, out if sinks is not None else None, rest, empty)


def _logsumexp_grad(ctx, g):
    c = ctx.c
    return _backward(ctx, g, logsumexp_backward, ops.logsumexp_backward_op,
                     (c.dim, c.scale, c.softcap, c.keepdim, c.backend, group_name(c.group)))


# This rank's shard of the softmax / log_softmax; the global logsumexp per row on every rank.
EagerShardedSoftmax, ShardedSoftmax = _functions("ShardedSoftmax", _softmax_outputs, _softmax_save, _softmax_grad)
EagerShardedLogsumexp, ShardedLogsumexp = _functions("ShardedLogsumexp", _logsumexp_outputs, _logsumexp_save,
                                                     _logsumexp_grad)
