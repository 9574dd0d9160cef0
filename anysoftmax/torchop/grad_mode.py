"""Which path a call takes, and the eager form of an autograd.Function: checked on every eager
call, so it imports nothing heavy (the operators and their autograd load on first need)."""

from __future__ import annotations

import operator

import torch
import torch.autograd.forward_ad as _fwad
from torch._C._functorch import TransformType, get_interpreter_stack, is_functorch_wrapped_tensor, \
    peek_interpreter_stack

_Tensor, _Parameter = torch.Tensor, torch.nn.Parameter
_PLAIN_TYPES = frozenset((_Tensor, _Parameter))
_needs_grad = operator.attrgetter("requires_grad")
_is_compiling, _grad_enabled = torch.compiler.is_compiling, torch.is_grad_enabled


def eager_mode() -> bool:
    """Whether calls run eagerly: not compiling, no forward-AD level open (`plain_eager`'s mode part)."""
    return not _is_compiling() and _fwad._current_level < 0


def plain_eager(*tensors, gradients: bool = True) -> bool:
    """Whether a call on `tensors` (None where absent) may run dispatch directly: eager (not
    compiling, no forward-AD level), every tensor a plain one (fake and functional ones, which
    AOTAutograd traces with while `is_compiling()` is False, and functorch-wrapped ones need the
    operators) and, with `gradients`, none that needs a gradient. A non-tensor counts as plain."""
    if _is_compiling() or _fwad._current_level >= 0:
        return False
    # (grad mode once: under no_grad / inference_mode no tensor's requires_grad is read)
    grad = gradients and _grad_enabled()
    if len(tensors) > 2 and _PLAIN_TYPES.issuperset(map(type, tensors)):
        # Every one a plain tensor (merge_states' K partials and lses): the checks as C loops,
        # a third of the Python loop's cost at 16 tensors.
        if grad and any(map(_needs_grad, tensors)):
            return False
        return peek_interpreter_stack() is None or not any(map(is_functorch_wrapped_tensor, tensors))
    wrapped = peek_interpreter_stack() is not None
    for t in tensors:
        if type(t) is _Tensor or type(t) is _Parameter:
            if (grad and t.requires_grad) or (wrapped and is_functorch_wrapped_tensor(t)):
                return False
        elif t is not None and isinstance(t, _Tensor):
            return False
    return True


def plain_eager_one(t) -> bool:
    """`plain_eager(t)` for one operand, without the varargs loop: the plain softmax's check."""
    if _is_compiling() or _fwad._current_level >= 0:
        return False
    if type(t) is not _Tensor:
        return plain_eager(t)
    return not ((_grad_enabled() and t.requires_grad) or
                (peek_interpreter_stack() is not None and is_functorch_wrapped_tensor(t)))


def transform_active() -> bool:
    """Whether a torch.func transform is running."""
    return peek_interpreter_stack() is not None


def wants_autodiff(*tensors) -> bool:
    """True when a call on `tensors` must be differentiable (a gradient, a transform, forward AD)."""
    return (_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)) or _fwad._current_level >= 0 \
        or any(t is not None and is_functorch_wrapped_tensor(t) for t in tensors)


def eager_form(function: type) -> type:
    """`function` (an autograd.Function with `setup_context`) for eager autograd outside torch.func:
    a forward that takes ctx, so `apply` skips binding its arguments through `inspect.signature`."""

    class Eager(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            output = function.forward(*inputs)
            function.setup_context(ctx, inputs, output)
            return output

        backward = staticmethod(function.backward)
        jvp = staticmethod(function.jvp)

    Eager.__name__ = Eager.__qualname__ = f"Eager{function.__name__}"
    return Eager


def refuse_forward_over_forward() -> None:
    """Raise under nested forward-mode transforms: torch runs an autograd.Function's jvp with
    forward AD off, so jacfwd(jacfwd(f)) would be silently zero (any Function, torch 2.13)."""
    if sum(ci.key() == TransformType.Jvp for ci in get_interpreter_stack() or ()) > 1:
        raise NotImplementedError(
            "anysoftmax: forward-mode over forward-mode differentiation (e.g. jacfwd(jacfwd(f))) "
            "is not supported: torch.autograd.Function jvps are not forward-differentiable; use "
            "reverse mode for the inner derivative (jacfwd(jacrev(f)), torch.func.hessian)")
