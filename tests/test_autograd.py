"""Gradients through anysoftmax match torch's."""

import pytest
import torch

import anysoftmax
from helpers import runnable_backends


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("backend", runnable_backends("cpu"))
@pytest.mark.parametrize("shape,dim", [((7, 33), 1), ((5, 6, 7), 0), ((40,), 0)])
def test_backward_matches_torch(backend, shape, dim, log, gen):
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    a = x.clone().requires_grad_()
    fn = anysoftmax.log_softmax if log else anysoftmax.softmax
    fn(a, dim, backend=backend).backward(g)
    b = x.clone().requires_grad_()
    (torch.log_softmax if log else torch.softmax)(b, dim).backward(g)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


def test_backward_fp32_gradient_dtype(gen):
    x = torch.randn(4, 9, generator=gen).requires_grad_()
    anysoftmax.softmax(x, 1).sum().backward()
    assert x.grad.dtype == torch.float32
