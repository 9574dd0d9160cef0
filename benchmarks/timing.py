"""Timing on the GPU: copy bandwidth and median kernel times with rotated inputs."""

from __future__ import annotations

import itertools

import torch
import triton.testing

L2_FLUSH_BYTES = 256 * 2**20


def median_ms(fn, inputs: list) -> float:
    """Median time of fn(input) over do_bench repeats, rotating through `inputs` so that a
    repeat never finds its input in L2 (do_bench also flushes L2 between repeats)."""
    it = itertools.cycle(inputs)
    return triton.testing.do_bench(lambda: fn(*next(it)), warmup=10, rep=60, return_mode="median")


def rotation_count(bytes_per_set: int) -> int:
    """How many input sets to rotate through so they do not fit in L2 together."""
    return max(2, min(8, -(-2 * L2_FLUSH_BYTES // max(bytes_per_set, 1))))


def copy_bandwidth_gbps(device="cuda", nbytes: int = 2**30) -> float:
    """Device-to-device copy bandwidth: bytes read + written over the median copy time."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * nbytes / (ms * 1e-3) / 1e9
