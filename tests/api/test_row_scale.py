"""A tensor `scale` with one value per row (per-request 1/temperature) for softmax, log_softmax
and logsumexp: values against the float64 reference (poisoned outputs, every dtype, rank 3 over
a middle and the last dim, broadcast and non-contiguous scales), torch's ``x * scale`` on special
values, gradients wrt x and the scale (gradcheck, the documented formula against autograd of the
reference), torch.func and torch.compile, the one key (a new scale tensor reuses the request and
the graph), errors naming `scale`, and the capability gate that refuses it to backends that do
not declare it."""

from __future__ import annotations

import math

import pytest
import torch

import anysoftmax
from anysoftmax import dispatch
from anysoftmax.core import SoftmaxSpec
from anysoftmax.core import registry
from anysoftmax.core.errors import UnsupportedRequestError
from anysoftmax.core.reference import fused_backward, fused_forward, row_scale_gradient, with_row_scale
from anysoftmax.core.request import FUSED_FWD, request_key
from anysoftmax.core.variant import keep_mask
from anysoftmax.dispatch import FusedArgs
from anysoftmax.testing import check_backward, check_forward
from helpers import StubBackend, backends_that_run, skip_if_refused
from helpers.compile import Capture, compiled

ROW_SCALE_PROBE = {"scale": torch.ones(2, 3, 4, 1)}
# The CPU backends that declare a tensor scale (chosen by what they declare, never by name).
BACKENDS = backends_that_run("cpu", fused=ROW_SCALE_PROBE)
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _scales(gen, shape, dtype=torch.float32):
    # 1 / temperature for temperatures in [0.3, 2], one row negative.
    s = 1.0 / (torch.rand(shape, generator=gen, dtype=torch.float64) * 1.7 + 0.3)
    s.view(-1)[0] = -s.view(-1)[0]
    return s.to(dtype)


# (x shape, dim, scale shape): rank 3 over the last and a middle dim, broadcast scales, rank 2.
LAYOUTS = [((3, 5, 40), -1, (3, 5, 1)), ((3, 40, 5), 1, (3, 1, 5)), ((3, 5, 40), -1, (5, 1)),
           ((3, 5, 40), -1, (1, 1, 1)), ((6, 70), 1, (6, 1))]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"{l[0]}-dim{l[1]}-scale{l[2]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_values_match_the_reference(backend, log, dtype, layout, gen):
    shape, dim, scale_shape = layout
    x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 3).to(dtype)
    fused = {"scale": _scales(gen, scale_shape)}
    skip_if_refused(check_forward(x, dim, backend=backend, log=log, fused=fused))


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_scale_and_its_gradients(backend, log, gen):
    x = torch.randn(4, 6, 30, generator=gen)
    scale = _scales(gen, (6, 4)).t().unsqueeze(-1)  # [4, 6, 1], strides (1, 4, 1)
    assert not scale.is_contiguous()
    skip_if_refused(check_backward(x, -1, backend=backend, log=log, fused={"scale": scale, "softcap": 4.0}))


@pytest.mark.parametrize("backend", [*BACKENDS, None])
def test_special_values_are_torchs_x_times_scale(backend, gen):
    x = torch.randn(7, 12, generator=gen, dtype=torch.float64)
    x[3, 2], x[4, 5] = -math.inf, math.inf
    scale = torch.tensor([0.0, -2.0, math.nan, 0.0, 1.5, math.inf, 1e-300], dtype=torch.float64).view(7, 1)
    for fn, ref in ((anysoftmax.softmax, torch.softmax), (anysoftmax.log_softmax, torch.log_softmax)):
        got = fn(x, -1, scale=scale, backend=backend)
        torch.testing.assert_close(got, ref(x * scale, -1), equal_nan=True)
    torch.testing.assert_close(anysoftmax.logsumexp(x, -1, scale=scale, backend=backend),
                               torch.logsumexp(x * scale, -1), equal_nan=True)
    # scale 0: uniform over the kept positions (an infinite logit gives NaN: 0 * inf).
    assert torch.allclose(anysoftmax.softmax(x, -1, scale=scale, backend=backend)[0], torch.full((12,), 1 / 12.0,
                                                                                                 dtype=torch.float64))


@pytest.mark.parametrize("backend", BACKENDS)
def test_logsumexp_values_and_gradients(backend, gen):
    # (small: the numerical derivatives launch once per perturbed element, interpreted in CI)
    x = torch.randn(3, 7, 4, generator=gen, dtype=torch.float64)
    scale = _scales(gen, (3, 1, 4), torch.float64)
    mask = torch.rand(7, 4, generator=gen) < 0.3
    got = anysoftmax.logsumexp(x, 1, scale=scale, mask=mask, backend=backend)
    expected = torch.logsumexp((x * scale).masked_fill(mask, -math.inf), 1)
    torch.testing.assert_close(got, expected)
    xg, sg = x.clone().requires_grad_(), scale.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, s: anysoftmax.logsumexp(a, 1, scale=s, softcap=3.0, backend=backend),
                                    (xg, sg))
    assert torch.autograd.gradgradcheck(lambda a, s: anysoftmax.logsumexp(a, 1, scale=s, backend=backend), (xg, sg))


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck_in_float64_with_softcap_mask_and_sinks(backend, log, gen):
    fn = anysoftmax.log_softmax if log else anysoftmax.softmax
    # (small: the numerical derivatives launch once per perturbed element, interpreted in CI)
    x = torch.randn(2, 3, 2, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    scale = _scales(gen, (3, 1, 1), torch.float64).requires_grad_()
    sinks = torch.randn(3, 1, 1, generator=gen, dtype=torch.float64, requires_grad=True)
    # (log_softmax's excluded outputs are -inf: finite differences there are NaN)
    mask = None if log else torch.rand(2, 1, 2, 6, generator=gen) < 0.3
    kw = dict(softcap=4.0, mask=mask, backend=backend)
    assert torch.autograd.gradcheck(lambda a, s, k: fn(a, -1, scale=s, sinks=k, **kw), (x, scale, sinks))
    assert torch.autograd.gradgradcheck(lambda a, s: fn(a, -1, scale=s, **kw), (x, scale))


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_the_documented_scale_gradient_is_autograds_of_the_reference(log, gen):
    # d/dscale = sum_j x_j du_j per row (core.variant; du the gradient of u = scale * x), for
    # softmax: sum_j x_j y_j (dy_j - sum_k y_k dy_k); log_softmax: sum_j x_j (dy_j - y~_j sum dy).
    x = torch.randn(4, 3, 9, generator=gen, dtype=torch.float64)
    scale = _scales(gen, (4, 1, 1), torch.float64)
    mask = torch.rand(3, 9, generator=gen) < 0.3
    spec, _ = SoftmaxSpec.from_request(x, -1, log=log, fused=dict(scale=scale, softcap=5.0, mask=mask))
    s = scale.clone().requires_grad_()
    y, _ = fused_forward(x, spec.variant.with_values(s, 5.0), -1, log, mask, None, torch.float64)
    # (an upstream gradient at an excluded output is ignored: core.variant, Gradients)
    g = torch.randn(y.shape, generator=gen, dtype=torch.float64).masked_fill(mask, 0.0)
    (expected,) = torch.autograd.grad(y, s, g)
    v = with_row_scale(spec.variant, scale)
    _, _, dz = fused_backward(g, y.detach(), x, v, 2, log, mask, None, torch.float64, want_dz=True)
    got = row_scale_gradient(dz, x, v, 2, keep_mask(tuple(x.shape), v, mask)).sum_to_size(scale.shape)
    torch.testing.assert_close(got, expected)
    if not log:  # the closed form without softcap and mask
        y0 = torch.softmax(x * scale, -1)
        closed = (x * y0 * (g - (y0 * g).sum(-1, keepdim=True))).sum(-1, keepdim=True).sum_to_size(scale.shape)
        s0 = scale.clone().requires_grad_()
        (auto,) = torch.autograd.grad(anysoftmax.softmax(x, -1, scale=s0), s0, g)
        torch.testing.assert_close(auto, closed)


def test_a_new_scale_tensor_reuses_the_request(gen):
    x = torch.randn(4, 50, generator=gen)
    a, b = _scales(gen, (4, 1)), _scales(gen, (4, 1))
    key_a = request_key(FUSED_FWD, x, 1, None, None, False, None, FusedArgs(scale=a))
    assert key_a == request_key(FUSED_FWD, x, 1, None, None, False, None, FusedArgs(scale=b))
    # The layout is part of the key (a broadcast scale is another request), the values never.
    assert key_a != request_key(FUSED_FWD, x, 1, None, None, False, None, FusedArgs(scale=a[:1]))
    assert key_a != request_key(FUSED_FWD, x, 1, None, None, False, None, FusedArgs(scale=0.5))
    spec_a, _ = SoftmaxSpec.from_request(x, 1, fused={"scale": a})
    assert spec_a.kernel_key() == SoftmaxSpec.from_request(x, 1, fused={"scale": b})[0].kernel_key()
    anysoftmax.softmax(x, 1, scale=a)
    hits = dispatch.stats["hits"]
    y = anysoftmax.softmax(x, 1, scale=b)
    assert dispatch.stats["hits"] == hits + 1
    torch.testing.assert_close(y, torch.softmax(x.double() * b.double(), 1).float())


def test_torch_compile_keeps_one_graph_for_new_scales(gen):
    capture = Capture()
    fn = compiled(lambda x, s: anysoftmax.softmax(x, -1, scale=s, softcap=6.0), capture)
    x = torch.randn(4, 30, generator=gen, requires_grad=True)
    for _ in range(2):
        s = _scales(gen, (4, 1)).requires_grad_()
        y = fn(x, s)
        g = torch.randn(y.shape, generator=gen)
        dx, ds = torch.autograd.grad(y, (x, s), g)
        x64, s64 = x.detach().double().requires_grad_(), s.detach().double().requires_grad_()
        y64 = torch.softmax(6.0 * torch.tanh(x64 * s64 / 6.0), -1)
        torch.testing.assert_close(y, y64.float())
        ex, es = torch.autograd.grad(y64, (x64, s64), g.double())
        torch.testing.assert_close(dx, ex.float())
        torch.testing.assert_close(ds, es.float())
    assert len(capture.graphs) == 2  # one forward graph and one backward graph, for both scales


def test_torch_func_grad_and_vmap(gen):
    x = torch.randn(5, 16, generator=gen, dtype=torch.float64)
    scale = _scales(gen, (5, 1), torch.float64)
    g = torch.func.grad(lambda s: anysoftmax.log_softmax(x, -1, scale=s)[:, 0].sum())(scale)
    expected = torch.func.grad(lambda s: torch.log_softmax(x * s, -1)[:, 0].sum())(scale)
    torch.testing.assert_close(g, expected)
    per = torch.func.vmap(lambda xr, sr: anysoftmax.softmax(xr, -1, scale=sr))(x, scale)
    torch.testing.assert_close(per, torch.softmax(x * scale, -1))


BAD = [
    (lambda x: torch.ones(4, 1, dtype=torch.int64), TypeError, "scale dtype torch.int64"),
    (lambda x: torch.ones(4, 1, dtype=torch.complex64), TypeError, "scale dtype"),
    (lambda x: torch.ones(4, 10), ValueError, "scale of shape \\[4, 10\\] does not broadcast"),
    (lambda x: torch.ones(3, 1), ValueError, "scale of shape \\[3, 1\\]"),
    (lambda x: torch.ones(2, 4, 1), ValueError, "scale of shape \\[2, 4, 1\\]"),
    (lambda x: torch.ones(4, 1, device="meta"), ValueError, "scale is on meta"),
]


@pytest.mark.parametrize("make,exc,match", BAD, ids=[str(i) for i in range(len(BAD))])
@pytest.mark.parametrize("fn", ["softmax", "log_softmax", "logsumexp"])
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "autograd"])
def test_bad_scales_name_the_argument(make, exc, match, fn, grad, gen):
    x = torch.randn(4, 10, generator=gen, requires_grad=grad)
    with pytest.raises(exc, match=match):
        getattr(anysoftmax, fn)(x, -1, scale=make(x))


class _FusedWithoutRowScale(StubBackend):
    """A fused plugin written before tensor scales: it must be refused, never handed one."""

    name = "fused_without_row_scale"
    fused = True
    priority = 1000

    def run(self, x, spec, operands=None):
        raise AssertionError("a tensor scale reached a backend that does not declare it")


def test_backends_without_the_declaration_are_refused_and_the_choice_falls_back(gen):
    x = torch.randn(3, 8, generator=gen)
    scale = _scales(gen, (3, 1))
    plugin = _FusedWithoutRowScale()
    anysoftmax.register(plugin)
    try:
        with pytest.raises(UnsupportedRequestError, match="row_scale = True"):
            anysoftmax.softmax(x, -1, scale=scale, backend=plugin.name)
        torch.testing.assert_close(anysoftmax.softmax(x, -1, scale=scale), torch.softmax(x * scale, -1))
    finally:
        anysoftmax.unregister(plugin.name)
    for name in ("cute", "wave", "triton_ascend"):
        if name in registry.registered():
            spec, _ = SoftmaxSpec.from_request(x, -1, fused={"scale": scale})
            assert registry.fused_refusal(registry.get_backend(name), spec) is not None, name


def test_logsumexp_under_torch_compile(gen):
    fn = compiled(lambda x, s: anysoftmax.logsumexp(x, -1, scale=s), Capture())
    x = torch.randn(3, 20, generator=gen, dtype=torch.float64)
    for _ in range(2):
        s = _scales(gen, (3, 1), torch.float64)
        torch.testing.assert_close(fn(x, s), torch.logsumexp(x * s, -1))
    with pytest.raises(Exception, match="scale of shape .* does not broadcast"):
        fn(x, torch.ones(2, 1, dtype=torch.float64))


@pytest.mark.parametrize("fn", ["softmax", "log_softmax", "logsumexp"])
def test_the_sharded_functions_refuse_a_tensor_scale(fn, gen):
    import anysoftmax.distributed

    x = torch.randn(3, 8, generator=gen)
    with pytest.raises(ValueError, match="scale as a tensor .* not supported over a sharded dim"):
        getattr(anysoftmax.distributed, fn)(x, -1, scale=_scales(gen, (3, 1)))


@pytest.mark.gpu
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_on_cuda_every_backend_that_declares_it_and_the_automatic_choice(log, dtype, gen):
    x = (torch.randn(8, 3000, generator=gen) * 4).to(dtype).cuda()
    fused = {"scale": _scales(gen, (8, 1)).cuda()}
    for backend in [*backends_that_run("cuda", fused=ROW_SCALE_PROBE), None]:
        if backend is not None:
            skip_if_refused(check_backward(x, -1, backend=backend, log=log, fused=fused))
        fn = anysoftmax.log_softmax if log else anysoftmax.softmax
        expected = (torch.log_softmax if log else torch.softmax)(x.double() * fused["scale"].double(), -1)
        torch.testing.assert_close(fn(x, -1, backend=backend, **fused), expected.to(dtype))
