"""anysoftmax.compat.vllm.merge_attn_states: vLLM's layout and in-place contract, against the
float64 merge of the same partials; the documented differences from vLLM's kernels."""

from __future__ import annotations

import math

import pytest
import torch

from anysoftmax.compat.vllm import merge_attn_states
from anysoftmax.testing.compare import compare_merge
from anysoftmax.core.spec import TOLERANCES


def _vllm_reference(p_out, p_lse, s_out, s_lse):
    """vLLM's Triton kernel's arithmetic (+inf read as -inf) in float64, for finite cases."""
    p = p_lse.double().t()
    s = s_lse.double().t()
    m = torch.maximum(p, s)
    pe, se = torch.exp(p - m), torch.exp(s - m)
    out = (p_out.double() * (pe / (pe + se)).unsqueeze(-1) + s_out.double() * (se / (pe + se)).unsqueeze(-1))
    return out, (torch.log(pe + se) + m).t()


@pytest.mark.parametrize("backend", ["torch", "triton", "triton_ascend"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens,heads,head_size", [(1, 4, 64), (13, 3, 40)])
def test_matches_vllm_on_finite_lses(backend, dtype, tokens, heads, head_size, gen):
    p_out = torch.randn(tokens, heads, head_size, generator=gen).to(dtype)
    s_out = torch.randn(tokens, heads, head_size, generator=gen).to(dtype)
    p_lse = torch.randn(heads, tokens, generator=gen) * 4
    s_lse = torch.randn(heads, tokens, generator=gen) * 4
    output = torch.full_like(p_out, math.nan)
    output_lse = torch.full((heads, tokens), math.nan)
    assert merge_attn_states(output, p_out, p_lse, s_out, s_lse, output_lse, backend=backend) is None
    c = compare_merge(output, output_lse.t(), [p_out, s_out], [p_lse.t(), s_lse.t()])
    assert c.ok, c.detail
    ref_out, ref_lse = _vllm_reference(p_out, p_lse, s_out, s_lse)
    # The output is rounded once to its dtype: the per-dtype tolerance (relative: a merged value
    # of magnitude 4-8 in bf16 is 1 ulp = 0.03 from an exactly rounded one).
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(output.double(), ref_out, atol=tol.atol, rtol=tol.rtol)
    torch.testing.assert_close(output_lse.double(), ref_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_documented_differences(backend, gen):
    p_out = torch.randn(3, 2, 8, generator=gen)
    s_out = torch.randn(3, 2, 8, generator=gen)
    p_lse = torch.tensor([[-math.inf, math.inf, 0.5], [-math.inf, 0.0, -math.inf]])
    s_lse = torch.tensor([[-math.inf, 0.0, -math.inf], [1.0, 0.0, 2.0]])
    output, output_lse = torch.empty_like(p_out), torch.empty(2, 3)
    merge_attn_states(output, p_out, p_lse, s_out, s_lse, output_lse, backend=backend)
    assert torch.equal(output[0, 0], torch.zeros(8)) and output_lse[0, 0].item() == -math.inf  # both empty
    assert torch.isnan(output[1, 0]).all() and output_lse[0, 1].item() == math.inf  # +inf is +inf
    torch.testing.assert_close(output[2, 0], p_out[2, 0])  # only the prefix
    torch.testing.assert_close(output[0, 1], s_out[0, 1])  # only the suffix
    merge_attn_states(output, p_out, p_lse, s_out, s_lse, backend=backend)  # output_lse optional


def test_errors():
    a = torch.zeros(2, 3, 4)
    lse = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="prefix_lse has shape"):
        merge_attn_states(a, a, lse.t(), a, lse)
    with pytest.raises(TypeError, match="output_lse must be float32"):
        merge_attn_states(a, a, lse, a, lse, lse.double())
    with pytest.raises(ValueError, match="output has shape"):
        merge_attn_states(a[:1], a, lse, a, lse)


def _vllm_top_k_top_p(logits, k, p):
    """vLLM's torch path (v1 sampler): sort ascending, -inf below the k-th largest, then drop
    the tokens whose ascending cumulative probability is <= 1 - p (the largest always kept)."""
    srt, idx = logits.sort(-1)
    if k is not None:
        srt = srt.masked_fill(srt < srt.gather(1, (srt.shape[1] - k.long())[:, None]), -math.inf)
    if p is not None:
        drop = srt.softmax(-1).cumsum(-1) <= 1 - p[:, None]
        drop[:, -1] = False
        srt = srt.masked_fill(drop, -math.inf)
    return torch.empty_like(logits).scatter_(-1, idx, srt)


def test_apply_top_k_top_p_matches_vllm_on_distinct_probabilities(gen):
    from anysoftmax.compat.vllm import apply_top_k_top_p

    rows, vocab = 32, 50
    logits = torch.stack([torch.randperm(vocab, generator=gen) for _ in range(rows)]).float() * 0.2
    k = torch.randint(1, vocab + 1, (rows,), generator=gen, dtype=torch.int32)
    p = torch.rand(rows, generator=gen) * 0.9 + 0.05
    for kk, pp in ((k, None), (None, p), (k, p)):
        x = logits.clone()
        got = apply_top_k_top_p(x, kk, pp)
        assert got is x  # (in place, as vLLM)
        assert torch.equal(got, _vllm_top_k_top_p(logits, kk, pp))
    x = logits.clone()
    assert apply_top_k_top_p(x, None, None) is x and torch.equal(x, logits)


def test_apply_top_k_top_p_keeps_ties_and_names_bad_arguments():
    from anysoftmax.compat.vllm import apply_top_k_top_p

    ties = torch.tensor([[3.0, 2.0, 2.0, 1.0], [1.0, 1.0, 1.0, 1.0], [math.nan, 0.0, 1.0, 2.0]])
    got = apply_top_k_top_p(ties.clone(), torch.tensor([2, 4, 1]), torch.tensor([1.0, 0.5, 0.5]))
    assert torch.equal(got[0], torch.tensor([3.0, 2.0, 2.0, -math.inf]))  # (ties at the k-th value kept)
    assert torch.equal(got[1], ties[1])  # (a tie group straddling top-p kept whole; vLLM's sort splits it)
    assert torch.isnan(got[2, 0]) and torch.equal(got[2, 1:], ties[2, 1:])  # (no distribution: unchanged)
    with pytest.raises(ValueError, match="p is top_p.*top_p"):
        apply_top_k_top_p(ties.clone(), None, torch.tensor([0.0, 0.5, 0.5]))
    with pytest.raises(TypeError, match="top_k"):
        apply_top_k_top_p(ties.clone(), torch.tensor([1.0, 2.0, 3.0]), None)
    with pytest.raises(ValueError, match="top_k"):
        apply_top_k_top_p(ties.clone(), torch.tensor([1, 2]), None)
    with pytest.raises(TypeError, match="k must be a tensor"):
        apply_top_k_top_p(ties.clone(), 3, None)
