"""The model benchmark's CPU-checkable parts: the attention module and its captured inputs in
every family, the interleaved timing loop's bookkeeping, tables and plot from a results file."""

from __future__ import annotations

import json

import pytest
import torch

import families as F
from anysoftmax.bench import models as bm

pytest.importorskip("anysoftmax.integrations.transformers", reason="needs transformers (pip install 'anysoftmax[hf]')")


@pytest.mark.parametrize("family", F.FAMILIES)
def test_captured_inputs_replay_the_attention_module(family, gen):
    # The benchmark times layer 0's attention module on the inputs the model gives it; the
    # replay must compute what the model computed there.
    model = F.build(family)
    ids = torch.randint(0, 96, (2, 10), generator=gen)
    attn = bm.attention_layer(model)
    seen = []
    handle = attn.register_forward_hook(lambda m, a, out: seen.append(out[0]))
    with torch.no_grad():
        model(ids, use_cache=False)
        args, kwargs = bm.capture_attention_inputs(model, ids)
        handle.remove()
        replay = attn(*args, **kwargs)[0]
    assert bm._hidden(args, kwargs).shape == (2, 10, model.config.hidden_size)
    torch.testing.assert_close(replay, seen[0], rtol=0, atol=0)


def test_interleaved_timing_records_oom_and_medians(monkeypatch):
    events = iter(range(10**6))

    class Event:  # a fake CUDA event: each record() one "ms" later than the one before
        def __init__(self, **_):
            self.t = None

        def record(self):
            self.t = next(events)

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return float(other.t - self.t)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    order = []

    def oom():
        raise torch.cuda.OutOfMemoryError("test")

    steps = {"a": (lambda: order.append("a"), lambda: None), "b": (lambda: order.append("b"), lambda: None),
             "big": (lambda: None, oom)}
    times = bm.interleaved_ms(steps, n=3, warmup=1)
    assert times["big"] == "OOM"
    assert times["a"] == times["b"] == [1.0, 1.0, 1.0]
    assert order == ["a", "b"] * 4, "round-robin, warm-up round first"
    assert bm._row("f", 8, "a", "model", "fwd", times["a"])["ms"] == 1.0
    assert bm._row("f", 8, "big", "model", "fwd", "OOM")["status"] == "OOM"


def test_tables_and_plot_from_a_results_file(tmp_path):
    rows = []
    for impl, ms in (("eager", 9.0), ("sdpa", 2.0), ("anysoftmax", 3.0)):
        for scope in ("model", "attention"):
            rows.append(bm._row("gemma2", 2048, impl, scope, "fwd+bwd", [ms] * 5))
    rows.append(bm._row("gemma2", 4096, "eager", "model", "fwd+bwd", "OOM"))
    result = {"device": "NVIDIA H100 80GB HBM3", "batch": 4, "layers": 2, "vocab": 32000, "torch": "2.11",
              "triton": "3.6", "transformers": "5.17.0", "families": {"gemma2": {}}, "rows": rows,
              "accuracy": {"gemma2 S=1024": {"rel_err": {"eager": 4e-3, "anysoftmax": 3e-3}, "bound": 8e-3,
                                             "ok": True}}, "skipped": []}
    path = tmp_path / "in.json"
    path.write_text(json.dumps(result))
    assert bm.main(["--from-json", str(path), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "models.md").read_text()
    assert "| gemma2 | 2048 | model | fwd+bwd | 9.00 | 2.00 (not the same function) | 3.00 | 3.00x |" in md
    assert "| gemma2 | 4096 | model | fwd+bwd | OOM | – | – | – |" in md
    assert "NVIDIA H100 80GB HBM3" in md and "gemma2 S=1024: eager 4.00e-03, anysoftmax 3.00e-03" in md
    assert (tmp_path / "out" / "models.png").stat().st_size > 0
