"""Bad input fails before any kernel runs, with an exception that names the problem."""

import pytest
import torch

import anysoftmax
from anysoftmax import BackendUnavailableError, UnsupportedRequestError
from anysoftmax.core import registry
from helpers import StubBackend, runnable_backends

BACKENDS = runnable_backends("cpu")


class _ExplodingBackend(StubBackend):
    """Available, supports everything, and fails the test if a kernel would be launched."""

    name = "exploding"

    def run(self, x, spec):
        raise AssertionError("a kernel was launched for a bad request")


@pytest.fixture
def exploding():
    anysoftmax.register(_ExplodingBackend())
    yield "exploding"
    registry.unregister("exploding")


@pytest.mark.parametrize("fn", [anysoftmax.softmax, anysoftmax.log_softmax])
@pytest.mark.parametrize("bad,exc,words", [
    (torch.arange(6).reshape(2, 3), TypeError, "int64"),
    (torch.ones(2, 3, dtype=torch.int32), TypeError, "int32"),
    (torch.ones(2, 3, dtype=torch.bool), TypeError, "bool"),
    (torch.ones(2, 3, dtype=torch.complex64), TypeError, "complex64"),
    ([[1.0, 2.0]], TypeError, "torch.Tensor"),
    (3.0, TypeError, "torch.Tensor"),
])
def test_bad_input_type(fn, bad, exc, words, exploding):
    with pytest.raises(exc, match=words):
        fn(bad, 1 if isinstance(bad, torch.Tensor) else 0, backend=exploding)


@pytest.mark.parametrize("dim", [2, -3, 5])
def test_dim_out_of_range(dim, exploding):
    with pytest.raises(IndexError, match=rf"dim {dim} out of range.*\[-2, 1\]"):
        anysoftmax.softmax(torch.randn(2, 3), dim, backend=exploding)


def test_dim_out_of_range_zero_dim(exploding):
    with pytest.raises(IndexError, match=r"\[-1, 0\]"):
        anysoftmax.softmax(torch.tensor(1.5), 1, backend=exploding)


@pytest.mark.parametrize("dim", [1.0, "1", True])
def test_dim_not_int(dim, exploding):
    with pytest.raises(TypeError, match="dim must be an int"):
        anysoftmax.softmax(torch.randn(2, 3), dim, backend=exploding)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64, torch.uint8])
def test_dtype_keyword_not_float(dtype, exploding):
    with pytest.raises(TypeError, match=rf"dtype={dtype} is not supported"):
        anysoftmax.softmax(torch.randn(2, 3), 1, dtype=dtype, backend=exploding)


def test_dtype_keyword_not_a_dtype(exploding):
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        anysoftmax.softmax(torch.randn(2, 3), 1, dtype="float32", backend=exploding)


def test_unknown_backend_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown backend 'nope'.*torch"):
        anysoftmax.softmax(torch.randn(2, 3), 1, backend="nope")


def test_backend_not_a_string():
    with pytest.raises(TypeError, match="backend must be a backend name"):
        anysoftmax.softmax(torch.randn(2, 3), 1, backend=3)


class _Unavailable(_ExplodingBackend):
    name = "unavailable"

    def is_available(self):
        return "the frobnicator package is not installed"


class _Refusing(_ExplodingBackend):
    name = "refusing"

    def supports(self, spec):
        return f"{spec.in_dtype} is not supported"


@pytest.fixture
def odd_backends():
    anysoftmax.register(_Unavailable())
    anysoftmax.register(_Refusing())
    yield
    registry.unregister("unavailable")
    registry.unregister("refusing")


def test_unavailable_backend_is_an_error_not_a_fallback(odd_backends):
    with pytest.raises(BackendUnavailableError, match=r"'unavailable'.*frobnicator"):
        anysoftmax.softmax(torch.randn(2, 3), 1, backend="unavailable")


def test_unsupported_request_is_an_error_not_a_fallback(odd_backends):
    with pytest.raises(UnsupportedRequestError, match=r"'refusing'.*float32 is not supported"):
        anysoftmax.softmax(torch.randn(2, 3), 1, backend="refusing")


def test_env_backend_is_explicit(odd_backends, monkeypatch):
    monkeypatch.setenv("ANYSOFTMAX_BACKEND", "unavailable")
    with pytest.raises(BackendUnavailableError, match="ANYSOFTMAX_BACKEND"):
        anysoftmax.softmax(torch.randn(2, 3), 1)
    monkeypatch.setenv("ANYSOFTMAX_BACKEND", "typo")
    with pytest.raises(ValueError, match=r"ANYSOFTMAX_BACKEND='typo'.*unknown backend"):
        anysoftmax.softmax(torch.randn(2, 3), 1)


def test_env_backend_is_used(monkeypatch):
    from anysoftmax.core import SoftmaxSpec, select
    monkeypatch.setenv("ANYSOFTMAX_BACKEND", "torch")
    assert select(SoftmaxSpec.from_tensor(torch.randn(2, 3), 1)).name == "torch"


def test_triton_refuses_cpu_without_interpreter(monkeypatch):
    from anysoftmax.backends._triton_common import interpreter
    from anysoftmax.backends.triton import backend as tb
    from anysoftmax.core import SoftmaxSpec
    monkeypatch.setattr(interpreter, "interpreting", lambda: False)
    reason = tb.TritonBackend().supports(SoftmaxSpec.from_tensor(torch.randn(2, 3), 1))
    assert "TRITON_INTERPRET=1" in reason


@pytest.mark.parametrize("backend", BACKENDS)
def test_errors_raise_before_any_backend_runs(backend):
    # The same bad requests against the real backends: still the validation error, not a crash.
    with pytest.raises(TypeError):
        anysoftmax.softmax(torch.ones(3, 4, dtype=torch.int16), 1, backend=backend)
    with pytest.raises(IndexError):
        anysoftmax.log_softmax(torch.randn(3, 4), 2, backend=backend)


@pytest.mark.parametrize("grad,exc,words", [
    (torch.randn(3, 5), ValueError, r"grad shape \(3, 5\) must equal the output's shape \(3, 4\)"),
    (torch.ones(3, 4, dtype=torch.int32), TypeError, "grad dtype torch.int32 is not floating"),
    ("g", TypeError, "grad must be a torch.Tensor"),
])
def test_backward_bad_grad_names_it(grad, exc, words, exploding):
    with pytest.raises(exc, match=words):
        anysoftmax.torchop.api.softmax_backward(torch.rand(3, 4), grad, 1, backend=exploding)


def test_backward_grad_on_another_device():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU to put grad on another device")
    with pytest.raises(ValueError, match="grad is on cuda"):
        anysoftmax.torchop.api.softmax_backward(torch.rand(3, 4), torch.rand(3, 4, device="cuda"), 1)


def test_integer_input_with_float_dtype_is_accepted_complex_is_not(exploding):
    x = torch.arange(12).reshape(3, 4)
    torch.testing.assert_close(anysoftmax.softmax(x, 1, dtype=torch.float64, backend="torch"),
                               torch.softmax(x, 1, dtype=torch.float64))
    with pytest.raises(TypeError, match="complex64 is not supported"):
        anysoftmax.softmax(torch.ones(3, 4, dtype=torch.complex64), 1, dtype=torch.float32, backend=exploding)


def test_repeated_requests_are_still_validated_and_reselected(monkeypatch):
    """Validated requests are memoised (shape, strides, dtypes, dim, backend choice): a
    variant that differs in any of these, dim=True included, is validated afresh; a change of
    the registered backends is honoured at once, and of $ANYSOFTMAX_BACKEND by new requests
    and, for memoised ones, after `anysoftmax.refresh()` (the hit path reads no environment)."""
    x = torch.randn(3, 4)
    anysoftmax.softmax(x, 1)
    anysoftmax.softmax(x, 1)
    with pytest.raises(TypeError, match="dim must be an int"):
        anysoftmax.softmax(x, True)
    monkeypatch.setenv("ANYSOFTMAX_BACKEND", "no_such_backend")
    with pytest.raises(ValueError, match="no_such_backend"):
        anysoftmax.softmax(torch.randn(3, 5), 1)  # a new request reads it
    anysoftmax.softmax(x, 1)  # memoised: not re-selected until refresh()
    anysoftmax.refresh()
    with pytest.raises(ValueError, match="no_such_backend"):
        anysoftmax.softmax(x, 1)
    monkeypatch.delenv("ANYSOFTMAX_BACKEND")
    anysoftmax.refresh()

    class _Preferred(StubBackend):
        name, priority = "preferred", 10 ** 6

        def run(self, x, spec):
            raise RuntimeError("the newly registered backend was chosen")

    anysoftmax.register(_Preferred())
    try:
        with pytest.raises(RuntimeError, match="newly registered"):
            anysoftmax.softmax(x, 1)
    finally:
        registry.unregister("preferred")
    torch.testing.assert_close(anysoftmax.softmax(x, 1), torch.softmax(x, 1))
