"""A tensor `scale` (one value per row) applied inside the triton kernels on the eager
no-grad path: every forward kernel kind (tile, online, split, the column kernels) and both
logsumexp forms (the row kernels' STATES_ONLY, `lse_kernel` for column plans), alone and with
softcap, a bool mask and sinks, against the float64 reference; the launch is spied on to prove
the kernel kind ran and was handed the row scale (no fallback, no scale·x in torch first)."""

from __future__ import annotations

import pytest
import torch

from anysoftmax.backends._triton_common import logsumexp as lse_kernel_module
from anysoftmax.backends._triton_common import lse_rows, softmax_launchers
from anysoftmax.backends.triton import heuristics
from anysoftmax.testing import check_forward
from anysoftmax.testing.cases import row_scale
from anysoftmax.testing.checks import check_logsumexp
from helpers import LONG_ROW_PATHS, runnable_backends
from helpers.spies import bound_softmax_plans

ON_CPU = pytest.mark.skipif("triton" not in runnable_backends("cpu"),
                            reason="triton does not run on CPU here: TRITON_INTERPRET is not set")

PATHS = {"tile": {}, **LONG_ROW_PATHS}
# (x shape, dim, scale shape, kernel kinds the paths give): the last dim (row kernels), a
# middle dim over contiguous inner positions (the column kernels), a broadcast scale.
LAYOUTS = {
    "rows": ((2, 3, 150), -1, (2, 3, 1), {"tile": "tile", "online": "online", "split": "split"}),
    "rows-broadcast": ((2, 3, 150), -1, (3, 1), {"tile": "tile", "online": "online", "split": "split"}),
    "cols": ((2, 150, 20), 1, (2, 1, 20), {"tile": "cols", "split": "cols_split"}),
}
# Other fused steps beside it (x shape, scale shape -> keywords): sinks of the scale's shape.
EXTRAS = {"alone": lambda gen, shape, scale_shape: {},
          "softcap-mask-sinks": lambda gen, shape, scale_shape: {
              "softcap": 5.0, "mask": torch.rand(shape, generator=gen) < 0.3,
              "sinks": torch.randn(scale_shape, generator=gen)}}


def _cases():
    for name, (shape, dim, scale_shape, kinds) in LAYOUTS.items():
        for path, kind in kinds.items():
            yield pytest.param(shape, dim, scale_shape, path, kind, id=f"{name}-{path}")


@pytest.fixture
def launched(monkeypatch):
    """The (kind, has_row_scale) of every forward plan the triton launchers bind."""
    seen = bound_softmax_plans(monkeypatch, softmax_launchers, lse_rows)
    real_kernel = lse_kernel_module.bind_kernel

    def spy_kernel(binding, *args, **kwargs):
        seen.append(("lse_kernel", binding.metas[0]["HAS_ROW_SCALE"]))
        return real_kernel(binding, *args, **kwargs)

    monkeypatch.setattr(lse_kernel_module, "bind_kernel", spy_kernel)
    return seen


@ON_CPU
@pytest.mark.parametrize("extra", list(EXTRAS))
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dim,scale_shape,path,kind", list(_cases()))
def test_every_kernel_kind_applies_the_row_scale(shape, dim, scale_shape, path, kind, log, extra, launched, gen):
    x = torch.randn(shape, generator=gen) * 3
    fused = {"scale": row_scale(scale_shape)(gen), **EXTRAS[extra](gen, shape, scale_shape)}
    with heuristics.override(**PATHS[path]):
        assert check_forward(x, dim, backend="triton", log=log, fused=fused) is None
    assert launched == [(kind, True)]


@ON_CPU
@pytest.mark.parametrize("extra", list(EXTRAS))
@pytest.mark.parametrize("shape,dim,scale_shape,path,kind", list(_cases()))
def test_logsumexp_applies_the_row_scale(shape, dim, scale_shape, path, kind, extra, launched, gen):
    x = torch.randn(shape, generator=gen) * 3
    fused = {"scale": row_scale(scale_shape)(gen), **EXTRAS[extra](gen, shape, scale_shape)}
    with heuristics.override(**PATHS[path]):
        assert check_logsumexp(x, dim, backend="triton", fused=fused) is None
    # Row plans run their own kernel (STATES_ONLY); column plans `lse_kernel`.
    assert launched[-1] == ((kind if kind in lse_rows.ROW_KINDS else "lse_kernel"), True)


@ON_CPU
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=str)
def test_scale_dtypes_and_a_non_contiguous_scale(dtype, launched, gen):
    # A float64 scale in a float64 kernel is read exactly; a bfloat16 one widened.
    x = torch.randn(4, 6, 30, generator=gen, dtype=torch.float64)
    scale = row_scale((6, 4, 1))(gen).to(dtype).transpose(0, 1)  # [4, 6, 1], not contiguous
    assert not scale.is_contiguous()
    assert check_forward(x, -1, backend="triton", fused={"scale": scale}) is None
    assert launched == [("tile", True)]


# Sampler-sized logits on a GPU, the planner's own choices: vocabulary rows (tile for a short
# vocabulary, the cooperative split for 128K; online where the table asks for it), a reduction
# over a middle dim (the column kernels).
GPU_CASES = {"tile": ((64, 4096), -1, (64, 1), {}), "split": ((8, 128256), -1, (8, 1), {}),
             "online": ((8, 128256), -1, (8, 1), {"long_rows": "online"}),
             "cols": ((4, 2048, 64), 1, (4, 1, 64), {})}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_gpu_row_scale_in_every_kernel_kind(case, dtype, launched, gen):
    shape, dim, scale_shape, over = GPU_CASES[case]
    x = (torch.randn(shape, generator=gen) * 4).to(dtype).cuda()
    fused = {"scale": row_scale(scale_shape)(gen).cuda()}
    with heuristics.override(**over):
        for log in (False, True):
            assert check_forward(x, dim, backend="triton", log=log, fused=fused) is None
        assert check_logsumexp(x, dim, backend="triton", fused=fused) is None
    assert launched and all(has_row_scale for _, has_row_scale in launched)
