"""Deliberately broken backends for the matrix runner's and the CLI's tests.

The `broken` fixture (tests/conftest.py) registers them for one test; a matrix file names
`broken_plugin` (which registers them when imported: what a matrix `plugins:` module does) so
that worker processes have them too. They serve CPU tensors only and have the lowest priority,
so an automatic choice never picks them. Importing this module registers nothing.
"""

from __future__ import annotations

import os

import torch

import anysoftmax
from anysoftmax.core import unregister


class _Base:
    name = "broken_base"
    devices = ("cpu",)
    priority = -100

    def is_available(self):
        return None

    def supports(self, spec):
        return None


class Wrong(_Base):
    """Computes softmax 2% too large: conformance must fail."""

    name = "broken_wrong"

    def run(self, x, spec):
        op = torch.log_softmax if spec.log else torch.softmax
        return op(x, spec.dim, dtype=spec.out_dtype) * 1.02


class Crash(_Base):
    """Raises inside run: the cell must fail with the error text, the run go on."""

    name = "broken_crash"

    def run(self, x, spec):
        raise RuntimeError("deliberate crash in broken_crash.run")


class Exit(_Base):
    """Kills its process: the worker dies, the cell fails with the exit code."""

    name = "broken_exit"

    def run(self, x, spec):
        os._exit(7)


class Absent(_Base):
    """Never available: its cells must be skipped with this reason."""

    name = "broken_absent"

    def is_available(self):
        return "needs the imaginary XPU-9000"

    def run(self, x, spec):  # pragma: no cover - never called
        raise AssertionError("run() of an unavailable backend")


class Picky(_Base):
    """Refuses float64: those cells must be skipped, the others pass."""

    name = "broken_picky"

    def supports(self, spec):
        return "float64 is not supported" if spec.out_dtype == torch.float64 else None

    def run(self, x, spec):
        op = torch.log_softmax if spec.log else torch.softmax
        return op(x, spec.dim, dtype=spec.out_dtype)


BACKENDS = (Wrong(), Crash(), Exit(), Absent(), Picky())


def register_all() -> None:
    """Register every broken backend (replacing any of the same name)."""
    for b in BACKENDS:
        anysoftmax.register(b)


def unregister_all() -> None:
    """Remove them again."""
    for b in BACKENDS:
        unregister(b.name)
