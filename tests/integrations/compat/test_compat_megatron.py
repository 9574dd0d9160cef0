"""anysoftmax.compat.megatron against apex's and Megatron-LM's documented semantics, restated in
plain torch (tests/helpers/vendor.py), on fresh random data, every dtype apex takes (and
float32), lengths apex refuses, the -10000 fill's corner cases."""

from __future__ import annotations

import enum

import pytest
import torch

from anysoftmax.compat import megatron as mg
from helpers.vendor import FILL, assert_close_to, causal_softmax, fill_softmax

BACKENDS = ["torch", "triton"]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


class AttnMaskType(enum.Enum):  # Megatron's enum (megatron/core/transformer/enums.py), members by name
    padding = 1
    causal = 2
    no_mask = 3
    padding_causal = 4
    arbitrary = 5
    causal_bottom_right = 6


def attention_mask_func(scores, mask):  # Megatron's default mask_func
    scores.masked_fill_(mask, FILL)
    return scores


def _scores(gen, shape, dtype, spread=4.0):
    return (torch.randn(shape, generator=gen) * spread).to(dtype)


def _padding_mask(gen, b, sq, sk, broadcast_batch=False):
    """[b or 1, 1, sq, sk], ~30% masked, with one fully masked row and one unmasked row."""
    m = torch.rand(1 if broadcast_batch else b, 1, sq, sk, generator=gen) < 0.3
    m[0, 0, 1] = True
    m[0, 0, 2] = False
    return m


def _below_fill_row(x, mask, scale, dtype):
    """Row [0, 0, 2] (unmasked) gets logits around -20000 after scaling: its max is below the
    -10000 fill, which must not count as "fully masked". Values chosen so scale * x is exact."""
    row = (-20000.0 + 0.25 * torch.arange(x.shape[-1], dtype=torch.float64) % 8) / scale
    x[0, 0, 2] = row.to(dtype)
    assert not mask[0, 0, 2].any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("broadcast_batch", [False, True])
def test_scaled_masked_softmax(dtype, backend, broadcast_batch, gen):
    b, np_, sq, sk = 2, 3, 5, 37
    scale = float(torch.empty(()).uniform_(0.25, 2.0, generator=gen))
    mask = _padding_mask(gen, b, sq, sk, broadcast_batch)
    x = _scores(gen, (b, np_, sq, sk), dtype)
    if dtype != torch.float16:  # fp16 cannot hold -20000 / scale for small scales
        _below_fill_row(x, mask, scale, dtype)
    expected = fill_softmax(x, mask, scale, apex_zero_rows=True)
    assert (expected[0, :, 1] == 0).all() and (expected[0, :, 2].sum(-1) - 1).abs().max() < 1e-12
    for m in (mask, mask.to(torch.uint8)):  # apex's uint8 (1 = masked) as well as bool
        out = mg.scaled_masked_softmax(x, m, scale, backend=backend)
        assert_close_to(out, expected, dtype, x.double() * scale, f"scaled_masked_softmax {dtype} {m.dtype}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_scaled_softmax_and_upper_triangular(dtype, backend, gen):
    scale = float(torch.empty(()).uniform_(0.25, 2.0, generator=gen))
    x4 = _scores(gen, (2, 3, 6, 33), dtype)
    assert_close_to(mg.scaled_softmax(x4, scale, backend=backend), fill_softmax(x4, None, scale, True), dtype,
                    x4.double() * scale, f"scaled_softmax {dtype}")
    x3 = _scores(gen, (6, 19, 19), dtype)
    out = mg.scaled_upper_triang_masked_softmax(x3, scale, backend=backend)
    assert_close_to(out, causal_softmax(x3, scale), dtype, x3.double() * scale, f"upper triangular {dtype}")
    assert (out.triu(1) == 0).all(), "exact zeros above the diagonal"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lengths_apex_refuses(dtype, gen):
    # apex dispatches masked rows only up to 4096 keys and causal ones to 16384 (and needs
    # sq > 1): 5000 keys and a single query work here.
    x = _scores(gen, (1, 2, 3, 5000), dtype)
    mask = torch.rand(1, 1, 3, 5000, generator=gen) < 0.5
    assert_close_to(mg.scaled_masked_softmax(x, mask, 0.5, backend="torch"), fill_softmax(x, mask, 0.5, True), dtype,
                    x.double() * 0.5, "sk = 5000")
    one = x[:, :, :1]
    assert_close_to(mg.scaled_softmax(one, 0.5, backend="triton"), fill_softmax(one, None, 0.5, True), dtype,
                    one.double() * 0.5, "sq = 1")


def test_documented_differences_from_apex(gen):
    # Stated in the module docstring: the mask alone decides. (1) An unmasked row whose max is
    # exactly -10000 is an ordinary row here (apex zeroes it); (2) a partly masked row whose
    # kept logits are all far below -10000 is the softmax of its kept logits here (apex's fill
    # is then the row's max, so apex zeroes it as "fully masked").
    x = torch.randn(1, 1, 2, 8, generator=gen, dtype=torch.float64)
    x[0, 0, 0] = FILL - torch.arange(8, dtype=torch.float64)
    x[0, 0, 1] = -30000.0 + torch.arange(8, dtype=torch.float64)
    mask = torch.zeros(1, 1, 2, 8, dtype=torch.bool)
    mask[0, 0, 1, :3] = True
    apex = fill_softmax(x, mask, 1.0, apex_zero_rows=True)
    assert (apex[0, 0] == 0).all()
    ours = mg.scaled_masked_softmax(x, mask, 1.0, backend="torch")
    torch.testing.assert_close(ours[0, 0, 0], torch.softmax(x[0, 0, 0], -1))
    torch.testing.assert_close(ours[0, 0, 1], torch.softmax(x[0, 0, 1].masked_fill(mask[0, 0, 1], float("-inf")), -1))


def _megatron_module(dtype, mask_type, fusion, scale, window_size=None, backend="triton"):
    return mg.FusedScaleMaskSoftmax(dtype == torch.float16, dtype == torch.bfloat16, mask_type, fusion,
                                    attention_mask_func, True, scale, window_size, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scale", [None, 0.125])
def test_fused_scale_mask_softmax_fused_path(dtype, scale, backend, gen):
    x = _scores(gen, (2, 3, 7, 7), dtype)
    s = 1.0 if scale is None else scale
    mask = _padding_mask(gen, 2, 7, 7)
    padding = _megatron_module(dtype, AttnMaskType.padding, True, scale, backend=backend)
    assert padding.is_kernel_available(mask, *x.shape)
    assert_close_to(padding(x, mask), fill_softmax(x, mask, s, True), dtype, x.double() * s, "padding")
    assert_close_to(padding(x, None), fill_softmax(x, None, s, True), dtype, x.double() * s, "no mask")
    causal = _megatron_module(dtype, "causal", True, scale, backend=backend)
    out = causal(x, mask)  # the fused causal kernel ignores the mask, as Megatron's does
    assert_close_to(out, causal_softmax(x, s), dtype, x.double() * s, "causal")


def _megatron_torch_path(x, mask, scale, in_fp16, in_bf16, softmax_offset=None):
    """Megatron's forward_torch_softmax restated (softmax_in_fp32=True, attention_mask_func)."""
    z = x.float() if (in_fp16 or in_bf16) else x
    z = z.double() * (1.0 if scale is None else scale)
    if mask is not None:
        z = z.masked_fill(mask, FILL)
    if softmax_offset is None:
        return z.softmax(-1)
    sink = softmax_offset.double().reshape(1, -1, 1, 1).expand(z.shape[0], -1, z.shape[2], -1)
    return torch.cat([z, sink], -1).softmax(-1)[..., :-1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_scale_mask_softmax_torch_path(dtype, backend, gen):
    # Fusion off (or a float32 input): Megatron's torch path, mask_func's -10000 fill included,
    # so here the fully masked row is uniform.
    x = _scores(gen, (2, 3, 6, 21), dtype)
    mask = _padding_mask(gen, 2, 6, 21)
    fp16, bf16 = dtype == torch.float16, dtype == torch.bfloat16
    module = mg.FusedScaleMaskSoftmax(fp16, bf16, AttnMaskType.padding, False, attention_mask_func, True, 0.5,
                                      backend=backend)
    expected = _megatron_torch_path(x, mask, 0.5, fp16, bf16)
    assert (expected[0, :, 1] - 1 / 21).abs().max() < 1e-12
    assert_close_to(module(x, mask), expected, dtype, x.double() * 0.5, "torch path")
    offset = torch.randn(3, generator=gen)  # Megatron's softmax_offset: a sink per head
    with_offset = _megatron_module(dtype, AttnMaskType.padding, True, 0.5, backend=backend)
    assert_close_to(with_offset(x, mask, offset), _megatron_torch_path(x, mask, 0.5, fp16, bf16, offset), dtype,
                    x.double() * 0.5, "softmax_offset")
    causal = mg.FusedScaleMaskSoftmax(fp16, bf16, AttnMaskType.causal, False, attention_mask_func, True, None,
                                      backend=backend)
    sq = x[:, :, :, :6].contiguous()
    above = torch.ones(6, 6, dtype=torch.bool).triu(1)
    assert_close_to(causal(sq, None), _megatron_torch_path(sq, above, None, fp16, bf16), dtype, sq.double(), "causal")


def test_sliding_window_and_decoding(gen):
    x = _scores(gen, (1, 2, 6, 9), torch.bfloat16)
    module = _megatron_module(torch.bfloat16, AttnMaskType.causal, True, None, window_size=(2, 0))
    i, j = torch.arange(6)[:, None], torch.arange(9)[None, :]
    offset = j - i - 3  # Megatron's window: keys j with -2 <= j - i - (sk - sq) <= 0
    masked = (offset < -2) | (offset > 0)
    assert_close_to(module(x, None), _megatron_torch_path(x, masked, None, False, True), torch.bfloat16, x.double(),
                    "window (2, 0)")
    decode = _megatron_module(torch.bfloat16, AttnMaskType.causal, True, None)
    one = x[:, :, -1:]  # one query: no causal mask (Megatron's torch path)
    assert_close_to(decode(one, None), _megatron_torch_path(one, None, None, False, True), torch.bfloat16,
                    one.double(), "decoding")


def test_gradients_flow_as_apex_backward(gen):
    # apex's backward: d(scale * x) = y * (dy - sum(y dy)), times scale; zero on masked entries.
    x = (torch.randn(2, 2, 4, 9, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    mask = _padding_mask(gen, 2, 4, 9)
    dy = torch.randn(2, 2, 4, 9, generator=gen, dtype=torch.float64)
    (got,) = torch.autograd.grad(mg.scaled_masked_softmax(x, mask, 0.7, backend="torch"), x, dy)
    y = fill_softmax(x.detach(), mask, 0.7, True)
    expected = 0.7 * y * (dy - (y * dy).sum(-1, keepdim=True))
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_bad_arguments_are_named(gen):
    x = _scores(gen, (2, 2, 4, 4), torch.float16)
    with pytest.raises(ValueError, match="input_in_fp16 and input_in_bf16"):
        mg.FusedScaleMaskSoftmax(True, True, "padding", True, attention_mask_func, True, None)
    with pytest.raises(ValueError, match="softmax_in_fp32"):
        mg.FusedScaleMaskSoftmax(True, False, "padding", True, attention_mask_func, False, 0.5)
    with pytest.raises(ValueError, match="attn_mask_type"):
        mg.FusedScaleMaskSoftmax(True, False, "diagonal", True, attention_mask_func, True, None)
    with pytest.raises(ValueError, match="window_size"):
        mg.FusedScaleMaskSoftmax(True, False, "causal", True, attention_mask_func, True, None, 3)
    module = mg.FusedScaleMaskSoftmax(True, False, "causal", True, attention_mask_func, True, None)
    with pytest.raises(ValueError, match="4-D"):
        module(x[0], None)
    with pytest.raises(ValueError, match="sq == sk"):
        module(x[:, :, :3], None)
    with pytest.raises(ValueError, match="sq == sk"):
        mg.scaled_upper_triang_masked_softmax(x[0, :, :3], 1.0)
    with pytest.raises(TypeError, match="mask dtype torch.float32"):
        mg.scaled_masked_softmax(x, torch.zeros(2, 1, 4, 4), 1.0)
    with pytest.raises(ValueError, match="scale"):
        mg.scaled_softmax(x, float("nan"))


def test_refusals_are_apex_and_megatron_error_types(gen):
    # apex raises RuntimeError, Megatron asserts: code catching either still catches these.
    x = _scores(gen, (2, 2, 4, 4), torch.float16)
    for kind in (ValueError, RuntimeError, AssertionError):
        with pytest.raises(kind, match="softmax_in_fp32"):
            mg.FusedScaleMaskSoftmax(True, False, "padding", True, attention_mask_func, False, 2.0)
        module = mg.FusedScaleMaskSoftmax(False, False, "causal", False, attention_mask_func, True, None)
        with pytest.raises(kind, match="sq == sk"):
            module(x.float()[:, :, :3], None)
        with pytest.raises(kind, match="sq == sk"):
            mg.scaled_upper_triang_masked_softmax(x[0, :, :3], 1.0)


def test_causal_bottom_right_is_accepted_and_takes_the_mask_as_given(gen):
    # Megatron accepts every AttnMaskType member; only `causal` generates a mask.
    x = _scores(gen, (2, 2, 4, 8), torch.float32)
    mask = _padding_mask(gen, 2, 4, 8)
    module = mg.FusedScaleMaskSoftmax(False, False, AttnMaskType.causal_bottom_right, False, attention_mask_func,
                                      True, None, backend="torch")
    torch.testing.assert_close(module(x.clone(), mask), fill_softmax(x, mask, 1.0, False).float())
    torch.testing.assert_close(module(x.clone(), None), torch.softmax(x, -1))


def test_scaled_masked_softmax_without_a_mask_is_the_scaled_softmax(gen):
    x = _scores(gen, (2, 2, 4, 8), torch.float16)
    torch.testing.assert_close(mg.scaled_masked_softmax(x, None, 0.5, backend="torch"),
                               mg.scaled_softmax(x, 0.5, backend="torch"), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_casts_float32_inputs_as_apex(dtype, gen):
    x = _scores(gen, (2, 2, 8, 8), torch.float32)
    mask = _padding_mask(gen, 2, 8, 8)
    with torch.autocast("cpu", dtype=dtype):
        got = [mg.scaled_masked_softmax(x, mask, 0.5, backend="torch"), mg.scaled_softmax(x, 0.5, backend="torch"),
               mg.scaled_upper_triang_masked_softmax(x[0], 0.5, backend="torch")]
    assert [g.dtype for g in got] == [dtype] * 3
    torch.testing.assert_close(got[0], mg.scaled_masked_softmax(x.to(dtype), mask, 0.5, backend="torch"))
    assert mg.scaled_softmax(x, 0.5, backend="torch").dtype == torch.float32  # no autocast: x's dtype


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_beyond_apex_limits(dtype, gen):
    # On the GPU (automatic backend): a masked row of 6000 keys (apex: <= 4096), a causal
    # block of 2100 (apex's warp kernels: powers of two up to 16384 after padding, sq % 4 == 0
    # for Megatron's gate; 2100 % 8 != 0) and Megatron's module on them.
    x = _scores(gen, (2, 4, 8, 6000), dtype).cuda()
    mask = (torch.rand(2, 1, 8, 6000, generator=gen) < 0.3).cuda()
    mask[0, 0, 1] = True
    assert_close_to(mg.scaled_masked_softmax(x, mask, 0.25), fill_softmax(x, mask, 0.25, True), dtype,
                    x.double() * 0.25, "sk = 6000 on CUDA")
    x3 = _scores(gen, (3, 2100, 2100), dtype).cuda()
    assert_close_to(mg.scaled_upper_triang_masked_softmax(x3, 0.5), causal_softmax(x3, 0.5), dtype,
                    x3.double() * 0.5, "causal 2100 on CUDA")
    module = _megatron_module(dtype, AttnMaskType.padding, True, 0.25, backend=None)
    assert_close_to(module(x, mask), fill_softmax(x, mask, 0.25, True), dtype, x.double() * 0.25, "module on CUDA")
