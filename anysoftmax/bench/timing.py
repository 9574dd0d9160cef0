"""Timing for the benchmarks: do_bench medians with rotated inputs (`anysoftmax.perf`)."""

from __future__ import annotations

from anysoftmax import perf


def median_ms(fn, inputs: list) -> float:
    """Median time of fn(*input) over do_bench repeats, rotating through `inputs` (tuples,
    `perf.rotation_count` of them) so that a repeat never finds its input in L2 (do_bench
    also flushes L2 between repeats)."""
    return perf.time_ms(lambda args: fn(*args), inputs, "cuda", warmup_ms=10, rep_ms=60)
