"""The attention function alone against transformers' own eager attention functions (Llama,
Gemma2, gpt-oss), on the masks transformers builds: the same mask as a bool "sdpa" mask for
anysoftmax and as an additive "eager" mask for eager; errors; the mask-inversion reuse."""

from __future__ import annotations

import types

import pytest
import torch

import families as F

hf = pytest.importorskip("anysoftmax.integrations.transformers",
                         reason="needs transformers (pip install 'anysoftmax[hf]')")
from transformers import masking_utils  # noqa: E402
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as gemma2_eager  # noqa: E402
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_eager  # noqa: E402
from transformers.models.llama.modeling_llama import eager_attention_forward as llama_eager  # noqa: E402

B, H, HKV, S, D = 2, 4, 2, 11, 8


def _module(sinks=None):
    m = types.SimpleNamespace(num_key_value_groups=H // HKV, training=False, is_causal=True)
    if sinks is not None:
        m.sinks = sinks
    return m


def _masks(window=None):
    """The same padding + causal (+ sliding window) mask in both of transformers' forms: row 0
    is left-padded by 3 tokens, so its first 3 query rows keep no key."""
    padding = torch.ones(B, S, dtype=torch.bool)
    padding[0, :3] = False
    fn = masking_utils.causal_mask_function if window is None else masking_utils.sliding_window_causal_mask_function(window)
    kw = dict(batch_size=B, q_length=S, kv_length=S, mask_function=fn, attention_mask=padding)
    return masking_utils.sdpa_mask(**kw, allow_is_causal_skip=False), masking_utils.eager_mask(**kw, dtype=torch.float32)


def _qkv(gen, dtype=torch.float32, spread=3.0):
    q = torch.randn(B, H, S, D, generator=gen, dtype=dtype) * spread
    k = torch.randn(B, HKV, S, D, generator=gen, dtype=dtype) * spread
    v = torch.randn(B, HKV, S, D, generator=gen, dtype=dtype)
    return q, k, v


CASES = {  # name: (eager function, keywords, with sinks)
    "llama": (llama_eager, {}, False),
    "gemma2_softcap_window": (gemma2_eager, {"softcap": 5.0, "window": 4}, False),
    "gpt_oss_sinks_window": (gpt_oss_eager, {"window": 4}, True),
}


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_the_models_eager_attention(case, backend, gen):
    eager_fn, kw, with_sinks = CASES[case]
    kw = dict(kw)
    keep, additive = _masks(kw.pop("window", None))
    module = _module(torch.randn(H, generator=gen) * 2 if with_sinks else None)
    q, k, v = _qkv(gen)
    scaling = D ** -0.5
    out_e, p_e = eager_fn(module, q, k, v, additive, scaling=scaling, **kw)
    out, p = hf.attention_forward(module, q, k, v, keep, scaling=scaling, backend=backend, **kw)
    torch.testing.assert_close(p, p_e, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, out_e, rtol=1e-5, atol=1e-5)
    # The empty rows (padded queries before the first token) exactly as eager gives them:
    # uniform 1/S without sinks, 0 with them.
    empty = p_e[0, :, :3]
    assert torch.equal(empty, torch.full_like(empty, 0.0 if with_sinks else 1 / S))
    assert torch.equal(p[0, :, :3], empty)


@pytest.mark.parametrize("backend, dtype", [
    ("torch", torch.float64), ("torch", torch.float32), ("triton", torch.float32), ("triton", torch.float64)])
def test_gradients_match_float64_eager(backend, dtype, gen):
    # Gemma2's softcap + gpt-oss's sinks + a sliding window at once, against the float64
    # restatement of eager; upstream gradients are zero on the empty rows (their gradient is
    # 0 here, eager back-propagates through its finfo.min fill: module docstring). float32
    # runs are held to a float32 bound (2-norm of the error over the float64 gradient's).
    keep, additive = _masks(window=4)
    sinks = torch.randn(H, generator=gen, dtype=torch.float64) * 2
    q, k, v = _qkv(gen, torch.float64)
    grad_out = torch.randn(B, S, H, D, generator=gen, dtype=torch.float64)
    grad_out[0, :3] = 0
    kw = dict(scaling=D ** -0.5, softcap=5.0)

    def grads(fn, mask, t):
        leaves = [x.detach().to(t).requires_grad_() for x in (q, k, v, sinks)]
        out = fn(_module(leaves[3]), *leaves[:3], mask, **kw)[0]
        return torch.autograd.grad(out, leaves, grad_out.to(t))

    expected = grads(F.reference_attention, additive.to(torch.float64), torch.float64)
    got = grads(lambda *a, **k: hf.attention_forward(*a, backend=backend, **k), keep, dtype)
    for name, g, e in zip("q k v sinks".split(), got, expected):
        assert g.dtype == dtype
        if dtype == torch.float64:
            torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-11, msg=lambda m: f"d{name}: {m}")
        else:
            err = ((g.double() - e).norm() / e.norm()).item()
            assert err < 16 * torch.finfo(dtype).eps, f"d{name}: relative error {err:.2e}"


def test_no_mask_is_causal_unless_the_module_or_call_says_otherwise(gen):
    q, k, v = _qkv(gen)
    module = _module()
    causal = torch.ones(S, S).tril().bool()
    additive = torch.zeros(S, S).masked_fill(~causal, torch.finfo(torch.float32).min)
    torch.testing.assert_close(hf.attention_forward(module, q, k, v, None)[1],
                               llama_eager(module, q, k, v, additive, scaling=D ** -0.5)[1])
    full = llama_eager(module, q, k, v, None, scaling=D ** -0.5)[1]
    torch.testing.assert_close(hf.attention_forward(module, q, k, v, None, is_causal=False)[1], full)
    module.is_causal = False  # an encoder's attention
    torch.testing.assert_close(hf.attention_forward(module, q, k, v, None)[1], full)
    module.is_causal = True  # one query (decoding): it reads every key
    torch.testing.assert_close(hf.attention_forward(module, q[:, :, -1:], k, v, None)[1], full[:, :, -1:])


def test_a_floating_mask_is_added_as_eager_adds_it(gen):
    q, k, v = _qkv(gen)
    bias = torch.randn(B, 1, S, S, generator=gen)
    module = _module()
    before = hf.calls["additive"]
    out, p = hf.attention_forward(module, q, k, v, bias)
    out_e, p_e = llama_eager(module, q, k, v, bias, scaling=D ** -0.5)
    torch.testing.assert_close(p, p_e, rtol=1e-5, atol=1e-6)
    assert hf.calls["additive"] == before + 1


def test_the_mask_inversion_is_reused_only_for_the_same_unchanged_mask():
    keep, _ = _masks()
    first = hf.excluded_positions(keep)
    assert torch.equal(first, ~keep)
    assert hf.excluded_positions(keep) is first  # the next layer of the same forward
    keep[1, 0, 5, 0] = ~keep[1, 0, 5, 0]  # modified in place: recomputed
    second = hf.excluded_positions(keep)
    assert second is not first and torch.equal(second, ~keep)
    other = keep.clone()
    assert hf.excluded_positions(other) is not second


def test_bad_input_names_the_argument(gen):
    q, k, v = _qkv(gen)
    with pytest.raises(TypeError, match="attention_mask dtype torch.int64"):
        hf.attention_forward(_module(), q, k, v, torch.ones(B, 1, S, S, dtype=torch.long))
    with pytest.raises(TypeError, match="attention_mask must be a torch.Tensor"):
        hf.attention_forward(_module(), q, k, v, [[1]])
    with pytest.raises(NotImplementedError, match="position_bias"):
        hf.attention_forward(_module(), q, k, v, None, position_bias=torch.zeros(1))
    with pytest.raises(ValueError, match="softcap"):
        hf.attention_forward(_module(), q, k, v, None, softcap=-1.0)
    with pytest.raises(ValueError, match="name"):
        hf.register("org/kernel")
