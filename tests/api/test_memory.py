"""No allocation besides the output, plus the documented scratch of split rows
(`KernelPlan.stats_numel`), measured with torch.cuda.max_memory_allocated."""

from __future__ import annotations

import pytest
import torch

import anysoftmax
from helpers import as_backend_sees_it

def allocating(*nbytes: int):
    """The same allocations done directly: the caching allocator rounds each request (512 B,
    2 MiB for large ones), so the bound is measured with it rather than computed by hand."""
    return lambda: [torch.empty(n, dtype=torch.uint8, device="cuda") for n in nbytes if n]


def plan_of(x, dim, backward=False):
    """(plan, layout) the triton backend uses (the backward: y, dy and dx contiguous alike)."""
    x, y, layout, spec = as_backend_sees_it(x, dim)
    return anysoftmax.get_backend("triton").plan(x, y, layout, spec, backward=backward), layout


def peak_extra(fn) -> int:
    """Bytes allocated at the peak of `fn()` above what was allocated before it."""
    # An empty pool first: the allocator may hand out a larger cached block whole, which
    # would count as more than was asked for.
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    fn()  # compile, size the grid and allocate the reused barrier counters first
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak


CASES = [
    # (shape, dim, dtype, expected kernel)
    ((4096, 1000), 1, torch.float32, "tile"),
    ((64, 65536), 1, torch.bfloat16, "split"),
    ((3, 262144), 1, torch.float32, "split"),
    ((512, 8192), 0, torch.float32, "cols"),
    ((8192, 2048), 0, torch.float16, "cols_split"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape,dim,dtype,kind", CASES, ids=[f"{k}-{'x'.join(map(str, s))}" for s, _, _, k in CASES])
def test_forward_allocates_output_and_scratch_only(shape, dim, dtype, kind, gen):
    x = torch.randn(shape, generator=gen).to(dtype).cuda()
    plan, layout = plan_of(x, dim)
    assert plan.kind == kind
    allowed = peak_extra(allocating(x.numel() * x.element_size(), plan.stats_numel(layout) * 4))
    assert peak_extra(lambda: anysoftmax.softmax(x, dim)) <= allowed


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4096, 1000), (16, 262144)])
def test_backward_allocates_gradient_and_scratch_only(shape, gen):
    y = torch.softmax(torch.randn(shape, generator=gen).cuda(), 1)
    g = torch.randn(shape, generator=gen).cuda()
    plan, layout = plan_of(y, 1, backward=True)
    allowed = peak_extra(allocating(y.numel() * 4, max(plan.stats_numel(layout), 1) * 4))
    assert peak_extra(lambda: anysoftmax.torchop.api.softmax_backward(y, g, 1)) <= allowed


@pytest.mark.gpu
def test_documented_copies_only_when_needed(gen):
    """A narrowing dtype= rounds the input once (as torch does): that copy plus the output."""
    x = torch.randn(2048, 1024, generator=gen).cuda()
    out_bytes = x.numel() * 2
    assert peak_extra(lambda: anysoftmax.softmax(x, 1, dtype=torch.float16)) <= peak_extra(allocating(out_bytes, out_bytes))
    # A widening dtype= is folded into the kernel's loads: no copy.
    h = x.half()
    assert peak_extra(lambda: anysoftmax.softmax(h, 1, dtype=torch.float32)) <= peak_extra(allocating(x.numel() * 4))
