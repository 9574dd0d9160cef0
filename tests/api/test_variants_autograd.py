"""The fused family in every autograd mode: gradcheck / gradgradcheck (x, sinks, a floating mask),
forward over reverse, torch.func transforms (grad, vjp, jacrev, jacfwd, hessian, vmap) and
torch.compile with the Triton kernels visible — each against a float64 torch composition of the
same steps (what a user would otherwise write)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import grad, hessian, jacfwd, jacrev, vmap

import anysoftmax
from helpers import FUSED_PROBE, backends_that_run, runnable_backends
from helpers.compile import Capture, compiled

# The backends that declare they take float64 fused requests (chosen by what they declare, not by name).
FP64_BACKENDS = backends_that_run("cpu", torch.float64, fused=FUSED_PROBE)


def composed(x, *, scale=None, softcap=None, mask=None, causal=False, sinks=None, log=False):
    """The fused steps in torch ops, as models write them (for a float64 oracle)."""
    z = x if scale is None else x * scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    if mask is not None and mask.dtype == torch.bool:
        z = z.masked_fill(mask, -math.inf)
    elif mask is not None:
        z = z + mask
    if causal:
        sq, sk = z.shape[-2:]
        keep = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq if causal == "bottom_right" else 0)
        z = z.masked_fill(~keep, -math.inf)
    if sinks is not None:
        z = torch.cat([z, sinks.expand(*z.shape[:-1], 1)], -1)
    out = z.log_softmax(-1) if log else z.softmax(-1)
    return out[..., :-1] if sinks is not None else out


def _inputs(gen, shape=(2, 3, 4, 6)):
    x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    sinks = torch.randn((shape[1], 1, 1), generator=gen, dtype=torch.float64).requires_grad_()
    add = torch.randn(shape[-2:], generator=gen, dtype=torch.float64).requires_grad_()
    keep_one = torch.rand((shape[0], 1, *shape[-2:]), generator=gen) < 0.3
    keep_one[..., 0] = False  # no empty rows: their constant outputs have no numerical derivative
    return x, sinks, add, keep_one


@pytest.mark.parametrize("backend", FP64_BACKENDS)
def test_gradcheck_gradgradcheck(backend, gen):
    # Small enough for numerical second derivatives through the interpreter (one launch per
    # perturbed element); still two batches, per-head sinks and a bottom-right causal offset.
    x, sinks, add, mask = _inputs(gen, shape=(2, 2, 2, 3))

    def f(x_, s_, m_):
        return anysoftmax.softmax(x_, -1, scale=0.7, softcap=1.5, mask=m_, sinks=s_, causal="bottom_right",
                                  backend=backend)

    assert torch.autograd.gradcheck(f, (x, sinks, add))
    assert torch.autograd.gradgradcheck(f, (x, sinks, add))
    g = lambda x_, s_: anysoftmax.softmax(x_, -1, scale=-0.4, mask=mask, sinks=s_, empty_rows="uniform",  # noqa: E731
                                          backend=backend)
    assert torch.autograd.gradgradcheck(g, (x, sinks), check_fwd_over_rev=True)
    assert torch.autograd.gradcheck(g, (x, sinks), check_forward_ad=True, check_backward_ad=False,
                                    check_undefined_grad=False, check_batched_grad=False)


@pytest.mark.parametrize("backend", FP64_BACKENDS)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_gradients_equal_the_composition(backend, log, gen):
    """x, sinks and a floating mask against autograd of the float64 composition (log forms with
    excluded positions have -inf outputs, which numerical gradients cannot take)."""
    x, sinks, add, mask = _inputs(gen)
    fn = anysoftmax.log_softmax if log else anysoftmax.softmax
    for kw, ref_kw, wrt in [
        (dict(mask=mask, causal=True, scale=0.5), dict(mask=mask, causal=True, scale=0.5), (x,)),
        (dict(sinks=sinks, softcap=2.0), dict(sinks=sinks, softcap=2.0), (x, sinks)),
        (dict(mask=add, scale=1.3), dict(mask=add, scale=1.3), (x, add)),
    ]:
        y = fn(x, -1, backend=backend, **kw)
        ref = composed(x, log=log, **ref_kw)
        torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-12)
        g = torch.randn(y.shape, generator=gen, dtype=torch.float64)
        if log:
            # Excluded outputs of log_softmax are -inf constants: anysoftmax ignores an upstream
            # gradient there (core.variant), where torch's graph would still route it through
            # the normaliser. Compare where the two definitions agree.
            g = g.masked_fill(torch.isinf(ref.detach()), 0.0)
        got = torch.autograd.grad(y, wrt, g)
        want = torch.autograd.grad(ref, wrt, g)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


# The backends that take float32 fused requests (the Triton backends through the interpreter),
# and on CUDA tensors (marked gpu: skipped with the reason without a GPU).
FUSED_BACKENDS = backends_that_run("cpu", torch.float32, fused=FUSED_PROBE)
CUDA_FUSED = backends_that_run("cuda", torch.float32, fused=FUSED_PROBE) if torch.cuda.is_available() \
    else ["torch", "triton"]
FUSED_ON_DEVICES = [pytest.param(b, "cpu", id=b) for b in FUSED_BACKENDS] + [
    pytest.param(b, "cuda", id=f"{b}-cuda", marks=pytest.mark.gpu) for b in CUDA_FUSED]
EXCLUDED_LOGITS = [math.nan, math.inf, -math.inf]


def _poison_excluded(x, mask, causal):
    """x with NaN / +-inf at every position the bool mask or causal excludes, and the kept positions."""
    keep = ~mask.expand(x.shape)
    if causal:
        sq, sk = x.shape[-2:]
        keep = keep & torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq if causal == "bottom_right" else 0)
    fill = torch.tensor(EXCLUDED_LOGITS, dtype=x.dtype)[torch.arange(x.numel()) % len(EXCLUDED_LOGITS)]
    return torch.where(keep, x, fill.view(x.shape)), keep


@pytest.mark.parametrize("backend,device", FUSED_ON_DEVICES)
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
def test_excluded_logits_never_reach_the_softcap_gradient(backend, device, op, gen):
    """A NaN or infinite logit at a position the bool mask or causal excludes is outside the
    softmax: the gradient there is 0 and elsewhere that of the same call with finite values
    there, with softcap (whose derivative 1 - tanh^2 would be NaN at such a logit) as without."""
    x = torch.randn(2, 3, 5, 6, generator=gen) * 2
    mask = torch.rand(2, 1, 5, 6, generator=gen) < 0.3
    mask[..., 0] = False
    fn = getattr(anysoftmax, op)
    for causal in (False, "bottom_right"):
        poisoned, keep = _poison_excluded(x, mask, causal)
        for kw in (dict(softcap=2.5), dict(softcap=2.5, scale=0.7), dict()):
            got_x, want_x = poisoned.to(device).requires_grad_(), x.double().requires_grad_()
            y = fn(got_x, -1, mask=mask.to(device), causal=causal, backend=backend, **kw)
            ref = fn(want_x, -1, mask=mask, causal=causal, backend="torch", **kw)
            g = torch.randn(y.shape, generator=gen)
            if op == "log_softmax":
                g = g.masked_fill(~keep, 0.0)  # (-inf constants there: numerical comparison ignores them)
            got, = torch.autograd.grad(y, got_x, g.to(device), create_graph=True)
            want, = torch.autograd.grad(ref, want_x, g.double())
            got = got.cpu()
            assert torch.equal(got.detach()[~keep], torch.zeros_like(got[~keep])), (causal, kw)
            torch.testing.assert_close(got.detach().double(), want, rtol=1e-4, atol=1e-5)
            # second order: a NaN at an excluded logit must not leak into the double backward
            second, = torch.autograd.grad((got * torch.randn(got.shape, generator=gen)).sum(), got_x,
                                          allow_unused=True)
            assert second is None or torch.isfinite(second).all(), (causal, kw)


@pytest.mark.parametrize("backend", FP64_BACKENDS)
def test_func_transforms(backend, gen):
    sink = torch.randn(1, generator=gen, dtype=torch.float64)
    v = torch.randn(7, generator=gen, dtype=torch.float64)

    def ours(t):
        return anysoftmax.softmax(t, -1, scale=0.3, softcap=2.0, sinks=sink, backend=backend).pow(2).sum()

    def ref(t):
        return composed(t, scale=0.3, softcap=2.0, sinks=sink).pow(2).sum()

    for transform in (grad, jacrev, jacfwd):
        torch.testing.assert_close(transform(ours)(v), transform(ref)(v), rtol=1e-9, atol=1e-12)
    for inner, outer in ((jacrev, jacrev), (jacfwd, jacrev), (jacrev, jacfwd)):
        torch.testing.assert_close(outer(inner(ours))(v), hessian(ref)(v), rtol=1e-8, atol=1e-11)
    _, vjp_fn = torch.func.vjp(lambda t: anysoftmax.softmax(t, -1, sinks=sink, backend=backend), v)
    _, vjp_ref = torch.func.vjp(lambda t: composed(t, sinks=sink), v)
    c = torch.randn(7, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(vjp_fn(c)[0], vjp_ref(c)[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", FP64_BACKENDS)
def test_vmap_batches_masks_and_sinks(backend, gen):
    xb = torch.randn(4, 5, 7, generator=gen, dtype=torch.float64)
    mb = torch.rand(4, 5, 7, generator=gen) < 0.3
    sb = torch.randn(4, 5, 1, generator=gen, dtype=torch.float64)
    fn = lambda a, m, s: anysoftmax.softmax(a, -1, mask=m, sinks=s, scale=2.0, backend=backend)  # noqa: E731
    torch.testing.assert_close(vmap(fn)(xb, mb, sb), composed(xb, mask=mb, sinks=sb, scale=2.0), equal_nan=True)
    # one mask for the whole batch (unbatched operand), per-sample sinks of lower rank
    m1 = torch.rand(5, 7, generator=gen) < 0.3
    s1 = torch.randn(4, 1, generator=gen, dtype=torch.float64)
    got = vmap(lambda a, s: anysoftmax.softmax(a, -1, mask=m1, sinks=s, backend=backend))(xb, s1)
    want = composed(xb, mask=m1.expand(4, 5, 7), sinks=s1.unsqueeze(1))
    torch.testing.assert_close(got, want, equal_nan=True)
    g = vmap(grad(lambda a, s: anysoftmax.softmax(a, -1, sinks=s, softcap=3.0, backend=backend).pow(2).sum(),
                  argnums=(0, 1)))(xb, sb)
    gr = vmap(grad(lambda a, s: composed(a, sinks=s, softcap=3.0).pow(2).sum(), argnums=(0, 1)))(xb, sb)
    torch.testing.assert_close(g, gr)


@pytest.mark.parametrize("backend", FP64_BACKENDS)
def test_compile_fullgraph_matches_eager(backend, gen):
    x = torch.randn(2, 3, 6, 40, generator=gen, dtype=torch.float64)
    mask = torch.rand(2, 1, 6, 40, generator=gen) < 0.2
    sinks = torch.randn(3, 1, 1, generator=gen, dtype=torch.float64)

    def f(t, s):
        return anysoftmax.softmax(t, -1, scale=0.5, softcap=5.0, mask=mask, causal="bottom_right", sinks=s,
                                  backend=backend)

    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    xg, sg = x.clone().requires_grad_(), sinks.clone().requires_grad_()
    xe, se = x.clone().requires_grad_(), sinks.clone().requires_grad_()
    yc, ye = cf(xg, sg), f(xe, se)
    torch.testing.assert_close(yc, ye)
    g = torch.randn(yc.shape, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(yc, (xg, sg), g), torch.autograd.grad(ye, (xe, se), g))


TEMPERATURES = [(0.5, 3.0), (0.7, 4.5), (-1.3, 6.0)]
# (backend, dynamic, device, compiler): dynamic=True and torch's default (automatic dynamic)
# with the torch backend; dynamic=True with the backends whose kernels torch.compile traces
# (`traceable`: the triton_op route); on a GPU, Inductor with the triton backend.
COMPILE_MODES = [pytest.param("torch", True, "cpu", "aot_eager", id="torch-dynamic"),
                 pytest.param("torch", None, "cpu", "aot_eager", id="torch-automatic")] + [
    pytest.param(b, True, "cpu", "aot_eager", id=f"{b}-dynamic") for b in FUSED_BACKENDS
    if hasattr(anysoftmax.get_backend(b), "traceable")] + [
    pytest.param("triton", None, "cuda", "inductor", id="triton-cuda-inductor", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("backend,dynamic,device,compiler", COMPILE_MODES)
def test_compiled_temperature_is_an_argument(backend, dynamic, device, compiler, gen):
    """scale and softcap as arguments of a fullgraph-compiled function: each value's result and
    gradient are right, and a new value does not recompile (with dynamic=True: one frame for
    all; by default torch recompiles once to make a changed float dynamic, then never again)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    x = torch.randn(2, 3, 4, 8, generator=gen)
    mask = torch.rand(2, 1, 4, 8, generator=gen) < 0.3
    mask[..., 0] = False
    x, on_device = x.to(device), mask.to(device)

    def f(t, s, c, on=backend, m=on_device):
        kw = dict(scale=s, softcap=c, mask=m, backend=on)
        return (anysoftmax.softmax(t, -1, **kw), anysoftmax.log_softmax(t, -1, **kw),
                anysoftmax.logsumexp(t, -1, **kw))

    torch._dynamo.reset()
    counter = CompileCounterWithBackend(compiler)
    cf = torch.compile(f, fullgraph=True, backend=counter, dynamic=dynamic)
    frames = []
    for s, c in TEMPERATURES:
        xc, xe = x.clone().requires_grad_(), x.cpu().double().requires_grad_()
        got, want = cf(xc, s, c), f(xe, s, c, "torch", mask)
        for a, b in zip(got, want):
            torch.testing.assert_close(a.cpu().double(), b, rtol=1e-5, atol=1e-6)
        g = [torch.randn(a.shape, generator=gen).masked_fill(torch.isinf(a.cpu()), 0.0) for a in got]
        torch.testing.assert_close(torch.autograd.grad(got, xc, [t.to(device) for t in g])[0].cpu().double(),
                                   torch.autograd.grad(want, xe, [t.double() for t in g])[0], rtol=1e-4, atol=1e-5)
        frames.append(counter.frame_count)
    assert frames[-1] == frames[1] and frames[1] <= 2, frames
    if dynamic:
        assert frames == [1] * len(TEMPERATURES), frames
    # A temperature the graph holds as a symbol is checked on the host when the graph runs.
    for s, c, name in ((0.5, -1.0, "softcap"), (float("nan"), 2.0, "scale")):
        with pytest.raises(ValueError, match=f"softmax: {name} must be"):
            cf(x, s, c)
    if device == "cuda":  # (a device-side assert would surface here; it ends the CUDA context)
        torch.cuda.synchronize()


def test_compiled_temperature_is_checked_on_the_host(gen):
    """Inductor checks a symbol temperature on the host, as eager mode does (a ValueError
    naming it), never in a kernel: a device-side assert would end the process's CUDA context.
    Inductor moves a CPU scalar's pointwise work onto the GPU unless a user of it is an operator
    outside aten and prims (post_grad's constructor mover), so in the post-grad graphs every
    assert reads the verdict of `anysoftmax::check_temperature`, which reads a CPU scalar."""
    from torch._inductor import config as inductor_config

    graphs = []
    x = torch.randn(2, 3, 8, generator=gen)

    def f(t, s, c):
        return anysoftmax.softmax(t, -1, scale=s, softcap=c, backend="torch")

    torch._dynamo.reset()
    with inductor_config.patch(post_grad_custom_post_pass=graphs.append):
        cf = torch.compile(f, fullgraph=True, backend="inductor", dynamic=True)
        torch.testing.assert_close(cf(x, 0.5, 3.0), f(x, 0.5, 3.0))
    nodes = [n for g in graphs for n in g.nodes if n.op == "call_function"]
    checks = [n for n in nodes if str(n.target) == "anysoftmax.check_temperature.default"]
    asserts = [n for n in nodes if n.target == torch.ops.aten._assert_async.msg]
    assert {n.args[1] for n in checks} == {"scale", "softcap"}, [n.format_node() for n in nodes]
    for n in checks:
        value = n.args[0].meta["val"]
        assert value.device.type == "cpu" and value.dim() == 0, n.format_node()
    assert asserts and all(n.args[0] in checks for n in asserts), [n.format_node() for n in asserts]
    torch.testing.assert_close(cf(x, -1.3, 6.0), f(x, -1.3, 6.0))
    for s, c, message in ((0.5, -1.0, "softcap must be > 0"), (float("nan"), 2.0, "scale must be finite")):
        with pytest.raises(ValueError, match=f"softmax: {message}"):
            cf(x, s, c)


@pytest.mark.parametrize("value,name,message", [
    (float("inf"), "scale", "softmax: scale must be finite"),
    (0.0, "softcap", "softmax: softcap must be > 0"),
    (1.0, "temperature", "name must be 'scale' or 'softcap'"),
    ([1.0, 2.0], "scale", "value must have one element"),
])
def test_temperature_check_operator(value, name, message):
    """The graph's check called directly: eager mode's ValueError for a bad value, a clear one
    for a bad call; True for a good value."""
    check = torch.ops.anysoftmax.check_temperature
    assert check(torch.tensor(-0.5, dtype=torch.float64), "scale").item() is True
    with pytest.raises(ValueError, match=message):
        check(torch.tensor(value, dtype=torch.float64), name)


def test_compiled_backward_calls_the_backward_operator(gen):
    """A compiled graph's backward reaches the fused backward through its operator (which
    torch.compile routes to the Triton kernels on GPUs), never by running dispatch on the fake
    tensors AOTAutograd traces with: on a CUDA tensor that fails inside the kernel launcher,
    here (torch backend) it would trace the torch formula instead of the operator."""
    q = torch.randn(2, 3, 8, 4, generator=gen).requires_grad_()
    k = torch.randn(2, 3, 8, 4, generator=gen).requires_grad_()
    cap = Capture()
    f = compiled(lambda a, b: anysoftmax.softmax(a @ b.transpose(-1, -2), -1, scale=0.3, backend="torch"), cap)
    y = f(q, k)
    y.backward(torch.ones_like(y) + torch.rand(y.shape, generator=gen))
    assert torch.ops.anysoftmax.softmax_backward.default in cap.targets(1), cap.targets(1)
    assert q.grad is not None and torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0


def test_fake_and_functional_tensors_never_reach_dispatch():
    """torch 2.11 (the GPU host) traces a compiled graph's backward with `is_compiling()`
    False: what keeps fake and functional tensors out of the kernel launchers is their type
    (found by the compiled attention block's fwd+bwd on the H100: 'Cannot access data pointer
    of Tensor')."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

    from anysoftmax.torchop.grad_mode import plain_eager

    plain = torch.randn(3)
    assert plain_eager(plain, None, torch.nn.Parameter(plain), gradients=False)
    with FakeTensorMode():
        fake = torch.empty(3)
    assert not plain_eager(plain, fake, gradients=False)
    with FunctionalTensorMode():
        functional = FunctionalTensor.to_functional(plain)
    assert not plain_eager(functional, None, gradients=False)


def test_compiled_variant_is_user_triton_kernels(gen):
    """Under torch.compile the fused request traces to the shared Triton kernels (forward and
    backward), not an opaque operator."""
    if "triton" not in runnable_backends("cpu"):
        pytest.skip("triton does not run on CPU here: TRITON_INTERPRET is not set")
    x = torch.randn(2, 3, 8, 24, generator=gen).requires_grad_()
    mask = torch.rand(2, 1, 8, 24, generator=gen) < 0.2
    sinks = torch.randn(3, 1, 1, generator=gen).requires_grad_()
    cap = Capture()
    f = compiled(lambda t, s: anysoftmax.softmax(t, -1, scale=0.3, mask=mask, causal=True, sinks=s,
                                                 backend="triton"), cap)
    y = f(x, sinks)
    y.backward(torch.ones_like(y))
    assert cap.kernels(0) == ["softmax_tile_kernel"] and cap.kernels(1) == ["softmax_bwd_kernel"]
    fused_ops = {torch.ops.anysoftmax.softmax.default, torch.ops.anysoftmax.softmax_backward.default}
    assert not fused_ops & set(cap.targets(0) + cap.targets(1))
    ref = composed(x.detach().double(), scale=0.3, mask=mask, causal=True, sinks=sinks.detach().double())
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-6)
