"""Timing for the benchmarks: `anysoftmax.perf` (copy bandwidth, do_bench medians with rotated
inputs) plus how many input sets to rotate through."""

from __future__ import annotations

from anysoftmax import perf

L2_FLUSH_BYTES = 256 * 2**20


def median_ms(fn, inputs: list) -> float:
    """Median time of fn(*input) over do_bench repeats, rotating through `inputs` (tuples) so
    that a repeat never finds its input in L2 (do_bench also flushes L2 between repeats)."""
    return perf.time_ms(lambda args: fn(*args), inputs, "cuda", warmup_ms=10, rep_ms=60)


def rotation_count(bytes_per_set: int) -> int:
    """How many input sets to rotate through so they do not fit in L2 together."""
    return max(2, min(8, -(-2 * L2_FLUSH_BYTES // max(bytes_per_set, 1))))


def copy_bandwidth_gbps(device="cuda") -> float:
    """Device-to-device copy bandwidth (bytes read + written per second, in GB/s), 1 GiB."""
    return perf.copy_bandwidth_gbps(device)
