"""Public functions: `softmax` and `log_softmax`, drop-in for `torch.softmax` / `torch.log_softmax`."""

from __future__ import annotations

import os
from dataclasses import replace

import torch

from . import autodiff, batching  # noqa: F401  (batching registers the operators' vmap rules)
from .core.cache import BoundedDict
from .core.reference import backward_from_output
from .core.registry import ENV_BACKEND, generation, select
from .core.spec import SoftmaxSpec

# Validated requests -> (spec, backend[, backward spec]): a repeated call with the same shape,
# strides, dtypes, device, dim and backend choice skips validation and selection (tens of
# microseconds of Python that small tensors would otherwise wait on).
_forward_requests: BoundedDict = BoundedDict(maxsize=1024)
_backward_requests: BoundedDict = BoundedDict(maxsize=1024)


def _request_key(t: torch.Tensor, dim, *extra) -> tuple | None:
    # Only plain tensors and real ints: dim=True must still reach validation (True == 1).
    if type(t) is not torch.Tensor or type(dim) is not int:
        return None
    return (t.shape, t.stride(), t.dtype, t.device, dim, *extra, os.environ.get(ENV_BACKEND), generation())


def _backward_with(backend, y: torch.Tensor, grad: torch.Tensor, spec: SoftmaxSpec) -> torch.Tensor:
    """The backend's own backward kernel when it has one, else the formula in torch ops.
    `spec` describes y (its dtype in and out)."""
    run_backward = getattr(backend, "run_backward", None)
    if run_backward is not None and spec.numel:
        return run_backward(y, grad, spec)
    # Accumulated in fp32 (fp64 for fp64) like the forward.
    return backward_from_output(y, grad, spec.dim if y.dim() else 0, spec.log, spec.acc_dtype).to(y.dtype)


def prepare(x, dim, dtype=None, log: bool = False) -> tuple[torch.Tensor, SoftmaxSpec]:
    """Validate a request and return (the input a backend receives, its spec).

    When `dtype=` narrows, torch rounds the input to `dtype` first; that rounding is this one
    host-side copy, and backends only ever see inputs no wider than their output.
    """
    spec = SoftmaxSpec.from_tensor(x, dim, dtype, log=log)
    if spec.needs_input_cast:
        x = x.to(spec.out_dtype)
        spec = replace(spec, in_dtype=x.dtype, strides=tuple(x.stride()))
    return x, spec


def forward_no_grad(x, dim, dtype, backend, log: bool) -> torch.Tensor:
    """Validate, pick the backend and run it (no autograd): the operators' implementation."""
    key = _request_key(x, dim, dtype, backend, log)
    hit = _forward_requests.get(key) if key is not None else None
    if hit is not None:
        spec, chosen = hit
        return chosen.run(x, spec)
    prepared, spec = prepare(x, dim, dtype, log)
    chosen = select(spec, backend)
    if spec.numel == 0:
        return torch.empty(spec.shape, dtype=spec.out_dtype, device=x.device)
    if key is not None and prepared is x:  # (a narrowing dtype= converts x on every call)
        _forward_requests.put(key, (spec, chosen))
    return chosen.run(prepared, spec)


def _run(x, dim, dtype, backend, log: bool) -> torch.Tensor:
    # Under torch.compile go through the registered operator (opaque to the compiler, autograd
    # attached); in eager mode, whenever a derivative may be wanted (gradients, forward AD,
    # torch.func), through the operator's autograd.Function; plain eager inference calls the
    # backend directly and saves the dispatcher's few microseconds on small tensors.
    if torch.compiler.is_compiling():
        return autodiff.compiled_softmax(x, dim, dtype, backend, log)
    if isinstance(x, torch.Tensor) and autodiff.wants_autodiff(x):
        return autodiff.softmax(x, dim, dtype, backend, log)
    return forward_no_grad(x, dim, dtype, backend, log)


def softmax(x: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None,
            backend: str | None = None) -> torch.Tensor:
    """Softmax of `x` along `dim`, as `torch.softmax(x, dim, dtype=dtype)`.

    `backend` names a backend explicitly (see `list_backends()`); otherwise
    $ANYSOFTMAX_BACKEND or the automatic choice for the tensor's device is used.
    """
    return _run(x, dim, dtype, backend, log=False)


def log_softmax(x: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None,
                backend: str | None = None) -> torch.Tensor:
    """Log-softmax of `x` along `dim`, as `torch.log_softmax(x, dim, dtype=dtype)`."""
    return _run(x, dim, dtype, backend, log=True)


def check_backward_args(y, grad, dim, log: bool = False) -> SoftmaxSpec:
    """Validate `softmax_backward`'s arguments (before anything runs) and return y's spec."""
    spec = SoftmaxSpec.from_tensor(y, dim, log=log)
    if not isinstance(grad, torch.Tensor):
        raise TypeError(f"softmax_backward: grad must be a torch.Tensor, got {type(grad).__name__}")
    if grad.shape != y.shape:
        raise ValueError(f"softmax_backward: grad shape {tuple(grad.shape)} must equal the output's shape "
                         f"{tuple(y.shape)}")
    if grad.device != y.device:
        raise ValueError(f"softmax_backward: grad is on {grad.device} but the output is on {y.device}; "
                         f"both must be on one device")
    if not grad.dtype.is_floating_point:
        raise TypeError(f"softmax_backward: grad dtype {grad.dtype} is not floating")
    return spec


def softmax_backward(y: torch.Tensor, grad: torch.Tensor, dim: int, *, log: bool = False,
                     backend: str | None = None) -> torch.Tensor:
    """Gradient of softmax (log_softmax with `log=True`) w.r.t. its input, given the forward
    output `y` and the output gradient `grad`: y * (grad - sum(y * grad)) along `dim`, in
    y's dtype."""
    key = _request_key(y, dim, log, backend)
    if key is not None and type(grad) is torch.Tensor:
        key += (grad.shape, grad.dtype, grad.device)
        hit = _backward_requests.get(key)
        if hit is not None:
            return _backward_with(hit[1], y, grad, hit[0])
    spec = check_backward_args(y, grad, dim, log)
    chosen = select(spec, backend)
    if spec.numel == 0:
        return torch.empty(spec.shape, dtype=y.dtype, device=y.device)
    spec = replace(spec, in_dtype=y.dtype, out_dtype=y.dtype)
    if key is not None and type(grad) is torch.Tensor:
        _backward_requests.put(key, (spec, chosen))
    return _backward_with(chosen, y, grad, spec)
