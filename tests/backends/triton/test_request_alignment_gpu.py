"""Issue 34, bug 1, on a GPU: the same backward request three times, the third with a gradient
whose address is not 16-byte aligned (`buf[1:].view(...)`), killed the CUDA context with
"misaligned address": the memoised launcher reused the kernel Triton had specialised for
aligned pointers. Every operand's alignment is now part of the request key
(`core.request.request_key`); these run the issue's sequences and compare every result with
the float64 reference.

    pytest -q -m gpu tests/backends/triton/test_request_alignment_gpu.py
"""

from __future__ import annotations

import pytest
import torch

import anysoftmax
from anysoftmax import dispatch
from anysoftmax.core.reference import backward_from_output, fused_backward
from anysoftmax.core.request import alignment
from anysoftmax.core.spec import SoftmaxSpec

pytestmark = pytest.mark.gpu

SHAPE = (64, 4096)
DTYPES = [torch.float32, torch.bfloat16]


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = buf[1:].view(t.shape)
    view.copy_(t)
    assert alignment(view) != 0
    return view


def _close(out: torch.Tensor, want64: torch.Tensor, spec: SoftmaxSpec) -> None:
    tol = spec.tolerance
    torch.testing.assert_close(out.double(), want64, atol=tol.atol, rtol=tol.rtol)


def _operands(dtype, gen):
    x = torch.randn(SHAPE, generator=gen).to("cuda", dtype)
    g = torch.randn(SHAPE, generator=gen).to("cuda", dtype)
    return x, g


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softmax_backward_aligned_twice_then_misaligned(dtype, gen):
    x, g = _operands(dtype, gen)
    y = anysoftmax.softmax(x, -1, backend="triton")
    spec = SoftmaxSpec.from_tensor(y, -1)
    for grad in (g, g, _misaligned(g)):
        dx = anysoftmax.softmax_backward(y, grad, -1, backend="triton")
        torch.cuda.synchronize()
        _close(dx, backward_from_output(y.cpu(), grad.cpu(), -1).cuda(), spec)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_softmax_backward_data_under_use(dtype, gen):
    x, g = _operands(dtype, gen)
    y = torch.softmax(x.float(), -1).to(dtype)
    spec = SoftmaxSpec.from_tensor(y, -1)
    with anysoftmax.use(backend="triton"):
        for grad in (g, g, _misaligned(g)):
            dx = torch._softmax_backward_data(grad, y, -1, dtype)
            torch.cuda.synchronize()
            _close(dx, backward_from_output(y.cpu(), grad.cpu(), -1).cuda(), spec)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("moved", ["grad", "x", "p_sink"])
def test_fused_backward_aligned_twice_then_misaligned(dtype, moved, gen):
    """The fused backward (scale, softcap, bool mask, sinks) with one of the operands it reads
    moved off the 16-byte boundary on the third call."""
    x, g = _operands(dtype, gen)
    mask = (torch.rand(SHAPE, generator=gen) < 0.2).cuda()
    sinks = torch.randn(SHAPE[0], 1, generator=gen).cuda()
    a = dispatch.FusedArgs(scale=0.5, mask=mask, softcap=4.0, sinks=sinks)
    y, p = dispatch.forward_fused(x, -1, None, "triton", False, a)
    spec, _ = SoftmaxSpec.from_request(y, -1, fused=a.as_kwargs())
    ops = dict(grad=g, x=x, p_sink=p)
    for o in (ops, ops, dict(ops, **{moved: _misaligned(ops[moved])})):
        dx, ds = dispatch.backward_fused(o["grad"], y, o["x"], -1, False, a, o["p_sink"], backend="triton")
        torch.cuda.synchronize()
        want_dx, want_ds, _ = fused_backward(o["grad"].double(), y.double(), o["x"].double(), spec.variant, -1,
                                             False, mask, o["p_sink"].double(), torch.float64)
        _close(dx, want_dx, spec)
        torch.testing.assert_close(ds.double(), want_ds, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_autograd_aligned_twice_then_misaligned(dtype, gen):
    """The same through the public fused softmax and autograd."""
    x, g = _operands(dtype, gen)
    mask = (torch.rand(SHAPE, generator=gen) < 0.2).cuda()
    x.requires_grad_(True)
    y = anysoftmax.softmax(x, -1, mask=mask, scale=0.5, backend="triton")
    spec, _ = SoftmaxSpec.from_request(y, -1, fused=dict(mask=mask, scale=0.5))
    for grad in (g, g, _misaligned(g)):
        (dx,) = torch.autograd.grad(y, x, grad, retain_graph=True)
        torch.cuda.synchronize()
        want, _, _ = fused_backward(grad.double(), y.detach().double(), x.detach().double(), spec.variant, -1, False,
                                    mask, None, torch.float64)
        _close(dx, want, spec)
