"""anysoftmax.logsumexp and anysoftmax.merge_states: values against the float64 reference on
fresh random data, the special values core.lse_merge states, errors, autograd, vmap, compile."""

from __future__ import annotations

import math

import pytest
import torch

import anysoftmax
from anysoftmax.testing.compare import compare_logsumexp, compare_merge
from anysoftmax.core.errors import UnsupportedRequestError
from anysoftmax.core.lse_merge import logsumexp_request
from anysoftmax.testing.compare import reference_logsumexp
from anysoftmax.core.spec import TOLERANCES
from helpers import takes_float64

BACKENDS = ["torch", "triton", "triton_ascend"]
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _lse(x, dim, backend, **kw):
    return anysoftmax.logsumexp(x, dim, keepdim=True, backend=backend, **kw)


def _check_lse(x, dim, backend, **kw):
    out = _lse(x, dim, backend, **kw)
    spec, _ = logsumexp_request(x, dim, **kw)
    c = compare_logsumexp(out, x, spec, kw.get("mask"), kw.get("sinks"))
    assert c.ok, c.detail
    return out


def _dtypes_of(backend):
    # triton_ascend refuses float64 on every device (the NPU has no fp64 exp): tested below.
    return [d for d in DTYPES if not (backend == "triton_ascend" and d == torch.float64)]


def _skip_fp64(backend, dtype):
    if backend == "triton_ascend" and dtype == torch.float64:
        with pytest.raises(UnsupportedRequestError, match="float64"):
            anysoftmax.logsumexp(torch.zeros(2, 3, dtype=dtype), 1, backend=backend)
        with pytest.raises(UnsupportedRequestError, match="float64"):
            anysoftmax.merge_states([torch.zeros(2, 3, dtype=dtype)], [torch.zeros(2)], backend=backend)
        pytest.skip("triton_ascend refuses float64 (checked above)")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((6, 37), -1), ((3, 5, 9), 1), ((4, 300), 1), ((5, 3), 0)])
def test_logsumexp_plain(backend, dtype, shape, dim, gen):
    _skip_fp64(backend, dtype)
    x = (torch.randn(shape, generator=gen) * 4).to(dtype)
    out = _check_lse(x, dim, backend)
    assert out.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert anysoftmax.logsumexp(x, dim, backend=backend).shape == torch.logsumexp(x, dim).shape


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_logsumexp_fused_keywords(backend, dtype, gen):
    x = (torch.randn(2, 3, 6, 40, generator=gen) * 3).to(dtype)
    bool_mask = torch.rand(2, 1, 6, 40, generator=gen) < 0.3
    bool_mask[0, 0, 1] = True  # an empty row
    add_mask = torch.randn(6, 40, generator=gen).to(dtype)
    add_mask[2, :7] = -math.inf
    sinks = torch.randn(3, 1, 1, generator=gen)
    long = (torch.randn(2, 2, 5, 300, generator=gen) * 3).to(dtype)  # chunked rows (the interpreter's plan)
    _check_lse(long, -1, backend, causal="bottom_right", sinks=torch.randn(2, 1, 1, generator=gen))
    _check_lse(long, -1, backend, mask=torch.rand(5, 300, generator=gen) < 0.5, scale=0.25)
    for kw in (dict(scale=0.3), dict(softcap=2.5, scale=1.7), dict(mask=bool_mask), dict(mask=add_mask),
               dict(causal=True), dict(causal="bottom_right", sinks=sinks), dict(sinks=sinks, mask=bool_mask),
               dict(scale=0.5, softcap=4.0, mask=add_mask, sinks=sinks, causal=True)):
        out = _check_lse(x, -1, backend, **kw)
        if "mask" in kw and kw["mask"].dtype == torch.bool and "sinks" not in kw:
            assert torch.isneginf(out[0, :, 1]).all()  # a row with nothing kept
        if kw.get("sinks") is not None and kw.get("mask") is bool_mask:
            assert torch.equal(out[0, :, 1, 0], sinks.reshape(3).float())  # only the sink: lse = s


@pytest.mark.parametrize("backend", BACKENDS)
def test_logsumexp_special_values(backend, gen):
    x = torch.randn(6, 33, generator=gen)
    x[0] = -math.inf
    x[1, 3] = math.inf
    x[2, 5] = math.nan
    x[3, :30] = -math.inf
    x[4, 1] = math.inf
    x[4, 2] = math.nan
    out = _check_lse(x, -1, backend)
    ref = torch.logsumexp(x, -1, keepdim=True)
    assert torch.isneginf(out[0]).all() and torch.isposinf(out[1]).all() and torch.isnan(out[2]).all()
    assert torch.isnan(out[4]).all()
    torch.testing.assert_close(out[3], ref[3])


@pytest.mark.parametrize("backend", BACKENDS)
def test_logsumexp_strides_and_empty(backend, gen):
    base = torch.randn(8, 20, 6, generator=gen)
    _check_lse(base.transpose(0, 2), 1, backend)
    _check_lse(base[::2, ::3], -1, backend)
    _check_lse(base.expand(2, 8, 20, 6), 2, backend)
    for shape, dim in (((0, 5), 1), ((4, 0), 1), ((4, 0), 0), ((3, 0, 2), 1)):
        x = torch.randn(shape, generator=gen)
        torch.testing.assert_close(anysoftmax.logsumexp(x, dim, backend=backend), torch.logsumexp(x, dim))
    s = torch.tensor(2.5)
    assert anysoftmax.logsumexp(s, 0, backend=backend).item() == 2.5
    assert anysoftmax.logsumexp(s, -1, keepdim=True, backend=backend).shape == ()


def test_logsumexp_errors():
    x = torch.randn(3, 4)
    with pytest.raises(IndexError, match="logsumexp: dim 2"):
        anysoftmax.logsumexp(x, 2)
    with pytest.raises(TypeError, match="logsumexp: x dtype"):
        anysoftmax.logsumexp(torch.ones(3, dtype=torch.int32), 0)
    with pytest.raises(ValueError, match="logsumexp: softcap must be > 0"):
        anysoftmax.logsumexp(x, 1, softcap=-1.0)
    with pytest.raises(ValueError, match="logsumexp: mask of shape"):
        anysoftmax.logsumexp(x, 1, mask=torch.zeros(5, dtype=torch.bool))
    with pytest.raises(ValueError, match="logsumexp: causal"):
        anysoftmax.logsumexp(x, 0, causal=True)
    with pytest.raises(TypeError, match="keepdim"):
        anysoftmax.logsumexp(x, 1, keepdim=1)


def test_backends_without_kernels_refuse_with_reason():
    x = torch.randn(3, 4)
    for name in ("cute", "wave"):
        if anysoftmax.core.registry.unavailable_reason(name) is not None:
            continue  # not available here: the availability error comes first
        with pytest.raises(UnsupportedRequestError, match="logsumexp"):
            anysoftmax.logsumexp(x, 1, backend=name)
    # The ops a backend has no kernel for: refused by name, before any request is looked at.
    for name, op in (("wave", "logsumexp"), ("wave", "merge_states"), ("cute", "merge_states")):
        refusal = anysoftmax.core.registry.op_refusal(anysoftmax.get_backend(name), op, None)
        assert f"no {op} kernel" in refusal, (name, refusal)


def test_logsumexp_gradients_float64(gen):
    x = torch.randn(3, 4, 9, generator=gen, dtype=torch.float64, requires_grad=True)
    sinks = torch.randn(4, 1, generator=gen, dtype=torch.float64, requires_grad=True)
    add = torch.randn(9, generator=gen, dtype=torch.float64, requires_grad=True)

    def f(a, s, m):
        return anysoftmax.logsumexp(a, -1, scale=0.7, softcap=3.0, sinks=s, mask=m)
    torch.autograd.gradcheck(f, (x, sinks, add))
    torch.autograd.gradgradcheck(f, (x, sinks, add))
    # the gradient is the fused softmax
    g, = torch.autograd.grad(anysoftmax.logsumexp(x, -1, sinks=sinks).sum(), x)
    torch.testing.assert_close(g, anysoftmax.softmax(x, -1, sinks=sinks).detach())


def test_logsumexp_empty_rows_have_zero_gradient(gen):
    x = torch.randn(4, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(4, 7, dtype=torch.bool)
    mask[1] = True
    out = anysoftmax.logsumexp(x, 1, mask=mask)
    assert torch.isneginf(out[1])
    g, = torch.autograd.grad(out[torch.isfinite(out)].sum() + 0 * out[1], x)
    assert torch.equal(g[1], torch.zeros(7, dtype=torch.float64)) and torch.isfinite(g).all()


def test_logsumexp_vmap_grad_compile(gen):
    x = torch.randn(5, 3, 11, generator=gen)
    torch.testing.assert_close(torch.vmap(lambda a: anysoftmax.logsumexp(a, -1))(x), torch.logsumexp(x, -1))
    mask = torch.rand(5, 3, 11, generator=gen) < 0.2
    got = torch.vmap(lambda a, m: anysoftmax.logsumexp(a, -1, mask=m))(x, mask)
    torch.testing.assert_close(got, anysoftmax.logsumexp(x, -1, mask=mask))
    g = torch.vmap(torch.func.grad(lambda a: anysoftmax.logsumexp(a, -1).sum()))(x)
    torch.testing.assert_close(g, torch.softmax(x, -1))
    f = torch.compile(lambda a: anysoftmax.logsumexp(a, -1, scale=0.5), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(f(x), torch.logsumexp(0.5 * x, -1))


# ---- merge_states -----------------------------------------------------------------------------

def _split_states(x, bounds, backend):
    """Per segment [a, b) of x's last dim: (softmax of the segment, its logsumexp)."""
    outs, lses = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        seg = x[..., a:b]
        outs.append(torch.softmax(seg.to(torch.float64), -1).nan_to_num(0.0).to(x.dtype) if b > a
                    else torch.zeros(*x.shape[:-1], 0, dtype=x.dtype))
        lses.append(anysoftmax.logsumexp(seg, -1, backend=backend))
    return outs, lses


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 2, 3, 8, 11])
def test_merge_against_reference(backend, dtype, k, gen):
    _skip_fp64(backend, dtype)
    outs = [torch.randn(3, 5, 24, generator=gen).to(dtype) for _ in range(k)]
    lses = [(torch.randn(3, 5, generator=gen) * 5).float() for _ in range(k)]
    out, lse = anysoftmax.merge_states(outs, lses, backend=backend)
    assert out.dtype == dtype and lse.dtype == torch.float32
    c = compare_merge(out, lse, outs, lses)
    assert c.ok, c.detail


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_merge_of_split_is_softmax(backend, dtype, gen):
    """merge(split(x)) == (softmax(x), logsumexp(x)): the attention value with V = identity."""
    _skip_fp64(backend, dtype)
    n = 40
    x = (torch.randn(4, n, generator=gen) * 3).to(dtype)
    x[1, :25] = -math.inf  # fully masked segments
    eye = torch.eye(n, dtype=torch.float64)
    for bounds in ([0, n], [0, 13, n], [0, 0, 7, 7, 30, n], [0, 5, 10, 15, 20, 25, 30, 35, n]):
        outs, lses = [], []
        for a, b in zip(bounds[:-1], bounds[1:]):
            seg = x[:, a:b]
            lse_i = anysoftmax.logsumexp(seg, -1, backend=backend)
            p = torch.exp(seg.to(torch.float64) - lse_i.to(torch.float64).unsqueeze(-1)).nan_to_num(0.0)
            outs.append((p @ eye[a:b]).to(dtype))  # this segment's part of softmax(x) @ I
            lses.append(lse_i)
        out, lse = anysoftmax.merge_states(outs, lses, backend=backend)
        x64 = x.to(torch.float64)
        expected = (torch.softmax(x64, -1), torch.logsumexp(x64, -1))
        c = compare_merge(out, lse, outs, lses, expected=expected, roundings=3)
        assert c.ok, f"{bounds}: {c.detail}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_merge_strided_layouts(backend, gen):
    """vLLM's layout: partials [tokens, heads, D], lses [heads, tokens] read transposed, and
    partials of different layouts (copied once)."""
    outs = [torch.randn(7, 3, 16, generator=gen) for _ in range(2)]
    lses = [torch.randn(3, 7, generator=gen).t() for _ in range(2)]
    outs[1] = torch.randn(3, 7, 16, generator=gen).transpose(0, 1)
    out, lse = anysoftmax.merge_states(outs, lses, backend=backend)
    c = compare_merge(out, lse, outs, lses)
    assert c.ok, c.detail


@pytest.mark.parametrize("backend", BACKENDS)
def test_merge_special_values(backend, gen):
    inf, nan = math.inf, math.nan
    o = [torch.randn(6, 4, generator=gen) for _ in range(2)]
    l0 = torch.tensor([-inf, -inf, nan, inf, 1.0, inf])
    l1 = torch.tensor([0.5, -inf, 0.0, 0.0, -inf, inf])
    o[0][0] = nan  # a -inf partial's output is not read
    out, lse = anysoftmax.merge_states(o, [l0, l1], backend=backend)
    torch.testing.assert_close(out[0], o[1][0])
    assert lse[0].item() == 0.5
    assert torch.equal(out[1], torch.zeros(4)) and lse[1].item() == -inf  # all -inf: 0 and -inf, no NaN
    assert torch.isnan(out[2]).all() and math.isnan(lse[2].item())
    assert torch.isnan(out[3]).all() and lse[3].item() == inf
    torch.testing.assert_close(out[4], o[0][4])
    assert lse[4].item() == 1.0
    assert torch.isnan(out[5]).all() and lse[5].item() == inf


def test_merge_errors():
    a = torch.randn(2, 3, 4)
    la = torch.randn(2, 3)
    with pytest.raises(ValueError, match="at least one"):
        anysoftmax.merge_states([], [])
    with pytest.raises(ValueError, match=r"outputs\[1\] has shape"):
        anysoftmax.merge_states([a, a[:1]], [la, la])
    with pytest.raises(ValueError, match=r"lses\[0\] has shape"):
        anysoftmax.merge_states([a], [la.t()])
    with pytest.raises(ValueError, match="one lse per partial"):
        anysoftmax.merge_states([a, a], [la])
    with pytest.raises(TypeError, match=r"outputs\[0\] dtype"):
        anysoftmax.merge_states([a.long()], [la])
    with pytest.raises(TypeError, match="outputs must be a list"):
        anysoftmax.merge_states(a, la)


def test_merge_gradients_float64(gen):
    o = [torch.randn(3, 2, 5, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    ls = [torch.randn(3, 2, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    with torch.no_grad():
        ls[2][0, 0] = -math.inf  # a -inf partial: its gradients are 0
    f = lambda *t: anysoftmax.merge_states(t[:3], t[3:])  # noqa: E731
    torch.autograd.gradcheck(f, (*o, *ls))
    torch.autograd.gradgradcheck(f, (*o, *ls))


def test_merge_vmap_and_compile(gen):
    o = [torch.randn(4, 3, 8, generator=gen) for _ in range(2)]
    ls = [torch.randn(4, 3, generator=gen) for _ in range(2)]
    want = anysoftmax.merge_states(o, ls)
    got = torch.vmap(lambda a, b, c, d: anysoftmax.merge_states([a, b], [c, d]))(*o, *ls)
    torch.testing.assert_close(got, want)
    f = torch.compile(lambda a, b, c, d: anysoftmax.merge_states([a, b], [c, d]), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(f(*o, *ls), want)


def test_a_repeated_merge_of_plain_tensors_is_not_checked_again(gen, monkeypatch):
    """A repeated request whose operands were plain tensors is proven plain by its memoised
    layout guard (it checks each operand's type, grad requirement and dispatch state): the
    per-tensor plain-eager check is not asked on the hit path."""
    import anysoftmax.torchop.lse_merge as api_merge

    o = [torch.randn(3, 2, 5, generator=gen) for _ in range(8)]
    ls = [torch.randn(3, 2, generator=gen) for _ in range(8)]
    want = anysoftmax.merge_states(o, ls)
    asked = []
    real = api_merge.plain_eager
    monkeypatch.setattr(api_merge, "plain_eager", lambda *t, **kw: asked.append(len(t)) or real(*t, **kw))
    for _ in range(3):
        got = anysoftmax.merge_states(o, [t.clone() for t in ls])
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert asked == []


def test_a_repeated_merge_still_follows_gradients_and_transforms(gen):
    """After plain calls of a request, the same layouts needing a gradient, or wrapped by vmap
    or torch.func.grad, still reach autograd and the operator (the guard refuses them)."""
    o = [torch.randn(3, 2, 5, generator=gen, dtype=torch.float64) for _ in range(3)]
    ls = [torch.randn(3, 2, generator=gen, dtype=torch.float64) for _ in range(3)]
    for _ in range(2):
        anysoftmax.merge_states(o, ls)
    weight = torch.exp(ls[2] - torch.stack(ls).logsumexp(0))  # d lse / d lse_2
    needs = ls[2].clone().requires_grad_()
    _, lse = anysoftmax.merge_states(o, [*ls[:2], needs])
    torch.testing.assert_close(torch.autograd.grad(lse.sum(), needs)[0], weight)
    grad = torch.func.grad(lambda l2: anysoftmax.merge_states(o, [*ls[:2], l2])[1].sum())(ls[2])
    torch.testing.assert_close(grad, weight)
    batch = [torch.stack([t, 2 * t]) for t in (*o, *ls)]
    got = torch.vmap(lambda *t: anysoftmax.merge_states(t[:3], t[3:]))(*batch)
    for i in range(2):
        want = anysoftmax.merge_states([b[i] for b in batch[:3]], [b[i] for b in batch[3:]])
        torch.testing.assert_close((got[0][i], got[1][i]), want)


def test_the_registry_chooses_per_op(monkeypatch):
    """CPU tensors: the automatic choice is torch (triton serves cuda); an explicit or
    $ANYSOFTMAX_BACKEND choice is honoured or refused naming the backend and the reason."""
    from anysoftmax.core import registry
    from anysoftmax.core.lse_merge import MergeSpec, logsumexp_request

    x = torch.randn(3, 4)
    spec, _ = logsumexp_request(x, 1)
    assert registry.select_op("logsumexp", spec).name == "torch"
    assert registry.select_op("logsumexp", spec, "triton").name == "triton"
    mspec = MergeSpec.from_tensors([torch.randn(2, 3)], [torch.randn(2)])
    assert registry.select_op("merge_states", mspec).name == "torch"
    monkeypatch.setenv("ANYSOFTMAX_BACKEND", "cute")
    with pytest.raises((UnsupportedRequestError, anysoftmax.BackendUnavailableError), match="cute"):
        anysoftmax.logsumexp(x, 1)
    monkeypatch.setenv("ANYSOFTMAX_BACKEND", "triton_ascend")
    assert registry.select_op("merge_states", mspec).name == "triton_ascend"
    with pytest.raises(ValueError, match="unknown backend"):
        anysoftmax.merge_states([torch.randn(2, 3)], [torch.randn(2)], backend="nope")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_opcheck(backend, gen):
    """The operators' schema, fake implementations and autograd registration (torch.library.opcheck)."""
    from anysoftmax.torchop.lse_merge import logsumexp_op, merge_states_op

    x = torch.randn(3, 4, 10, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.randn(10, generator=gen, dtype=torch.float64)
    sinks = torch.randn(4, 1, generator=gen, dtype=torch.float64)
    torch.library.opcheck(logsumexp_op, (x, None, None, -1, None, None, "none", backend))
    torch.library.opcheck(logsumexp_op, (x, mask, sinks, 2, 0.5, 3.0, "top_left", backend))
    o = [torch.randn(5, 2, 8, generator=gen, dtype=torch.float32, requires_grad=True) for _ in range(3)]
    ls = [torch.randn(5, 2, generator=gen, requires_grad=True) for _ in range(3)]
    torch.library.opcheck(merge_states_op, (o, ls, backend))


# ---- merge_states: a fully masked segment's partial weighs 0 in the derivatives too ----------

def _merge_grads(outs, lses, backend, w_out, w_lse, create_graph=False):
    leaves = [t.detach().requires_grad_() for t in (*outs, *lses)]
    out, lse = anysoftmax.merge_states(leaves[:len(outs)], leaves[len(outs):], backend=backend)
    return torch.autograd.grad((out * w_out).sum() + (lse * w_lse).sum(), leaves, create_graph=create_graph)


@pytest.mark.parametrize("backend", BACKENDS)
def test_merge_gradients_ignore_a_nan_partial_of_weight_zero(backend, gen):
    """A partial with lse -inf and NaN in its output (what a fully masked segment's softmax with
    empty_rows="nan", or SDPA's, leaves) gets 0 gradients, and the others get exactly what they
    get when that output holds finite values instead; rows where every partial is -inf too."""
    dtype = torch.float64 if takes_float64(backend) else torch.float32
    outs = [torch.randn(4, 6, generator=gen, dtype=dtype) for _ in range(3)]
    lses = [torch.randn(4, generator=gen, dtype=dtype) * 3 for _ in range(3)]
    lses[1][0] = lses[1][2] = -math.inf  # partial 1 is empty in rows 0 and 2
    for ls in lses:
        ls[2] = -math.inf  # row 2: every partial empty
    w_out, w_lse = torch.randn(4, 6, generator=gen, dtype=dtype), torch.randn(4, generator=gen, dtype=dtype)
    finite = _merge_grads(outs, lses, backend, w_out, w_lse)
    outs[1][0] = math.nan
    outs[1][2] = math.nan
    got = _merge_grads(outs, lses, backend, w_out, w_lse)
    for i, (g, want) in enumerate(zip(got, finite)):
        assert torch.equal(g, want), f"gradient {i} differs (NaN: {torch.isnan(g).any().item()})"
    assert torch.equal(got[1][0], torch.zeros(6, dtype=dtype)) and got[4][0].item() == 0.0


def test_merge_double_backward_with_a_nan_partial(gen):
    """gradcheck and gradgradcheck (float64) with a partial of lse -inf and NaN output in one
    row: its derivatives of every order are 0. (The derivatives are one formula in torch ops for
    every backend; finite differences through an interpreted kernel would cost seconds.)"""
    outs = [torch.randn(3, 4, generator=gen, dtype=torch.float64) for _ in range(3)]
    lses = [torch.randn(3, generator=gen, dtype=torch.float64) for _ in range(3)]
    lses[1][0] = -math.inf
    outs[1][0] = math.nan
    leaves = [t.requires_grad_() for t in (*outs, *lses)]
    f = lambda *t: anysoftmax.merge_states(t[:3], t[3:])  # noqa: E731
    assert torch.autograd.gradcheck(f, leaves)
    assert torch.autograd.gradgradcheck(f, leaves)


@pytest.mark.parametrize("backend", BACKENDS)
def test_split_kv_with_a_fully_masked_segment(backend, gen):
    """Attention over keys split in three segments, the middle one fully masked in every row:
    x.grad through merge_states equals the unsplit attention's (float64 torch), never NaN."""
    dtype = torch.float64 if takes_float64(backend) else torch.float32
    x = torch.randn(5, 12, generator=gen, dtype=dtype, requires_grad=True)
    v = torch.randn(12, 4, generator=gen, dtype=dtype)
    mask = torch.rand(5, 12, generator=gen) < 0.3
    mask[:, 4:8] = True
    mask[:, 9] = False  # every row keeps something
    w_out, w_lse = torch.randn(5, 4, generator=gen, dtype=dtype), torch.randn(5, generator=gen, dtype=dtype)
    outs, lses = [], []
    for a, b in ((0, 4), (4, 8), (8, 12)):
        seg, m = x[:, a:b], mask[:, a:b]
        outs.append(anysoftmax.softmax(seg, -1, mask=m, empty_rows="nan") @ v[a:b])
        lses.append(anysoftmax.logsumexp(seg, -1, mask=m))
    assert torch.isnan(outs[1]).all() and torch.isneginf(lses[1]).all()
    out, lse = anysoftmax.merge_states(outs, lses, backend=backend)
    g, = torch.autograd.grad((out * w_out).sum() + (lse * w_lse).sum(), x)
    x64 = x.detach().double().requires_grad_()
    z = x64.masked_fill(mask, -math.inf)
    ref_loss = ((torch.softmax(z, -1) @ v.double()) * w_out.double()).sum() + \
        (torch.logsumexp(z, -1) * w_lse.double()).sum()
    ref, = torch.autograd.grad(ref_loss, x64)
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(g.double(), ref, rtol=10 * tol.rtol, atol=10 * tol.rtol * ref.abs().max().item())
    assert torch.equal(g[:, 4:8], torch.zeros(5, 4, dtype=dtype))


# ---- merge_states: float64 lses with 16/32-bit outputs ----------------------------------------

@pytest.mark.parametrize("backend", [b for b in BACKENDS if takes_float64(b)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_merge_float64_lses_with_narrower_outputs(backend, dtype, gen):
    """Outputs in 16/32 bits with float64 lses (every one, or some): the merge accumulates in
    float64 and rounds the result once to the outputs' dtype (through float32 in the kernels);
    K = 11 merges in groups through a float64 intermediate."""
    for k, lse_dtypes in ((3, (torch.float64,) * 3), (3, (torch.float64, torch.float32, torch.float64)),
                          (11, (torch.float64,) * 11)):
        outs = [torch.randn(6, 3, 40, generator=gen).to(dtype) for _ in range(k)]
        lses = [(torch.randn(6, 3, generator=gen, dtype=torch.float64) * 4).to(d) for d in lse_dtypes]
        lses[0][1, 2] = -math.inf
        out, lse = anysoftmax.merge_states(outs, lses, backend=backend)
        assert out.dtype == dtype
        assert lse.dtype == (torch.float64 if set(lse_dtypes) == {torch.float64} else torch.float32)
        c = compare_merge(out, lse, outs, lses)
        assert c.ok, f"K={k} {lse_dtypes}: {c.detail}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gpu_merge_float64_lses_with_narrower_outputs(dtype, gen):
    """The compiled merge kernel (CUDA) with float64 lses and 16/32-bit outputs: the same
    rounding through float32 as the interpreter's, against the float64 reference; K = 2, 8
    and 11 (merged in groups through a float64 intermediate)."""
    for k in (2, 8, 11):
        outs = [torch.randn(300, 8, 128, generator=gen).to(dtype).cuda() for _ in range(k)]
        lses = [(torch.randn(300, 8, generator=gen, dtype=torch.float64) * 4).cuda() for _ in range(k)]
        lses[0][::7] = -math.inf
        out, lse = anysoftmax.merge_states(outs, lses, backend="triton")
        assert out.dtype == dtype and lse.dtype == torch.float64
        c = compare_merge(out, lse, outs, lses)
        assert c.ok, f"K={k}: {c.detail}"


# ---- forward mode and torch.func transforms, against torch.func of the float64 formulas --------

def _transform_setup(backend):
    """(dtype, tolerances): float64 where the backend takes it, else float32 (NPU backends)."""
    if takes_float64(backend):
        return torch.float64, dict(rtol=1e-9, atol=1e-11)
    return torch.float32, dict(rtol=2e-5, atol=2e-5)


def _lse_pair(backend, x, dim, **fused):
    """(anysoftmax.logsumexp of (x, mask, sinks), the float64 formula of the same request), both
    functions of the three tensors (mask and sinks as given in `fused`, None when absent)."""
    from anysoftmax.core.lse_merge import logsumexp_formula

    spec, _ = logsumexp_request(x, dim, **fused)
    kw = {k: v for k, v in fused.items() if k not in ("mask", "sinks")}

    def ours(a, m, s):
        return anysoftmax.logsumexp(a, dim, mask=m, sinks=s, backend=backend, **kw)

    def reference(a, m, s):
        m = None if m is None else (m if m.dtype == torch.bool else m.double())
        s = None if s is None else s.double()
        return logsumexp_formula(a.double(), spec.variant, spec.dim, m, s, torch.float64).squeeze(spec.dim)
    return ours, reference


@pytest.mark.parametrize("backend", BACKENDS)
def test_logsumexp_forward_mode(backend, gen):
    """jvp (tangents of x, an additive mask and the sinks), dual numbers and jacfwd of the fused
    logsumexp equal those of the float64 formula."""
    import torch.autograd.forward_ad as fwad
    from torch.func import jacfwd, jvp

    dtype, tol = _transform_setup(backend)
    rand = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    x, m, s = rand(3, 4, 9) * 2, rand(9), rand(4, 1)
    ours, ref = _lse_pair(backend, x, -1, scale=0.7, softcap=3.0, mask=m, sinks=s)
    tangents = (rand(3, 4, 9), rand(9), rand(4, 1))
    got, want = jvp(ours, (x, m, s), tangents), jvp(ref, (x, m, s), tangents)
    torch.testing.assert_close(got[0], want[0].to(got[0].dtype), **tol)
    torch.testing.assert_close(got[1], want[1].to(got[1].dtype), **tol)
    with fwad.dual_level():
        dual = fwad.unpack_dual(ours(fwad.make_dual(x, tangents[0]), m, s))
    torch.testing.assert_close(dual.tangent, jvp(lambda a: ref(a, m, s), (x,), tangents[:1])[1].to(dtype), **tol)
    for got_j, want_j in zip(jacfwd(ours, argnums=(0, 1, 2))(x, m, s), jacfwd(ref, argnums=(0, 1, 2))(x, m, s)):
        torch.testing.assert_close(got_j, want_j.to(got_j.dtype), **tol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logsumexp_forward_mode_of_empty_rows_is_zero(backend, gen):
    """Rows with nothing kept (a bool mask, -inf logits, causal) are -inf: their tangent is 0,
    never NaN (the formula's exp(-inf - -inf)); with a sink such a row is s, tangent t_s."""
    from torch.func import jacfwd, jvp

    dtype, tol = _transform_setup(backend)
    x = torch.randn(2, 5, 7, generator=gen, dtype=dtype)
    x[1, 2] = -math.inf
    mask = torch.rand(2, 5, 7, generator=gen) < 0.3
    mask[0, 1] = True
    t = torch.randn(2, 5, 7, generator=gen, dtype=dtype)
    for fused in (dict(mask=mask), dict(mask=mask, causal="bottom_right", scale=0.5), dict(mask=mask, softcap=2.0)):
        empty = torch.zeros(2, 5, dtype=torch.bool)
        empty[0, 1] = True
        empty[1, 2] = "softcap" not in fused  # (softcap maps -inf logits to -softcap)
        ours, ref = _lse_pair(backend, x, -1, **fused)
        value, tangent = jvp(lambda a: ours(a, mask, None), (x,), (t,))
        want = jvp(lambda a: ref(a, mask, None), (x,), (t,))[1]
        assert torch.isneginf(value[empty]).all(), fused
        empty = torch.isneginf(value)  # (with causal, the random mask may empty more rows)
        assert torch.equal(tangent[empty], torch.zeros_like(tangent[empty])), fused
        torch.testing.assert_close(tangent[~empty], want[~empty].to(tangent.dtype), **tol)
        jac = jacfwd(lambda a: ours(a, mask, None))(x)
        assert torch.isfinite(jac).all() and torch.equal(jac[empty], torch.zeros_like(jac[empty])), fused
    sinks = torch.randn(5, 1, generator=gen, dtype=dtype)
    ts = torch.randn(5, 1, generator=gen, dtype=dtype)
    ours, ref = _lse_pair(backend, x, -1, mask=mask, sinks=sinks)
    got = jvp(lambda a, s: ours(a, mask, s), (x, sinks), (t, ts))
    want = jvp(lambda a, s: ref(a, mask, s), (x, sinks), (t, ts))
    torch.testing.assert_close(got[1], want[1].to(got[1].dtype), **tol)
    torch.testing.assert_close(got[1][0, 1], ts[1, 0], **tol)  # only the sink: d lse = t_s


@pytest.mark.parametrize("backend", BACKENDS)
def test_logsumexp_second_order_transforms(backend, gen):
    """hessian (forward over reverse) and jacrev(jacfwd) of a loss of the fused logsumexp, an
    empty row among them (its block 0), against torch.func of the float64 formula; forward over
    forward is refused, as for softmax."""
    from torch.func import hessian, jacfwd, jacrev

    dtype, tol = _transform_setup(backend)
    x = torch.randn(3, 6, generator=gen, dtype=dtype)
    mask = torch.randn(3, 6, generator=gen, dtype=dtype)
    mask[1] = -math.inf  # row 1: nothing kept
    w = torch.randn(3, generator=gen, dtype=dtype)
    ours, ref = _lse_pair(backend, x, -1, scale=0.8, softcap=2.5, mask=mask)

    def loss(f, rows):
        def run(a):
            lse = f(a, mask[rows], None)
            return (torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)) * w[rows].to(lse.dtype)).sin().sum()
        return run
    every, live = torch.arange(3), torch.tensor([0, 2])
    for transform in (hessian, lambda f: jacrev(jacfwd(f))):
        got = transform(loss(ours, every))(x)
        want = transform(loss(ref, live))(x[live])
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got[live][:, :, live], want.to(got.dtype), **tol)
        assert torch.equal(got[1], torch.zeros_like(got[1]))
    with pytest.raises(NotImplementedError, match=r"jacfwd\(jacrev"):
        jacfwd(jacfwd(lambda a: anysoftmax.logsumexp(a, -1, backend=backend)))(x)


def _merge_pair(backend, k):
    """(anysoftmax.merge_states, the float64 formula) as functions of the 2k tensors."""
    from anysoftmax.core.lse_merge import merge_formula

    def ours(*t):
        return anysoftmax.merge_states(list(t[:k]), list(t[k:]), backend=backend)

    def reference(*t):
        return merge_formula([a.double() for a in t[:k]], [a.double() for a in t[k:]], torch.float64, torch.float64,
                             torch.float64)
    return ours, reference


def _merge_inputs(gen, dtype, k=3):
    """k partials [4, 5] with lses [4]; partial 1 is empty (lse -inf, NaN output) in row 0."""
    outs = [torch.randn(4, 5, generator=gen, dtype=dtype) for _ in range(k)]
    lses = [torch.randn(4, generator=gen, dtype=dtype) * 2 for _ in range(k)]
    lses[1][0] = -math.inf
    outs[1][0] = math.nan
    return (*outs, *lses)


@pytest.mark.parametrize("backend", BACKENDS)
def test_merge_forward_mode(backend, gen):
    """jvp and jacfwd of merge_states equal those of the float64 formula; a partial of lse -inf
    (NaN output) contributes 0, and a row where every partial is -inf has tangent 0."""
    from torch.func import jacfwd, jvp

    dtype, tol = _transform_setup(backend)
    k = 3
    ours, ref = _merge_pair(backend, k)
    inputs = _merge_inputs(gen, dtype, k)
    tangents = tuple(torch.randn(t.shape, generator=gen, dtype=dtype) for t in inputs)
    (value, got), (_, want) = jvp(ours, inputs, tangents), jvp(ref, inputs, tangents)
    torch.testing.assert_close(got, tuple(w.to(dtype) for w in want), **tol)
    argnums = tuple(range(2 * k))
    for got_j, want_j in zip(jacfwd(ours, argnums=argnums)(*inputs), jacfwd(ref, argnums=argnums)(*inputs)):
        torch.testing.assert_close(got_j, tuple(w.to(dtype) for w in want_j), **tol)
    for t in inputs[k:]:
        t[2] = -math.inf  # row 2: every partial empty
    value, got = jvp(ours, inputs, tangents)
    assert torch.isneginf(value[1][2]) and torch.equal(value[0][2], torch.zeros(5, dtype=dtype))
    assert got[1][2].item() == 0.0 and torch.equal(got[0][2], torch.zeros(5, dtype=dtype))
    assert all(torch.isfinite(g).all() for g in got)


@pytest.mark.parametrize("backend", BACKENDS)
def test_merge_second_order_transforms(backend, gen):
    """hessian and jacrev(jacfwd) of a loss of merge_states (a partial of lse -inf with NaN
    output among them) against torch.func of the float64 formula."""
    from torch.func import hessian, jacfwd, jacrev

    dtype, tol = _transform_setup(backend)
    k = 2
    ours, ref = _merge_pair(backend, k)
    inputs = _merge_inputs(gen, dtype, k)
    w_out, w_lse = torch.randn(4, 5, generator=gen, dtype=dtype), torch.randn(4, generator=gen, dtype=dtype)

    def loss(f):
        def run(*t):
            out, lse = f(*t)
            return (out * w_out.to(out.dtype)).sin().sum() + (lse * w_lse.to(lse.dtype)).sin().sum()
        return run
    argnums = tuple(range(2 * k))
    for transform in (hessian, lambda f, argnums: jacrev(jacfwd(f, argnums=argnums), argnums=argnums)):
        got, want = transform(loss(ours), argnums=argnums)(*inputs), transform(loss(ref), argnums=argnums)(*inputs)
        for got_row, want_row in zip(got, want):
            torch.testing.assert_close(got_row, tuple(w.to(dtype) for w in want_row), **tol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logsumexp_without_keepdim_is_allocated_in_its_shape(backend, gen):
    # keepdim=False reaches the launcher, which allocates the result without `dim` (no view of a
    # kept-shape result a call); values against the reference, on a miss and on the memo's hit,
    # and on the empty-rows formula path.
    for shape, dim in (((3, 5, 40), 1), ((6, 33), -1), ((4, 0, 3), 1), ((0, 7), -1)):
        x = torch.randn(shape, generator=gen)
        for _ in range(2):
            out = anysoftmax.logsumexp(x, dim, backend=backend)
            assert out.shape == tuple(s for d, s in enumerate(shape) if d != dim % len(shape))
            if backend == "triton" and x.numel():  # (a launch: the formula and the other backends view)
                assert out._base is None, "the result is a view of a kept-shape tensor"
            spec, _ = logsumexp_request(x, dim)
            c = compare_logsumexp(out.unsqueeze(dim), x, spec, None, None)
            assert c.ok, c.detail
        kept = anysoftmax.logsumexp(x, dim, keepdim=True, backend=backend)
        assert kept.shape == tuple(1 if d == dim % len(shape) else s for d, s in enumerate(shape))
        torch.testing.assert_close(kept.squeeze(dim), out, rtol=0, atol=0)

