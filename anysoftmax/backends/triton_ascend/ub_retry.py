"""Unified-buffer overflow at compile time: where the planner's estimate was short, the NPU compiler
fails with "ub overflow, requires N bits while M bits available"; the backend plans again with half
the budget until it compiles, the count kept per shape class. Pure (the compile is a callable)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

from ...core.layout import next_power_of_2
from .._triton_common.plan import KernelPlan

OVERFLOW = re.compile(r"ub overflow, requires (\d+) bits while (\d+) bits available")


class UBOverflowError(RuntimeError):
    """The compiler overflowed the unified buffer even with the narrowest tile."""


def overflow_in(exc: BaseException) -> tuple[int, int] | None:
    """(required, available) bits when `exc` (its text or stderr) is a UB overflow, else None."""
    stderr = getattr(exc, "stderr", None) or ""
    m = OVERFLOW.search(f"{exc}\n{stderr.decode(errors='replace') if isinstance(stderr, bytes) else stderr}")
    return (int(m.group(1)), int(m.group(2))) if m else None


def shape_class(in_dtype, out_dtype, log: bool, n_cols: int, flat_rows: bool, variant_key: tuple = ()) -> tuple:
    """The key of requests compiling to the same tile shape, which share one halving count."""
    return (str(in_dtype), str(out_dtype), bool(log), next_power_of_2(max(n_cols, 1)), bool(flat_rows),
            variant_key)


class Halvings:
    """shape class -> halvings of the UB budget that compiled (thread-safe)."""

    def __init__(self) -> None:
        self._known: dict = {}
        self._lock = threading.Lock()

    def get(self, key) -> int:
        with self._lock:
            return self._known.get(key, 0)

    def put(self, key, halvings: int) -> None:
        with self._lock:
            self._known[key] = max(halvings, self._known.get(key, 0))


def fit_plan(plan_at: Callable[[int], KernelPlan], attempt: Callable[[KernelPlan], None],
             start: int = 0) -> tuple[KernelPlan, int]:
    """(plan, halvings): the first plan from `start` halvings that `attempt` (compile and launch)
    accepts, retrying UB overflows only; `UBOverflowError` when not even the narrowest tile fits."""
    halvings, failed, last = start, None, None
    while True:
        try:
            plan = plan_at(halvings)
        except ValueError as exc:
            raise UBOverflowError(
                f"triton_ascend: the NPU compiler reported a unified-buffer overflow ({last}) and halving "
                f"the tile {halvings} times left no tile that fits: {exc}") from exc
        if plan == failed:
            halvings += 1
            continue
        try:
            attempt(plan)
            return plan, halvings
        except Exception as exc:  # the compiler's own error types vary: recognised by message
            over = overflow_in(exc)
            if over is None:
                raise
            last = f"requires {over[0]} bits while {over[1]} bits available, tile {plan.block_m}x{plan.block_n}"
            failed, halvings = plan, halvings + 1
