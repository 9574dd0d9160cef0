"""Shared test helpers: run a case on a backend and check it against the one reference."""

from __future__ import annotations

import pytest
import torch

import anysoftmax
from anysoftmax.core import SoftmaxSpec
from anysoftmax.core.layout import allocate_rows
from anysoftmax.dispatch import prepare
from anysoftmax.testing import check_backward, check_forward


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


def check(x: torch.Tensor, dim: int, *, backend: str, log: bool, dtype=None) -> str | None:
    """Run softmax/log_softmax on `x` with `backend` and assert it matches the reference (the
    kit's `check_forward`); returns the backend's declared refusal (after checking that it was
    raised as UnsupportedRequestError), or None when it ran."""
    return check_forward(x, dim, backend=backend, log=log, dtype=dtype)


def skip_if_refused(refusal: str | None) -> None:
    """A declared refusal (a check's return value) is a skip with the backend's reason, never a
    pass: nothing was computed."""
    if refusal is not None:
        pytest.skip(f"declared refusal: {refusal}")


def kit_params(backends, device: str, **marks) -> list:
    """(backend, check) pytest params: the kit's checks (`anysoftmax.testing.conformance_checks`)
    for each backend on `device`, ids '<backend>-<check name>'."""
    from anysoftmax.testing import conformance_checks

    return [pytest.param(b, c, id=f"{b}-{c.name}".replace(" ", "-"), **marks)
            for b in backends for c in conformance_checks(b, device=device)]


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
                  backward: bool = True) -> str | None:
    """A fused-family call on `x` with `backend`: the forward against the float64 reference and,
    with `backward`, dx, dsinks and a floating mask's gradient (the kit's `check_forward` and
    `check_backward`); returns the declared refusal, or None when it ran."""
    refusal = check_forward(x, dim, backend=backend, log=log, dtype=dtype, fused=kwargs)
    if refusal is None and backward:
        check_backward(x, dim, backend=backend, log=log, dtype=dtype, fused=kwargs)
    return refusal


def params(cases):
    """(case, dtype) pairs of `anysoftmax.testing.cases` as pytest params with readable ids."""
    return [pytest.param(c, d, id=f"{c.name}-{str(d).removeprefix('torch.')}") for c in cases for d in c.dtypes]


variant_params = params
