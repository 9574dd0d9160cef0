"""Each public function's errors begin with its own name and call its arguments by their
parameter names (`input` of softmax and log_softmax, `x` of logsumexp, `y` of softmax_backward)."""

from __future__ import annotations

import re

import pytest
import torch

import anysoftmax

X = torch.randn(2, 3)
INTS = torch.ones(2, 3, dtype=torch.int64)
BAD_MASK = torch.ones(5, 5, dtype=torch.bool)

CASES = [
    ("softmax list", lambda: anysoftmax.softmax([1.0], 0), TypeError, r"softmax: input must be a torch\.Tensor"),
    ("softmax dtype str", lambda: anysoftmax.softmax(X, -1, dtype="float32"), TypeError,
     r"softmax: dtype must be a torch\.dtype"),
    ("log_softmax list", lambda: anysoftmax.log_softmax([1.0], 0), TypeError,
     r"log_softmax: input must be a torch\.Tensor"),
    ("log_softmax ints", lambda: anysoftmax.log_softmax(INTS, -1), TypeError,
     r"log_softmax: input dtype torch\.int64 is not supported"),
    ("log_softmax dim str", lambda: anysoftmax.log_softmax(X, "a"), TypeError, r"log_softmax: dim must be an int"),
    ("log_softmax dtype", lambda: anysoftmax.log_softmax(X, -1, torch.int32), TypeError,
     r"log_softmax: dtype=torch\.int32 is not supported"),
    ("log_softmax dim", lambda: anysoftmax.log_softmax(X, 5), IndexError, r"log_softmax: dim 5 out of range"),
    ("log_softmax mask", lambda: anysoftmax.log_softmax(X, -1, mask=BAD_MASK), ValueError,
     r"log_softmax: mask of shape \[5, 5\] does not broadcast"),
    ("log_softmax softcap", lambda: anysoftmax.log_softmax(X, -1, softcap=-1.0), ValueError,
     r"log_softmax: softcap must be > 0"),
    ("nn.LogSoftmax dim", lambda: anysoftmax.nn.LogSoftmax(dim=4)(X), IndexError, r"log_softmax: dim 4 out of range"),
    ("softmax_backward y", lambda: anysoftmax.softmax_backward([1.0], X, -1), TypeError,
     r"softmax_backward: y must be a torch\.Tensor"),
    ("softmax_backward dim", lambda: anysoftmax.softmax_backward(X, X, 7, log=True), IndexError,
     r"softmax_backward: dim 7 out of range"),
    ("logsumexp list", lambda: anysoftmax.logsumexp([1.0], -1), TypeError, r"logsumexp: x must be a torch\.Tensor"),
    ("logsumexp ints", lambda: anysoftmax.logsumexp(INTS, -1), TypeError,
     r"logsumexp: x dtype torch\.int64 is not supported; allowed: float16, bfloat16, float32, float64$"),
    ("logsumexp mask", lambda: anysoftmax.logsumexp(X, -1, mask=BAD_MASK), ValueError,
     r"logsumexp: mask of shape \[5, 5\] does not broadcast"),
]


@pytest.mark.parametrize("call,exc,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_errors_name_the_function_and_its_parameter(call, exc, message):
    with pytest.raises(exc) as info:
        call()
    assert re.match(message, str(info.value)), str(info.value)
