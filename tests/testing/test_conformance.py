"""The conformance suite: the kit's checks (`anysoftmax.testing`: every shipped case, plain and
fused, forward and backward, repeated calls, bad input) on every backend that runs here (an
installed plugin's included), and on triton on a CUDA GPU."""

import os

import pytest
import torch

from anysoftmax.testing.cases import LONG_ROW_CASES, LONG_VARIANT_CASES
from anysoftmax.testing.kit import conformance_checks
from helpers import kit_params, runnable_backends, skip_if_refused

CPU_BACKENDS = runnable_backends("cpu")

# triton_ascend launches triton's kernels (`backends/_triton_common`) with plans of its own (grid,
# tile and UB budget): on the CPU, where both run them through the interpreter, it runs in full
# only the checks its plans change (the long rows: looped and split tiles, forward and backward,
# plain and fused) and the kit's quick sample of everything else (one case of each kind, float32
# and bfloat16); triton runs every check. (docs/testing.md: "One kernel family, one full run".)
SHARES_KERNELS_WITH = {"triton_ascend": "triton"}
LONG_CASES = {c.name for c in LONG_ROW_CASES + LONG_VARIANT_CASES}


def sampled_checks(backend: str) -> set[str]:
    """The names of the checks `backend` runs on the CPU when it shares triton's kernels."""
    quick = {c.name for c in conformance_checks(backend, quick=True)}
    return {c.name for c in conformance_checks(backend)
            if c.name in quick or c.kind in ("protocol", "bad-input") or c.name.split(" ")[2] in LONG_CASES}


def cpu_params() -> list:
    params = kit_params(CPU_BACKENDS, "cpu")
    keep = {b: sampled_checks(b) for b in SHARES_KERNELS_WITH if b in CPU_BACKENDS}
    return [p for p in params if p.values[0] not in keep or p.values[1].name in keep[p.values[0]]]


@pytest.mark.parametrize("backend,check", cpu_params())
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


def test_the_sample_keeps_every_kind_and_every_long_row():
    names = sampled_checks("triton_ascend")
    full = conformance_checks("triton_ascend")
    assert {c.kind for c in full} == {c.kind for c in full if c.name in names}
    assert all(c.name in names for c in full if c.name.split(" ")[2] in LONG_CASES)
    assert len(names) < len(full) / 3
