"""Tiny random models of the families the real-model suite covers, built from configs.

Sizes are CI-sized (2 layers, hidden 64, 4 query heads over 2 key/value heads where the family
has grouped-query attention; a dozen tokens on the CPU, 200 on the GPU, positions up to 256)
but every feature the attention function must carry is switched on: GQA, Gemma2's logit softcap and sliding window, gpt-oss's
learned sinks (set non-zero here) and sliding window, Mistral's sliding window. gpt-oss routes
every token to EVERY expert (num_experts_per_tok = num_local_experts): with top-k routing a
last-bit difference in the attention flips an expert and moves the logits far more than the
attention's own error, and no honest tolerance covers that.

`initializer_range` is raised from the families' 0.02 so that the attention is not nearly
uniform and the softcap (set to 2, Gemma2 ships 50 for far larger scores) actually bends the
scores: with default weights the scores are ~1e-3 and every variant looks the same.
"""

from __future__ import annotations

import torch

transformers = __import__("pytest").importorskip(
    "transformers", reason="the real-model suite needs transformers (pip install 'anysoftmax[hf]')")

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, initializer_range=0.15,
              attention_dropout=0.0, tie_word_embeddings=False)

FAMILIES = ("llama", "gpt2", "gemma2", "gpt_oss", "qwen2", "mistral")

# torch softmax calls per decoder layer in the eager model (what `anysoftmax.use()` serves):
# gpt-oss also softmaxes its router's top-k values.
SOFTMAX_PER_LAYER = {"gpt_oss": 2}


def config(family: str, **overrides):
    """The tiny config of `family` (see the module docstring); `overrides` replace fields."""
    t = transformers
    if family == "llama":
        cfg = t.LlamaConfig(**COMMON)
    elif family == "gpt2":
        cfg = t.GPT2Config(vocab_size=96, n_embd=64, n_layer=2, n_head=4, n_positions=256, initializer_range=0.15,
                           attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    elif family == "gemma2":
        cfg = t.Gemma2Config(**COMMON, query_pre_attn_scalar=16, attn_logit_softcapping=2.0,
                             final_logit_softcapping=30.0, sliding_window=5)
    elif family == "gpt_oss":
        cfg = t.GptOssConfig(**COMMON, num_local_experts=4, num_experts_per_tok=4, sliding_window=5)
    elif family == "qwen2":
        cfg = t.Qwen2Config(**COMMON)
    elif family == "mistral":
        cfg = t.MistralConfig(**COMMON, sliding_window=5)
    else:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def build(family: str, attn_implementation: str = "eager", seed: int = 0, **overrides) -> torch.nn.Module:
    """A float32 causal LM of `family` with random weights from `seed`, in eval mode (no
    dropout). gpt-oss's sinks are drawn N(0, 1): zero sinks would hide a missing sink term."""
    torch.manual_seed(seed)
    # gpt-oss's experts in plain torch (the default grouped_mm has no float64 kernel).
    extra = {"experts_implementation": "eager"} if family == "gpt_oss" else {}
    model = transformers.AutoModelForCausalLM.from_config(config(family, **overrides),
                                                          attn_implementation=attn_implementation, **extra)
    for module in model.modules():
        if isinstance(getattr(module, "sinks", None), torch.nn.Parameter):
            with torch.no_grad():
                module.sinks.copy_(torch.randn(module.sinks.shape))
    return model.float().eval()


def softmax_calls_per_forward(model) -> int:
    """How many torch softmax calls one forward of the eager model makes."""
    return SOFTMAX_PER_LAYER.get(model.config.model_type, 1) * model.config.num_hidden_layers


def batch(gen: torch.Generator, vocab: int = 96, size: int = 2, length: int = 12, pad: int = 3):
    """(input_ids, attention_mask, loss weights): row 0 left-padded by `pad` tokens; the
    weights (fresh N(0,1) per logit) are zero on padded positions, as labels -100 would be."""
    ids = torch.randint(0, vocab, (size, length), generator=gen)
    mask = torch.ones(size, length, dtype=torch.long)
    mask[0, :pad] = 0
    weights = torch.randn(size, length, vocab, generator=gen) * mask[..., None]
    return ids, mask, weights


# The reference: eager attention restated with every step in the model's dtype. transformers'
# own eager attention softmaxes in float32 for most families (a float64 model would then hold a
# float32 softmax, and turn its finfo(float64).min mask into -inf: NaN rows); this keeps a
# float64 model float64 throughout. Registered as "float64_reference" with the additive mask.
REFERENCE = "float64_reference"


def reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                        s_aux=None, **kwargs):
    """softmax(softcap(scaling * Q K^T) + mask [, sink]) V in the inputs' dtype, as eager
    attention states it (gpt-oss: the sink logit as an extra column, dropped after)."""
    groups = getattr(module, "num_key_value_groups", 1)
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    z = query @ key.transpose(2, 3) * (query.shape[-1] ** -0.5 if scaling is None else scaling)
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    if attention_mask is not None:
        z = z + attention_mask
    sinks = s_aux if s_aux is not None else getattr(module, "sinks", None)
    if sinks is None:
        p = z.softmax(-1)
    else:
        column = sinks.reshape(1, -1, 1, 1).expand(*z.shape[:-1], 1)
        p = torch.cat([z, column], dim=-1).softmax(-1)[..., :-1]
    return (p @ value).transpose(1, 2).contiguous(), p


transformers.AttentionInterface.register(REFERENCE, reference_attention)
transformers.masking_utils.AttentionMaskInterface.register(REFERENCE, transformers.masking_utils.eager_mask)


def run(model, implementation: str, ids, mask, weights, **kwargs):
    """Logits and every parameter's gradient of sum(weights * logits) with `implementation`
    (both float64, detached; the model's own dtype inside)."""
    model.set_attn_implementation(implementation)
    model.zero_grad(set_to_none=True)
    logits = model(ids, attention_mask=mask, **kwargs).logits
    (logits.to(torch.float64) * weights.to(logits.device, torch.float64)).sum().backward()
    grads = {n: p.grad.detach().to(torch.float64) for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach().to(torch.float64), grads


def reference_copy(model) -> torch.nn.Module:
    """The same weights in float64 (the reference run uses `REFERENCE` attention)."""
    import copy

    return copy.deepcopy(model).to(torch.float64)


def _flat(t) -> torch.Tensor:
    if isinstance(t, dict):
        return torch.cat([v.reshape(-1) for _, v in sorted(t.items())])
    return t.reshape(-1)


def assert_as_accurate_as_eager(ours, eager, ref, dtype: torch.dtype, what: str, factor: float = 2.0) -> None:
    """`ours` (a tensor or a dict of gradients) is no further from the float64 run `ref` than
    eager attention's run `eager` is: ||ours - ref|| <= factor * ||eager - ref|| + eps/8 ||ref||
    (2-norms over every entry; eps of `dtype`, the dtype both ran in; the eps/8 term only
    matters if eager were exact). Same parameters in all three dicts."""
    if isinstance(ref, dict):
        assert sorted(ours) == sorted(ref) == sorted(eager), f"{what}: gradients of different parameters"
    o, e, r = _flat(ours), _flat(eager), _flat(ref)
    assert torch.isfinite(o).all(), f"{what}: non-finite values"
    err, err_eager, scale = (o - r).norm().item(), (e - r).norm().item(), r.norm().item()
    bound = factor * err_eager + torch.finfo(dtype).eps / 8 * scale
    assert err <= bound, (f"{what}: |ours - float64| = {err:.3e} > {bound:.3e} "
                          f"(eager's {err_eager:.3e}, |float64| = {scale:.3e})")
