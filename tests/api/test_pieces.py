"""anysoftmax.logsumexp and anysoftmax.merge_states: values against the float64 reference on
fresh random data, the special values core.pieces states, errors, autograd, vmap, compile."""

from __future__ import annotations

import math

import pytest
import torch

import anysoftmax
from anysoftmax.core.compare import compare_logsumexp, compare_merge
from anysoftmax.core.errors import UnsupportedRequestError
from anysoftmax.core.pieces import logsumexp_request, reference_logsumexp

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


def test_the_registry_chooses_per_op(monkeypatch):
    """CPU tensors: the automatic choice is torch (triton serves cuda); an explicit or
    $ANYSOFTMAX_BACKEND choice is honoured or refused naming the backend and the reason."""
    from anysoftmax.core import registry
    from anysoftmax.core.pieces import MergeSpec, logsumexp_request

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
    from anysoftmax.torchop.pieces import logsumexp_op, merge_states_op

    x = torch.randn(3, 4, 10, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.randn(10, generator=gen, dtype=torch.float64)
    sinks = torch.randn(4, 1, generator=gen, dtype=torch.float64)
    torch.library.opcheck(logsumexp_op, (x, None, None, -1, None, None, "none", backend))
    torch.library.opcheck(logsumexp_op, (x, mask, sinks, 2, 0.5, 3.0, "top_left", backend))
    o = [torch.randn(5, 2, 8, generator=gen, dtype=torch.float32, requires_grad=True) for _ in range(3)]
    ls = [torch.randn(5, 2, generator=gen, requires_grad=True) for _ in range(3)]
    torch.library.opcheck(merge_states_op, (o, ls, backend))
