"""The triton backend's long-row paths (split, online, the cooperative split and its two-launch
form) forced on small rows by lowered tuning thresholds, through the interpreter and on a GPU;
large GPU shapes; the automatic choice on a GPU."""

import pytest
import torch

from anysoftmax.backends.triton import heuristics
from anysoftmax.testing.cases import LONG_ROW_CASES
from helpers import LONG_ROW_PATHS, check, params, runnable_backends, skip_if_refused

CPU_BACKENDS = runnable_backends("cpu")


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("case,dtype", params(LONG_ROW_CASES))
@pytest.mark.parametrize("path", list(LONG_ROW_PATHS))
def test_triton_long_rows_cpu(path, case, dtype, log, gen):
    """The split-row and online kernels, triggered on small rows by lowering the tile limit."""
    if "triton" not in CPU_BACKENDS:
        pytest.skip("triton does not run on CPU here: TRITON_INTERPRET is not set")
    with heuristics.override(**LONG_ROW_PATHS[path]):
        skip_if_refused(check(case.make(gen, dtype), case.dim, backend="triton", log=log, dtype=case.out_dtype))


GPU_EXTRA_SHAPES = [((4096, 4096), 1), ((8192, 1000), 0), ((8192, 8192), 0), ((16384, 1024), 0), ((64, 65536), 1),
                    ((3, 262144), 1), ((32768, 128), 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("case,dtype", params(LONG_ROW_CASES))
@pytest.mark.parametrize("path", list(LONG_ROW_PATHS) + ["split-two-phase"])
def test_gpu_long_row_paths(path, case, dtype, log, gen):
    """The long-row paths on small rows, the cooperative split included."""
    over = LONG_ROW_PATHS["split"] | {"cooperative": False} if path == "split-two-phase" else LONG_ROW_PATHS[path]
    with heuristics.override(**over):
        skip_if_refused(check(case.make(gen, dtype).cuda(), case.dim, backend="triton", log=log,
                              dtype=case.out_dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,dim", GPU_EXTRA_SHAPES, ids=[f"{s[0]}x{s[1]}-dim{d}" for s, d in GPU_EXTRA_SHAPES])
def test_gpu_large(shape, dim, dtype, gen):
    x = (torch.randn(shape, generator=gen) * 3).to(dtype).cuda()
    check(x, dim, backend="triton", log=False)
    check(x, dim, backend="triton", log=True)


@pytest.mark.gpu
def test_gpu_automatic_choice_is_triton():
    import anysoftmax
    from anysoftmax.core import SoftmaxSpec, select
    x = torch.randn(4, 8, device="cuda")
    assert select(SoftmaxSpec.from_tensor(x, 1)).name == "triton"
    torch.testing.assert_close(anysoftmax.softmax(x, 1), torch.softmax(x, 1))
