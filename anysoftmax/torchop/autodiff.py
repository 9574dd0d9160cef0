"""Derivatives of the softmax operators (`ops`) in every autograd mode. autograd.Functions beside
the operators' `register_autograd` because in torch 2.13 an operator's registered autograd has
neither `setup_context` (functorch refuses it) nor a jvp; both call the one formula here. On plain
eager tensors a Function calls dispatch itself (the dispatcher round trip costs more than a small softmax).
"""

from __future__ import annotations

import torch

from . import ops
from .grad_mode import eager_form, plain_eager, refuse_forward_over_forward, transform_active, wants_autodiff
from .traced_temperature import scaled_logits, traced_as_symbols
from ..core.lse_merge import lse_dtype as acc_dtype
from ..core.reference import fused_backward, prologue_chain
from ..core.spec import SoftmaxSpec
from ..core.variant import MASK_ADDITIVE, Variant, build, causal_name, check_row_scale, is_row_scale, keep_mask


@torch._dynamo.assume_constant_result
def _functorch_active() -> bool:
    # Evaluated once while dynamo traces (it cannot trace the functorch query itself); dynamo
    # guards compiled graphs on the functorch state anyway.
    return transform_active()


class Args:
    """A call's non-tensor arguments (dim normalised) on the autograd context; `variant` built on use."""

    __slots__ = ("dim", "log", "tail", "_shape", "_device", "_mask", "_sinks", "_variant")

    def __init__(self, shape, device, dim, log, mask, sinks, tail):
        # `tail`: (scale, softcap, causal, empty_rows, backend), the operators' last arguments
        self.dim, self.log, self.tail = dim % max(len(shape), 1), log, tuple(tail)
        self._shape, self._device, self._mask, self._sinks, self._variant = tuple(shape), device, mask, sinks, None

    @property
    def variant(self) -> Variant:
        if self._variant is None:
            scale, softcap, causal, empty_rows, _ = self.tail
            self._variant = build(self._shape, self._device, self.dim, scale=scale, mask=self._mask, causal=causal,
                                  softcap=softcap, sinks=self._sinks, empty_rows=empty_rows)[0]
        return self._variant


# ---- the formulas ---------------------------------------------------------------------------

def _sink_share_with_identity(p: torch.Tensor, y: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    # Value: the forward's p_s (exact); derivative: that of 1 - sum_j y_j, which p_s equals.
    q = 1 - (y.exp() if log else y).sum(dim, keepdim=True)
    return p.to(q.dtype) + (q - q.detach())


def _backward_formula(grad, y, x, p, mask, a: Args):
    """dx (with sinks: (dx, ds_rows)) in torch ops, differentiable in grad, y and x."""
    acc = acc_dtype(y.dtype)
    p_eff = None if p is None else _sink_share_with_identity(p, y.to(acc), a.dim, a.log)
    dx, ds, _ = fused_backward(grad, y, x, a.variant, a.dim, a.log, mask, p_eff, acc)
    return dx.to(y.dtype) if p is None else (dx.to(y.dtype), ds)


def output_tangent(tx, tmask, tsinks, y, p, x, mask, a: Args) -> torch.Tensor:
    """jvp of the forward: t_z = scale * (1 - tanh^2) * t_x (+ t_mask for a floating mask),
    zero where excluded; softmax: y * (t_z - sum(y t_z) - p_s t_s); log: t_z - sum(p t_z) - p_s t_s;
    excluded positions and empty rows: 0."""
    acc = acc_dtype(y.dtype)
    v, dim = a.variant, a.dim
    keep = keep_mask(tuple(y.shape), v, mask, y.device)
    tz = torch.zeros(y.shape, dtype=acc, device=y.device)
    if tx is not None:
        tz = tz + prologue_chain(tx.to(acc), x, v.scale, v.softcap, keep)
    if tmask is not None and v.mask_kind == MASK_ADDITIVE:
        tz = tz + tmask.to(acc)
    if keep is not None:
        tz = tz.masked_fill(~keep, 0.0)
    yw = y.to(acc)
    prob = torch.nan_to_num(yw.exp() if a.log else yw, nan=0.0)
    inner = (prob * tz).sum(dim, keepdim=True)
    if tsinks is not None and p is not None:
        inner = inner + p.to(acc) * tsinks.to(acc)
    ty = tz - inner if a.log else prob * (tz - inner)
    if keep is not None:
        empty = ~keep.any(dim, keepdim=True)
        ty = ty.masked_fill(~keep | empty, 0.0)
    return ty.to(y.dtype)


# ---- the two directions, through dispatch or the operators ------------------------------------

def _backward_values(grad, y, dim, log, x, p, mask, sinks, *tail):
    run = ops.run_backward if plain_eager(grad, y, x, p, mask, sinks, gradients=False) else ops.softmax_backward_op
    return run(grad, y, dim, log, x, p, mask, sinks, *tail)


def _call_backward(grad, y, x, p, mask, sinks, a: Args):
    """(dx, ds_rows or None) through the backward, differentiable again when that is needed."""
    args = (grad, y, a.dim, a.log, x, p, mask, sinks, *a.tail)
    if not torch.compiler.is_compiling() and wants_autodiff(grad, y, x, mask, sinks):
        out = _SoftmaxBackward.apply(*args)
        return (out, None) if sinks is None else out
    return _backward_values(*args)


def setup_op_forward(ctx, inputs, output) -> tuple:
    """setup_context of the `softmax` operator and of `_Softmax`: returns the saved tensors."""
    x, dim, _dtype, log, mask, sinks, *tail = inputs
    y, p = output
    ctx.args = Args(x.shape, x.device, dim, log, mask, sinks, tail)
    ctx.x_dtype = x.dtype
    softcap = tail[1]  # (its derivative reads x)
    saved = (y, p if sinks is not None else None, x if softcap is not None else None, mask, sinks)
    ctx.save_for_backward(*saved)
    return saved


def op_forward_backward(ctx, grad, *_) -> tuple:
    """Backward of the `softmax` operator (and `_Softmax`), in the operator's argument order."""
    y, p, x, mask, sinks = ctx.saved_tensors
    # (an operator's call omits trailing arguments equal to their defaults: no gradient there)
    a, needs = ctx.args, (*ctx.needs_input_grad, False, False, False, False, False)
    d_x = d_mask = d_sinks = None
    if needs[0] or needs[5]:
        dx, ds = _call_backward(grad, y, x, p, mask, sinks, a)
        d_x = dx.to(ctx.x_dtype) if needs[0] else None
        d_sinks = ds.sum_to_size(sinks.shape).to(sinks.dtype) if needs[5] else None
    if needs[4] and mask is not None and mask.dtype.is_floating_point:
        v = a.variant
        _, _, dz = fused_backward(grad, y, None, Variant(mask=v.mask, mask_kind=MASK_ADDITIVE, causal=v.causal,
                                                         sinks=v.sinks), a.dim, a.log, mask, None,
                                  acc_dtype(y.dtype), want_dz=True)
        d_mask = dz.sum_to_size(mask.shape).to(mask.dtype)
    return d_x, None, None, None, d_mask, d_sinks, None, None, None, None, None


def setup_op_backward(ctx, inputs, output=None) -> tuple:
    """setup_context of the `softmax_backward` operator and of `_SoftmaxBackward`."""
    grad, y, dim, log, x, p, mask, sinks, *tail = inputs
    ctx.args = Args(y.shape, y.device, dim, log, mask, sinks, tail)
    saved = (grad, y, x, mask, p if sinks is not None else None)
    ctx.save_for_backward(*saved)
    return saved


def _formula_vjp(ctx):
    """The backward's formula at (grad, y, x): (value, vjp, those primals, whether x was given)."""
    a = ctx.args
    grad, y, x, mask, p = ctx.saved_tensors
    primals = (grad, y, x if x is not None else torch.zeros_like(y))
    out, vjp = torch.func.vjp(lambda g_, y_, x_: _backward_formula(g_, y_, x_, p, mask, a), *primals)
    return out, vjp, primals, x is not None


def op_backward_backward(ctx, gdx, gds=None) -> tuple:
    """Double backward: of the `softmax_backward` operator (and `_SoftmaxBackward`)."""
    out, vjp, (_, y, _), has_x = _formula_vjp(ctx)
    gdx = torch.zeros_like(y) if gdx is None else gdx
    if isinstance(out, tuple):  # with sinks: ds_rows has a cotangent too
        gdx = (gdx, torch.zeros_like(out[1]) if gds is None else gds)
    d_grad, d_y, d_x = vjp(gdx)
    return d_grad, d_y, None, None, (d_x if has_x else None), *(None,) * 8


# ---- autograd.Functions: eager autograd, forward mode and torch.func -------------------------

class _Softmax(torch.autograd.Function):
    """The softmax operator's work, with reverse, forward and vmap rules: y, or (y, p_sink)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, dim, dtype, log, mask, sinks, *tail):
        run = ops.run_forward if plain_eager(x, mask, sinks, gradients=False) else ops.softmax_op
        y, p = run(x, dim, dtype, log, mask, sinks, *tail)
        return y if sinks is None else (y, p)

    @staticmethod
    def setup_context(ctx, inputs, output):
        with_sinks = inputs[5] is not None
        if with_sinks:
            ctx.mark_non_differentiable(output[1])
        ctx.save_for_forward(*setup_op_forward(ctx, inputs, output if with_sinks else (output, None)))

    backward = staticmethod(op_forward_backward)

    @staticmethod
    def jvp(ctx, tx, _dim, _dtype, _log, tmask, tsinks, *_):
        refuse_forward_over_forward()
        y, p, x, mask, sinks = ctx.saved_tensors
        ty = output_tangent(tx, tmask, tsinks, y, p, x, mask, ctx.args)
        return ty if sinks is None else (ty, None)


_EagerSoftmax = eager_form(_Softmax)


class _SoftmaxBackward(torch.autograd.Function):
    """The backward operator's work, differentiable again in every mode: dx, or (dx, ds_rows)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(grad, y, dim, log, x, p, mask, sinks, *tail):
        dx, ds = _backward_values(grad, y, dim, log, x, p, mask, sinks, *tail)
        return dx if sinks is None else (dx, ds)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_forward(*setup_op_backward(ctx, inputs))

    backward = staticmethod(op_backward_backward)

    @staticmethod
    def jvp(ctx, t_grad, t_y, _dim, _log, t_x, *_):
        refuse_forward_over_forward()
        out, vjp, primals, _ = _formula_vjp(ctx)
        tangents = tuple(torch.zeros_like(pr) if t is None else t for pr, t in zip(primals, (t_grad, t_y, t_x)))
        # J t by reverse mode twice (the vjp is linear in its cotangent u, so the vjp of
        # u -> J^T u is J t): forward mode cannot nest inside torch's forward AD here.
        outs = out if isinstance(out, tuple) else (out,)
        _, vjp_of_vjp = torch.func.vjp(lambda *u: vjp(u if isinstance(out, tuple) else u[0]),
                                       *(torch.zeros_like(o) for o in outs))
        result = vjp_of_vjp(tangents)
        return result if isinstance(out, tuple) else result[0]


# ---- entry points (`api`) ----------------------------------------------------------------------

def softmax(x, dim, dtype, log, mask, sinks, scale, softcap, causal, empty_rows, backend) -> torch.Tensor:
    """Differentiable softmax (log_softmax with `log`): `anysoftmax.softmax` when not straight to dispatch."""
    if is_row_scale(scale):
        return _row_scaled_softmax(x, dim, dtype, log, mask, sinks, scale, softcap, causal, empty_rows, backend)
    if torch.compiler.is_compiling():
        return _compiled_softmax(x, dim, dtype, log, mask, sinks, scale, softcap, causal, empty_rows, backend)
    scale, softcap, causal = ops.op_arguments(scale, softcap, causal)
    function = _Softmax if transform_active() else _EagerSoftmax
    out = function.apply(x, dim, dtype, log, mask, sinks, scale, softcap, causal, empty_rows, backend)
    return out if sinks is None else out[0]


def _compiled_softmax(x, dim, dtype, log, mask, sinks, scale, softcap, causal, empty_rows, backend):
    # Under torch.compile: the operator (AOTAutograd routes it to Triton kernels, `traced_ops`).
    # Inside a torch.func transform dynamo traces neither an operator's registered autograd nor a
    # custom jvp (torch 2.13): that call runs eagerly, one graph break. A scale or softcap traced
    # as a symbol is applied before the operator (`traced_temperature`).
    if _functorch_active():
        return _eager_softmax(x, dim, dtype, log, mask, sinks, scale, softcap, causal, empty_rows, backend)
    if traced_as_symbols(scale, softcap):
        out_dtype = x.dtype if dtype is None else dtype
        z = scaled_logits(x, out_dtype, scale, softcap, mask, causal)
        y, _ = ops.softmax_op(z, dim, None, log, mask, sinks, None, None, causal_name(causal), empty_rows, backend)
        return y.to(out_dtype)
    scale, softcap, causal = ops.op_arguments(scale, softcap, causal)
    return ops.softmax_op(x, dim, dtype, log, mask, sinks, scale, softcap, causal, empty_rows, backend)[0]


def _row_scaled_softmax(x, dim, dtype, log, mask, sinks, scale, softcap, causal, empty_rows, backend):
    # A row scale where a derivative may be wanted: z = softcap(scale * x) in torch ops, then the
    # fused softmax of z, so every autograd mode differentiates x and the scale. It reads x twice;
    # eager inference applies the scale in the backend's kernel instead.
    if torch.compiler.is_compiling():  # (dynamo traces no spec; the operator's fake checks the rest)
        check_row_scale(scale, tuple(x.shape), x.device, dim % max(x.dim(), 1))
        out_dtype = x.dtype if dtype is None else dtype
    else:
        out_dtype = SoftmaxSpec.from_request(x, dim, dtype, log=log, fused=dict(
            scale=scale, mask=mask, causal=causal, softcap=softcap, sinks=sinks, empty_rows=empty_rows))[0].out_dtype
    z = scaled_logits(x if dtype is None else x.to(dtype), out_dtype, scale, softcap, mask, causal)
    return softmax(z, dim, None, log, mask, sinks, None, None, causal, empty_rows, backend).to(out_dtype)


@torch._dynamo.disable
def _eager_softmax(*args):
    return softmax(*args)


def softmax_backward(grad, y, dim, log, backend) -> torch.Tensor:
    """Differentiable `softmax_backward` (plain): when not straight to dispatch."""
    args = (grad, y, dim, log, None, None, None, None, None, None, "none", "zero", backend)
    if torch.compiler.is_compiling():
        return ops.softmax_backward_op(*args)[0]
    return _SoftmaxBackward.apply(*args)
