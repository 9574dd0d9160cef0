"""`anysoftmax.softmax_backward` as users call it: eager, differentiable, and under torch.compile
(the latency benchmark compiles it; a direct dispatch call would not trace)."""

from __future__ import annotations

import pytest
import torch

import anysoftmax
from helpers import backends_that_run

BACKENDS = backends_that_run("cpu", torch.float64)  # float64 below: those that declare they take it


def _inputs(gen, shape=(5, 37), dtype=torch.float64):
    y = torch.softmax(torch.randn(shape, generator=gen, dtype=dtype) * 3, -1)
    g = torch.randn(shape, generator=gen, dtype=dtype)
    return y, g


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("log", [False, True])
def test_eager_matches_torch(gen, backend, log):
    y, g = _inputs(gen)
    if log:
        y = torch.log(y)
    want = (torch._log_softmax_backward_data if log else torch._softmax_backward_data)(g, y, -1, y.dtype)
    got = anysoftmax.softmax_backward(y, g, -1, log=log, backend=backend)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_differentiable(gen, backend):
    y, g = _inputs(gen, (3, 11))
    y.requires_grad_(), g.requires_grad_()
    assert torch.autograd.gradcheck(lambda y, g: anysoftmax.softmax_backward(y, g, -1, backend=backend), (y, g))


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_fullgraph(gen, backend):
    torch._dynamo.reset()
    y, g = _inputs(gen, (6, 300), torch.float32)
    fn = torch.compile(lambda y, g: anysoftmax.softmax_backward(y, g, -1, backend=backend),
                       fullgraph=True, backend="aot_eager")
    want = torch._softmax_backward_data(g.double(), y.double(), -1, torch.float64).float()
    torch.testing.assert_close(fn(y, g), want, rtol=1e-5, atol=1e-6)
