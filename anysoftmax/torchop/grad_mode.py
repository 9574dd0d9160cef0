"""Whether a call must be differentiable: checked on every eager call, so it imports nothing
heavy (the operators and their autograd, which pull in torch._dynamo and Triton, are loaded
only when a derivative is wanted; see `api.softmax`)."""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwad
from torch._C._functorch import is_functorch_wrapped_tensor


def wants_autodiff(*tensors: torch.Tensor) -> bool:
    """True when a call on `tensors` must be differentiable: a tensor needs a gradient, a
    torch.func transform wraps one, or a forward-AD level is open (dual tensors)."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return True
    return _fwad._current_level >= 0 or any(is_functorch_wrapped_tensor(t) for t in tensors)
