"""Real models (tiny, random, from configs) served by anysoftmax two ways, against eager attention:

* ``attn_implementation="anysoftmax"`` (anysoftmax.integrations.transformers): one fused call per
  layer carrying the model's scale, mask (left padding, sliding windows), softcap and sinks;
* ``anysoftmax.use()`` around the unmodified eager model (torch's softmax ops overridden).

Each run's logits (every position, padded ones included: their rows are the empty-row case)
and every parameter's gradient must be as close to a float64 run of the same weights as eager
attention's own run is (`families.assert_as_accurate_as_eager`); counters prove that every
layer was served.
"""

from __future__ import annotations

import pytest
import torch

import anysoftmax
from anysoftmax.torchop import override

import families as F

hf = pytest.importorskip("anysoftmax.integrations.transformers",
                         reason="needs transformers (pip install 'anysoftmax[hf]')")

BACKENDS = ["torch", "triton"]


def implementation(backend: str) -> str:
    """The attention implementation name served by `backend` (registered on first use)."""
    name = f"anysoftmax_{backend}"
    hf.register(name, backend=backend)
    return name


def _runs(family: str, gen: torch.Generator, device="cpu", dtype=torch.float32, length=12, pad=3):
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    model = F.build(family, seed=seed).to(device, dtype)
    ids, mask, weights = (t.to(device) for t in F.batch(gen, length=length, pad=pad))
    reference = F.run(F.reference_copy(model), F.REFERENCE, ids, mask, weights)
    eager = F.run(model, "eager", ids, mask, weights)
    return model, (ids, mask, weights), eager, reference


def _check(ours, eager, reference, dtype, what):
    F.assert_as_accurate_as_eager(ours[0], eager[0], reference[0], dtype, f"{what}: logits")
    F.assert_as_accurate_as_eager(ours[1], eager[1], reference[1], dtype, f"{what}: gradients")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", F.FAMILIES)
def test_attention_implementation(family, backend, gen):
    model, inputs, eager, reference = _runs(family, gen)
    before = dict(hf.calls)
    ours = F.run(model, implementation(backend), *inputs)
    layers = model.config.num_hidden_layers
    assert hf.calls["forward"] - before["forward"] == layers, "every layer's attention served by anysoftmax"
    assert hf.calls["mask"] - before["mask"] == layers, "the padding mask reached every layer"
    if family == "gemma2":
        assert hf.calls["softcap"] - before["softcap"] == layers
    if family == "gpt_oss":
        assert hf.calls["sinks"] - before["sinks"] == layers
    _check(ours, eager, reference, torch.float32, f"{family} attn_implementation=anysoftmax ({backend})")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", F.FAMILIES)
def test_unmodified_model_under_use(family, backend, gen):
    model, inputs, eager, reference = _runs(family, gen)
    before = dict(override.calls)
    with anysoftmax.use(backend=backend, devices=("cpu",)):
        ours = F.run(model, "eager", *inputs)
    served = F.softmax_calls_per_forward(model)
    assert override.calls["forward"] - before["forward"] == served
    assert override.calls["backward"] - before["backward"] == served
    if backend != "torch":  # the torch backend calls torch's softmax, which the override hands back to torch
        assert override.calls["reentrant"] == before["reentrant"]
    _check(ours, eager, reference, torch.float32, f"{family} under anysoftmax.use({backend!r})")


def test_unpadded_batch_takes_the_causal_path(gen):
    # No padding and no window reached: transformers skips the mask; the function must then
    # apply causal itself (a missing causal would let tokens read the future).
    model, _, _, _ = _runs("llama", gen)
    ids = torch.randint(0, 96, (2, 10), generator=gen)
    mask = torch.ones_like(ids)
    weights = torch.randn(2, 10, 96, generator=gen)
    reference = F.run(F.reference_copy(model), F.REFERENCE, ids, mask, weights)
    eager = F.run(model, "eager", ids, mask, weights)
    before = dict(hf.calls)
    ours = F.run(model, implementation("triton"), ids, mask, weights)
    assert hf.calls["causal"] - before["causal"] == model.config.num_hidden_layers
    assert hf.calls["mask"] == before["mask"]
    _check(ours, eager, reference, torch.float32, "llama without padding")


@pytest.mark.parametrize("family", ["llama", "gpt_oss"])
def test_output_attentions_returns_the_probabilities(family, gen):
    model, (ids, mask, _), _, _ = _runs(family, gen)
    with torch.no_grad():
        model.set_attn_implementation("eager")
        expected = model(ids, attention_mask=mask, output_attentions=True).attentions
        model.set_attn_implementation(implementation("triton"))
        got = model(ids, attention_mask=mask, output_attentions=True).attentions
    assert len(got) == len(expected) == model.config.num_hidden_layers
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("family", F.FAMILIES)
def test_attention_implementation_cuda_bf16(family, gen):
    # bf16 on the GPU with the automatic backend (Triton), 200 tokens (not a power of two),
    # 37 of them left padding; the float64 reference runs on the GPU as well.
    model, inputs, eager, reference = _runs(family, gen, device="cuda", dtype=torch.bfloat16, length=200, pad=37)
    before = dict(hf.calls)
    ours = F.run(model, "anysoftmax", *inputs)
    assert hf.calls["forward"] - before["forward"] == model.config.num_hidden_layers
    _check(ours, eager, reference, torch.bfloat16, f"{family} bf16 on CUDA")


@pytest.mark.gpu
@pytest.mark.parametrize("family", F.FAMILIES)
def test_unmodified_model_under_use_cuda_bf16(family, gen):
    model, inputs, eager, reference = _runs(family, gen, device="cuda", dtype=torch.bfloat16, length=200, pad=37)
    before = dict(override.calls)
    with anysoftmax.use():
        ours = F.run(model, "eager", *inputs)
    assert override.calls["forward"] - before["forward"] == F.softmax_calls_per_forward(model)
    assert override.calls["reentrant"] == before["reentrant"]
    _check(ours, eager, reference, torch.bfloat16, f"{family} bf16 under anysoftmax.use()")
