"""NaN-poisoned allocations: an output element a backend forgets to write reads as NaN.

`torch.empty` hands back whatever the memory held, and stale memory often holds the right
answer of the previous call (same shape, same data): a kernel that skips a tail, a row or a
whole tile can pass every comparison. While `poisoned_allocations()` is active, every floating
tensor made by `torch.empty`, `empty_like`, `empty_strided`, `empty_permuted`,
`Tensor.new_empty` or `Tensor.new_empty_strided` is filled with NaN, whichever backend (built-in
or third-party) allocates it, so an unwritten element fails the comparison. Integer scratch
(counters, barriers) is left alone: a kernel must zero it itself, and NaN has no integer form.

($ANYSOFTMAX_POISON_OUTPUTS=1, read at import, does the same for outputs allocated through
`anysoftmax.core.layout.new_output`; the project's test suite sets it. This mode needs no
environment and covers backends that allocate with torch directly.)
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

_ALLOCATORS = frozenset(f for f in (
    torch.empty, torch.empty_like, torch.empty_strided, getattr(torch, "empty_permuted", None),
    torch.Tensor.new_empty, torch.Tensor.new_empty_strided) if f is not None)


class poisoned_allocations(TorchFunctionMode):
    """A context manager (a TorchFunctionMode): floating tensors from the `torch.empty`
    family start as NaN inside it. Calls inside the handler are not intercepted again."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _ALLOCATORS and isinstance(out, torch.Tensor) and out.dtype.is_floating_point \
                and out.device.type != "meta":
            out.fill_(float("nan"))
        return out
