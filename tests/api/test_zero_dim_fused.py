"""The fused family on 0-dim inputs (a row of one element): the forward of every `empty_rows`
policy with bool and additive masks against the float64 reference and against the same call on
the one-element row, on every backend that takes the fused family (issue 34, bug 3); and double
backward (gradgradcheck in float64) on 0-dim, one-element and ordinary shapes (bug 4)."""

from __future__ import annotations

import math

import pytest
import torch

import anysoftmax
from anysoftmax.core.reference import empty_row_value
from anysoftmax.testing import check_forward
from helpers import FUSED_PROBE, backends_that_run

FUSED_BACKENDS = backends_that_run("cpu", torch.float32, fused=FUSED_PROBE)
FP64_BACKENDS = backends_that_run("cpu", torch.float64, fused=FUSED_PROBE)

# name -> (the mask, what the single element is: "empty" (excluded), "kept", or "nan" (-inf added))
MASKS = {
    "bool-true": (lambda g: torch.tensor(True), "empty"),
    "bool-false": (lambda g: torch.tensor(False), "kept"),
    "additive": (lambda g: torch.randn((), generator=g), "kept"),
    "additive-neginf": (lambda g: torch.tensor(-math.inf), "nan"),
}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool((a == b) | (a.isnan() & b.isnan()))


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("policy", ["zero", "nan", "uniform"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_zero_dim_masked_forward(backend, mask_name, policy, log, gen):
    make, kind = MASKS[mask_name]
    x, mask = torch.randn((), generator=gen), make(gen)
    fn = anysoftmax.log_softmax if log else anysoftmax.softmax
    # the float64 reference (the kit's check: poisoned outputs, input unmodified)
    assert check_forward(x, 0, backend=backend, log=log, fused={"mask": mask, "empty_rows": policy}) is None
    y0 = fn(x, -1, mask=mask, empty_rows=policy, backend=backend)
    assert y0.shape == () and y0.dtype == x.dtype
    # what the definition says for a row of one element
    want = {"empty": empty_row_value(policy, 1, log), "kept": 0.0 if log else 1.0, "nan": math.nan}[kind]
    assert _same(y0, torch.tensor(want, dtype=y0.dtype)), (y0, want)
    # and the same as the one-element row
    y1 = fn(x.reshape(1), 0, mask=mask.reshape(1), empty_rows=policy, backend=backend)
    assert _same(y0, y1[0]), (y0, y1)


def _fused_cases(shape, gen):
    """(name, function of the float64 tensors it differentiates, those tensors)."""
    row = shape[:-1] + (1,) if shape else ()
    x = torch.randn(shape, generator=gen, dtype=torch.float64).requires_grad_()
    sinks = torch.randn(row, generator=gen, dtype=torch.float64).requires_grad_()
    add = torch.randn(shape, generator=gen, dtype=torch.float64).requires_grad_()
    excluded = torch.zeros(shape, dtype=torch.bool)
    if len(shape) > 1:
        excluded[0, 1:] = True  # some excluded positions, no empty row (its output is a constant)
    cases = [
        ("mask-false-0d", lambda f: lambda a: f(a, mask=torch.tensor(False)), (x,)),
        ("bool-mask-empty-rows", lambda f: lambda a: f(a, mask=excluded, empty_rows="uniform"), (x,)),
        ("scale-softcap", lambda f: lambda a: f(a, scale=0.7, softcap=2.0), (x,)),
        ("additive-mask", lambda f: lambda a, m: f(a, mask=m, scale=-1.3), (x, add)),
        ("sinks", lambda f: lambda a, s: f(a, sinks=s, empty_rows="nan"), (x, sinks)),
    ]
    if len(shape) > 1:
        cases.append(("causal", lambda f: lambda a, s: f(a, sinks=s, causal="bottom_right", softcap=3.0), (x, sinks)))
    return cases


@pytest.mark.parametrize("backend", FP64_BACKENDS)
@pytest.mark.parametrize("shape", [(), (1,), (2, 4)], ids=["0-dim", "one-element", "2x4"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_fused_gradgradcheck(backend, shape, log, gen):
    fn = anysoftmax.log_softmax if log else anysoftmax.softmax

    def call(a, **kw):
        return fn(a, -1, backend=backend, **kw)

    for name, make, inputs in _fused_cases(shape, gen):
        if log and len(shape) > 1 and name in ("bool-mask-empty-rows", "causal"):
            continue  # excluded outputs of log_softmax are -inf: no numerical derivative there
        f = make(call)
        assert torch.autograd.gradcheck(f, inputs), name
        assert torch.autograd.gradgradcheck(f, inputs), name


@pytest.mark.parametrize("backend", FP64_BACKENDS)
def test_zero_dim_double_backward_runs(backend):
    """The repro of bug 4: grad with create_graph, then backward through it."""
    x0 = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    y = anysoftmax.softmax(x0, 0, mask=torch.tensor(False), backend=backend)
    (g,) = torch.autograd.grad(y, x0, torch.tensor(1.0, dtype=torch.float64), create_graph=True)
    g.backward()
    assert g.item() == 0.0 and x0.grad is not None and x0.grad.item() == 0.0
