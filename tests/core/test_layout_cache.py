"""Row normalisation (in-place strided reads, the one documented copy) and the kernel cache."""

import threading

import pytest
import torch

from anysoftmax.core.cache import OnceCache
from anysoftmax.core.layout import MAX_ROW_DIMS, RowLayout, allocate_rows, contiguous_strides
from anysoftmax.core.spec import SoftmaxSpec


def layout_of(x, dim):
    spec = SoftmaxSpec.from_tensor(x, dim)
    return RowLayout.from_strides(spec.shape, tuple(x.stride()), contiguous_strides(spec.shape), spec.dim)


def offsets(layout):
    """Every (input offset, output offset) the kernels would touch, by the kernels' formula."""
    s0, s1, s2 = layout.row_sizes
    out = []
    for r in range(layout.n_rows):
        i2, rest = r % s2, r // s2
        i1, i0 = rest % s1, rest // s1
        xo = i0 * layout.in_row_strides[0] + i1 * layout.in_row_strides[1] + i2 * layout.in_row_strides[2]
        yo = i0 * layout.out_row_strides[0] + i1 * layout.out_row_strides[1] + i2 * layout.out_row_strides[2]
        out.extend((xo + c * layout.in_col_stride, yo + c * layout.out_col_stride) for c in range(layout.n_cols))
    return out


@pytest.mark.parametrize("make,dim", [
    (lambda: torch.randn(4, 5, 6), 1),
    (lambda: torch.randn(4, 5, 6), 2),
    (lambda: torch.randn(4, 5, 6).transpose(0, 2), 0),
    (lambda: torch.randn(8, 9)[::2, 1::3], 1),
    (lambda: torch.randn(1, 7).expand(5, 7), 1),
    (lambda: torch.randn(3, 4, 5, 6).permute(2, 0, 3, 1), 2),
])
def test_layout_reaches_every_element_in_place(make, dim):
    x = make()
    lay = layout_of(x, dim)
    assert lay is not None
    # The kernel formula must pair each input element with its output element exactly as
    # torch's indexing does (output contiguous).
    out_strides = contiguous_strides(tuple(x.shape))
    expected = set()
    for flat in range(x.numel()):
        coords = [int(c) for c in torch.unravel_index(torch.tensor(flat), x.shape)]
        expected.add((sum(c * s for c, s in zip(coords, x.stride())), sum(c * s for c, s in zip(coords, out_strides))))
    got = offsets(lay)
    assert len(got) == x.numel() and set(got) == expected


def test_contiguous_tensor_needs_at_most_two_row_dims():
    for dim in range(4):
        lay = layout_of(torch.randn(2, 3, 4, 5), dim)
        assert sum(s > 1 for s in lay.row_sizes) <= 2


def test_irregular_layout_is_the_one_copy():
    # Five row dimensions that cannot merge: more than MAX_ROW_DIMS, so allocate_rows copies once.
    x = torch.randn(2, 3, 2, 3, 2, 7).permute(4, 2, 0, 3, 1, 5)[:, :, :, :, :, ::2]
    assert layout_of(x, 5) is None and MAX_ROW_DIMS == 3
    spec = SoftmaxSpec.from_tensor(x, 5)
    x2, y, lay = allocate_rows(x, spec)
    assert x2.is_contiguous() and lay is not None and y.is_contiguous()


def test_once_cache_builds_once_under_threads():
    cache = OnceCache(maxsize=8)
    calls = []
    barrier = threading.Barrier(16)

    def factory():
        calls.append(1)
        return object()

    results = []

    def worker():
        barrier.wait()
        results.append(cache.get(("k", 1), factory))

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and all(r is results[0] for r in results)


def test_once_cache_is_bounded():
    cache = OnceCache(maxsize=4)
    for i in range(10):
        cache.get(i, lambda i=i: i)
    assert len(cache) == 4 and cache.get(9, lambda: None) == 9


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32])
def test_outputs_are_poisoned_under_the_test_suite(dtype):
    """The suite allocates every output poisoned (tests/conftest.py): floating ones NaN, integer
    ones (token ids) their dtype's least value, which no kernel writes; a forgotten element shows."""
    from anysoftmax.core import layout

    assert layout.POISON_OUTPUTS, "the test suite's outputs are not poisoned: tests/conftest.py sets it"
    made = layout.output_maker((3, 2), dtype, torch.device("cpu"))
    for out in (layout.new_output((3, 2), dtype, "cpu"), made(), made()):
        assert out.dtype == dtype and out.shape == (3, 2)
        if dtype.is_floating_point:
            assert bool(out.isnan().all())
        else:
            assert bool((out == torch.iinfo(dtype).min).all())
    first = made()
    assert made() is not first
