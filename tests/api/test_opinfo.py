"""PyTorch's own OpInfo samples of softmax, log_softmax and _softmax_backward_data, run through
anysoftmax on every CPU-runnable backend (needs `expecttest`, part of the test extra)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("expecttest", reason="OpInfo samples need expecttest (pip install -e '.[test]')")
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

import anysoftmax  # noqa: E402
from anysoftmax.core import SoftmaxSpec  # noqa: E402
from anysoftmax.testing.compare import compare_backward
from helpers import check, runnable_backends  # noqa: E402

BACKENDS = runnable_backends("cpu")
OPINFOS = {(o.name, o.variant_test_name): o for o in op_db
           if o.name in ("softmax", "log_softmax", "_softmax_backward_data")}
FORWARD = [key for key in OPINFOS if key[0] != "_softmax_backward_data"]


def sample_params(keys):
    """(opinfo key, input dtype) for every dtype torch declares for the OpInfo."""
    return [pytest.param(key, dtype, id=f"{key[0]}{'-' + key[1] if key[1] else ''}-{str(dtype)[6:]}")
            for key in keys for dtype in sorted(OPINFOS[key].dtypes, key=str)]


def test_opinfos_found():
    assert {("softmax", ""), ("softmax", "with_dtype"), ("log_softmax", ""), ("log_softmax", "with_dtype"),
            ("_softmax_backward_data", "")} <= set(OPINFOS)


class Outcome:
    """What the samples of one test did: checked against the reference, refused as torch
    refuses, or declared refused by the backend. A test where nothing was checked or
    refused-as-torch-does is a skip with the backend's reasons, never a pass."""

    def __init__(self):
        self.checked, self.errors_as_torch, self.declared = 0, 0, set()

    def done(self) -> None:
        if not self.checked and not self.errors_as_torch:
            pytest.skip(f"every sample is a declared refusal: {'; '.join(sorted(self.declared))}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("key,dtype", sample_params(FORWARD))
def test_forward_samples(backend, key, dtype):
    log = key[0] == "log_softmax"
    fn = anysoftmax.log_softmax if log else anysoftmax.softmax
    torch_fn = torch.log_softmax if log else torch.softmax
    seen = Outcome()
    for sample in OPINFOS[key].sample_inputs("cpu", dtype, requires_grad=False):
        x, (dim,), kwargs = sample.input, sample.args, sample.kwargs
        try:
            torch_fn(x, dim, **kwargs)
            torch_error = None
        except Exception as exc:  # torch refuses (integer input without dtype=): so must we
            torch_error = exc
        if torch_error is not None or x.dtype.is_complex:
            # Complex inputs: torch drops the imaginary part silently; anysoftmax refuses.
            with pytest.raises(TypeError, match="dtype"):
                fn(x, dim, backend=backend, **kwargs)
            seen.errors_as_torch += 1
            continue
        refusal = check(x, dim, backend=backend, log=log, dtype=kwargs.get("dtype"))
        if refusal is None:
            seen.checked += 1
        else:
            seen.declared.add(refusal)
    seen.done()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("key,dtype", sample_params([("_softmax_backward_data", "")]))
def test_backward_samples(backend, key, dtype):
    seen = Outcome()
    for sample in OPINFOS[key].sample_inputs("cpu", dtype, requires_grad=False):
        grad, (y, dim, input_dtype) = sample.input, sample.args
        spec = SoftmaxSpec.from_tensor(y, dim)
        refusal = anysoftmax.get_backend(backend).supports(spec)
        if refusal is not None:  # a declared limit: the call must say so
            with pytest.raises(anysoftmax.UnsupportedRequestError, match=backend):
                anysoftmax.torchop.api.softmax_backward(y, grad, dim, backend=backend)
            seen.declared.add(refusal)
            continue
        dx = anysoftmax.torchop.api.softmax_backward(y, grad, dim, backend=backend)
        result = compare_backward(dx, y, grad, spec)
        assert result.ok, result.detail
        got = dx.to(input_dtype)
        want = torch._softmax_backward_data(grad, y, dim, input_dtype)
        assert got.dtype == want.dtype and got.shape == want.shape
        seen.checked += 1
    seen.done()
