"""The checker itself can fail: wrong values, NaN/inf mismatches, shape/dtype, unwritten outputs."""

import pytest
import torch

import anysoftmax
from anysoftmax.core import SoftmaxSpec, compare, registry
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
    from anysoftmax.core import compare_backward
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
    from anysoftmax.core import compare_backward
    from anysoftmax.core.reference import backward_from_output

    x, spec, y = _case(gen, torch.float32)
    dy = torch.randn(x.shape, generator=gen)
    dx = backward_from_output(y, dy, 1).float()
    i = y[0].argmin()
    row = float((y[0].double() * dy[0].double()).abs().sum())
    dx[0, i] += 2 * spec.tolerance.rtol * row
    assert not compare_backward(dx, y, dy, spec).ok
