"""Derivatives of the fused family (`core.variant`) in every autograd mode torch has.

* Reverse mode: `softmax_fused` differentiates to the `softmax_fused_backward` operator (the
  backend's kernel, or `core.reference.fused_backward` in torch): dx, dsinks from the per-row
  sums, and for a floating mask the gradient of the logits summed over its broadcast dims.
* Higher orders: the backward operator differentiates through the same formula written in torch
  ops (`_backward_formula`), by `torch.func.vjp` / `torch.func.jvp` of it. The sink share p_s
  enters that formula with its value from the forward and the derivative of its identity
  p_s = 1 - sum_j y_j, so second derivatives w.r.t. the sinks flow through y.
* Forward mode: the jvp of the forward is written out (`output_tangent`).
* torch.func and vmap: the Functions set `generate_vmap_rule` over operators with vmap rules
  (`anysoftmax.batching`).

Why Functions beside the operators' `register_autograd`: see `anysoftmax.autodiff` (the same
reasons hold for the fused operators).
"""

from __future__ import annotations

import torch
from torch._C._functorch import is_functorch_wrapped_tensor

from .. import dispatch

from . import ops
from .autodiff import _functorch_active, refuse_forward_over_forward
from ..core.reference import fused_backward, prologue_chain
from ..core.variant import MASK_ADDITIVE, Variant, build, causal_name, keep_mask, runtime_values
from .grad_mode import wants_autodiff
from .traced_temperature import scaled_logits, traced_as_symbols


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else accumulates in float32 (as the kernels do)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class Args:
    """The non-tensor arguments of a fused call, normalised once (dim in range) and kept on the
    autograd context; `variant` (the `core.variant.Variant` with its values, which the torch
    formulas need) is built on first use only: the kernel paths never need it."""

    __slots__ = ("dim", "dtype", "scale", "softcap", "causal", "empty_rows", "log", "backend", "_shape", "_device",
                 "_mask", "_sinks", "_variant")

    def __init__(self, shape, device, dim, dtype, scale, softcap, causal, empty_rows, log, backend, mask, sinks):
        ndim = len(shape)
        self.dim = dim % max(ndim, 1)
        self.dtype, self.scale, self.softcap, self.causal = dtype, scale, softcap, causal
        self.empty_rows, self.log, self.backend = empty_rows, log, backend
        self._shape, self._device, self._mask, self._sinks, self._variant = tuple(shape), device, mask, sinks, None

    @property
    def variant(self) -> Variant:
        if self._variant is None:
            self._variant = build(self._shape, self._device, self.dim, scale=self.scale, mask=self._mask,
                                  causal=self.causal, softcap=self.softcap, sinks=self._sinks,
                                  empty_rows=self.empty_rows)[0]
        return self._variant

    def op_tail(self) -> tuple:
        """(dim, scale, softcap, causal, empty_rows, log, backend) as the backward operator takes them."""
        return self.dim, self.scale, self.softcap, self.causal, self.empty_rows, self.log, self.backend


def _sink_share_with_identity(p: torch.Tensor, y: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    # Value: the forward's p_s (exact); derivative: that of 1 - sum_j y_j, which p_s equals.
    q = 1 - (y.exp() if log else y).sum(dim, keepdim=True)
    return p.to(q.dtype) + (q - q.detach())


def _backward_formula(grad, y, x, p, mask, a: Args):
    """(dx, ds_rows) in torch ops, differentiable in grad, y and x (see the module docstring)."""
    acc = acc_dtype(y.dtype)
    p_eff = None if p is None else _sink_share_with_identity(p, y.to(acc), a.dim, a.log)
    dx, ds, _ = fused_backward(grad, y, x, a.variant, a.dim, a.log, mask, p_eff, acc)
    return dx.to(y.dtype), (_no_rows(y) if ds is None else ds)


def _no_rows(y: torch.Tensor) -> torch.Tensor:
    # The second output without sinks: empty and of one shape for every rank (a 0-dim y has no
    # last dim to slice), as the operator's own placeholder (`ops._no_sinks`).
    return y.new_zeros(0, dtype=torch.float32)


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
    prob = yw.exp() if a.log else yw
    prob = torch.nan_to_num(prob, nan=0.0)
    inner = (prob * tz).sum(dim, keepdim=True)
    if tsinks is not None and p is not None:
        inner = inner + p.to(acc) * tsinks.to(acc)
    ty = tz - inner if a.log else prob * (tz - inner)
    if keep is not None:
        empty = ~keep.any(dim, keepdim=True)
        ty = ty.masked_fill(~keep | empty, 0.0)
    return ty.to(y.dtype)


def _direct(*tensors) -> bool:
    """True when a call may skip the operator and run dispatch itself: eager, every tensor a
    plain one (AOTAutograd traces a compiled graph's backward with fake and functional tensor
    subclasses while `is_compiling()` is already False: dispatch would hand them to a kernel),
    and none wrapped by a torch.func transform (those need the operator's vmap rule). The
    operator's dispatcher round trip costs tens of microseconds per call, which a training step
    of a small model pays at every layer."""
    return not torch.compiler.is_compiling() and all(
        t is None or (type(t) in _PLAIN_TENSORS and not is_functorch_wrapped_tensor(t)) for t in tensors)


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def forward_op(x, mask, sinks, dim, dtype, scale, softcap, causal, empty_rows, log, backend):
    """`softmax_fused` (y, p_sink), through dispatch directly when `_direct`."""
    if _direct(x, mask, sinks):
        y, p = dispatch.forward_fused(x, dim, dtype, backend, log,
                                      dispatch.FusedArgs(scale, mask, causal, softcap, sinks, empty_rows))
        return y, (ops._no_sinks(x) if p is None else p)
    return ops.softmax_fused_op(x, mask, sinks, dim, dtype, scale, softcap, causal, empty_rows, log, backend)


def backward_op(grad, y, x, mask, sinks, p, dim, scale, softcap, causal, empty_rows, log, backend):
    """`softmax_fused_backward` (dx, ds_rows), through dispatch directly when `_direct`."""
    if _direct(grad, y, x, mask, sinks, p):
        dx, ds = dispatch.backward_fused(grad, y, x, dim, log,
                                         dispatch.FusedArgs(scale, mask, causal, softcap, sinks, empty_rows),
                                         p if sinks is not None else None, backend)
        return dx, (ops._no_sinks(y) if ds is None else ds)
    return ops.softmax_fused_backward_op(grad, y, x, mask, sinks, p, dim, scale, softcap, causal, empty_rows, log,
                                         backend)


def _call_backward(grad, y, x, mask, sinks, p, a: Args):
    """(dx, ds_rows) through the backward operator, differentiable again when that is needed."""
    p_arg = p if sinks is not None else ops._no_sinks(y)
    if not torch.compiler.is_compiling() and wants_autodiff(grad, y, *(t for t in (x, mask, sinks) if t is not None)):
        return _FusedBackward.apply(grad, y, x, mask, sinks, p_arg, *a.op_tail())
    return backward_op(grad, y, x, mask, sinks, p_arg, *a.op_tail())


def input_grads(grad, y, p, x, mask, sinks, a: Args, x_dtype, needs) -> tuple:
    """(d x, d mask, d sinks) for the incoming gradient `grad` of y; None where not needed."""
    need_x, need_mask, need_sinks = needs
    d_x = d_mask = d_sinks = None
    if need_x or need_sinks:
        dx, ds = _call_backward(grad, y, x if a.softcap is not None else None, mask, sinks, p, a)
        if need_x:
            d_x = dx.to(x_dtype)
        if need_sinks:
            d_sinks = ds.sum_to_size(sinks.shape).to(sinks.dtype)
    if need_mask and mask is not None and mask.dtype.is_floating_point:
        acc = acc_dtype(y.dtype)
        _, _, dz = fused_backward(grad, y, None, Variant(mask=a.variant.mask, mask_kind=MASK_ADDITIVE,
                                                         causal=a.variant.causal, sinks=a.variant.sinks), a.dim,
                                  a.log, mask, None, acc, want_dz=True)
        d_mask = dz.sum_to_size(mask.shape).to(mask.dtype)
    return d_x, d_mask, d_sinks


class _FusedSoftmax(torch.autograd.Function):
    """The fused family through its operator, with reverse, forward and vmap rules."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, mask, sinks, dim, dtype, scale, softcap, causal, empty_rows, log, backend):
        return forward_op(x, mask, sinks, dim, dtype, scale, softcap, causal, empty_rows, log, backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, mask, sinks, dim, dtype, scale, softcap, causal, empty_rows, log, backend = inputs
        y, p = output
        ctx.mark_non_differentiable(p)
        ctx.args = Args(x.shape, x.device, dim, dtype, scale, softcap, causal, empty_rows, log, backend, mask, sinks)
        ctx.x_dtype = x.dtype
        saved = (y, p, x if softcap is not None else None, mask, sinks)
        ctx.save_for_backward(*saved)
        ctx.save_for_forward(*saved)

    @staticmethod
    def backward(ctx, grad, _grad_p):
        y, p, x, mask, sinks = ctx.saved_tensors
        d_x, d_mask, d_sinks = input_grads(grad, y, p, x, mask, sinks, ctx.args, ctx.x_dtype, ctx.needs_input_grad[:3])
        return d_x, d_mask, d_sinks, None, None, None, None, None, None, None, None

    @staticmethod
    def jvp(ctx, tx, tmask, tsinks, *_):
        y, p, x, mask, sinks = ctx.saved_tensors
        refuse_forward_over_forward()
        ty = output_tangent(tx, tmask, tsinks, y, p if sinks is not None else None, x, mask, ctx.args)
        return ty, None


class _FusedBackward(torch.autograd.Function):
    """`softmax_fused_backward` through its operator, differentiable again (through
    `_backward_formula`) in every mode."""

    generate_vmap_rule = True

    @staticmethod
    def forward(grad, y, x, mask, sinks, p, dim, scale, softcap, causal, empty_rows, log, backend):
        return backward_op(grad, y, x, mask, sinks, p, dim, scale, softcap, causal, empty_rows, log, backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        grad, y, x, mask, sinks, p, dim, scale, softcap, causal, empty_rows, log, backend = inputs
        ctx.args = Args(y.shape, y.device, dim, None, scale, softcap, causal, empty_rows, log, backend, mask, sinks)
        ctx.has_sinks = sinks is not None
        saved = (grad, y, x, mask, p)
        ctx.save_for_backward(*saved)
        ctx.save_for_forward(*saved)

    @staticmethod
    def _formula(ctx):
        a, has_sinks = ctx.args, ctx.has_sinks
        grad, y, x, mask, p = ctx.saved_tensors

        def f(g_, y_, x_):
            return _backward_formula(g_, y_, x_, p if has_sinks else None, mask, a)
        return f, grad, y, x

    @staticmethod
    def backward(ctx, gdx, gds):
        f, grad, y, x = _FusedBackward._formula(ctx)
        primals = (grad, y, x if x is not None else torch.zeros_like(y))
        _, vjp = torch.func.vjp(f, *primals)
        gds = torch.zeros_like(vjp_out_like(y, ctx)) if gds is None else gds
        d_grad, d_y, d_x = vjp((gdx if gdx is not None else torch.zeros_like(y), gds))
        return d_grad, d_y, (d_x if x is not None else None), None, None, None, None, None, None, None, None, None, None

    @staticmethod
    def jvp(ctx, t_grad, t_y, t_x, *_):
        refuse_forward_over_forward()
        f, grad, y, x = _FusedBackward._formula(ctx)
        primals = (grad, y, x if x is not None else torch.zeros_like(y))
        tangents = tuple(torch.zeros_like(pr) if t is None else t for pr, t in zip(primals, (t_grad, t_y, t_x)))
        # J t by reverse mode twice (the vjp is linear in its cotangent u, so the vjp of
        # u -> J^T u is J t): forward mode cannot nest inside torch's forward AD here.
        out, vjp = torch.func.vjp(f, *primals)
        u0 = tuple(torch.zeros_like(o) for o in out)
        _, vjp_of_vjp = torch.func.vjp(lambda *u: vjp(u), *u0)
        return vjp_of_vjp(tangents)


def vjp_out_like(y: torch.Tensor, ctx) -> torch.Tensor:
    """A tensor shaped like the backward's second output (per-row dsinks, or [..., 0])."""
    if ctx.has_sinks:
        return torch.empty(ops.row_shape(y.shape, ctx.args.dim), dtype=acc_dtype(y.dtype), device=y.device)
    return _no_rows(y)


def op_arguments(scale, softcap, causal):
    """(scale, softcap, causal) as the operators' schema takes them: floats or None (validated)
    and the causal form's name."""
    s, c = runtime_values(scale, softcap)
    return (None if scale is None else s), (None if softcap is None else c), causal_name(causal)


def fused_softmax(x, dim, dtype, backend, log, mask, sinks, scale, softcap, causal, empty_rows) -> torch.Tensor:
    """Differentiable fused softmax: what `anysoftmax.softmax` runs in eager mode when a
    derivative may be wanted."""
    scale, softcap, causal = op_arguments(scale, softcap, causal)
    y, _ = _FusedSoftmax.apply(x, mask, sinks, dim, dtype, scale, softcap, causal, empty_rows, log, backend)
    return y


def compiled_fused(x, dim, dtype, backend, log, mask, sinks, scale, softcap, causal, empty_rows) -> torch.Tensor:
    """What `anysoftmax.softmax` traces to under torch.compile: the operator (autograd
    registered on it by `anysoftmax.registration`); inside a torch.func transform, the eager
    Function (one graph break), as for the plain operator. A scale or softcap that Dynamo
    traces as a symbol is applied before the operator (`traced_temperature`)."""
    if _functorch_active():
        return _eager_fused(x, dim, dtype, backend, log, mask, sinks, scale, softcap, causal, empty_rows)
    if traced_as_symbols(scale, softcap):
        out_dtype = x.dtype if dtype is None else dtype
        z = scaled_logits(x, out_dtype, scale, softcap, mask, causal)
        y, _ = ops.softmax_fused_op(z, mask, sinks, dim, None, None, None, causal_name(causal), empty_rows, log,
                                    backend)
        return y.to(out_dtype)
    scale, softcap, causal = op_arguments(scale, softcap, causal)
    y, _ = ops.softmax_fused_op(x, mask, sinks, dim, dtype, scale, softcap, causal, empty_rows, log, backend)
    return y


@torch._dynamo.disable
def _eager_fused(*args):
    return fused_softmax(*args)


# ---- what the operators' own registrations call (`anysoftmax.registration`) ------------------

def setup_fused(ctx, inputs, output):
    """setup_context of the `softmax_fused` operator's registered autograd."""
    x, mask, sinks, dim, dtype, scale, softcap, causal, empty_rows, log, backend = inputs
    y, p = output
    ctx.args = Args(x.shape, x.device, dim, dtype, scale, softcap, causal, empty_rows, log, backend, mask, sinks)
    ctx.x_dtype = x.dtype
    ctx.save_for_backward(y, p, x if softcap is not None else None, mask, sinks)


def op_fused_backward(ctx, grad, _grad_p):
    """Backward of the `softmax_fused` operator (torch.compile, direct torch.ops calls)."""
    y, p, x, mask, sinks = ctx.saved_tensors
    d_x, d_mask, d_sinks = input_grads(grad, y, p, x, mask, sinks, ctx.args, ctx.x_dtype, ctx.needs_input_grad[:3])
    return d_x, d_mask, d_sinks, None, None, None, None, None, None, None, None


def setup_fused_backward(ctx, inputs, output):
    """setup_context of the `softmax_fused_backward` operator's registered autograd."""
    grad, y, x, mask, sinks, p, dim, scale, softcap, causal, empty_rows, log, backend = inputs
    ctx.args = Args(y.shape, y.device, dim, None, scale, softcap, causal, empty_rows, log, backend, mask, sinks)
    ctx.has_sinks = sinks is not None
    ctx.save_for_backward(grad, y, x, mask, p)


def op_fused_backward_backward(ctx, gdx, gds):
    """Backward of the `softmax_fused_backward` operator: double backward (torch ops)."""
    return _FusedBackward.backward(ctx, gdx, gds)


__all__ = ["compiled_fused", "fused_softmax", "input_grads", "op_fused_backward", "op_fused_backward_backward",
           "output_tangent", "setup_fused", "setup_fused_backward"]
