"""The backend protocol (`core.backend.Backend`): a subclass gets every default (a launcher from
`run`, torch's backward formula, the fused family's formula backward, the pieces ops refused
until it defines them), and a duck-typed object (the README's `MyBackend`) is adapted once at
registration: dispatch calls methods, it never probes the object per call."""

from __future__ import annotations

import pytest
import torch

import anysoftmax
from anysoftmax import dispatch
from anysoftmax.backends.torch_eager import TorchBackend
from anysoftmax.core import UnsupportedRequestError, registry
from anysoftmax.core.backend import Backend
from anysoftmax.testing.compare import compare_logsumexp
from anysoftmax.core.lse_merge import logsumexp_request, merge_formula
from anysoftmax.core.reference import backward_from_output, reference
from anysoftmax.core.spec import SoftmaxSpec


class Minimal(Backend):
    """`run` alone: everything else is the base class's."""

    name = "minimal"
    devices = ("cpu",)
    priority = -50

    def run(self, x, spec):
        op = torch.log_softmax if spec.log else torch.softmax
        return op(x.double(), spec.dim).to(spec.out_dtype)


class WithPieces(Minimal):
    """Declares the fused family and both pieces ops by defining their per-call kernels (the
    torch backend's formulas)."""

    name = "with_pieces"
    fused = True
    run = TorchBackend.run
    run_logsumexp = TorchBackend.run_logsumexp
    run_merge_states = TorchBackend.run_merge_states


@pytest.fixture
def registered():
    made = [anysoftmax.register(b) for b in (Minimal(), WithPieces())]
    try:
        yield made
    finally:
        for b in made:
            registry.unregister(b.name)


def _close(got, want64, spec: SoftmaxSpec):
    torch.testing.assert_close(got.double(), want64, atol=spec.tolerance.atol, rtol=spec.tolerance.rtol)


def test_a_subclass_gets_every_default(registered, gen):
    b = Minimal()
    x = torch.randn(5, 37, generator=gen)
    spec = SoftmaxSpec.from_tensor(x, 1)
    for name in ("launcher", "backward_launcher", "fused_backward_launcher", "logsumexp_launcher",
                 "merge_states_launcher", "supports_logsumexp", "supports_merge_states", "status_note"):
        assert callable(getattr(b, name)), name
    _close(b.launcher(x, spec)(x), reference(x, spec), spec)
    y = torch.softmax(x, 1)
    g = torch.randn(5, 37, generator=gen)
    _close(b.backward_launcher(y, spec)(y, g), backward_from_output(y.double(), g.double(), 1), spec)
    # Through the API: forward, the gradient (torch's formula), the fused gate, the pieces refused.
    xr = x.clone().requires_grad_()
    out = anysoftmax.log_softmax(xr, 1, backend="minimal")
    (dx,) = torch.autograd.grad(out, xr, g)
    lspec = SoftmaxSpec.from_tensor(x, 1, log=True)
    _close(out, reference(x, lspec), lspec)
    _close(dx, backward_from_output(reference(x, lspec), g.double(), 1, True), lspec)
    with pytest.raises(UnsupportedRequestError, match="fused = True"):
        anysoftmax.softmax(x, 1, scale=0.5, backend="minimal")
    with pytest.raises(UnsupportedRequestError, match="no logsumexp kernel"):
        anysoftmax.logsumexp(x, 1, backend="minimal")
    with pytest.raises(UnsupportedRequestError, match="no merge_states kernel"):
        anysoftmax.merge_states([x, x], [x[:, 0], x[:, 1]], backend="minimal")


def test_a_subclass_declares_the_pieces_by_defining_their_kernels(registered, gen):
    x = torch.randn(6, 50, generator=gen)
    mask = torch.rand(6, 50, generator=gen) < 0.3
    for kw in ({}, {"scale": 0.5, "mask": mask}):
        lse = anysoftmax.logsumexp(x, -1, keepdim=True, backend="with_pieces", **kw)
        spec, _ = logsumexp_request(x, -1, **kw)
        c = compare_logsumexp(lse, x, spec, kw.get("mask"))
        assert c.ok, c.detail
    outs = [torch.randn(6, 16, generator=gen) for _ in range(3)]
    lses = [torch.randn(6, generator=gen) for _ in range(3)]
    want_o, want_l = merge_formula([t.double() for t in outs], [t.double() for t in lses], torch.float64,
                                   torch.float64, torch.float64)
    into, lse_into = torch.empty(6, 16), torch.empty(6)
    for merge in (anysoftmax.merge_states, lambda *a, **k: dispatch.merge_states(*a, **k, out=into, lse_out=lse_into)):
        o, lse = merge(outs, lses, backend="with_pieces")
        torch.testing.assert_close(o.double(), want_o, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse.double(), want_l, atol=1e-5, rtol=1e-5)
    assert o is into and lse is lse_into
    y, grad = anysoftmax.softmax(x, -1, mask=mask, backend="with_pieces"), torch.randn(6, 50, generator=gen)
    spec, _ = SoftmaxSpec.from_request(x, -1, fused=dict(mask=mask))
    _close(y, reference(x, spec, mask=mask), spec)


# The optional members of the duck-typed protocol: what dispatch used to look up per request.
OPTIONAL = {"launcher", "backward_launcher", "fused_backward_launcher", "run_backward", "fused", "logsumexp_launcher",
            "run_logsumexp", "supports_logsumexp", "logsumexp_refusal", "merge_states_launcher", "run_merge_states",
            "supports_merge_states", "merge_states_refusal"}


class Watched:
    """The README's duck-typed backend with a backward and the pieces, recording every read of an
    optional member after registration."""

    name = "watched"
    devices = ("cpu",)
    priority = -50
    fused = True
    reads: list = []

    def __getattribute__(self, item):
        if item in OPTIONAL:
            type(self).reads.append(item)
        return object.__getattribute__(self, item)

    def is_available(self):
        return None

    def supports(self, spec):
        return None

    run = TorchBackend.run
    run_logsumexp = TorchBackend.run_logsumexp

    def run_backward(self, y, grad, spec):
        return backward_from_output(y, grad, spec.dim, spec.log, torch.float64).to(y.dtype)

    run_merge_states = TorchBackend.run_merge_states


def test_a_duck_typed_backend_is_adapted_once_never_probed_per_call(gen):
    w = Watched()
    assert isinstance(w, registry.Backend) and not isinstance(object(), registry.Backend)
    assert anysoftmax.register(w) is w and registry.get_backend("watched") is w
    try:
        Watched.reads.clear()
        for n in (17, 18, 19):  # new requests: every call a miss
            x = torch.randn(4, n, generator=gen, requires_grad=True)
            y = anysoftmax.softmax(x, -1, backend="watched")
            torch.autograd.grad(y, x, torch.randn_like(y))
            anysoftmax.softmax(x.detach(), -1, scale=0.5, backend="watched")
            anysoftmax.logsumexp(x.detach(), -1, backend="watched")
            anysoftmax.merge_states([x.detach(), x.detach()], [x.detach()[:, 0], x.detach()[:, 1]], backend="watched")
        assert Watched.reads == [], f"dispatch probed the backend per call: {sorted(set(Watched.reads))}"
    finally:
        registry.unregister("watched")
