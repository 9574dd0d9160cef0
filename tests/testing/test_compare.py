"""The checker itself can fail: wrong values, NaN/inf mismatches, shape/dtype, unwritten outputs."""

import pytest
import torch

import anysoftmax
from anysoftmax.core import SoftmaxSpec, registry
from anysoftmax.testing.compare import compare
from anysoftmax.core.layout import new_output
from helpers import StubBackend


def _case(gen, dtype=torch.float32, log=False):
    x = (torch.randn(6, 50, generator=gen) * 3).to(dtype)
    spec = SoftmaxSpec.from_tensor(x, 1, log=log)
    y = (torch.log_softmax if log else torch.softmax)(x.double(), 1).to(dtype)
    return x, spec, y


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("log", [False, True])
def test_correct_output_passes_and_perturbed_fails(dtype, log, gen):
    x, spec, y = _case(gen, dtype, log)
    assert compare(y, x, spec).ok
    bad = y.clone()
    # Three tolerances away from the reference at the largest output: must fail.
    i = bad.double().abs().argmax()
    tol = spec.tolerance
    ref = bad.view(-1)[i].double()
    bad.view(-1)[i] = (ref + 3 * (tol.atol + tol.rtol * ref.abs()) + 4 * torch.finfo(dtype).eps * ref.abs()).to(dtype)
    assert not compare(bad, x, spec).ok


def test_nan_inf_shape_dtype_mismatches_fail(gen):
    x, spec, y = _case(gen)
    nan = y.clone()
    nan[2, 3] = float("nan")
    assert "NaN mismatch" in compare(nan, x, spec).detail
    inf = y.clone()
    inf[0, 0] = float("inf")
    assert not compare(inf, x, spec).ok
    assert "shape" in compare(y[:, :49], x, spec).detail
    assert "dtype" in compare(y.double(), x, spec).detail


class _ForgetfulBackend(StubBackend):
    """Writes every element but the last, into an output from `new_output`."""

    name = "forgetful"

    def run(self, x, spec):
        y = new_output(spec.shape, spec.out_dtype, x.device)
        flat = torch.softmax(x.double(), spec.dim).to(spec.out_dtype).reshape(-1)
        y.view(-1)[:-1] = flat[:-1]
        return y


def test_poisoned_outputs_expose_unwritten_elements(gen):
    anysoftmax.register(_ForgetfulBackend())
    try:
        x = torch.randn(4, 9, generator=gen)
        out = anysoftmax.softmax(x, 1, backend="forgetful")
        assert torch.isnan(out[-1, -1])  # the suite sets ANYSOFTMAX_POISON_OUTPUTS=1
        assert not compare(out, x, SoftmaxSpec.from_tensor(x, 1)).ok
    finally:
        registry.unregister("forgetful")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("log", [False, True])
def test_backward_correct_gradient_passes_and_perturbed_fails(dtype, log, gen):
    from anysoftmax.testing.compare import compare_backward
    from anysoftmax.core.reference import backward_from_output

    x, spec, y = _case(gen, dtype, log)
    dy = torch.randn(x.shape, generator=gen).to(dtype)
    dx = backward_from_output(y, dy, 1, log).to(dtype)  # the float64 gradient, rounded once
    ok = compare_backward(dx, y, dy, spec)
    assert ok.ok and 0 <= ok.max_rel_err <= 1, ok.detail
    # Three bounds off at the element with the largest allowance: must fail, naming the error.
    bad = dx.double().clone()
    y64, g = y.double(), dy.double()
    scale = (g.abs() + y64.exp() * g.sum(1, keepdim=True).abs() * (1 + y64.abs())) if log else \
        y64 * (g.abs() + 2 * (y64 * g.abs()).sum(1, keepdim=True))
    i = scale.argmax()
    tol = spec.tolerance
    bad.view(-1)[i] += 3 * (tol.atol + tol.rtol * scale.view(-1)[i]) + 4 * torch.finfo(dtype).eps * bad.view(-1)[i].abs()
    result = compare_backward(bad.to(dtype), y, dy, spec)
    assert not result.ok and result.max_rel_err > 1 and "gradient error" in result.detail
    nan = dx.clone()
    nan[0, 0] = float("nan")
    assert not compare_backward(nan, y, dy, spec).ok
    assert not compare_backward(dx[:, :-1], y, dy, spec).ok  # shape


def test_backward_bound_is_per_element_not_per_row(gen):
    """An error the size of the row's whole |y * dy| sum at a tiny output must fail: the bound
    scales with y_i, not with the row."""
    from anysoftmax.testing.compare import compare_backward
    from anysoftmax.core.reference import backward_from_output

    x, spec, y = _case(gen, torch.float32)
    dy = torch.randn(x.shape, generator=gen)
    dx = backward_from_output(y, dy, 1).float()
    i = y[0].argmin()
    row = float((y[0].double() * dy[0].double()).abs().sum())
    dx[0, i] += 2 * spec.tolerance.rtol * row
    assert not compare_backward(dx, y, dy, spec).ok


def test_fused_gradients_pass_and_a_wrong_one_names_its_worst_element(gen):
    """dx, dsinks and a floating mask's gradient from the float64 formulas pass; one perturbed
    element fails, and the message names the gradient, the element's value and the reference's."""
    from anysoftmax.testing.compare import compare_fused_backward, compare_mask_gradient
    from anysoftmax.core.reference import fused_backward, fused_forward

    x = torch.randn(4, 3, 20, generator=gen)
    mask, sinks = torch.randn(1, 3, 20, generator=gen), torch.randn(4, 3, 1, generator=gen)
    spec, _ = SoftmaxSpec.from_request(x, -1, fused=dict(mask=mask, sinks=sinks, scale=0.5))
    dy = torch.randn(x.shape, generator=gen)
    y, p = fused_forward(x.double(), spec.variant, spec.dim, False, mask, sinks, torch.float64)
    dx, ds, dz = fused_backward(dy.double(), y, x.double(), spec.variant, spec.dim, False, mask, p, torch.float64,
                                want_dz=True)
    y, dx = y.float(), dx.float()
    dsinks, dmask = ds.sum_to_size(sinks.shape).float(), dz.sum_to_size(mask.shape).float()
    assert compare_fused_backward(dx, y, dy, x, spec, mask, sinks, dsinks).ok
    assert compare_mask_gradient(dmask, y, dy, x, spec, mask, sinks).ok
    bad_ds, bad_dm = dsinks.clone(), dmask.clone()
    bad_ds[1, 2, 0] += 1.0
    bad_dm[0, 1, 7] -= 1.0
    wrong = compare_fused_backward(dx, y, dy, x, spec, mask, sinks, bad_ds)
    assert not wrong.ok and "dsinks error" in wrong.detail and f"got {bad_ds[1, 2, 0].item():.8g}" in wrong.detail
    wrong = compare_mask_gradient(bad_dm, y, dy, x, spec, mask, sinks)
    assert not wrong.ok and "mask gradient error" in wrong.detail and f"got {bad_dm[0, 1, 7].item():.8g}" in wrong.detail


def test_log_softmax_gradient_with_excluded_inputs_is_checked(gen):
    """An input of -inf (a masked logit) makes its log_softmax output -inf and its probability 0:
    that element's bound weighs (1 + |y|) by p = 0, so the exact gradient passes and a wrong one
    still fails."""
    from anysoftmax.testing.compare import compare_backward
    from anysoftmax.core.reference import backward_from_output

    x = torch.randn(5, 30, generator=gen)
    x[:, ::7] = float("-inf")
    spec = SoftmaxSpec.from_tensor(x, 1, log=True)
    y = torch.log_softmax(x.double(), 1).float()
    dy = torch.randn(x.shape, generator=gen)
    dx = backward_from_output(y, dy, 1, log=True).float()
    ok = compare_backward(dx, y, dy, spec)
    assert ok.ok, ok.detail
    bad = dx.clone()
    bad[2, 7] += 0.5
    assert not compare_backward(bad, y, dy, spec).ok
