"""Public functions: `softmax` and `log_softmax`, drop-ins for `torch.softmax` /
`torch.nn.functional.softmax` (and the log forms): same positions, keywords and results.

    anysoftmax.softmax(input, dim=None, dtype=None, *, backend=None)

A third positional argument is `dtype` as in `torch.softmax(x, 1, torch.float32)`; an int there
is `F.softmax`'s `_stacklevel` (then a fourth positional is `dtype`). `dim=None` picks torch's
implicit dim with torch's deprecation warning, as `F.softmax` does.
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwad
from torch._C._functorch import is_functorch_wrapped_tensor

from . import dispatch
from .grad_mode import wants_autodiff


def _implicit_dim(name: str, ndim: int, stacklevel: int) -> int:
    # torch's own rule and warning (F.softmax: dim 0 for 0-, 1- and 3-d inputs, else 1).
    get = getattr(torch.nn.functional, "_get_softmax_dim", None)
    if get is not None:
        return get(name, ndim, stacklevel + 1)
    import warnings
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call to include "
                  f"dim=X as an argument.", stacklevel=stacklevel + 1)
    return 0 if ndim in (0, 1, 3) else 1


def _normalise(name: str, input, dim, dtype, stacklevel):
    if isinstance(dtype, int) and not isinstance(dtype, bool):  # F.softmax(x, dim, _stacklevel, dtype)
        stacklevel, dtype = dtype, (stacklevel if isinstance(stacklevel, torch.dtype) else None)
    if dim is None:
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"{name}: input must be a torch.Tensor, got {type(input).__name__}")
        dim = _implicit_dim(name, input.dim(), stacklevel + 1)
    return dim, dtype


def _run(input, dim, dtype, backend, log: bool) -> torch.Tensor:
    # (is_compiling first: under torch.compile it is a constant, and nothing after it is traced.)
    if not torch.compiler.is_compiling() and type(input) is torch.Tensor and not input.requires_grad \
            and _fwad._current_level < 0 and not is_functorch_wrapped_tensor(input):
        return dispatch.forward(input, dim, dtype, backend, log)  # eager inference: the hot path
    return _run_general(input, dim, dtype, backend, log)


def _run_general(input, dim, dtype, backend, log: bool) -> torch.Tensor:
    # Under torch.compile: the registered operator (autograd attached); when AOTAutograd traces
    # it for a request the triton backend serves, its kernels enter the graph as user-defined
    # Triton kernels (anysoftmax.traced_ops), else it stays opaque.
    # In eager mode, whenever a derivative may be wanted (gradients, forward AD, torch.func):
    # the operator's autograd.Function. Plain eager inference calls dispatch directly and saves
    # the dispatcher's microseconds that small tensors would wait on.
    # (The operators load torch._dynamo and with it Triton: imported on first need, so that
    # `import anysoftmax` leaves the Triton interpreter choice open.)
    if torch.compiler.is_compiling():
        from . import autodiff
        return autodiff.compiled_softmax(input, dim, dtype, backend, log)
    if isinstance(input, torch.Tensor) and wants_autodiff(input):
        from . import autodiff
        return autodiff.softmax(input, dim, dtype, backend, log)
    return dispatch.forward(input, dim, dtype, backend, log)


def softmax(input: torch.Tensor, dim: int | None = None, dtype: torch.dtype | None = None,
            _stacklevel: int = 3, *, backend: str | None = None) -> torch.Tensor:
    """Softmax of `input` along `dim`, as `torch.softmax(input, dim, dtype=dtype)`.

    `backend` names a backend explicitly (see `list_backends()`); otherwise
    $ANYSOFTMAX_BACKEND or the automatic choice for the tensor's device is used.
    """
    if dim is None or type(dtype) is int:
        dim, dtype = _normalise("softmax", input, dim, dtype, _stacklevel)
    return _run(input, dim, dtype, backend, False)


def log_softmax(input: torch.Tensor, dim: int | None = None, dtype: torch.dtype | None = None,
                _stacklevel: int = 3, *, backend: str | None = None) -> torch.Tensor:
    """Log-softmax of `input` along `dim`, as `torch.log_softmax(input, dim, dtype=dtype)`."""
    if dim is None or type(dtype) is int:
        dim, dtype = _normalise("log_softmax", input, dim, dtype, _stacklevel)
    return _run(input, dim, dtype, backend, True)


def softmax_backward(y: torch.Tensor, grad: torch.Tensor, dim: int, *, log: bool = False,
                     backend: str | None = None) -> torch.Tensor:
    """Gradient of softmax (log_softmax with `log=True`) w.r.t. its input, given the forward
    output `y` and the output gradient `grad`: y * (grad - sum(y * grad)) along `dim`, in
    y's dtype."""
    # Inline checks, as in `_run` (a helper call costs ~1.5 us per call on small tensors):
    # eager without autodiff goes straight to dispatch; otherwise the operator, which is
    # traceable (fake implementation) and differentiable (double backward).
    try:
        plain = not torch.compiler.is_compiling() \
            and not (torch.is_grad_enabled() and (y.requires_grad or grad.requires_grad)) \
            and _fwad._current_level < 0 and not is_functorch_wrapped_tensor(y) and not is_functorch_wrapped_tensor(grad)
    except (AttributeError, TypeError):  # not tensors: dispatch's validation names the argument
        plain = True
    if plain:
        return dispatch.backward(y, grad, dim, log=log, backend=backend)
    from . import ops
    return ops.softmax_backward_op(grad, y, dim, log, backend)
