"""anysoftmax as PyTorch operators: opcheck, gradcheck in float64, torch.compile(fullgraph=True)."""

from pathlib import Path

import pytest
import torch

import anysoftmax
from anysoftmax.torchop import ops, registration  # noqa: F401  (the operators with their autograd and routing)
from anysoftmax.core import SoftmaxSpec
from anysoftmax.testing.compare import compare
from helpers import FUSED_PROBE, backend_devices, backends_that_run, takes_float64

BACKEND_DEVICES = backend_devices()
LOG = pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])


@LOG
@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
@pytest.mark.parametrize("shape,dim", [((5, 33), 1), ((6, 4, 17), 0), ((7,), -1)])
def test_opcheck_forward(backend, device, log, shape, dim, gen):
    """Schema, fake implementation, autograd registration and AOT dispatch (dynamic shapes)."""
    x = torch.randn(shape, generator=gen).to(device).requires_grad_()
    torch.library.opcheck(ops.softmax_op, (x, dim), {"log": log, "backend": backend})
    if takes_float64(backend, device):  # dtype= widening, and a transposed input
        torch.library.opcheck(ops.softmax_op, (x.detach().transpose(0, -1), 0, torch.float64, log),
                              {"backend": backend})


@LOG
@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_opcheck_backward(backend, device, log, gen):
    x = torch.randn(6, 40, generator=gen).to(device)
    y = (torch.log_softmax if log else torch.softmax)(x, 1)
    g = torch.randn(6, 40, generator=gen).to(device)
    torch.library.opcheck(ops.softmax_backward_op, (g, y, 1, log), {"backend": backend})


@LOG
@pytest.mark.parametrize("backend", backends_that_run("cpu", torch.float32, fused=FUSED_PROBE))
def test_opcheck_fused(backend, log, gen):
    """The same operators with every fused keyword set: a floating mask and sinks that need
    gradients, scale, softcap, causal, empty rows."""
    x = torch.randn(2, 3, 6, 9, generator=gen).requires_grad_()
    mask = torch.randn(2, 1, 6, 9, generator=gen).requires_grad_()
    sinks = torch.randn(3, 1, 1, generator=gen).requires_grad_()
    fused = dict(mask=mask, sinks=sinks, scale=0.5, softcap=4.0, causal="bottom_right", empty_rows="uniform",
                 backend=backend)
    torch.library.opcheck(ops.softmax_op, (x, -1, None, log), fused)
    y, p = ops.softmax_op(x.detach(), -1, None, log, **{**fused, "mask": mask.detach(), "sinks": sinks.detach()})
    g = torch.randn(y.shape, generator=gen).masked_fill(~torch.isfinite(y), 0.0)
    torch.library.opcheck(ops.softmax_backward_op, (g, y, -1, log, x.detach(), p), {**fused, "mask": mask.detach(),
                                                                                   "sinks": sinks.detach()})


@LOG
@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
@pytest.mark.parametrize("shape,dim", [((3, 7), 1), ((4, 5, 3), 0), ((2, 3, 8), 1)])
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




# ---- one operator family -------------------------------------------------------------------------

TORCHOP = Path(anysoftmax.__file__).resolve().parent / "torchop"


def test_one_operator_family(gen):
    """One forward and one backward operator for softmax and log_softmax, plain and fused (the
    plain call is the fused one with nothing set), one traced twin of each, logsumexp and
    merge_states: six operators; and the host check of a temperature torch.compile traces as a
    symbol (`traced_temperature`)."""
    registration.traced_ops()  # (the traced twins register on first use)
    names = {name.partition("::")[2] for name in torch._C._dispatch_get_all_op_names()
             if name.startswith("anysoftmax::") and not name.startswith("anysoftmax::sharded_")}
    assert names == {"softmax", "softmax_backward", "softmax_triton", "softmax_backward_triton", "logsumexp",
                     "merge_states", "check_temperature"}, sorted(names)
    x, g = torch.randn(5, 33, generator=gen), torch.randn(5, 33, generator=gen)
    for log in (False, True):
        y, p_sink = torch.ops.anysoftmax.softmax(x, 1, log=log, backend="torch")
        assert p_sink.shape == (0,) and compare(y, x, SoftmaxSpec.from_tensor(x, 1, log=log)).ok
        dx, ds = torch.ops.anysoftmax.softmax_backward(g, y, 1, log, backend="torch")
        torch.testing.assert_close(dx, anysoftmax.softmax_backward(y, g, 1, log=log, backend="torch"))
        assert ds.shape == (0,)


def _operators_run(fn) -> list:
    """The anysoftmax operators that run while `fn()` does (seen at torch's Python dispatch key)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "anysoftmax":
                seen.append(func.__name__)
            return func(*args, **(kwargs or {}))

    with Seen():
        fn()
    return seen


@pytest.mark.parametrize("fused", [{}, {"scale": 0.5, "softcap": 3.0}], ids=["plain", "fused"])
@LOG
def test_eager_autograd_skips_the_dispatcher(log, fused, gen):
    """Eager training on plain tensors calls dispatch directly, forward and backward (the
    operators' dispatcher round trip costs more than a small softmax); torch.func transforms go
    through the operators (their vmap rules), and the results are the same."""
    fn = anysoftmax.log_softmax if log else anysoftmax.softmax
    x, g = torch.randn(4, 9, generator=gen, dtype=torch.float64), torch.randn(4, 9, generator=gen, dtype=torch.float64)

    def train():
        a = x.clone().requires_grad_()
        fn(a, -1, backend="torch", **fused).backward(g)
        return a.grad

    assert _operators_run(train) == []
    assert _operators_run(lambda: anysoftmax.softmax_backward(x, g.clone().requires_grad_(), -1, log=log,
                                                              backend="torch")) == []
    per_row = torch.func.grad(lambda t, w: (fn(t, -1, backend="torch", **fused) * w).sum())
    assert _operators_run(lambda: torch.func.vmap(per_row)(x, g)) != []
    torch.testing.assert_close(torch.func.vmap(per_row)(x, g), train())


@pytest.mark.parametrize("fused", [{}, {"scale": 0.5, "softcap": 3.0}], ids=["plain", "fused"])
def test_eager_training_binds_no_signature(monkeypatch, fused, gen):
    """torch's `Function.apply` binds a setup_context-style forward's arguments through
    `inspect.signature` on every call, which costs more than a small softmax: eager training
    outside torch.func does without."""
    import inspect

    x = torch.randn(3, 8, generator=gen, requires_grad=True)
    anysoftmax.softmax(x, -1, backend="torch", **fused).backward(torch.ones(3, 8))  # (first call: imports)
    calls, signature = [], inspect.signature
    monkeypatch.setattr(inspect, "signature", lambda *a, **kw: calls.append(a) or signature(*a, **kw))
    anysoftmax.softmax(x, -1, backend="torch", **fused).backward(torch.ones(3, 8))
    assert calls == []


def test_one_plain_eager_predicate():
    """Whether a call may skip the operators (eager, plain tensors, no derivative wanted) is
    asked in one place, `grad_mode.plain_eager`: the functorch and forward-AD queries it makes
    appear nowhere else in the operator layer."""
    queries = ("is_functorch_wrapped_tensor", "_current_level", "peek_interpreter_stack")
    found = {p.name: [q for q in queries if q in p.read_text()] for p in TORCHOP.glob("*.py")}
    assert {name: q for name, q in found.items() if q} == {"grad_mode.py": list(queries)}


def test_plain_eager_forms_agree():
    """`plain_eager_one` (the plain softmax's check) answers as `plain_eager` itself for plain
    tensors, ones needing a gradient (with grad mode on and off), Parameters, subclasses,
    non-tensors, under forward AD and under vmap."""
    import torch.autograd.forward_ad as fwAD

    from anysoftmax.torchop.grad_mode import plain_eager, plain_eager_one

    class Sub(torch.Tensor):
        pass

    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    cases = [x, w, torch.nn.Parameter(torch.randn(3)), x.as_subclass(Sub), 1.0, None]

    def agree():
        for t in cases:
            assert plain_eager_one(t) == plain_eager(t), t

    seen = []
    agree()
    seen.append(plain_eager_one(x))
    with torch.no_grad():
        agree()
        seen.append(plain_eager_one(w))
    with fwAD.dual_level():
        agree()
        seen.append(plain_eager_one(x))

    def under_vmap(v):
        cases.append(v)
        agree()
        seen.append(plain_eager_one(v))
        cases.pop()
        return v

    torch.func.vmap(under_vmap)(torch.randn(2, 3))
    assert seen == [True, True, False, False]
