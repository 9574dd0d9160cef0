"""Shared test helpers: run a case on a backend and check it against the one reference."""

from __future__ import annotations

import pytest
import torch

import anysoftmax
from anysoftmax.dispatch import prepare
from anysoftmax.core import SoftmaxSpec, compare
from anysoftmax.core.layout import allocate_rows


def runnable_backends(device_type: str) -> list[str]:
    """Backends that can run tensors of `device_type` on this machine (explicit choice)."""
    names = []
    for status in anysoftmax.list_backends():
        if not status.available:
            continue
        probe = SoftmaxSpec.from_tensor(torch.empty(2, 2, device=device_type), 1)
        if anysoftmax.get_backend(status.name).supports(probe) is None:
            names.append(status.name)
    return names


def as_backend_sees_it(x: torch.Tensor, dim: int, dtype=None, log: bool = False) -> tuple:
    """(x, y, layout, spec) of a request as `run` receives and lays it out: validated and
    converted by the API (`prepare`), output allocated and rows described (`allocate_rows`)."""
    x, spec = prepare(x, dim, dtype, log)
    x, y, layout = allocate_rows(x, spec)
    return x, y, layout, spec


def check(x: torch.Tensor, dim: int, *, backend: str, log: bool, dtype=None) -> None:
    """Run softmax/log_softmax on `x` with `backend` and assert it matches the reference."""
    fn = anysoftmax.log_softmax if log else anysoftmax.softmax
    spec = SoftmaxSpec.from_tensor(x, dim, dtype, log=log)
    refusal = anysoftmax.get_backend(backend).supports(prepare(x, dim, dtype, log)[1])
    if refusal is not None:
        # A declared limit (e.g. no float64 on NPUs) must be a clear error, never a wrong result.
        with pytest.raises(anysoftmax.UnsupportedRequestError, match=backend):
            fn(x, dim, dtype=dtype, backend=backend)
        return
    out = fn(x, dim, dtype=dtype, backend=backend)
    result = compare(out, x, spec)
    assert result.ok, f"{backend} {spec.describe()}: {result.detail}"


class StubBackend:
    """A test backend: available, supports everything, serves CPU tensors; subclasses override."""

    name = "stub"
    devices = ("cpu",)
    priority = -1

    def is_available(self):
        return None

    def supports(self, spec):
        return None

    def run(self, x, spec):
        raise NotImplementedError


def backend_devices() -> list:
    """(backend, device) pairs: the backends runnable on CPU tensors here, and on CUDA tensors
    those runnable there, marked `gpu` (skipped with the reason on a machine without CUDA)."""
    pairs = [(b, "cpu") for b in runnable_backends("cpu")]
    cuda = runnable_backends("cuda") if torch.cuda.is_available() else ["torch", "triton"]
    return pairs + [pytest.param(b, "cuda", marks=pytest.mark.gpu) for b in cuda]


def check_variant(x: torch.Tensor, dim: int, kwargs: dict, *, backend: str, log: bool, dtype=None,
                  backward: bool = True) -> None:
    """Run a fused-family call on `x` with `backend` and assert it matches the float64
    reference forward (`core.compare.compare`) and, with `backward`, that dx, dsinks and a
    floating mask's gradient match the float64 formulas (`compare_fused_backward`)."""
    from anysoftmax.core.compare import compare_fused_backward
    from anysoftmax.core.reference import fused_backward, fused_forward

    fn = anysoftmax.log_softmax if log else anysoftmax.softmax
    spec, _ = SoftmaxSpec.from_request(x, dim, dtype, log=log, fused=kwargs)
    prepared = prepare(x, dim, dtype, log)[1].with_variant(spec.variant)
    refusal = anysoftmax.get_backend(backend).supports(prepared)
    if refusal is not None:
        with pytest.raises(anysoftmax.UnsupportedRequestError, match=backend):
            fn(x, dim, dtype=dtype, backend=backend, **kwargs)
        return
    mask, sinks = kwargs.get("mask"), kwargs.get("sinks")
    out = fn(x, dim, dtype=dtype, backend=backend, **kwargs)
    result = compare(out, x, spec, mask=mask, sinks=sinks)
    assert result.ok, f"{backend} {spec.describe()}: {result.detail}"
    if not backward or not x.dtype.is_floating_point or x.numel() == 0:
        return
    xg = x.detach().clone().requires_grad_()
    kw = dict(kwargs)
    wants = [xg]
    if sinks is not None:
        kw["sinks"] = sinks.detach().clone().requires_grad_()
        wants.append(kw["sinks"])
    additive = mask is not None and mask.dtype.is_floating_point
    if additive:
        kw["mask"] = mask.detach().clone().requires_grad_()
        wants.append(kw["mask"])
    y = fn(xg, dim, dtype=dtype, backend=backend, **kw)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(int(x.numel()) + 7), dtype=torch.float64)
    g = g.to(y.device)
    grads = torch.autograd.grad(y, wants, g.to(y.dtype))
    ds = grads[1] if sinks is not None else None
    result = compare_fused_backward(grads[0], y.detach(), g.to(y.dtype), x, spec, mask, sinks, ds)
    assert result.ok, f"{backend} backward {spec.describe()}: {result.detail}"
    if additive:
        # A floating mask receives the gradient of the logits, summed over its broadcast dims.
        y64 = y.detach().to(torch.float64)
        x64 = x.detach().to(spec.out_dtype).to(torch.float64)
        _, p = fused_forward(x64, spec.variant, spec.dim, log, mask, sinks, torch.float64)
        _, _, dz = fused_backward(g.to(y.dtype).to(torch.float64), y64, x64, spec.variant, spec.dim, log, mask, p,
                                  torch.float64, want_dz=True)
        want = dz.sum_to_size(mask.shape)
        scale = y64.abs().nan_to_num() * (g.abs() + 2 * (y64.abs().nan_to_num() * g.abs()).sum(spec.dim, keepdim=True))
        if log:
            scale = g.abs() + y64.exp() * g.sum(spec.dim, keepdim=True).abs() * (1 + y64.nan_to_num(neginf=0).abs())
        tol = spec.tolerance
        fi = torch.finfo(mask.dtype)  # the gradient is rounded to the mask's dtype (subnormals included)
        bound = (tol.atol + tol.rtol * scale).sum_to_size(mask.shape) + fi.eps * want.abs() + fi.tiny * fi.eps
        err = (grads[-1].to(torch.float64) - want).abs()
        bound = bound.to(err.device)
        assert bool((err <= bound).all()), f"{backend} mask gradient off by {float((err / bound).max()):.3g}x its bound"
