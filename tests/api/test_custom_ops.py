"""anysoftmax as PyTorch operators: opcheck, gradcheck in float64, torch.compile(fullgraph=True)."""

import pytest
import torch

import anysoftmax
from anysoftmax.torchop import ops, registration  # noqa: F401  (the operators with their autograd and routing)
from anysoftmax.core import SoftmaxSpec, compare
from helpers import backend_devices, takes_float64

BACKEND_DEVICES = backend_devices()
FORWARD_OPS = {"softmax": ops.softmax_op, "log_softmax": ops.log_softmax_op}



@pytest.mark.parametrize("op", list(FORWARD_OPS))
@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
@pytest.mark.parametrize("shape,dim", [((5, 33), 1), ((6, 4, 17), 0), ((7,), -1)])
def test_opcheck_forward(backend, device, op, shape, dim, gen):
    """Schema, fake implementation, autograd registration and AOT dispatch (dynamic shapes)."""
    x = torch.randn(shape, generator=gen).to(device).requires_grad_()
    torch.library.opcheck(FORWARD_OPS[op], (x, dim), {"backend": backend})
    if takes_float64(backend, device):  # dtype= widening, and a transposed input
        torch.library.opcheck(FORWARD_OPS[op], (x.detach().transpose(0, -1), 0, torch.float64),
                              {"backend": backend})


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_opcheck_backward(backend, device, log, gen):
    x = torch.randn(6, 40, generator=gen).to(device)
    y = (torch.log_softmax if log else torch.softmax)(x, 1)
    g = torch.randn(6, 40, generator=gen).to(device)
    torch.library.opcheck(ops.softmax_backward_op, (g, y, 1, log, backend))


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
@pytest.mark.parametrize("shape,dim", [((3, 7), 1), ((4, 5, 3), 0), ((2, 3, 16), 1)])
def test_gradcheck_float64(backend, device, shape, dim, log, gen):
    if not takes_float64(backend, device):
        pytest.skip(f"{backend} declares no float64 support on {device} (gradcheck needs float64)")
    x = torch.randn(shape, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    fn = anysoftmax.log_softmax if log else anysoftmax.softmax
    assert torch.autograd.gradcheck(lambda t: fn(t, dim, backend=backend), (x,), eps=1e-6, atol=1e-7)


class _Attention(torch.nn.Module):
    """A model shape where a graph break would hurt: projections around softmax/log_softmax."""

    def __init__(self, backend):
        super().__init__()
        self.backend = backend
        self.q = torch.nn.Linear(16, 16)
        self.k = torch.nn.Linear(16, 16)

    def forward(self, x):
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / 4.0
        p = anysoftmax.softmax(scores, -1, backend=self.backend)
        logp = anysoftmax.log_softmax(scores.float(), 1, dtype=torch.float32, backend=self.backend)
        return p @ x, logp


@pytest.mark.parametrize("backend,device", [(None, "cpu"), pytest.param(None, "cuda", marks=pytest.mark.gpu)] + BACKEND_DEVICES)
def test_compile_fullgraph_same_results(backend, device, gen):
    """No graph break (fullgraph=True raises on one), results and gradients as in eager."""
    torch._dynamo.reset()
    model = _Attention(backend).to(device)
    x = torch.randn(2, 24, 16, generator=gen).to(device)
    # Inductor (the default) for the automatic choice; aot_eager keeps the explicit backends'
    # CPU runs fast while still tracing the fake implementations and the autograd graph.
    compiler = "inductor" if backend is None else "aot_eager"
    compiled = torch.compile(model, fullgraph=True, backend=compiler)
    out, logp = compiled(x)
    ref, ref_logp = model(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logp, ref_logp, rtol=1e-5, atol=1e-5)
    (out.sum() + logp.sum()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    (ref.sum() + ref_logp.sum()).backward()
    for got, want in zip(grads, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert torch._dynamo.explain(model)(x).graph_break_count == 0


def test_compiled_result_checked_against_reference(gen):
    x = torch.randn(9, 300, generator=gen)
    y = torch.compile(lambda t: anysoftmax.softmax(t, 1), fullgraph=True, backend="aot_eager")(x)
    assert compare(y, x, SoftmaxSpec.from_tensor(x, 1)).ok


def test_compile_reports_bad_dim_while_tracing():
    fn = torch.compile(lambda t: anysoftmax.softmax(t, 3), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match=r"dim 3 out of range"):
        fn(torch.randn(4, 5))


def test_eager_inference_skips_the_dispatcher(monkeypatch):
    """Plain inference calls the backend directly (small tensors pay no dispatcher cost); a
    tensor that needs a gradient goes through the operator and its registered autograd."""
    calls = []
    monkeypatch.setattr(ops, "_forward_impl", lambda *a, **kw: calls.append(a) or torch.softmax(a[0], a[1]))
    x = torch.randn(3, 4)
    anysoftmax.softmax(x, 1, backend="torch")
    assert calls == []
    anysoftmax.softmax(x.requires_grad_(), 1, backend="torch")
    assert len(calls) == 1
