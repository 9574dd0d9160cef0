"""`anysoftmax.logsumexp` and `anysoftmax.merge_states`, and their operators with fakes, autograd, forward mode
(`core.lse_merge`'s formulas) and vmap rules; eager inference calls `dispatch` directly, the rest the operators."""

from __future__ import annotations

from typing import Optional

import torch

from .. import dispatch
from ..core.lse_merge import (MergeSpec, logsumexp_backward_formula, logsumexp_request, logsumexp_tangent, lse_dtype,
                              merge_backward_formula, merge_tangent, row_shape)
from ..core.variant import build, check_row_scale, is_row_scale
from .batching import front
from .grad_mode import eager_mode, plain_eager, plain_eager_one, refuse_forward_over_forward
from .ops import fresh, op_arguments
from .traced_temperature import scaled_logits, traced_as_symbols


# ---- logsumexp --------------------------------------------------------------------------------

@torch.library.custom_op("anysoftmax::logsumexp", mutates_args=())
def logsumexp_op(x: torch.Tensor, mask: Optional[torch.Tensor], sinks: Optional[torch.Tensor], dim: int,
                 scale: Optional[float], softcap: Optional[float], causal: str,
                 backend: Optional[str] = None) -> torch.Tensor:
    """`anysoftmax.logsumexp` with keepdim as an operator (accumulation dtype)."""
    out = dispatch.logsumexp(x, dim, backend, True, scale, mask, causal, softcap, sinks)
    return fresh(out, inputs=(x,))[0]


@logsumexp_op.register_fake
def _logsumexp_fake(x, mask, sinks, dim, scale, softcap, causal, backend=None):
    spec, _ = logsumexp_request(x, dim, scale=scale, mask=mask, causal=causal, softcap=softcap, sinks=sinks)
    return x.new_empty(row_shape(spec.shape, spec.dim), dtype=spec.acc_dtype)


def _lse_setup(ctx, inputs, output):
    x, mask, sinks, dim, scale, softcap, causal, backend = inputs
    ctx.save_for_backward(x, mask, sinks, output)
    ctx.dim = dim % max(x.dim(), 1)
    ctx.fused = dict(scale=scale, softcap=softcap, causal=causal)


def _lse_backward(ctx, g):
    x, mask, sinks, lse = ctx.saved_tensors
    variant, _ = build(tuple(x.shape), x.device, ctx.dim, mask=mask, sinks=sinks, **ctx.fused)
    dx, dmask, ds = logsumexp_backward_formula(g, lse, x, variant, ctx.dim, mask, sinks, lse_dtype(x.dtype))
    d_mask = None if (dmask is None or not ctx.needs_input_grad[1]) else dmask.sum_to_size(mask.shape).to(mask.dtype)
    d_sinks = None if (ds is None or not ctx.needs_input_grad[2]) else ds.sum_to_size(sinks.shape).to(sinks.dtype)
    return dx.to(x.dtype), d_mask, d_sinks, None, None, None, None, None


logsumexp_op.register_autograd(_lse_backward, setup_context=_lse_setup)


@logsumexp_op.register_vmap
def _lse_vmap(info, in_dims, x, mask, sinks, dim, scale, softcap, causal, backend=None):
    nd = x.dim() - (in_dims[0] is not None)
    xb = front(x, in_dims[0], info.batch_size, nd)
    if nd == 0:  # a 0-dim sample: a row of one
        return logsumexp_op(xb.unsqueeze(1), None, None, 1, scale, softcap, causal, backend).squeeze(1), 0
    m, s = (front(t, d, info.batch_size, nd, False) for t, d in ((mask, in_dims[1]), (sinks, in_dims[2])))
    return logsumexp_op(xb, m, s, dim % nd + 1, scale, softcap, causal, backend), 0


class _Logsumexp(torch.autograd.Function):
    """The operator under eager autograd, forward mode and torch.func (see `autodiff`)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, mask, sinks, dim, scale, softcap, causal, backend):
        return logsumexp_op(x, mask, sinks, dim, scale, softcap, causal, backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _lse_setup(ctx, inputs, output)
        x, mask, sinks = inputs[:3]
        ctx.save_for_forward(x, mask, sinks, output)

    backward = staticmethod(_lse_backward)

    @staticmethod
    def jvp(ctx, tx, tmask, tsinks, *_):
        # In torch ops (`core.lse_merge.logsumexp_tangent`): an autograd.Function applied inside a jvp
        # would re-enter the same functorch level, while torch ops nest (hessian, jacrev(jacfwd)).
        refuse_forward_over_forward()
        x, mask, sinks, lse = ctx.saved_tensors
        variant, _ = build(tuple(x.shape), x.device, ctx.dim, mask=mask, sinks=sinks, **ctx.fused)
        tmask = tmask if mask is not None and mask.dtype.is_floating_point else None
        return logsumexp_tangent(tx, tmask, tsinks, lse, x, variant, ctx.dim, mask, sinks, lse_dtype(x.dtype))


def logsumexp(x: torch.Tensor, dim: int, *, scale: float | None = None, mask: torch.Tensor | None = None,
              causal: bool | str = False, softcap: float | None = None, sinks: torch.Tensor | None = None,
              keepdim: bool = False, backend: str | None = None) -> torch.Tensor:
    """log of the fused softmax's denominator along `dim` (sinks included): float32 for 16/32-bit
    inputs, float64 for float64; -inf for rows with nothing kept. The fused keywords as in
    `anysoftmax.softmax`, `keepdim` as in `torch.logsumexp`; differentiable."""
    if not isinstance(keepdim, bool):
        raise TypeError(f"logsumexp: keepdim must be a bool, got {type(keepdim).__name__}")
    # (one operand's check where mask, sinks and a tensor scale are absent; the launcher allocates
    # the result without dim where keepdim is False: no view a call)
    if plain_eager_one(x) if mask is None and sinks is None and scale is None else plain_eager(x, mask, sinks, scale):
        return dispatch.logsumexp(x, dim, backend, keepdim, scale, mask, causal, softcap, sinks)
    if not torch.compiler.is_compiling():  # (traced: the fake implementation validates)
        logsumexp_request(x, dim, scale=scale, mask=mask, causal=causal, softcap=softcap, sinks=sinks)
    elif is_row_scale(scale):  # (which it no longer sees)
        check_row_scale(scale, tuple(x.shape), x.device, dim % max(x.dim(), 1))
    if is_row_scale(scale) or traced_as_symbols(scale, softcap):
        # (see `traced_temperature`; a row scale as `autodiff` applies it, differentiable)
        x = scaled_logits(x, x.dtype, scale, softcap, mask, causal)
        scale = softcap = None
    args = (x, mask, sinks, dim, *op_arguments(scale, softcap, causal), backend)
    out = logsumexp_op(*args) if torch.compiler.is_compiling() else _Logsumexp.apply(*args)
    return out if keepdim or x.dim() == 0 else out.squeeze(dim % x.dim())


# ---- merge_states -----------------------------------------------------------------------------

@torch.library.custom_op("anysoftmax::merge_states", mutates_args=())
def merge_states_op(outputs: list[torch.Tensor], lses: list[torch.Tensor],
                    backend: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`anysoftmax.merge_states` as an operator."""
    return fresh(*dispatch.merge_states(outputs, lses, backend), inputs=(*outputs, *lses))


@merge_states_op.register_fake
def _merge_fake(outputs, lses, backend=None):
    spec = MergeSpec.from_tensors(outputs, lses)
    return outputs[0].new_empty(spec.shape), outputs[0].new_empty(spec.shape[:-1], dtype=spec.out_lse_dtype)


def _merge_setup(ctx, inputs, output):
    outputs, lses, backend = inputs
    ctx.k = len(outputs)
    ctx.save_for_backward(*outputs, *lses, *output)


def _merge_saved(ctx) -> tuple:
    # (outputs, lses, out, lse, the accumulation dtype)
    saved, k = ctx.saved_tensors, ctx.k
    outputs, lses = saved[:k], saved[k:2 * k]
    return outputs, lses, *saved[2 * k:], MergeSpec.from_tensors(list(outputs), list(lses)).acc_dtype


def _merge_backward(ctx, g_out, g_lse):
    outputs, lses, out, lse, acc = _merge_saved(ctx)
    return *merge_backward_formula(g_out, g_lse, outputs, lses, out, lse, acc), None


merge_states_op.register_autograd(_merge_backward, setup_context=_merge_setup)


class _MergeStates(torch.autograd.Function):
    """merge_states as `_Logsumexp`, its arguments flattened: (k, backend, *outputs, *lses)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(k, backend, *tensors):
        return merge_states_op(list(tensors[:k]), list(tensors[k:]), backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        k, backend, *tensors = inputs
        _merge_setup(ctx, (tensors[:k], tensors[k:], backend), output)
        ctx.save_for_forward(*tensors, *output)

    @staticmethod
    def backward(ctx, g_out, g_lse):
        d_outs, d_lses, _ = _merge_backward(ctx, g_out, g_lse)
        return None, None, *d_outs, *d_lses

    @staticmethod
    def jvp(ctx, _k, _backend, *tangents):
        refuse_forward_over_forward()
        outputs, lses, out, lse, acc = _merge_saved(ctx)
        return merge_tangent(tangents[:len(outputs)], tangents[len(outputs):], outputs, lses, out, lse, acc)


@merge_states_op.register_vmap
def _merge_vmap(info, in_dims, outputs, lses, backend=None):
    o_dims, l_dims = in_dims[0], in_dims[1]
    ob = [front(t, d, info.batch_size, t.dim() - (d is not None)) for t, d in zip(outputs, o_dims)]
    lb = [front(t, d, info.batch_size, t.dim() - (d is not None)) for t, d in zip(lses, l_dims)]
    return merge_states_op(ob, lb, backend), (0, 0)


def merge_states(outputs, lses, *, backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge K partial results (`outputs[i]` [..., D] normalised within its segment, `lses[i]` [...]
    its log-sum-exp) into (out, lse): out = sum_i exp(lse_i - lse) out_i in the outputs' dtype,
    lse = logsumexp_i(lse_i) in float32 (float64 when every lse is). Semantics: docs/semantics.md."""
    # Arguments that are not lists go straight to dispatch (its validation names them), and so do
    # plain eager tensors: a repeated request's guard proves them plain, others are checked.
    if not isinstance(outputs, (list, tuple)) or not isinstance(lses, (list, tuple)):
        return dispatch.merge_states(outputs, lses, backend)
    if eager_mode():
        done = dispatch.merge_states(outputs, lses, backend, eager=plain_eager)
        if done is not None:
            return done
    if torch.compiler.is_compiling():  # (the fake implementation validates)
        return merge_states_op(list(outputs), list(lses), backend)
    MergeSpec.from_tensors(outputs, lses)
    return _MergeStates.apply(len(outputs), backend, *outputs, *lses)
