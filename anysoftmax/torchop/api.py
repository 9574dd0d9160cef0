"""Public functions: `softmax` and `log_softmax`, drop-ins for `torch.softmax` / `F.softmax` (and the log
forms) plus the fused family's keywords; their signatures as torch's (docs/usage.md, "Functions")."""

from __future__ import annotations

import torch

from .. import dispatch
from .grad_mode import plain_eager, plain_eager_one


def _normalise(name: str, input, dim, dtype, stacklevel):
    if isinstance(dtype, int) and not isinstance(dtype, bool):  # F.softmax(x, dim, _stacklevel, dtype)
        stacklevel, dtype = dtype, (stacklevel if isinstance(stacklevel, torch.dtype) else None)
    if dim is None:
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"{name}: input must be a torch.Tensor, got {type(input).__name__}")
        # torch's own rule and deprecation warning (F.softmax: dim 0 for 0-, 1- and 3-d inputs, else 1)
        dim = torch.nn.functional._get_softmax_dim(name, input.dim(), stacklevel + 1)
    return dim, dtype


def _fused(input, dim, dtype, log, mask, sinks, scale, softcap, causal, empty_rows, backend):
    # Eager inference straight to dispatch; derivatives, torch.compile, tensor subclasses (a plain call's
    # too) through the operators' autograd, loaded on first need (they load torch._dynamo and Triton;
    # `import anysoftmax` leaves the interpreter choice open).
    if plain_eager(input, mask, sinks, scale):
        return dispatch.forward_fused(input, dim, dtype, backend, log,
                                      dispatch.FusedArgs(scale, mask, causal, softcap, sinks, empty_rows))[0]
    from . import autodiff, registration  # noqa: F401  (registers the operators' autograd)

    return autodiff.softmax(input, dim, dtype, log, mask, sinks, scale, softcap, causal, empty_rows, backend)


def softmax(input: torch.Tensor, dim: int | None = None, dtype: torch.dtype | None = None,
            _stacklevel: int = 3, *, scale: float | None = None, mask: torch.Tensor | None = None,
            causal: bool | str = False, softcap: float | None = None, sinks: torch.Tensor | None = None,
            empty_rows: str = "zero", backend: str | None = None) -> torch.Tensor:
    """Softmax of `input` along `dim`, as `torch.softmax(input, dim, dtype=dtype)`; with the
    fused keywords, softmax(softcap(scale * input) + mask, causal) with `sinks` in the
    denominator and `empty_rows` for rows the mask leaves empty (`anysoftmax.core.variant`).

    `mask`: bool (True = excluded) or floating (added), broadcastable to `input`; `causal`:
    True/"top_left" or "bottom_right"; `softcap` > 0; `sinks`: one logit per row; `empty_rows`:
    "zero", "nan" or "uniform". `backend` names a backend (else $ANYSOFTMAX_BACKEND or the
    automatic choice)."""
    if dim is None or type(dtype) is int:
        dim, dtype = _normalise("softmax", input, dim, dtype, _stacklevel)
    # Eager inference goes straight to dispatch: the hot path (plain_eager is constant under torch.compile).
    if scale is None and mask is None and causal is False and softcap is None and sinks is None \
            and empty_rows == "zero" and plain_eager_one(input):
        return dispatch.forward(input, dim, dtype, backend, False)
    return _fused(input, dim, dtype, False, mask, sinks, scale, softcap, causal, empty_rows, backend)


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
            and empty_rows == "zero" and plain_eager_one(input):  # (the hot path, as in `softmax`)
        return dispatch.forward(input, dim, dtype, backend, True)
    return _fused(input, dim, dtype, True, mask, sinks, scale, softcap, causal, empty_rows, backend)


def softmax_backward(y: torch.Tensor, grad: torch.Tensor, dim: int, *, log: bool = False,
                     backend: str | None = None) -> torch.Tensor:
    """Gradient of softmax (log_softmax with `log=True`) w.r.t. its input, given the forward output
    `y` and the output gradient `grad`: y * (grad - sum(y * grad)) along `dim`, in y's dtype."""
    if plain_eager(y, grad):
        return dispatch.backward(y, grad, dim, log, backend)  # (positional: no keyword parsing)
    from . import autodiff, registration  # noqa: F401  (registers the operators' autograd)

    return autodiff.softmax_backward(grad, y, dim, log, backend)
