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
