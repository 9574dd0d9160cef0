"""Derivatives of anysoftmax's operators in every autograd mode torch has.

* Reverse mode: softmax/log_softmax differentiate to the `softmax_backward` operator, and that
  operator differentiates in turn (double backward, hessians) with torch's own formula.
* Forward mode (`torch.autograd.forward_ad`, `torch.func.jvp`/`jacfwd`): the jvp rules below.
* torch.func (grad, vjp, jacrev, jacfwd, hessian, vmap of them).

Why two `torch.autograd.Function`s beside `register_autograd`: in torch 2.13 an operator's
`register_autograd` builds an autograd.Function with neither `setup_context` (functorch's
transforms refuse it) nor `jvp` (no forward mode), and `torch.library` has no forward-mode
registration. So every formula is written once here, as a function; the Functions (eager
autograd and torch.func) and the operators' registrations (what `torch.compile` traces; dynamo
cannot trace a Function with a custom jvp) both call them. The Functions' forwards are the
operators, so every path still runs the one backend implementation.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.autograd.forward_ad as _fwad
from torch._C._functorch import TransformType, get_interpreter_stack, is_functorch_wrapped_tensor

from . import ops
from .grad_mode import wants_autodiff
from ..core.reference import backward_from_output

_NARROW = (torch.float16, torch.bfloat16)


@torch._dynamo.assume_constant_result
def _functorch_active() -> bool:
    # Is any torch.func transform running? Evaluated once while dynamo traces (it cannot trace
    # the functorch query itself); dynamo guards compiled graphs on the functorch state anyway.
    return torch._C._functorch.peek_interpreter_stack() is not None


def _wide(t: torch.Tensor) -> torch.Tensor:
    # The formulas' sums accumulate in float32 for 16-bit tensors, like the kernels.
    return t.float() if t.dtype in _NARROW else t


def _rowsum(t: torch.Tensor, dim: int) -> torch.Tensor:
    return t.sum(dim, keepdim=True)


# ---- the formulas ---------------------------------------------------------------------------

def input_grad(grad: torch.Tensor, y: torch.Tensor, dim: int, log: bool,
               backend: Optional[str]) -> torch.Tensor:
    """Gradient w.r.t. softmax's input: the `softmax_backward` operator, differentiable
    itself whenever that is needed."""
    if not torch.compiler.is_compiling() and wants_autodiff(grad, y):
        return _SoftmaxBackward.apply(grad, y, dim, log, backend)
    return ops.softmax_backward_op(grad, y, dim, log, backend)


def refuse_forward_over_forward() -> None:
    # torch runs an autograd.Function's jvp with forward AD switched off, so an enclosing
    # forward-mode transform sees its result as a constant: jacfwd(jacfwd(f)) would silently
    # be zero (true of any autograd.Function in torch 2.13). Refuse it instead.
    if sum(ci.key() == TransformType.Jvp for ci in get_interpreter_stack() or ()) > 1:
        raise NotImplementedError(
            "anysoftmax: forward-mode over forward-mode differentiation (e.g. jacfwd(jacfwd(f))) "
            "is not supported: torch.autograd.Function jvps are not forward-differentiable; use "
            "reverse mode for the inner derivative (jacfwd(jacrev(f)), torch.func.hessian)")


def _formula(grad: torch.Tensor, y: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    # softmax_backward in torch ops. jvp rules use it rather than the operator: an
    # autograd.Function applied inside a jvp re-enters the same functorch level (unbounded
    # recursion under nested transforms), while torch ops nest.
    acc = torch.float64 if y.dtype == torch.float64 else torch.float32
    return backward_from_output(y, grad, dim, log, acc).to(y.dtype)


def output_tangent(t: torch.Tensor, y: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    """jvp of softmax: y * (t - sum(y * t)), i.e. softmax_backward(t, y); of log_softmax:
    t - sum(softmax * t)."""
    t = t.to(y.dtype)
    if not log:
        return _formula(t, y, dim, False)
    p, tw = _wide(y).exp(), _wide(t)
    return (tw - _rowsum(p * tw, dim)).to(y.dtype)


def backward_grads(gdx: torch.Tensor, grad: torch.Tensor, y: torch.Tensor, dim: int, log: bool,
                   backend: Optional[str], need_grad: bool = True, need_y: bool = True):
    """vjp of `softmax_backward(grad, y)` for the incoming gradient `gdx` of its result:
    (gradient w.r.t. grad, gradient w.r.t. y), None where not needed. torch's formulas:
    softmax: (y * (gdx - sum(y * gdx)),  gdx * (grad - sum(y * grad)) - grad * sum(gdx * y));
    log:     (gdx - sum(exp(y) * gdx),   -gdx * exp(y) * sum(grad))."""
    d_grad = d_y = None
    if need_grad and not log:  # the same operator, transposed arguments: reuse the kernel
        d_grad = input_grad(gdx.to(y.dtype), y, dim, False, backend).to(grad.dtype)
    if not (need_y or (need_grad and log)):
        return d_grad, d_y
    dw, yw, gw = _wide(gdx), _wide(y), _wide(grad)
    if log:
        p = yw.exp()
        if need_grad:
            d_grad = (dw - _rowsum(p * dw, dim)).to(grad.dtype)
        if need_y:
            d_y = (-dw * p * _rowsum(gw, dim)).to(y.dtype)
    elif need_y:
        d_y = (dw * (gw - _rowsum(yw * gw, dim)) - gw * _rowsum(dw * yw, dim)).to(y.dtype)
    return d_grad, d_y


def backward_tangent(t_grad: Optional[torch.Tensor], t_y: Optional[torch.Tensor], grad: torch.Tensor,
                     y: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    """jvp of `softmax_backward(grad, y)` for tangents of grad and/or y (None: zero)."""
    out = None
    if t_grad is not None:  # linear in grad
        out = _formula(t_grad.to(y.dtype), y, dim, log)
    if t_y is not None:
        tw, yw, gw = _wide(t_y), _wide(y), _wide(grad)
        if log:
            part = -tw * yw.exp() * _rowsum(gw, dim)
        else:
            part = tw * (gw - _rowsum(yw * gw, dim)) - yw * _rowsum(gw * tw, dim)
        out = part.to(y.dtype) if out is None else out + part.to(y.dtype)
    return out


# ---- autograd.Functions: eager autograd, forward mode and torch.func -------------------------

class _Softmax(torch.autograd.Function):
    """softmax / log_softmax through the operator, with reverse, forward and vmap rules."""

    generate_vmap_rule = True  # the operators have vmap rules (anysoftmax.batching)

    @staticmethod
    def forward(x, dim, dtype, backend, log):
        return (ops.log_softmax_op if log else ops.softmax_op)(x, dim, dtype, backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, dim, _dtype, backend, log = inputs
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)
        ctx.dim, ctx.backend, ctx.log, ctx.x_dtype = dim, backend, log, x.dtype

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return input_grad(grad, y, ctx.dim, ctx.log, ctx.backend).to(ctx.x_dtype), None, None, None, None

    @staticmethod
    def jvp(ctx, t, *_):
        (y,) = ctx.saved_tensors
        refuse_forward_over_forward()
        return output_tangent(t, y, ctx.dim, ctx.log)


class _SoftmaxBackward(torch.autograd.Function):
    """`softmax_backward(grad, y)` through the operator, differentiable again in every mode."""

    generate_vmap_rule = True

    @staticmethod
    def forward(grad, y, dim, log, backend):
        return ops.softmax_backward_op(grad, y, dim, log, backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        grad, y, dim, log, backend = inputs
        ctx.save_for_backward(grad, y)
        ctx.save_for_forward(grad, y)
        ctx.dim, ctx.log, ctx.backend = dim, log, backend

    @staticmethod
    def backward(ctx, gdx):
        grad, y = ctx.saved_tensors
        d_grad, d_y = backward_grads(gdx, grad, y, ctx.dim, ctx.log, ctx.backend,
                                     ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        return d_grad, d_y, None, None, None

    @staticmethod
    def jvp(ctx, t_grad, t_y, *_):
        grad, y = ctx.saved_tensors
        refuse_forward_over_forward()
        return backward_tangent(t_grad, t_y, grad, y, ctx.dim, ctx.log)


def softmax(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], backend: Optional[str],
            log: bool) -> torch.Tensor:
    """Differentiable softmax (log_softmax with `log`): what `anysoftmax.softmax` runs in eager
    mode when `wants_autodiff(x)`."""
    return _Softmax.apply(x, dim, dtype, backend, log)


def compiled_softmax(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], backend: Optional[str],
                     log: bool) -> torch.Tensor:
    """What `anysoftmax.softmax` traces to under torch.compile: the operator (its autograd
    registered; AOTAutograd replaces it by the backend's Triton kernels where `traced_ops` routes
    it, else it stays opaque). Inside a torch.func transform, functorch cannot use an operator's registered
    autograd and dynamo traces neither a custom jvp nor (correctly) a Function's forward under
    torch.func in torch 2.13, so that call runs eagerly: one graph break, torch's results."""
    if _functorch_active():
        return _eager_softmax(x, dim, dtype, backend, log)
    return (ops.log_softmax_op if log else ops.softmax_op)(x, dim, dtype, backend)


@torch._dynamo.disable
def _eager_softmax(x, dim, dtype, backend, log):
    return _Softmax.apply(x, dim, dtype, backend, log)


# ---- what the operators' own registrations call (`anysoftmax.ops`) ---------------------------

def op_forward_backward(ctx, grad, log: bool):
    """Backward of the softmax/log_softmax operator (torch.compile, direct torch.ops calls)."""
    (y,) = ctx.saved_tensors
    return input_grad(grad, y, ctx.dim, log, ctx.backend).to(ctx.x_dtype), None, None, None


def op_backward_backward(ctx, gdx):
    """Backward of the softmax_backward operator: double backward."""
    grad, y = ctx.saved_tensors
    d_grad, d_y = backward_grads(gdx, grad, y, ctx.dim, ctx.log, ctx.backend,
                                 ctx.needs_input_grad[0], ctx.needs_input_grad[1])
    return d_grad, d_y, None, None, None
