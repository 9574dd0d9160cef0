"""Spies on the Triton backend's binding and runner functions, set through a test's monkeypatch:
what a request bound or ran, for tests that check which path took it."""

from __future__ import annotations

from anysoftmax.backends._triton_common import sampling as triton_sampling
from anysoftmax.backends._triton_common import softmax_launchers
from anysoftmax.core import registry
from anysoftmax.core.backend import Backend


class _GenerationMarker(Backend):
    name, devices, priority = "spies-generation-marker", ("cpu",), -1


def bound_softmax_plans(monkeypatch, *modules) -> list:
    """(kernel kind, has a row scale) of every softmax plan bound through `bind` of `modules`
    (default: `softmax_launchers`), appended as they are bound."""
    seen = []
    real = softmax_launchers.bind

    def spy(plan, *args, **kwargs):
        seen.append((plan.kind, plan.fusion.has_row_scale))
        return real(plan, *args, **kwargs)

    for module in modules or (softmax_launchers,):
        monkeypatch.setattr(module, "bind", spy)
    return seen


def sampler_runs(monkeypatch) -> list:
    """The op of every call that runs the Triton sampler's scan and select (a runner of
    `sampling.runner`), appended as they run. The registry moves to a new generation, so the
    API makes every request's runner afresh, through the spy."""
    calls = []
    real = triton_sampling.runner

    def runner(op, *args, **kwargs):
        run = real(op, *args, **kwargs)
        return lambda *a: calls.append(op) or run(*a)

    monkeypatch.setattr(triton_sampling, "runner", runner)
    registry.register(_GenerationMarker())
    registry.unregister(_GenerationMarker.name)
    return calls
