"""anysoftmax.compat.vllm.merge_attn_states: vLLM's layout and in-place contract, against the
float64 merge of the same partials; the documented differences from vLLM's kernels."""

from __future__ import annotations

import math

import pytest
import torch

from anysoftmax.compat.vllm import merge_attn_states
from anysoftmax.core.compare import compare_merge
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
