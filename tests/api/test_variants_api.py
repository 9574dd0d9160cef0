"""The fused family's API: errors that name the argument, the vendors' conventions reproduced
through `empty_rows`, the one cache key, and "without the new keywords nothing changes"."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import anysoftmax
from anysoftmax import dispatch
from anysoftmax.core import SoftmaxSpec
from anysoftmax.core.request import FUSED_FWD, request_key
from helpers import FUSED_PROBE, StubBackend, backends_that_run

# The CPU backends that declare the fused family (a plugin without `fused = True` is not one).
CPU_BACKENDS = backends_that_run("cpu", fused=FUSED_PROBE)


def _x(gen, shape=(2, 3, 8, 10), dtype=torch.float32):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * 3).to(dtype)


# ---- errors name the argument ------------------------------------------------------------------

BAD = [
    (dict(mask=torch.zeros(4, 8, 10, dtype=torch.bool)), ValueError, "mask of shape \\[4, 8, 10\\] does not broadcast"),
    (dict(mask=torch.zeros(8, 10, dtype=torch.int32)), TypeError, "mask dtype torch.int32"),
    (dict(mask=[[True]]), TypeError, "mask must be a torch.Tensor"),
    (dict(causal="upper"), ValueError, "causal must be"),
    (dict(softcap=0.0), ValueError, "softcap must be > 0"),
    (dict(softcap=-1.0), ValueError, "softcap must be > 0"),
    (dict(softcap=float("inf")), ValueError, "softcap must be finite"),
    (dict(scale=float("nan")), ValueError, "scale must be finite"),
    (dict(scale="0.5"), TypeError, "scale must be a float"),
    (dict(scale=True), TypeError, "scale must be a float"),
    (dict(scale=np.True_), TypeError, "scale must be a float, got bool"),
    (dict(softcap=torch.tensor(True)), TypeError, "softcap must be a float, got bool"),
    (dict(softcap=np.float32("nan")), ValueError, "softcap must be finite"),
    (dict(sinks=torch.zeros(3, 1, 10)), ValueError, "sinks of shape \\[3, 1, 10\\]"),
    (dict(sinks=torch.zeros(4, 1, 1)), ValueError, "sinks of shape \\[4, 1, 1\\]"),
    (dict(sinks=torch.zeros(3, 1, 1, dtype=torch.int64)), TypeError, "sinks dtype"),
    (dict(empty_rows="zeros"), ValueError, "empty_rows must be one of"),
    (dict(empty_rows=None), ValueError, "empty_rows must be one of"),
]


@pytest.mark.parametrize("kwargs,exc,match", BAD, ids=[str(i) for i in range(len(BAD))])
@pytest.mark.parametrize("backend", ["torch", None])
def test_bad_keywords_name_the_argument(kwargs, exc, match, backend, gen):
    with pytest.raises(exc, match=match):
        anysoftmax.softmax(_x(gen), -1, backend=backend, **kwargs)


def test_bad_keywords_fail_with_autograd_and_repeatedly(gen):
    # The memo must not let a second call skip validation of values.
    x = _x(gen).requires_grad_()
    with pytest.raises(ValueError, match="softcap must be > 0"):
        anysoftmax.softmax(x, -1, softcap=-2.0, backend="torch")
    y = _x(gen)
    anysoftmax.softmax(y, -1, scale=0.5, backend="torch")
    with pytest.raises(ValueError, match="scale must be finite"):
        anysoftmax.softmax(y, -1, scale=float("inf"), backend="torch")


# What F.scaled_dot_product_attention's `scale` takes besides a float: a Python int, NumPy
# scalars (floating and integer) and a 0-dim tensor.
NUMBERS = [2, np.float32(0.375), np.float64(-0.7), np.float16(1.5), np.int64(3), np.int32(-2),
           torch.tensor(0.25, dtype=torch.float64)]


@pytest.mark.parametrize("value", NUMBERS, ids=lambda v: f"{type(v).__name__}({v})")
@pytest.mark.parametrize("backend", ["torch", None])
def test_scale_and_softcap_take_what_sdpa_takes(value, backend, gen):
    x = _x(gen).requires_grad_()
    as_float = float(value)
    for fn in (anysoftmax.softmax, anysoftmax.log_softmax, anysoftmax.logsumexp):
        for kw, same in ((dict(scale=value), dict(scale=as_float)),
                         (dict(softcap=abs(value)), dict(softcap=abs(as_float))),
                         (dict(scale=value, softcap=abs(value)), dict(scale=as_float, softcap=abs(as_float)))):
            want = fn(x, -1, backend=backend, **same)
            assert torch.equal(fn(x, -1, backend=backend, **kw), want), (fn.__name__, kw)
            with torch.no_grad():
                assert torch.equal(fn(x, -1, backend=backend, **kw), want), (fn.__name__, kw)


def test_causal_needs_the_last_dim_of_two(gen):
    with pytest.raises(ValueError, match="causal=True needs the softmax over the last dim"):
        anysoftmax.softmax(_x(gen), 2, causal=True)
    with pytest.raises(ValueError, match="at least 2 dims"):
        anysoftmax.softmax(torch.randn(7, generator=gen), 0, causal=True)


def test_mask_on_another_device_is_named(gen):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU to put the mask on another device")
    with pytest.raises(ValueError, match="mask is on cuda"):
        anysoftmax.softmax(_x(gen), -1, mask=torch.zeros(8, 10, dtype=torch.bool, device="cuda"))


class PlainOnly(StubBackend):
    """A backend that never declared the fused family."""

    name = "plain_only"

    def run(self, x, spec):
        return torch.softmax(x, spec.dim)


def test_backend_without_fused_family_is_refused_with_its_reason(gen):
    anysoftmax.register(PlainOnly())
    try:
        with pytest.raises(anysoftmax.UnsupportedRequestError, match="plain_only.*computes the plain softmax only"):
            anysoftmax.softmax(_x(gen), -1, scale=0.5, backend="plain_only")
        # plain calls still go to it
        x = _x(gen)
        torch.testing.assert_close(anysoftmax.softmax(x, -1, backend="plain_only"), torch.softmax(x, -1))
    finally:
        anysoftmax.unregister("plain_only")


# ---- without the new keywords nothing changes --------------------------------------------------

@pytest.mark.parametrize("backend", backends_that_run("cpu"))
def test_defaults_are_the_plain_softmax(backend, gen):
    """Every backend, plain-only ones included: the fused keywords at their defaults are the
    plain request."""
    x = _x(gen)
    plain = anysoftmax.softmax(x, -1, backend=backend)
    same = anysoftmax.softmax(x, -1, backend=backend, scale=None, mask=None, causal=False, softcap=None,
                              sinks=None, empty_rows="zero")
    assert torch.equal(plain, same)
    if backend in CPU_BACKENDS:  # scale=1.0 is a step (a flag) but the same function
        torch.testing.assert_close(anysoftmax.softmax(x, -1, backend=backend, scale=1.0), plain, rtol=1e-6,
                                   atol=1e-7)


def test_empty_rows_without_a_mask_is_the_plain_softmax(gen):
    x = _x(gen)
    spec, _ = SoftmaxSpec.from_request(x, -1, fused=dict(empty_rows="nan"))
    assert spec.is_plain
    torch.testing.assert_close(anysoftmax.softmax(x, -1, empty_rows="nan", backend="torch"), torch.softmax(x, -1))


# ---- the vendors' conventions, reproduced ------------------------------------------------------

def _scores(gen, dtype=torch.float64):
    x = _x(gen, (2, 2, 6, 9), dtype)
    mask = torch.rand((2, 1, 6, 9), generator=gen) < 0.4
    mask[0, 0, 1] = True  # a fully masked row
    mask[1, 0, 4] = True
    return x, mask


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_conventions(backend, gen):
    """Each vendor's fused softmax, restated in torch, equals one `empty_rows` policy."""
    x, mask = _scores(gen, torch.float32)
    scale = 0.3
    tol = dict(rtol=1e-5, atol=1e-6)
    # apex / Megatron on CUDA: fill -10000, a fully masked row gives zeros (decided by the mask).
    apex = (x * scale).masked_fill(mask, -10000.0).softmax(-1)
    apex = apex.masked_fill(mask.all(-1, keepdim=True), 0.0)
    torch.testing.assert_close(anysoftmax.softmax(x, -1, scale=scale, mask=mask, backend=backend), apex, **tol)
    # torch_npu npu_scaled_masked_softmax: fill -10000, no special case: a fully masked row is uniform.
    npu = (x * scale).masked_fill(mask, -10000.0).softmax(-1)
    torch.testing.assert_close(anysoftmax.softmax(x, -1, scale=scale, mask=mask, empty_rows="uniform",
                                                  backend=backend), npu, **tol)
    # torch's masked_fill(-inf) then softmax: NaN rows.
    nanrows = (x * scale).masked_fill(mask, -math.inf).softmax(-1)
    torch.testing.assert_close(anysoftmax.softmax(x, -1, scale=scale, mask=mask, empty_rows="nan", backend=backend),
                               nanrows, equal_nan=True, **tol)
    # SDPA's math path (_safe_softmax, bool attn_mask True = KEEP): zeros.
    keep = ~mask
    sdpa = torch._safe_softmax((x * scale).masked_fill(~keep, -math.inf), -1)
    torch.testing.assert_close(anysoftmax.softmax(x, -1, scale=scale, mask=~keep, backend=backend), sdpa, **tol)
    # HF eager: an additive finfo.min mask (uniform rows where everything is masked, by value).
    add = torch.zeros(mask.shape).masked_fill(mask, torch.finfo(torch.float32).min)
    hf = (x * scale + add).softmax(-1)
    torch.testing.assert_close(anysoftmax.softmax(x, -1, scale=scale, mask=add, backend=backend), hf, **tol)
    # gpt-oss: a sink column concatenated after scaling, dropped after the softmax.
    sinks = torch.randn(2, generator=gen)
    logits = torch.cat([x * scale, sinks.view(1, 2, 1, 1).expand(2, 2, 6, 1)], -1)
    oss = logits.softmax(-1)[..., :-1]
    torch.testing.assert_close(anysoftmax.softmax(x, -1, scale=scale, sinks=sinks.view(2, 1, 1), backend=backend),
                               oss, **tol)
    # Gemma2: cap * tanh(scaled / cap), then the mask.
    cap = 2.0
    gemma = (cap * torch.tanh(x * scale / cap) + add).softmax(-1)
    torch.testing.assert_close(anysoftmax.softmax(x, -1, scale=scale, softcap=cap, mask=add, backend=backend),
                               gemma, **tol)
    # FlashAttention's causal is bottom-right aligned; SDPA's is_causal top-left.
    sq, sk = 6, 9
    br = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
    tl_ = torch.ones(sq, sk, dtype=torch.bool).tril()
    torch.testing.assert_close(anysoftmax.softmax(x, -1, causal="bottom_right", backend=backend),
                               x.masked_fill(~br, -math.inf).softmax(-1), **tol)
    torch.testing.assert_close(anysoftmax.softmax(x, -1, causal=True, backend=backend),
                               x.masked_fill(~tl_, -math.inf).softmax(-1), **tol)


# ---- one cache key -----------------------------------------------------------------------------

def test_kernel_key_tells_operand_layouts_apart(gen):
    x = _x(gen)
    full = torch.rand(2, 3, 8, 10, generator=gen) < 0.3
    bcast = full[:, :1]  # [2, 1, 8, 10]: stride 0 over heads once expanded
    transposed = full.transpose(-1, -2).contiguous().transpose(-1, -2)
    keys = {SoftmaxSpec.from_request(x, -1, fused=dict(mask=m))[0].kernel_key() for m in (full, bcast, transposed)}
    assert len(keys) == 3
    # values of scale/softcap are arguments, not keys
    k1 = SoftmaxSpec.from_request(x, -1, fused=dict(scale=0.1, softcap=3.0))[0].kernel_key()
    k2 = SoftmaxSpec.from_request(x, -1, fused=dict(scale=7.0, softcap=30.0))[0].kernel_key()
    assert k1 == k2


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_memo_never_confuses_operand_layouts(backend, gen):
    """Same input, same mask shape and dtype, different mask strides: each call is right."""
    x = _x(gen, (2, 3, 8, 10))
    a = torch.rand(2, 3, 8, 10, generator=gen) < 0.3
    b = torch.rand(2, 3, 10, 8, generator=gen).transpose(-1, -2) < 0.3  # same shape, transposed strides
    for m in (a, b, a, b):
        want = x.masked_fill(m, -math.inf).softmax(-1)
        torch.testing.assert_close(anysoftmax.softmax(x, -1, mask=m, backend=backend), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_new_temperature_reuses_the_launcher(backend, gen):
    """A new scale or softcap value is an argument: no new memo entry, no new plan (no recompile)."""
    x = _x(gen)
    dispatch.refresh()
    anysoftmax.softmax(x, -1, scale=0.5, softcap=4.0, backend=backend)
    entries = len(dispatch._memo._data)
    for s in (0.1, 0.25, 3.0):
        got = anysoftmax.softmax(x, -1, scale=s, softcap=4.0 + s, backend=backend)
        want = (4.0 + s) * torch.tanh(x * s / (4.0 + s))
        torch.testing.assert_close(got, want.softmax(-1), rtol=1e-5, atol=1e-6)
    assert len(dispatch._memo._data) == entries


def test_request_keys_imply_kernel_keys(gen):
    """Two fused requests with one memo key have one kernel key (the memo cannot conflate
    requests that compile differently)."""
    x = _x(gen)
    masks = [torch.rand(s, generator=gen) < 0.5 for s in ((8, 10), (1, 8, 10), (2, 1, 8, 10), (2, 3, 8, 10))]
    seen = {}
    for m in masks + [m.transpose(-1, -2).contiguous().transpose(-1, -2) for m in masks]:
        for causal in (False, True, "bottom_right"):
            a = dispatch.FusedArgs(0.5, m, causal, None, None, "zero")
            rk = request_key(FUSED_FWD, x, -1, None, None, False, None, a)
            kk = SoftmaxSpec.from_request(x, -1, fused=a.as_kwargs())[0].kernel_key()
            assert seen.setdefault(rk, kk) == kk


def test_broadcast_mask_rows_run_fastest(gen):
    """With a mask broadcast over heads, rows are numbered heads-fastest (the heads of one query
    share the mask row they read), and causal finds each row's query through `inner_div`."""
    from anysoftmax.core.layout import allocate_rows

    x = _x(gen, (2, 3, 8, 10))
    mask = torch.rand(2, 1, 8, 10, generator=gen) < 0.3
    spec, _ = SoftmaxSpec.from_request(x, -1, fused=dict(mask=mask, causal=True, sinks=torch.randn(3, 1, 1)))
    _, _, layout = allocate_rows(x, spec)
    assert layout.row_sizes == (2, 8, 3) and layout.op_row_strides[0][2] == 0
    assert layout.inner_pos == 1 and layout.inner_div == 3
    # plain requests keep the logical order
    _, _, plain = allocate_rows(x, SoftmaxSpec.from_tensor(x, -1))
    assert plain.inner_div == 1
