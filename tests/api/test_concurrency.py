"""Threads, caches and streams: many threads with new shapes at once compile each kernel once
and all get correct results; caches stay bounded; kernels run on the caller's CUDA stream."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
import torch

import anysoftmax
from anysoftmax.backends.triton import backend as triton_backend
from anysoftmax.core import SoftmaxSpec
from anysoftmax.testing.compare import compare
from anysoftmax import dispatch
from anysoftmax.backends._triton_common import launcher as launch
from helpers import runnable_backends

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]  # gpu: skipped with the reason without CUDA
THREADS_PER_SHAPE = 4


def run_threads(calls):
    """Run every call in its own thread, all released at once; return results in order."""
    barrier = threading.Barrier(len(calls))
    results, errors = [None] * len(calls), []

    def worker(i, call):
        barrier.wait()
        try:
            results[i] = call()
        except BaseException as exc:  # reported below, with the thread's call
            errors.append((i, exc))

    threads = [threading.Thread(target=worker, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def count_triton_compiles():
    """A Counter of compiled (kernel, specialization) keys, filled by Triton's post-compile hook;
    None when this Triton has no such hook."""
    knobs = getattr(__import__("triton"), "knobs", None)
    if knobs is None or not hasattr(knobs.runtime, "jit_post_compile_hook"):
        return None
    seen = Counter()

    def hook(*args, **kwargs):
        seen[(kwargs["fn"].name, str(kwargs["key"]))] += 1
        return None

    knobs.runtime.jit_post_compile_hook = hook
    return seen


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["triton", "triton_ascend", "torch"])
def test_threads_with_new_shapes(device, backend, gen, monkeypatch):
    if backend == "triton_ascend" and device == "cuda":
        monkeypatch.setenv("ANYSOFTMAX_ASCEND_ON_CUDA", "1")  # the NPU launch cross-checked on CUDA
    if backend not in runnable_backends(device):
        pytest.skip(f"{backend} does not run {device} tensors here")
    shapes = [(3 + i, 50 + 37 * i) for i in range(6)] + [(2, 300, 40 + i) for i in range(2)]
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
    cases = []
    for i, shape in enumerate(shapes):
        dtype = dtypes[i % len(dtypes)] if backend != "triton_ascend" else torch.float32
        x = torch.randn(shape, generator=gen).mul_(3).to(dtype).to(device)
        cases += [(x, 1, bool(i % 2))] * THREADS_PER_SHAPE
    triton_backend._plans.clear()
    dispatch.refresh()
    builds = triton_backend._plans.builds
    compiles = count_triton_compiles() if device == "cuda" else None
    if device == "cuda":
        assert compiles is not None, "this Triton has no jit_post_compile_hook to count compiles with"
    try:
        outs = run_threads([lambda c=c: (anysoftmax.log_softmax if c[2] else anysoftmax.softmax)(
            c[0], c[1], backend=backend) for c in cases])
    finally:
        if compiles is not None:
            __import__("triton").knobs.runtime.jit_post_compile_hook = None
    for (x, dim, log), y in zip(cases, outs):
        result = compare(y, x, SoftmaxSpec.from_tensor(x, dim, log=log))
        assert result.ok, f"{backend} {tuple(x.shape)} dim {dim}: {result.detail}"
    if backend == "triton":  # one plan per shape, however many threads asked for it at once
        assert triton_backend._plans.builds - builds == len(shapes)
    if compiles is not None:
        twice = {k: n for k, n in compiles.items() if n > 1}
        assert not twice, f"kernels compiled more than once: {twice}"


def test_plan_cache_is_bounded(monkeypatch, gen):
    if "triton" not in runnable_backends("cpu"):
        pytest.skip("triton does not run on CPU here: TRITON_INTERPRET is not set")
    monkeypatch.setattr(triton_backend._plans, "maxsize", 4)
    for n in range(20, 40):
        x = torch.randn(2, n, generator=gen)
        assert compare(anysoftmax.softmax(x, 1, backend="triton"), x, SoftmaxSpec.from_tensor(x, 1)).ok
        assert len(triton_backend._plans) <= 4


@pytest.mark.gpu
def test_counter_buffers_bounded_across_streams(gen):
    """Split rows keep barrier counters per stream: many streams must not grow them forever."""
    x = torch.randn(8, 65536, generator=gen).cuda()
    for _ in range(launch.MAX_COUNTER_STREAMS + 20):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            y = anysoftmax.softmax(x, 1)
        stream.synchronize()
        assert compare(y, x, SoftmaxSpec.from_tensor(x, 1), device="cuda").ok
    assert len(launch._counters) <= launch.MAX_COUNTER_STREAMS


@pytest.mark.gpu
@pytest.mark.parametrize("shape,dim", [((4096, 1000), 1), ((16, 131072), 1), ((4096, 512), 0)])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_runs_on_callers_stream(shape, dim, backend, gen):
    """On a side stream: a long sleep, then new data copied into x, then softmax(x). A kernel
    launched on any other stream would run before the copy and see the old data."""
    old = torch.randn(shape, generator=gen).cuda()
    new = torch.randn(shape, generator=gen).cuda()
    x = old.clone()
    anysoftmax.softmax(x, dim, backend=backend)  # compile first: the sleep must outlast the launch
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU time
        x.copy_(new)
        y = anysoftmax.softmax(x, dim, backend=backend)
    assert not stream.query(), "the sleep ended before the launch returned: the check proves nothing"
    stream.synchronize()
    assert compare(y, new, SoftmaxSpec.from_tensor(new, dim), device="cuda").ok
