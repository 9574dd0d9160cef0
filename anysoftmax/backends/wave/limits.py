"""Capabilities of the Wave kernel per compile target, from `tuning.yaml` beside it."""

from __future__ import annotations

from ...config import is_int, load_tuning
from .kernel import max_row_length as kernel_max_row_length
from .target import Target

TUNING = "anysoftmax/backends/wave/tuning.yaml"


def max_row_length(target: Target, table: dict | None = None) -> int:
    """The longest row the backend accepts on `target`: the table's entry for its chip, else
    `default`, never more than the kernel's own bound for its wave size."""
    limits = (table if table is not None else load_tuning("wave")).get("max_row_length") or {}
    value = limits.get(target.chip, limits.get("default"))
    bound = kernel_max_row_length(target.threads_per_wave)
    if value is None:
        return bound
    if not is_int(value) or value < 1:
        raise ValueError(f"wave: max_row_length[{target.chip!r}]={value!r} in {TUNING}; allowed: a positive integer")
    return min(value, bound)
