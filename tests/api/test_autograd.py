"""Gradients through anysoftmax match torch's."""

import pytest
import torch

import anysoftmax
from anysoftmax.core import SoftmaxSpec
from anysoftmax.testing.compare import compare_backward
from helpers import runnable_backends


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("backend", runnable_backends("cpu"))
@pytest.mark.parametrize("shape,dim", [((7, 33), 1), ((5, 6, 7), 0), ((40,), 0)])
def test_backward_matches_torch(backend, shape, dim, log, gen):
    # float64 where the backend takes it (tight comparison), float32 otherwise (NPU backends).
    probe = SoftmaxSpec.from_tensor(torch.empty(shape, dtype=torch.float64), dim)
    dtype = torch.float64 if anysoftmax.get_backend(backend).supports(probe) is None else torch.float32
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    x = torch.randn(shape, generator=gen, dtype=dtype)
    g = torch.randn(shape, generator=gen, dtype=dtype)
    a = x.clone().requires_grad_()
    fn = anysoftmax.log_softmax if log else anysoftmax.softmax
    fn(a, dim, backend=backend).backward(g)
    b = x.clone().requires_grad_()
    (torch.log_softmax if log else torch.softmax)(b, dim).backward(g)
    torch.testing.assert_close(a.grad, b.grad, **tol)


def test_backward_fp32_gradient_dtype(gen):
    x = torch.randn(4, 9, generator=gen).requires_grad_()
    anysoftmax.softmax(x, 1).sum().backward()
    assert x.grad.dtype == torch.float32


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("path", ["tile", "split"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_backward_kernels(path, dtype, log, gen):
    """The Triton backward kernel, whole rows and rows split in chunks (two-phase on CPU)."""
    from anysoftmax.backends.triton import heuristics
    if "triton" not in runnable_backends("cpu"):
        pytest.skip("triton does not run on CPU here: TRITON_INTERPRET is not set")
    x = (torch.randn(6, 150, generator=gen) * 2).to(dtype)
    g = torch.randn(6, 150, generator=gen).to(dtype)
    over = dict(max_tile_elems=64, split_chunk_bytes=128) if path == "split" else {}
    with heuristics.override(**over):
        y = (anysoftmax.log_softmax if log else anysoftmax.softmax)(x, 1, backend="triton")
        dx = anysoftmax.torchop.api.softmax_backward(y, g, 1, log=log, backend="triton")
    result = compare_backward(dx, y, g, SoftmaxSpec.from_tensor(y, 1, log=log))
    assert result.ok, result.detail


@pytest.mark.gpu
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(4096, 1000), (64, 65536), (3, 262144), (300, 40)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cooperative", [True, False], ids=["cooperative", "two-phase"])
def test_gpu_backward(shape, dtype, log, cooperative, gen):
    """Backward kernels on the GPU, whole rows and split rows, against the float64 formula."""
    from anysoftmax.backends.triton import heuristics
    x = (torch.randn(shape, generator=gen) * 2).to(dtype).cuda().requires_grad_()
    g = torch.randn(shape, generator=gen).to(dtype).cuda()
    with heuristics.override(cooperative=cooperative):
        y = (anysoftmax.log_softmax if log else anysoftmax.softmax)(x, -1)
        y.backward(g)
    result = compare_backward(x.grad, y, g, SoftmaxSpec.from_tensor(y, -1, log=log), device="cuda")
    assert result.ok, result.detail
