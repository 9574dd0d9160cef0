"""Public functions: `softmax` and `log_softmax`, drop-ins for `torch.softmax` /
`torch.nn.functional.softmax` (and the log forms): same positions, keywords and results —
plus the fused family's keywords (`core.variant` states what they mean):

    anysoftmax.softmax(input, dim=None, dtype=None, *, scale=None, mask=None, causal=False,
                       softcap=None, sinks=None, empty_rows="zero", backend=None)

A third positional argument is `dtype` as in `torch.softmax(x, 1, torch.float32)`; an int there
is `F.softmax`'s `_stacklevel` (then a fourth positional is `dtype`). `dim=None` picks torch's
implicit dim with torch's deprecation warning, as `F.softmax` does.
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwad
from torch._C._functorch import is_functorch_wrapped_tensor

from .. import dispatch
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
        from . import autodiff, registration  # noqa: F401  (registers the operators' autograd)
        return autodiff.compiled_softmax(input, dim, dtype, backend, log)
    if isinstance(input, torch.Tensor) and wants_autodiff(input):
        from . import autodiff, registration  # noqa: F401
        return autodiff.softmax(input, dim, dtype, backend, log)
    return dispatch.forward(input, dim, dtype, backend, log)


def _run_fused(input, dim, dtype, backend, log: bool, a: dispatch.FusedArgs) -> torch.Tensor:
    # The fused family: its own operators (they also return the rows' sink shares, which the
    # sinks' gradient needs), otherwise routed like the plain ones.
    if torch.compiler.is_compiling():
        from . import fused_autodiff, registration  # noqa: F401
        return fused_autodiff.compiled_fused(input, dim, dtype, backend, log, a.mask, a.sinks, a.scale, a.softcap,
                                             a.causal, a.empty_rows)
    operands = [t for t in (input, a.mask, a.sinks) if isinstance(t, torch.Tensor)]
    if isinstance(input, torch.Tensor) and wants_autodiff(*operands):
        from . import fused_autodiff, registration  # noqa: F401
        return fused_autodiff.fused_softmax(input, dim, dtype, backend, log, a.mask, a.sinks, a.scale, a.softcap,
                                            a.causal, a.empty_rows)
    return dispatch.forward_fused(input, dim, dtype, backend, log, a)[0]


def softmax(input: torch.Tensor, dim: int | None = None, dtype: torch.dtype | None = None,
            _stacklevel: int = 3, *, scale: float | None = None, mask: torch.Tensor | None = None,
            causal: bool | str = False, softcap: float | None = None, sinks: torch.Tensor | None = None,
            empty_rows: str = "zero", backend: str | None = None) -> torch.Tensor:
    """Softmax of `input` along `dim`, as `torch.softmax(input, dim, dtype=dtype)`; with the
    fused keywords, softmax(softcap(scale * input) + mask, causal) with `sinks` in the
    denominator and `empty_rows` for rows the mask leaves empty (`anysoftmax.core.variant`).

    `mask`: bool (True = excluded) or floating (added), broadcastable to `input`; `causal`:
    True/"top_left" or "bottom_right" over the last two dims; `softcap` > 0; `sinks`: one
    logit per row, broadcasting against `input` with size 1 in `dim`; `empty_rows`: "zero",
    "nan" or "uniform". `backend` names a backend explicitly (see `list_backends()`);
    otherwise $ANYSOFTMAX_BACKEND or the automatic choice for the tensor's device is used.
    """
    if dim is None or type(dtype) is int:
        dim, dtype = _normalise("softmax", input, dim, dtype, _stacklevel)
    if scale is None and mask is None and causal is False and softcap is None and sinks is None \
            and empty_rows == "zero":
        # Eager inference goes straight to dispatch: the hot path, tested inline (a helper
        # would be one more frame per call). (is_compiling first: under torch.compile it is a
        # constant, and nothing after it is traced.)
        if not torch.compiler.is_compiling() and type(input) is torch.Tensor and not input.requires_grad \
                and _fwad._current_level < 0 and not is_functorch_wrapped_tensor(input):
            return dispatch.forward(input, dim, dtype, backend, False)
        return _run_general(input, dim, dtype, backend, False)
    return _run_fused(input, dim, dtype, backend, False,
                      dispatch.FusedArgs(scale, mask, causal, softcap, sinks, empty_rows))


def log_softmax(input: torch.Tensor, dim: int | None = None, dtype: torch.dtype | None = None,
                _stacklevel: int = 3, *, scale: float | None = None, mask: torch.Tensor | None = None,
                causal: bool | str = False, softcap: float | None = None, sinks: torch.Tensor | None = None,
                empty_rows: str = "zero", backend: str | None = None) -> torch.Tensor:
    """Log-softmax of `input` along `dim`, as `torch.log_softmax(input, dim, dtype=dtype)`;
    the fused keywords as in `softmax` (log forms: excluded positions -inf, empty rows -inf /
    NaN / -log N)."""
    if dim is None or type(dtype) is int:
        dim, dtype = _normalise("log_softmax", input, dim, dtype, _stacklevel)
    if scale is None and mask is None and causal is False and softcap is None and sinks is None \
            and empty_rows == "zero":
        # Eager inference goes straight to dispatch: the hot path, tested inline (a helper
        # would be one more frame per call). (is_compiling first: under torch.compile it is a
        # constant, and nothing after it is traced.)
        if not torch.compiler.is_compiling() and type(input) is torch.Tensor and not input.requires_grad \
                and _fwad._current_level < 0 and not is_functorch_wrapped_tensor(input):
            return dispatch.forward(input, dim, dtype, backend, True)
        return _run_general(input, dim, dtype, backend, True)
    return _run_fused(input, dim, dtype, backend, True,
                      dispatch.FusedArgs(scale, mask, causal, softcap, sinks, empty_rows))


def softmax_backward(y: torch.Tensor, grad: torch.Tensor, dim: int, *, log: bool = False,
                     backend: str | None = None) -> torch.Tensor:
    """Gradient of softmax (log_softmax with `log=True`) w.r.t. its input, given the forward
    output `y` and the output gradient `grad`: y * (grad - sum(y * grad)) along `dim`, in
    y's dtype."""
    # Inline checks, as in `softmax` (a helper call costs ~1.5 us per call on small tensors):
    # eager without autodiff goes straight to dispatch; otherwise the operator, which is
    # traceable (fake implementation) and differentiable (double backward).
    try:
        plain = not torch.compiler.is_compiling() \
            and not (torch.is_grad_enabled() and (y.requires_grad or grad.requires_grad)) \
            and _fwad._current_level < 0 and not is_functorch_wrapped_tensor(y) and not is_functorch_wrapped_tensor(grad)
    except (AttributeError, TypeError):  # not tensors: dispatch's validation names the argument
        plain = True
    if plain:
        return dispatch.backward(y, grad, dim, log, backend)  # (positional: no keyword parsing)
    from . import ops, registration  # noqa: F401  (registers the operators' autograd)
    return ops.softmax_backward_op(grad, y, dim, log, backend)
