"""Autograd beyond first-order reverse mode: double backward, forward mode, torch.func
transforms and torch.compile of them, each checked against torch's own softmax."""

import pytest
import torch
import torch.autograd.forward_ad as fwad
from torch.func import functional_call, grad, hessian, jacfwd, jacrev, jvp, vjp, vmap

import anysoftmax
from anysoftmax.torchop import ops, registration  # noqa: F401  (the operators with their autograd and routing)
from helpers import runnable_backends, takes_float64

CPU_BACKENDS = runnable_backends("cpu")
LOG = pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
BACKENDS = pytest.mark.parametrize("backend", CPU_BACKENDS)



def setup(backend, gen, *shape, device="cpu"):
    """(dtype, tolerances, random tensor factory) for `backend`: float64 where it takes float64,
    float32 otherwise (NPU backends), with fresh data every call."""
    dtype = torch.float64 if takes_float64(backend, device) else torch.float32
    # float32: log_softmax errors are absolute (about rtol at any magnitude, see core.spec.TOLERANCES).
    tol = dict(rtol=1e-9, atol=1e-11) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-5)
    return dtype, tol, lambda *s: (torch.randn(s or shape, generator=gen, dtype=dtype) * 2).to(device)


def pair(backend, log, dim):
    """(anysoftmax function, torch function) of one argument."""
    ours = anysoftmax.log_softmax if log else anysoftmax.softmax
    theirs = torch.log_softmax if log else torch.softmax
    return (lambda t: ours(t, dim, backend=backend)), (lambda t: theirs(t, dim))


def scalar_loss(f, w):
    # A nonlinear loss, so second derivatives do not vanish.
    return lambda t: (f(t) * w).sin().sum()


# ---- double backward ---------------------------------------------------------------------------

@LOG
@BACKENDS
@pytest.mark.parametrize("shape,dim", [((3, 5), 1), ((2, 4, 3), 0)])
def test_gradgradcheck_float64(backend, shape, dim, log, gen):
    if not takes_float64(backend):
        pytest.skip(f"{backend} declares no float64 support on cpu (see test_second_order_float32)")
    x = torch.randn(shape, generator=gen, dtype=torch.float64).requires_grad_()
    f, _ = pair(backend, log, dim)
    assert torch.autograd.gradgradcheck(f, (x,), eps=1e-6, atol=1e-6)


@LOG
@BACKENDS
def test_second_order_matches_torch(backend, log, gen):
    """Double backward by create_graph in the backend's dtype (float32 for NPU backends)."""
    dtype, tol, rand = setup(backend, gen, 4, 7)
    x, w, v = rand(), rand(), rand()

    def first_and_second(f, x, w, v):
        a = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(scalar_loss(f, w)(a), a, create_graph=True)
        (gg,) = torch.autograd.grad((g * v).sum(), a)
        return g, gg

    ours, theirs = pair(backend, log, 1)
    got, torch_same_dtype = first_and_second(ours, x, w, v), first_and_second(theirs, x, w, v)
    if dtype == torch.float64:
        torch.testing.assert_close(got, torch_same_dtype, **tol)
        return
    # float32: second derivatives are sums of products that cancel, so an elementwise rtol
    # against torch's float32 result is noise (one element in 28 missed 2e-5 by 1.5x on a fresh
    # seed). Both are measured against float64 torch; ours may not be much worse than torch's own.
    exact = first_and_second(theirs, x.double(), w.double(), v.double())
    for mine, torch32, ref in zip(got, torch_same_dtype, exact):
        assert_no_worse_than_torch(mine, torch32, ref, tol)


def assert_no_worse_than_torch(mine, torch32, ref, tol):
    """`mine` (float32) is within a small multiple of torch float32's own error from the float64
    `ref`, plus the dtype's tolerance on ref's scale."""
    err = (mine.double() - ref).abs().max().item()
    torch_err = (torch32.double() - ref).abs().max().item()
    bound = 4 * torch_err + tol["rtol"] * ref.abs().max().item() + tol["atol"]
    assert err <= bound, f"error {err:.3g} vs float64; torch float32's {torch_err:.3g}; bound {bound:.3g}"


@LOG
@BACKENDS
def test_softmax_backward_op_gradcheck(backend, log, gen):
    """The backward operator differentiates w.r.t. both its gradient and its output argument."""
    if not takes_float64(backend):
        pytest.skip(f"{backend} declares no float64 support on cpu (gradcheck needs float64)")
    x = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    y = ((torch.log_softmax if log else torch.softmax)(x, 1)).requires_grad_()
    g = torch.randn(3, 6, generator=gen, dtype=torch.float64).requires_grad_()
    fn = lambda g_, y_: ops.softmax_backward_op(g_, y_, 1, log, backend=backend)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (g, y), eps=1e-6, atol=1e-7)
    assert torch.autograd.gradgradcheck(fn, (g, y), eps=1e-6, atol=1e-6)


# ---- forward mode --------------------------------------------------------------------------------

@LOG
@BACKENDS
def test_forward_ad_dual_numbers(backend, log, gen):
    _, tol, rand = setup(backend, gen, 3, 8)
    x, t = rand(), rand()
    tangents = []
    for f in pair(backend, log, -1):
        with fwad.dual_level():
            out = f(fwad.make_dual(x, t))
            tangents.append(fwad.unpack_dual(out))
    torch.testing.assert_close(tangents[0].primal, tangents[1].primal, **tol)
    torch.testing.assert_close(tangents[0].tangent, tangents[1].tangent, **tol)


@LOG
@BACKENDS
def test_jvp_and_jacobians(backend, log, gen):
    _, tol, rand = setup(backend, gen, 3, 5)
    x, t = rand(), rand()
    ours, theirs = pair(backend, log, 1)
    torch.testing.assert_close(jvp(ours, (x,), (t,)), jvp(theirs, (x,), (t,)), **tol)
    torch.testing.assert_close(jacfwd(ours)(x), jacfwd(theirs)(x), **tol)
    torch.testing.assert_close(jacrev(ours)(x), jacrev(theirs)(x), **tol)


def test_forward_over_forward_is_refused(gen):
    """torch evaluates a Function's jvp as a constant for an enclosing forward transform: a
    silent zero would be the alternative to this error."""
    x = torch.randn(2, 3, generator=gen, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match=r"jacfwd\(jacrev"):
        jacfwd(jacfwd(lambda t: anysoftmax.softmax(t, 1, backend="torch")))(x)


# ---- torch.func ----------------------------------------------------------------------------------

@LOG
@BACKENDS
def test_grad_vjp_hessian(backend, log, gen):
    _, tol, rand = setup(backend, gen, 2, 4)
    x, w, v = rand(), rand(), rand()
    ours, theirs = pair(backend, log, 1)
    for transform in (grad, hessian, lambda f: jacrev(jacrev(f)), lambda f: jacrev(jacfwd(f))):
        got, torch_same_dtype = transform(scalar_loss(ours, w))(x), transform(scalar_loss(theirs, w))(x)
        if x.dtype == torch.float64:
            torch.testing.assert_close(got, torch_same_dtype, **tol)
        else:  # second derivatives in float32: measured against float64 torch (see test_second_order)
            assert_no_worse_than_torch(got, torch_same_dtype, transform(scalar_loss(theirs, w.double()))(x.double()), tol)
    (out_a, pull_a), (out_b, pull_b) = vjp(ours, x), vjp(theirs, x)
    torch.testing.assert_close((out_a, pull_a(v)), (out_b, pull_b(v)), **tol)


@LOG
@BACKENDS
def test_dim_in_the_middle_noncontiguous(backend, log, gen):
    """Softmax along dim 2 of a 4-D tensor, on a transposed and a sliced view."""
    _, tol, rand = setup(backend, gen)
    base = rand(3, 4, 2, 5)
    for x in (base.transpose(1, 3), rand(2, 6, 4, 3)[:, ::2, :, 1:]):
        assert not x.is_contiguous()
        w = rand(*x.shape)
        ours, theirs = pair(backend, log, 2)
        torch.testing.assert_close(ours(x), theirs(x), **tol)
        torch.testing.assert_close(grad(scalar_loss(ours, w))(x), grad(scalar_loss(theirs, w))(x), **tol)
        torch.testing.assert_close(jacfwd(ours)(x), jacfwd(theirs)(x), **tol)
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        torch.autograd.grad(scalar_loss(ours, w)(a), a, create_graph=True)[0].sum().backward()
        torch.autograd.grad(scalar_loss(theirs, w)(b), b, create_graph=True)[0].sum().backward()
        torch.testing.assert_close(a.grad, b.grad, **tol)


@LOG
@BACKENDS
def test_vmap(backend, log, gen):
    """vmap of the function, of grad and of jacrev, batch dimension first and in the middle."""
    _, tol, rand = setup(backend, gen)
    x, w = rand(4, 3, 5), rand(3, 5)
    for bdim, dim in ((0, 1), (1, -1), (2, 0)):
        ours, theirs = pair(backend, log, dim)
        torch.testing.assert_close(vmap(ours, in_dims=bdim)(x), vmap(theirs, in_dims=bdim)(x), **tol)
        sample_w = w if bdim == 0 else (rand(4, 5) if bdim == 1 else rand(4, 3))
        got = vmap(grad(scalar_loss(ours, sample_w)), in_dims=bdim)(x)
        torch.testing.assert_close(got, vmap(grad(scalar_loss(theirs, sample_w)), in_dims=bdim)(x), **tol)
    ours, theirs = pair(backend, log, 0)
    torch.testing.assert_close(vmap(jacrev(ours))(x[:, 0]), vmap(jacrev(theirs))(x[:, 0]), **tol)


@BACKENDS
def test_per_sample_gradients(backend, gen):
    """Per-sample gradients of a small model: functional_call + vmap(grad)."""
    dtype, tol, rand = setup(backend, gen)

    class Model(torch.nn.Module):
        def __init__(self, softmax):
            super().__init__()
            self.proj = torch.nn.Linear(6, 6, dtype=dtype)
            self.out = torch.nn.Linear(6, 3, dtype=dtype)
            self.softmax = softmax

        def forward(self, x):
            attn = self.softmax(self.proj(x) @ x.transpose(-1, -2), -1)
            return self.out(attn @ x)

    ours = Model(lambda t, d: anysoftmax.softmax(t, d, backend=backend))
    theirs = Model(lambda t, d: torch.softmax(t, d))
    theirs.load_state_dict(ours.state_dict())
    x, labels = rand(5, 4, 6), torch.randint(0, 3, (5, 4), generator=gen)

    def per_sample(model):
        params = {k: v.detach() for k, v in model.named_parameters()}

        def loss(p, xi, yi):
            logits = functional_call(model, p, (xi,))
            return torch.nn.functional.nll_loss(anysoftmax.log_softmax(logits, -1, backend=backend)
                                                if model is ours else torch.log_softmax(logits, -1), yi)
        return vmap(grad(loss), in_dims=(None, 0, 0))(params, x, labels)

    got, want = per_sample(ours), per_sample(theirs)
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], **tol)


def test_vmap_bad_dim_names_the_sample_shape(gen):
    x = torch.randn(4, 3, generator=gen)
    with pytest.raises(IndexError, match=r"dim 1 out of range for a tensor of 1 dimension"):
        vmap(lambda t: anysoftmax.softmax(t, 1, backend="torch"))(x)


def test_vmap_of_zero_dim_samples(gen):
    x = torch.randn(5, generator=gen, dtype=torch.float64)
    for fn, want in ((anysoftmax.softmax, 1.0), (anysoftmax.log_softmax, 0.0)):
        out = vmap(lambda t: fn(t, 0, backend="torch"))(x)
        torch.testing.assert_close(out, torch.full_like(x, want))


# ---- torch.compile of torch.func ------------------------------------------------------------------

@LOG
def test_compiled_func_grad(log, gen):
    """torch.compile(grad(f)) and of vmap(grad(f)) with the torch backend: torch's results (the
    softmax inside a torch.func transform runs eagerly: a graph break, see autodiff.softmax)."""
    torch._dynamo.reset()
    x, w = torch.randn(6, 9, generator=gen), torch.randn(6, 9, generator=gen)
    ours, theirs = pair("torch", log, -1)
    compiled = torch.compile(grad(scalar_loss(ours, w)), backend="aot_eager")
    torch.testing.assert_close(compiled(x), grad(scalar_loss(theirs, w))(x), rtol=1e-5, atol=1e-6)
    per_sample = torch.compile(vmap(grad(scalar_loss(ours, w[0]))), backend="aot_eager")
    torch.testing.assert_close(per_sample(x), vmap(grad(scalar_loss(theirs, w[0])))(x), rtol=1e-5, atol=1e-6)


# ---- GPU -----------------------------------------------------------------------------------------

@pytest.mark.gpu
@LOG
def test_gpu_transforms(log, gen):
    """The same transforms on CUDA tensors with the Triton kernels (float64 and float32)."""
    for dtype, tol in ((torch.float64, dict(rtol=1e-9, atol=1e-11)), (torch.float32, dict(rtol=2e-5, atol=2e-6))):
        x = torch.randn(8, 300, generator=gen, dtype=dtype).cuda()
        w, t = torch.randn_like(x), torch.randn_like(x)
        ours, theirs = pair("triton", log, -1)
        torch.testing.assert_close(jvp(ours, (x,), (t,)), jvp(theirs, (x,), (t,)), **tol)
        torch.testing.assert_close(vmap(grad(scalar_loss(ours, w[0])))(x), vmap(grad(scalar_loss(theirs, w[0])))(x), **tol)
        small = x[:2, :5]
        torch.testing.assert_close(hessian(scalar_loss(ours, w[:2, :5]))(small),
                                   hessian(scalar_loss(theirs, w[:2, :5]))(small), **tol)
        if dtype == torch.float64:
            assert torch.autograd.gradgradcheck(ours, (x[:3, :7].clone().requires_grad_(),), eps=1e-6, atol=1e-6)
