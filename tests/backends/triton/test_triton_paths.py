"""Every kernel path of the `triton` backend is reached by the conformance cases meant for it.

The conformance suite checks results; this checks that the plan behind them is the kernel the
case is there to cover, so a heuristics change cannot silently route a path out of CI.
"""

import pytest
import torch

import anysoftmax
from anysoftmax.backends.triton import heuristics
from helpers import LONG_ROW_PATHS, as_backend_sees_it, runnable_backends

CPU_BACKENDS = runnable_backends("cpu")

PATHS = [
    # (shape, dim, overrides, expected kernel kind)
    ((64, 128), 1, {}, "tile"),
    ((33, 70), 0, {}, "cols"),
    ((4, 50, 40), 1, {}, "cols"),
    ((300, 3), 0, {}, "tile"),  # inner dim too short for column tiles: strided rows
    ((5, 300), 1, LONG_ROW_PATHS["split"], "split"),
    ((5, 300), 1, LONG_ROW_PATHS["online"], "online"),
    ((2, 300, 40), 1, LONG_ROW_PATHS["split"], "cols_split"),
    ((1823, 781), 0, {}, "cols_split"),
]


def plan_for(shape, dim, backward=False):
    x, y, layout, spec = as_backend_sees_it(torch.randn(shape), dim)
    return anysoftmax.get_backend("triton").plan(x, y, layout, spec, backward=backward)


@pytest.mark.parametrize("shape,dim,over,kind", PATHS, ids=[f"{k}-{'x'.join(map(str, s))}-dim{d}" for s, d, _, k in PATHS])
def test_plan_kind(shape, dim, over, kind):
    if "triton" not in CPU_BACKENDS:
        pytest.skip("triton does not run on CPU here: TRITON_INTERPRET is not set")
    with heuristics.override(**over):
        assert plan_for(shape, dim).kind == kind


def test_backward_of_column_reduction_uses_row_kernels():
    # The column kernels are forward-only; the backward reads the same layout as rows.
    if "triton" not in CPU_BACKENDS:
        pytest.skip("triton does not run on CPU here: TRITON_INTERPRET is not set")
    assert plan_for((33, 70), 0, backward=True).kind in ("tile", "split")
