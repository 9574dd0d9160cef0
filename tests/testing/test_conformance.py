"""The conformance suite: the kit's checks (`anysoftmax.testing`: every shipped case, plain and
fused, forward and backward, repeated calls, bad input) on every backend that runs here (an
installed plugin's included), and on triton on a CUDA GPU."""

import os

import pytest
import torch

from helpers import kit_params, runnable_backends, skip_if_refused

CPU_BACKENDS = runnable_backends("cpu")


@pytest.mark.parametrize("backend,check", kit_params(CPU_BACKENDS, "cpu"))
def test_cpu(backend, check, seed):
    skip_if_refused(check.run(seed))


@pytest.mark.parametrize("backend,check", kit_params(["triton"], "cuda", marks=pytest.mark.gpu))
def test_gpu(backend, check, seed):
    skip_if_refused(check.run(seed))


def test_cpu_backends_include_triton_under_interpreter():
    # The suite must really exercise the kernels in CI, not only the torch fallback.
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        assert "triton" in CPU_BACKENDS and "triton_ascend" in CPU_BACKENDS
    assert "torch" in CPU_BACKENDS
