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
