"""The gradient comparison (`testing.compare.compare_backward`) on torch's own gradients, and the
timing helpers of anysoftmax.perf."""

import pytest
import torch

from anysoftmax import perf
from anysoftmax.core import SoftmaxSpec
from anysoftmax.testing.compare import compare_backward
from anysoftmax.matrix.conformance import make_input

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def torch_grad(x, dy, dim, log):
    """(dx, y): torch's gradient through autograd and the output it flows from."""
    x = x.detach().requires_grad_()
    y = (torch.log_softmax if log else torch.softmax)(x, dim)
    (dx,) = torch.autograd.grad(y, x, dy)
    return dx, y.detach()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dim", [((8, 3000), -1), ((2, 20000), 1), ((16, 5, 7), 0)])
def test_torch_gradient_passes(dtype, log, shape, dim):
    x = make_input(shape, dtype, "cpu", seed=1)
    dy = make_input(shape, dtype, "cpu", seed=2, scale=1.0)
    spec = SoftmaxSpec.from_tensor(x, dim, log=log)
    dx, y = torch_grad(x, dy, dim, log)
    result = compare_backward(dx, y, dy, spec)
    assert result.ok, result.detail
    assert 0 <= result.max_rel_err <= 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_wrong_gradients_fail(dtype, log):
    x = make_input((8, 512), dtype, "cpu", seed=3)
    dy = make_input((8, 512), dtype, "cpu", seed=4, scale=1.0)
    spec = SoftmaxSpec.from_tensor(x, -1, log=log)
    good, y = torch_grad(x, dy, -1, log)
    off = {torch.float16: 1.02, torch.bfloat16: 1.1, torch.float32: 1.001, torch.float64: 1 + 1e-7}[dtype]
    assert not compare_backward(good * off, y, dy, spec).ok, "a gradient a few tolerances off passed"
    no_sum_term = (dy.double() if log else y.double() * dy.double()).to(dtype)  # forgot the row-sum term
    assert not compare_backward(no_sum_term, y, dy, spec).ok
    wrong_dtype = good.float() if dtype != torch.float32 else good.double()
    assert not compare_backward(wrong_dtype, y, dy, spec).ok


def test_gbps_counts_bytes_read_and_written():
    assert perf.gbps(2e9, 1000.0) == pytest.approx(2.0)
    assert perf.gbps(3e6, 1.0) == pytest.approx(3.0)


def test_time_ms_rotates_inputs_and_labels_cpu_timing():
    calls = []
    inputs = [torch.zeros(4) + i for i in range(3)]
    ms = perf.time_ms(lambda x: calls.append(int(x[0])), inputs, "cpu", warmup_ms=1, rep_ms=2)
    assert ms >= 0 and len(calls) >= 5
    assert calls[:6] == [0, 1, 2, 0, 1, 2]
    assert perf.timer_label("cpu") == "cpu" and perf.timer_label("cuda:0") == "gpu"
    with pytest.raises(ValueError):
        perf.time_ms(lambda x: x, [], "cpu")


def test_copy_bandwidth_on_cpu_is_a_positive_number():
    assert 0.05 < perf.copy_bandwidth_gbps("cpu", nbytes=8 << 20) < 10_000
