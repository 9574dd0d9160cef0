"""Property-based conformance (hypothesis): random ranks, shapes, dims, strides, dtypes and
values, NaN/inf included, on every backend that runs here (CPU tensors through the
interpreter, and CUDA tensors when there is a GPU), against the one float64 reference."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anysoftmax.testing.cases import DTYPES
from helpers import LONG_ROW_PATHS, backend_devices, check
from helpers.ascend import SUBBLOCK_UB

# triton_ascend launches triton's kernels with plans of its own: on the CPU, where both run
# through the interpreter, it draws half the examples (as the conformance suite runs it on a
# sample: docs/testing.md, "One kernel family, one full run").
SHARES_KERNELS = {("triton_ascend", "cpu")}
BACKEND_DEVICES = [p for p in backend_devices() if tuple(getattr(p, "values", p)) not in SHARES_KERNELS]
SHARED_BACKEND_DEVICES = [p for p in backend_devices() if tuple(getattr(p, "values", p)) in SHARES_KERNELS]
SPECIALS = (float("nan"), float("inf"), float("-inf"))
# Enough examples to walk the layouts on each CI run (fresh ones every run), few enough for
# the Triton interpreter to stay within a minute per backend (at 100, an interpreted backend
# took up to 80 s on CI's CPU).
PROFILE = settings(max_examples=60, deadline=None, derandomize=False,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SHARED_PROFILE = settings(PROFILE, max_examples=30)


@st.composite
def requests(draw):
    """(base, view, dim, dtype=): x = view(base) is contiguous, permuted, step-sliced or
    expanded; the view is taken on the device the test runs on, so strides survive the move."""
    rank = draw(st.integers(0, 4))
    shape = [draw(st.integers(0 if draw(st.booleans()) and rank else 1, 6)) for _ in range(rank)]
    dim = draw(st.integers(-rank, rank - 1)) if rank else draw(st.sampled_from([0, -1]))
    if rank and draw(st.booleans()):  # a reduced dim long enough for several blocks
        shape[dim] = draw(st.integers(7, 300))
    in_dtype = draw(st.sampled_from(DTYPES + (torch.int32,)))
    out_dtype = draw(st.sampled_from((None,) + DTYPES)) if in_dtype.is_floating_point else draw(
        st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**31 - 1))
    view = draw(st.sampled_from(["contiguous", "permuted", "sliced", "expanded"])) if rank else "contiguous"

    gen = torch.Generator().manual_seed(seed)
    if view == "permuted":
        perm = draw(st.permutations(range(rank)))
        base_shape = [shape[p] for p in perm]
    elif view == "sliced":
        steps = [draw(st.integers(1, 3)) for _ in range(rank)]
        starts = [draw(st.integers(0, 2)) for _ in range(rank)]
        base_shape = [start + size * step for size, step, start in zip(shape, steps, starts)]
    elif view == "expanded":
        broadcast = [draw(st.booleans()) for _ in range(rank)]
        base_shape = [1 if b else s for s, b in zip(shape, broadcast)]
    else:
        base_shape = list(shape)

    base = torch.randn(base_shape, generator=gen, dtype=torch.float64) * draw(st.sampled_from([0.5, 3.0, 20.0]))
    if in_dtype == torch.int32:
        base = base.round()
    if base.numel() and in_dtype.is_floating_point and draw(st.booleans()):
        flat = base.view(-1)
        for _ in range(draw(st.integers(1, 3))):  # scattered specials: NaN, +inf, -inf
            flat[draw(st.integers(0, flat.numel() - 1))] = draw(st.sampled_from(SPECIALS))
        if base.dim() and draw(st.booleans()):  # one whole slice of -inf (all--inf rows)
            base.select(0, draw(st.integers(0, base.shape[0] - 1))).fill_(float("-inf"))
    base = base.to(in_dtype)

    def make_view(b):
        if view == "permuted":
            return b.permute([perm.index(i) for i in range(rank)])
        if view == "sliced":
            return b[tuple(slice(start, start + size * step, step) for size, step, start in zip(shape, steps, starts))]
        if view == "expanded":
            return b.expand(shape)
        return b

    assert list(make_view(base).shape) == shape
    return base, make_view, dim, out_dtype


def tuning(backend: str, path: str):
    """Tuning that sends these small requests down the long-row kernels too."""
    if path == "default":
        return contextlib.nullcontext()
    if backend == "triton":
        from anysoftmax.backends.triton import heuristics
        return heuristics.override(**LONG_ROW_PATHS[path])
    if backend == "triton_ascend":
        from anysoftmax.backends.triton_ascend import settings
        return settings.override(ub_bytes=SUBBLOCK_UB)
    return contextlib.nullcontext()


def _property_test(profile, backend_devices: list):
    """The property test over `backend_devices` with `profile`'s examples."""
    @pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
    @pytest.mark.parametrize("backend,device", backend_devices)
    @profile
    @given(request=requests(), path=st.sampled_from(["default", *LONG_ROW_PATHS]))
    def test(backend, device, log, request, path):
        base, make_view, dim, out_dtype = request
        x = make_view(base.to(device))
        before = x.clone()
        with tuning(backend, path):
            check(x, dim, backend=backend, log=log, dtype=out_dtype)
        assert torch.equal(x.isnan(), before.isnan()) and torch.equal(x.nan_to_num(), before.nan_to_num()), \
            "the input was modified"
    return test


test_matches_reference = _property_test(PROFILE, BACKEND_DEVICES)
test_matches_reference_sharing_kernels = _property_test(SHARED_PROFILE, SHARED_BACKEND_DEVICES)
