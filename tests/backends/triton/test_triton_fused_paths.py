"""The fused family (scale, masks, causal, softcap, sinks, empty rows) on the triton kernels' long-row
paths and attention-sized GPU shapes, forward and backward, against the one float64 reference
(`core.reference.fused_forward`). Every shipped case on every backend: the kit's checks
(tests/testing/test_conformance.py)."""

from __future__ import annotations

import pytest
import torch

from anysoftmax.backends.triton import heuristics
from anysoftmax.testing.cases import LONG_VARIANT_CASES
from helpers import LONG_ROW_PATHS_BACKWARD as LONG_ROW_PATHS
from helpers import check_variant, runnable_backends, skip_if_refused, variant_params

CPU_BACKENDS = runnable_backends("cpu")
LOG = pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])



@LOG
@pytest.mark.parametrize("case,dtype", variant_params(LONG_VARIANT_CASES))
@pytest.mark.parametrize("path", list(LONG_ROW_PATHS))
def test_triton_long_rows_cpu(path, case, dtype, log, gen):
    """The online, split and column-split kernels with every fused step, on small rows."""
    if "triton" not in CPU_BACKENDS:
        pytest.skip("triton does not run on CPU here: TRITON_INTERPRET is not set")
    x = case.make(gen, dtype)
    with heuristics.override(**LONG_ROW_PATHS[path]):
        skip_if_refused(check_variant(x, case.dim, case.kwargs(gen, x), backend="triton", log=log))


@pytest.mark.gpu
@LOG
@pytest.mark.parametrize("case,dtype", variant_params(LONG_VARIANT_CASES))
@pytest.mark.parametrize("path", list(LONG_ROW_PATHS) + ["split-two-phase"])
def test_gpu_long_row_paths(path, case, dtype, log, gen):
    over = LONG_ROW_PATHS["split"] | {"cooperative": False} if path == "split-two-phase" else LONG_ROW_PATHS[path]
    x = case.make(gen, dtype).cuda()
    kw = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in case.kwargs(gen, x).items()}
    with heuristics.override(**over):
        skip_if_refused(check_variant(x, case.dim, kw, backend="triton", log=log))


ATTENTION_SHAPES = [(8, 16, 1024, 1024), (2, 8, 2048, 2048), (1, 4, 777, 4100)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", ATTENTION_SHAPES, ids=["x".join(map(str, s)) for s in ATTENTION_SHAPES])
@pytest.mark.parametrize("variant", ["megatron", "gemma2", "gpt-oss", "causal-br", "everything"])
def test_gpu_attention_shapes(variant, shape, dtype, gen):
    """Attention-sized scores (the benchmark's shapes and an odd one), each model family's variant."""
    b, h, sq, sk = shape
    x = (torch.randn(shape, generator=gen) * 4).to(dtype).cuda()
    mask = (torch.rand((b, 1, sq, sk), generator=gen) < 0.3).cuda()
    sinks = torch.randn((h, 1, 1), generator=gen).to(dtype).cuda()
    kw = {"megatron": dict(scale=0.125, mask=mask), "gemma2": dict(scale=0.125, softcap=50.0),
          "gpt-oss": dict(scale=0.125, causal=True, sinks=sinks), "causal-br": dict(causal="bottom_right"),
          "everything": dict(scale=0.2, softcap=20.0, mask=mask, causal="bottom_right", sinks=sinks,
                             empty_rows="uniform")}[variant]
    check_variant(x, -1, kw, backend="triton", log=False)
