"""Backend registry: listing, automatic choice and its fall-through."""

import logging

import pytest
import torch

import anysoftmax
from anysoftmax.core import SoftmaxSpec, registry, select
from helpers import StubBackend


def test_list_backends_reports_every_backend_with_reason():
    rows = {r.name: r for r in anysoftmax.list_backends()}
    assert {"torch", "triton"} <= set(rows)
    assert rows["torch"].available and rows["torch"].reason == ""
    for r in rows.values():
        assert r.available or r.reason, f"{r.name} unavailable without a reason"


def test_automatic_choice_on_cpu_is_torch():
    assert select(SoftmaxSpec.from_tensor(torch.randn(2, 3), 1)).name == "torch"


class _Broken(StubBackend):
    name = "cpu-broken"
    priority = 1000

    def is_available(self):
        return "needs hardware this machine lacks"


def test_automatic_choice_falls_through_with_debug_log(caplog):
    anysoftmax.register(_Broken())
    try:
        with caplog.at_level(logging.DEBUG, logger="anysoftmax"):
            chosen = select(SoftmaxSpec.from_tensor(torch.randn(2, 3), 1))
        assert chosen.name == "torch"
        assert "cpu-broken" in caplog.text and "needs hardware" in caplog.text
    finally:
        registry.unregister("cpu-broken")


def test_no_backend_for_device_is_a_clear_error():
    spec = SoftmaxSpec.from_tensor(torch.randn(2, 3, device="meta"), 1)
    chosen = select(spec)  # torch serves every device type
    assert chosen.name == "torch"


def test_register_rejects_non_backends():
    with pytest.raises(TypeError, match="Backend protocol"):
        anysoftmax.register(object())


def test_list_backends_prints_one_backend_per_line_and_stays_a_list():
    rows = anysoftmax.list_backends()
    assert isinstance(rows, list) and all(isinstance(r, registry.BackendStatus) for r in rows)
    assert list(rows) == [r for r in rows] and rows[0].name == next(iter(rows)).name
    for text in (repr(rows), str(rows)):
        lines = text.splitlines()
        assert len(lines) == len(rows) + 1, text
        assert lines[0].split() == ["backend", "available", "devices", "reason", "/", "note"]
        for line, r in zip(lines[1:], rows):
            assert line.split()[:2] == [r.name, "yes" if r.available else "no"], line
            assert (r.reason or r.note) in line


class _PlainOnly(StubBackend):
    """The first choice by priority on CPU and CUDA, computing the plain softmax only (it does not
    declare `fused = True`): fused requests must pass it over."""

    name, devices, priority = "plain-only", ("cpu", "cuda"), 1000


class _NoFloat64(StubBackend):
    name, devices, priority, fused = "no-float64", ("cpu", "cuda"), 999, True

    def supports(self, spec):
        return "no float64 here" if torch.float64 in (spec.in_dtype, spec.out_dtype) else None


def _requests():
    """Plain and fused requests, each on a CPU and a CUDA-typed device (nothing is allocated)."""
    from dataclasses import replace

    x = torch.empty(2, 3, 5, 6, device="meta")
    fused = [dict(scale=0.5), dict(softcap=3.0, causal="bottom_right"), dict(mask=torch.zeros(6, dtype=torch.bool)),
             dict(sinks=torch.zeros(3, 1, 1), scale=0.25)]
    specs = [SoftmaxSpec.from_tensor(x, -1), SoftmaxSpec.from_tensor(x.double(), 1, log=True),
             SoftmaxSpec.from_tensor(x.half(), 0, torch.float32)]
    specs += [SoftmaxSpec.from_request(x, -1, fused={k: v.to("meta") if isinstance(v, torch.Tensor) else v
                                                     for k, v in f.items()})[0] for f in fused]
    return [replace(s, device=torch.device(d)) for s in specs for d in ("cpu", "cuda")]


def test_explain_and_select_decide_alike():
    """`explain` says what `select` does (one decision function): on plain and fused requests,
    with a backend that refuses the fused family and one that refuses float64 ahead of the rest."""
    anysoftmax.register(_PlainOnly())
    anysoftmax.register(_NoFloat64())
    try:
        seen = set()
        for spec in _requests():
            for direction in ("fwd", "bwd"):
                name, why = registry.explain(spec, direction)
                assert name == select(spec, direction=direction).name, (spec.describe(), direction, why)
                seen.add(name)
            lse = registry.select_op("logsumexp", spec).name
            assert lse in registry.runners(spec, "logsumexp"), spec.describe()
        assert {"plain-only", "no-float64"} <= seen, seen  # the sample reaches both refusals
    finally:
        registry.unregister("plain-only")
        registry.unregister("no-float64")


def test_the_benchmark_times_what_the_automatic_choice_chooses_among():
    """`anysoftmax bench`'s and `anysoftmax select`'s backend lists are the registry's: the
    backends the automatic choice takes a request from (`registry.runners`, `decide`'s
    candidates that run it), by priority; a backend that serves another device type (the
    interpreter's `triton` on CPU tensors) is only ever an explicit choice there."""
    from dataclasses import replace

    from anysoftmax.bench.harness import OURS, anysoftmax_names

    anysoftmax.register(_PlainOnly())
    anysoftmax.register(_NoFloat64())
    try:
        for device in ("cpu", "cuda"):
            probe = replace(SoftmaxSpec.from_tensor(torch.empty(2, 2, device="meta"), 1), device=torch.device(device))
            names = anysoftmax_names(device)
            assert names == [OURS] + [f"{OURS}:{n}" for n in registry.runners(probe)], names
            assert names[1:3] == [f"{OURS}:plain-only", f"{OURS}:no-float64"], names  # priority order
            for n in names[1:]:
                devices = registry.get_backend(n.split(":", 1)[1]).devices
                assert device in devices or "*" in devices, (device, names)
            assert registry.runners(probe)[0] == select(probe).name
            fused = probe.with_variant(replace(probe.variant, scale=0.5))
            assert "plain-only" not in registry.runners(fused) and registry.runners(fused)[0] == select(fused).name
    finally:
        registry.unregister("plain-only")
        registry.unregister("no-float64")
