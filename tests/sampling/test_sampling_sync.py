"""No host synchronisation in `anysoftmax.sampling`: on the CPU, the whole path runs on meta
tensors (which have no values, so any `.item()`, `nonzero()`, `bool(tensor)` or
data-dependent Python branch raises there); on a CUDA GPU, under
`torch.cuda.set_sync_debug_mode("error")` and inside a captured CUDA graph. The GPU tests also
run the kit's sampler section on the GPU."""

from __future__ import annotations

import pytest
import torch

import anysoftmax.sampling as sampling
from anysoftmax.testing.sampling import check_sampler


def _keywords(device, batch=(4, 3)):
    rows = batch[0] * batch[1]
    return dict(temperature=torch.rand(batch, device=device) + 0.5,
                top_k=torch.full((rows,), 7, dtype=torch.int64, device=device),
                top_p=torch.full(batch + (1,), 0.9, device=device), min_p=torch.full((), 0.02, device=device))


def _seeds(device, rows=12):
    return dict(seed=torch.arange(rows, dtype=torch.int64, device=device) * 7919,
                offset=torch.full((rows,), 5, dtype=torch.int64, device=device))


def test_meta_tensors_expose_any_host_read():
    m = torch.empty(3, device="meta")
    for read in (lambda: m.sum().item(), lambda: m.nonzero(), lambda: bool(m.any())):
        with pytest.raises((RuntimeError, NotImplementedError)):
            read()


@pytest.mark.parametrize("seeds", ["per-row", "int", "none"])
def test_no_host_read_on_meta_tensors(seeds):
    x = torch.empty(4, 3, 50, device="meta")
    kw = _keywords("meta")
    extra = {"per-row": _seeds("meta"), "int": dict(seed=3, offset=2**40), "none": {}}[seeds]
    ids, lp = sampling.sample(x, **kw, **extra, return_logprobs=True)
    assert ids.shape == (4, 3) and ids.dtype == torch.int64 and lp.shape == (4, 3) and ids.device.type == "meta"
    assert sampling.probs(x, **kw).shape == (4, 3, 50)
    picked, values, top_ids = sampling.logprobs(x, torch.empty(4, 3, 2, dtype=torch.int64, device="meta"),
                                                temperature=kw["temperature"], top_n=5)
    assert picked.shape == (4, 3, 2) and values.shape == top_ids.shape == (4, 3, 5)


@pytest.mark.gpu
def test_no_sync_on_cuda():
    x = torch.randn(4, 3, 5000, device="cuda")
    kw = _keywords("cuda")
    ids = torch.zeros(4, 3, 2, dtype=torch.int64, device="cuda")
    sampling.sample(x, **kw, **_seeds("cuda"))  # warm up (allocator, kernels) before checking
    torch.cuda.set_sync_debug_mode("error")
    try:
        sampling.sample(x, **kw, **_seeds("cuda"), return_logprobs=True)
        sampling.sample(x, **kw)  # a seed drawn on the device
        sampling.sample(x, temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, seed=1, offset=3)
        sampling.probs(x, **kw)
        sampling.logprobs(x, ids, temperature=kw["temperature"], top_n=20)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
def test_sample_captures_in_a_cuda_graph():
    """Per-row keywords and seeds as tensors: the graph replays the eager draw, and new values
    copied into the same tensors take effect without capturing again."""
    x = torch.randn(12, 3000, device="cuda")
    kw = {k: v.reshape(12) if v.dim() else v for k, v in _keywords("cuda").items()}
    seeds = _seeds("cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sampling.sample(x, **kw, **seeds)  # warm up on the side stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sampling.sample(x, **kw, **seeds)
    for step in range(3):
        seeds["offset"].fill_(step)
        x.copy_(torch.randn(12, 3000, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, sampling.sample(x, **kw, **seeds))


@pytest.mark.gpu
def test_the_kit_passes_on_cuda():
    report = check_sampler(sampling.sample, sampling.probs, sampling.logprobs, device="cuda", seed=0, name="torch")
    assert report.ok and "bad-input per-row values on the device give invalid rows" in report.passed


@pytest.mark.gpu
def test_an_unseeded_sample_advances_the_generator_eagerly_and_per_replay():
    """Without a seed the CUDA generator supplies it: read and advanced on the host in eager
    calls (torch.cuda.manual_seed replays them), drawn on the device inside a captured graph (so
    each replay draws anew instead of repeating the capture's number)."""
    x = torch.zeros(64, 3000, device="cuda")  # (uniform rows: two draws share ~1/3000 of their ids)
    gen = torch.cuda.default_generators[x.device.index]
    torch.cuda.manual_seed(3)
    a = sampling.sample(x, temperature=1.0)
    assert gen.get_offset() > 0, "an unseeded sample must advance the device's generator"
    b = sampling.sample(x, temperature=1.0)
    torch.cuda.manual_seed(3)
    assert torch.equal(sampling.sample(x, temperature=1.0), a) and (a == b).float().mean() < 0.1
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sampling.sample(x, temperature=1.0)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sampling.sample(x, temperature=1.0)
    replays = []
    for _ in range(2):
        graph.replay()
        replays.append(out.clone())
    assert (replays[0] == replays[1]).float().mean() < 0.1, "each replay of an unseeded sample must draw anew"
