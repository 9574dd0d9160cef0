"""Index arithmetic past int32: more than 2**31 elements, row and column offsets beyond int32.

On the GPU the tensors are real (several GB each). On the CPU the interpreter reads views
whose strides reach past 2**31 elements into one large allocation of which only the touched
pages are ever materialised; with 32-bit offsets these reads wrap and crash or read wrong data.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import anysoftmax
from anysoftmax.core import SoftmaxSpec
from anysoftmax.testing.compare import compare, compare_backward
from helpers import LONG_ROW_PATHS, runnable_backends

INT32_MAX = 2**31 - 1
CPU_BACKENDS = runnable_backends("cpu")


@pytest.fixture(scope="module")
def far_storage():
    """A 4.5 GB float16 buffer (virtual: untouched pages cost no memory)."""
    return torch.empty(2**31 + 2**28, dtype=torch.float16)


def planted(storage, size, stride, gen):
    """A view of `storage` with random data written at the elements it covers."""
    x = storage.as_strided(size, stride)
    x.copy_(torch.randn(size, generator=gen).mul_(3).half())
    return x


FAR_VIEWS = [
    # (size, stride, dim, tuning): offsets past int32 in rows, columns, column tiles, split rows
    ((3, 40), (2**30 + 7, 1), 1, "default"),
    ((4, 3), (1, 2**30 + 3), 1, "default"),
    ((4, 3), (1, 2**30 + 3), 0, "default"),
    ((3, 32), (2**30 + 16, 1), 0, "default"),  # column tiles (contiguous inner positions)
    ((3, 300), (2**30 + 9, 1), 1, "split"),
    ((3, 300), (2**30 + 9, 1), 1, "online"),
]


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("size,stride,dim,path", FAR_VIEWS,
                         ids=[f"{'x'.join(map(str, s))}-st{'x'.join(map(str, t))}-dim{d}-{p}" for s, t, d, p in FAR_VIEWS])
def test_offsets_beyond_int32_cpu(far_storage, backend, size, stride, dim, path, log, gen):
    x = planted(far_storage, size, stride, gen)
    assert max((n - 1) * s for n, s in zip(size, stride)) > INT32_MAX
    tuning = contextlib.nullcontext()
    if path != "default" and backend == "triton":
        from anysoftmax.backends.triton import heuristics
        tuning = heuristics.override(**LONG_ROW_PATHS[path])
    with tuning:
        y = (anysoftmax.log_softmax if log else anysoftmax.softmax)(x, dim, backend=backend)
    result = compare(y, x, SoftmaxSpec.from_tensor(x, dim, log=log))
    assert result.ok, result.detail


def compare_in_slices(y, x, dim, log, slice_elems=2**26):
    """compare() on slices of about `slice_elems` across the non-reduced dim (the float64
    reference of a 4 GB tensor would need 17 GB at once), on the GPU."""
    other = 1 - dim
    step = max(1, slice_elems // x.shape[dim])
    for start in range(0, x.shape[other], step):
        xs = x.narrow(other, start, min(step, x.shape[other] - start))
        ys = y.narrow(other, start, xs.shape[other])
        result = compare(ys, xs, SoftmaxSpec.from_tensor(xs, dim, log=log), device=x.device)
        assert result.ok, f"slice at {start}: {result.detail}"


HUGE = [
    # (rows, cols, dim): 2**16 + 16 rows x 2**15: 2**31 + 2**19 elements, row offsets past int32
    (2**16 + 16, 2**15, 1),
    (2**16 + 16, 2**15, 0),  # the same over dim 0: column tiles split across programs
    (2**11 + 8, 2**20, 1),  # rows of 1M split across programs, 2**31 + 2**23 elements
]


@pytest.mark.gpu
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("rows,cols,dim", HUGE, ids=[f"{r}x{c}-dim{d}" for r, c, d in HUGE])
def test_huge_gpu(rows, cols, dim, log):
    gen = torch.Generator(device="cuda").manual_seed(rows + cols + dim)
    x = torch.randn(rows, cols, device="cuda", dtype=torch.float16, generator=gen).mul_(3)
    assert x.numel() > 2**31
    y = (anysoftmax.log_softmax if log else anysoftmax.softmax)(x, dim)
    compare_in_slices(y, x, dim, log)


@pytest.mark.gpu
def test_huge_backward_gpu():
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(2**16 + 16, 2**15, device="cuda", dtype=torch.float16, generator=gen)
    y = anysoftmax.softmax(x, 1)
    del x
    g = torch.randn(y.shape, device="cuda", dtype=torch.float16, generator=gen)
    dx = anysoftmax.torchop.api.softmax_backward(y, g, 1)
    step = 2048
    for start in range(0, y.shape[0], step):
        ys, gs = y[start:start + step], g[start:start + step]
        result = compare_backward(dx[start:start + step], ys, gs, SoftmaxSpec.from_tensor(ys, 1), device="cuda")
        assert result.ok, f"rows {start}..: {result.detail}"
