"""anysoftmax.compat.torch_npu.npu_scaled_masked_softmax against torch_npu's documented
semantics (softmax of scale * x with masked positions filled with -10000; the generated
upper-triangular mask with fixed_triu_mask), restated in plain torch, on shapes torch_npu
refuses (last dims outside 32..4096 or not multiples of 32)."""

from __future__ import annotations

import pytest
import torch

from anysoftmax.compat.torch_npu import npu_scaled_masked_softmax
from helpers.vendor import FILL, assert_close_to, causal_softmax, fill_softmax

BACKENDS = ["torch", "triton"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("mask_shape", ["full", "broadcast"])
def test_masked(dtype, backend, mask_shape, gen):
    b, n, sq, sk = 2, 3, 6, 45
    scale = float(torch.empty(()).uniform_(0.25, 2.0, generator=gen))
    x = (torch.randn(b, n, sq, sk, generator=gen) * 4).to(dtype)
    mask = torch.rand((b, n, sq, sk) if mask_shape == "full" else (1, 1, sq, sk), generator=gen) < 0.3
    mask[0, 0, 1] = True  # a fully masked row: every entry -10000, so uniform
    mask[0, 0, 2] = False
    if dtype != torch.float16:  # an unmasked row far below the fill: an ordinary row
        x[0, 0, 2] = ((-20000.0 + 0.25 * (torch.arange(sk, dtype=torch.float64) % 8)) / scale).to(dtype)
    expected = fill_softmax(x, mask, scale, apex_zero_rows=False)
    assert (expected[0, 0, 1] - 1 / sk).abs().max() < 1e-15
    out = npu_scaled_masked_softmax(x, mask, scale, False, backend=backend)
    assert_close_to(out, expected, dtype, x.double() * scale, f"npu_scaled_masked_softmax {dtype}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fixed_triu_mask_replaces_the_mask(dtype, backend, gen):
    # MindSpeed's causal call: a dummy all-False mask and fixed_triu_mask=True; the generated
    # upper-triangular mask is used instead of the given one (the docs' computation logic).
    x = (torch.randn(1, 4, 21, 21, generator=gen) * 4).to(dtype)
    given = torch.rand(1, 1, 21, 21, generator=gen) < 0.5
    for mask in (torch.zeros(1, 1, 21, 21, dtype=torch.bool), given):
        out = npu_scaled_masked_softmax(x, mask, 0.5, True, backend=backend)
        assert_close_to(out, causal_softmax(x, 0.5), dtype, x.double() * 0.5, "fixed_triu_mask")
        assert (out.triu(1) == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_shapes_torch_npu_refuses_and_defaults(backend, gen):
    # 3-D, a last dim of 7 and of 4100, one query; scale defaults to 1.0.
    for shape in [(3, 5, 7), (1, 2, 4100), (2, 1, 1, 33)]:
        x = torch.randn(shape, generator=gen, dtype=torch.bfloat16) * 3
        mask = torch.rand(shape, generator=gen) < 0.25
        assert_close_to(npu_scaled_masked_softmax(x, mask, backend=backend), fill_softmax(x, mask, 1.0, False),
                        torch.bfloat16, x.double(), f"shape {shape}")


def test_gradient_is_the_softmax_backward_through_the_fill(gen):
    x = (torch.randn(2, 2, 5, 9, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    mask = torch.rand(2, 2, 5, 9, generator=gen) < 0.3
    mask[1, 1, 4] = True
    dy = torch.randn(2, 2, 5, 9, generator=gen, dtype=torch.float64)
    (got,) = torch.autograd.grad(npu_scaled_masked_softmax(x, mask, 0.7, backend="torch"), x, dy)
    # torch's autograd through the documented computation: the fill has no gradient, so the
    # fully masked row [1, 1, 4] gets none either.
    xr = x.detach().requires_grad_()
    (expected,) = torch.autograd.grad((xr * 0.7).masked_fill(mask, FILL).softmax(-1), xr, dy)
    assert (expected[1, 1, 4] == 0).all()
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_bad_arguments_are_named(gen):
    x = torch.randn(2, 2, 4, 4, generator=gen)
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        npu_scaled_masked_softmax(x, torch.zeros(2, 2, 4, 4, dtype=torch.uint8))
    with pytest.raises(TypeError, match="fixed_triu_mask"):
        npu_scaled_masked_softmax(x, None, 1.0, "yes")
    with pytest.raises(ValueError, match="mask of shape"):
        npu_scaled_masked_softmax(x, torch.zeros(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="scale"):
        npu_scaled_masked_softmax(x, None, float("inf"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_beyond_torch_npu_limits(dtype, gen):
    # The same call on an NVIDIA GPU (automatic backend), last dims 4100 x 4100 and 8 x 6000.
    x = (torch.randn(1, 2, 8, 6000, generator=gen) * 4).to(dtype).cuda()
    mask = (torch.rand(1, 1, 8, 6000, generator=gen) < 0.3).cuda()
    mask[0, 0, 3] = True
    assert_close_to(npu_scaled_masked_softmax(x, mask, 0.5), fill_softmax(x, mask, 0.5, False), dtype,
                    x.double() * 0.5, "8 x 6000 on CUDA")
    sq = (torch.randn(1, 1, 4100, 4100, generator=gen) * 4).to(dtype).cuda()
    assert_close_to(npu_scaled_masked_softmax(sq, None, 0.5, True), causal_softmax(sq, 0.5), dtype,
                    sq.double() * 0.5, "fixed_triu_mask 4100 on CUDA")
