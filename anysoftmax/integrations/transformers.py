"""Hugging Face transformers attention served by one fused anysoftmax call.

    import anysoftmax.integrations.transformers      # registers "anysoftmax"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="anysoftmax")
    model.set_attn_implementation("anysoftmax")      # or switch a loaded model

Importing this module registers `attention_forward` under the name ``"anysoftmax"`` with
transformers' `AttentionInterface`, and transformers' boolean ("sdpa") mask builder under the
same name with `AttentionMaskInterface` (without one, transformers builds no mask at all for a
custom name). Every model that dispatches through `AttentionInterface` is then served by:

    scores = Q @ repeat_kv(K)^T                      # key/value heads repeated as the model does
    probs  = anysoftmax.softmax(scores, -1, scale=scaling, softcap=softcap, mask=..., causal=...,
                                sinks=module.sinks[H,1,1], empty_rows=...)      # ONE fused call
    out    = dropout(probs) @ repeat_kv(V)

Masks, in transformers' convention converted once here:
* a bool 4-D mask (True = KEEP in transformers) is passed inverted (True = excluded, as
  anysoftmax states it); padding and sliding windows come inside it;
* a floating 4-D mask (a model or user that prepared its own additive mask) is added, as
  eager attention adds it;
* no mask (transformers skipped it: plain causal, no padding, window not reached): causal
  ``"top_left"`` when the module is causal and there is more than one query — SDPA's
  `is_causal`, the alignment transformers assumed when it skipped the mask.

Rows the mask leaves empty (a left-padded query before its first token) come out as eager
attention gives them, exactly: eager adds `finfo.min` to every score of such a row, so all its
entries are equal and the softmax is uniform 1/N (``empty_rows="uniform"``); with sinks (gpt-oss)
the sink logit dominates them and the row is 0 (``empty_rows="zero"``). Their gradient is 0
(they depend on no kept key) where eager back-propagates through its fill; a loss that ignores
padded positions (labels -100) sees the same gradients.

The probabilities (after dropout, as eager returns them) are always returned as the second
output, so `output_attentions=True` works. `calls` counts what was served.
"""

from __future__ import annotations

import functools
import weakref

import torch

try:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
except ImportError as exc:  # the one module that needs transformers: say how to get it
    raise ImportError(f"anysoftmax.integrations.transformers needs transformers>=5.17: "
                      f"pip install 'anysoftmax[hf]' ({exc})") from exc

from ..torchop import api

NAME = "anysoftmax"

# Served calls by feature (tests and users read them, like `anysoftmax.torchop.override.calls`):
# "forward" every call; "mask" a bool mask, "additive" a floating mask, "causal" no mask but
# causal; "softcap" and "sinks" when present.
calls = {"forward": 0, "mask": 0, "additive": 0, "causal": 0, "softcap": 0, "sinks": 0}

# transformers hands every layer of one forward the same mask tensor: its inversion is kept
# for the next layer (one entry; dropped when that mask is freed).
_inverted: tuple = (None, -1, None)


def _forget(ref) -> None:
    global _inverted
    if _inverted[0] is ref:
        _inverted = (None, -1, None)


def excluded_positions(keep: torch.Tensor) -> torch.Tensor:
    """transformers' bool mask (True = keep) as anysoftmax's (True = excluded); the last
    inversion is reused while the same, unmodified mask tensor comes back."""
    global _inverted
    if torch.compiler.is_compiling():
        return ~keep
    ref, version, inverted = _inverted
    if ref is not None and ref() is keep and version == keep._version:
        return inverted
    inverted = ~keep
    _inverted = (weakref.ref(keep, _forget), keep._version, inverted)
    return inverted


def repeat_kv(states: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, H_kv, S, D] -> [B, H_kv * groups, S, D], each key/value head repeated `groups`
    times in place (grouped-query attention: query head h reads kv head h // groups)."""
    if groups == 1:
        return states
    b, h, s, d = states.shape
    return states[:, :, None].expand(b, h, groups, s, d).reshape(b, h * groups, s, d)


def _mask_arguments(module, attention_mask, q_len: int, k_len: int, is_causal) -> dict:
    """The fused keywords for transformers' mask (see the module docstring)."""
    if attention_mask is None:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        if causal and q_len > 1:
            calls["causal"] += 1
            return {"causal": "top_left"}
        return {}
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"anysoftmax attention: attention_mask must be a torch.Tensor or None, got "
                        f"{type(attention_mask).__name__} (a flex-attention BlockMask is not supported)")
    if attention_mask.shape[-1] > k_len:  # a mask built for a longer cache than the keys given
        attention_mask = attention_mask[..., :k_len]
    if attention_mask.dtype == torch.bool:
        calls["mask"] += 1
        return {"mask": excluded_positions(attention_mask)}
    if attention_mask.dtype.is_floating_point:
        calls["additive"] += 1
        return {"mask": attention_mask}
    raise TypeError(f"anysoftmax attention: attention_mask dtype {attention_mask.dtype} is not supported: "
                    f"bool (True = keep, transformers' convention) or floating (added to the scores)")


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      softcap: float | None = None, s_aux: torch.Tensor | None = None, is_causal: bool | None = None,
                      backend: str | None = None, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' attention-function contract: `query` [B, H, Sq, D], `key`/`value`
    [B, H_kv, Sk, D], the model's 4-D `attention_mask` (or None), `scaling` (None: D**-0.5),
    `dropout`, `softcap` (Gemma2), `s_aux` (gpt-oss's sinks, [H]; else `module.sinks` when the
    module has them); returns (output [B, Sq, H, D], probabilities [B, H, Sq, Sk]).
    `backend` names the anysoftmax backend (None: the automatic choice)."""
    if kwargs.get("position_bias") is not None:
        raise NotImplementedError("anysoftmax attention: position_bias (T5-style relative bias) is not supported")
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    sinks = s_aux if s_aux is not None else getattr(module, "sinks", None)

    fused = _mask_arguments(module, attention_mask, query.shape[-2], key.shape[-2], is_causal)
    if softcap is not None:
        calls["softcap"] += 1
    if sinks is not None:
        calls["sinks"] += 1
        sinks = sinks.reshape(-1, 1, 1)  # one logit per head: [H, 1, 1] against [B, H, Sq, Sk]
    # Rows left empty by the mask: eager's result (see the module docstring).
    empty_rows = "zero" if sinks is not None else "uniform"

    scores = torch.matmul(query, key.transpose(2, 3))
    probs = api.softmax(scores, -1, scale=scaling, softcap=softcap, sinks=sinks, empty_rows=empty_rows,
                        backend=backend, **fused)
    calls["forward"] += 1
    probs = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    out = torch.matmul(probs.to(value.dtype), value)
    return out.transpose(1, 2).contiguous(), probs


def register(name: str = NAME, backend: str | None = None):
    """Register an attention implementation `name` served by anysoftmax with `backend` (None:
    the automatic choice per device), with transformers' boolean mask builder for it; returns
    the attention function. Importing this module registers ``"anysoftmax"``."""
    if not isinstance(name, str) or not name or "/" in name or ":" in name:
        raise ValueError(f"anysoftmax attention: name must be a non-empty string without '/' or ':' "
                         f"(transformers reads those as hub kernels), got {name!r}")
    fn = attention_forward if backend is None else functools.partial(attention_forward, backend=backend)
    AttentionInterface.register(name, fn)
    AttentionMaskInterface.register(name, sdpa_mask)
    return fn


register()
