"""vLLM's `merge_attn_states` and the v1 sampler's `apply_top_k_top_p`.

`merge_attn_states` is served by `anysoftmax.merge_states` on every backend that
declares it (triton on CUDA/ROCm, triton_ascend on Ascend, torch anywhere).

    from anysoftmax.compat.vllm import merge_attn_states
    merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse)

vLLM's signature and layout (vllm/attention/ops/triton_merge_attn_states.py and the CUDA op in
`vllm._custom_ops`): outputs `[num_tokens, num_heads, head_size]`, LSEs `[num_heads,
num_tokens]` (transposed against the outputs: read in place, never copied), results written
into `output` (and `output_lse` when given), nothing returned. Natural-log LSEs.

Where the answers differ from vLLM's kernels (`anysoftmax.core.lse_merge` states ours):
* a **+inf** LSE: vLLM's kernels read it as -inf (FlashAttention-2 marks an empty segment with
  +inf), so that part weighs 0. Here +inf is +inf: the merged LSE is +inf and the output NaN
  (as softmax and logsumexp of a row holding +inf give). Convert FA2's empty-segment marker
  first (``lse.masked_fill_(lse == inf, -inf)``) when feeding such LSEs.
* **both parts empty** (-inf and -inf): vLLM's Triton kernel computes 0/0 and writes NaN
  (output and LSE); here the output is 0 and the LSE -inf, never NaN.
* a part with LSE -inf is not read at all (a NaN in an empty part's output does not leak).
* NaN in an LSE gives NaN in that token/head's output and LSE (vLLM: the same, by arithmetic).
Accumulation in float32 as vLLM; the output is rounded once to its dtype.
"""

from __future__ import annotations

import math

import torch

from .. import dispatch, sampling


def _check(name: str, t, shape, device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"merge_attn_states: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.shape != shape:  # (torch.Size is a tuple: compared as one, no copies)
        raise ValueError(f"merge_attn_states: {name} has shape {list(t.shape)}, expected {list(shape)}")
    if t.device != device:
        raise ValueError(f"merge_attn_states: {name} is on {t.device}, output on {device}; one device")


def merge_attn_states(output: torch.Tensor, prefix_output: torch.Tensor, prefix_lse: torch.Tensor,
                      suffix_output: torch.Tensor, suffix_lse: torch.Tensor, output_lse: torch.Tensor | None = None,
                      *, backend: str | None = None) -> None:
    """Merge two attention partials into `output` (and `output_lse`), in place (see the module
    docstring); `backend` (keyword only, not in vLLM) picks the anysoftmax backend."""
    if not isinstance(prefix_output, torch.Tensor) or prefix_output.dim() != 3:
        raise ValueError("merge_attn_states: prefix_output must be a [num_tokens, num_heads, head_size] tensor")
    tokens, heads, _ = prefix_output.shape
    device = prefix_output.device
    _check("output", output, prefix_output.shape, device)
    _check("suffix_output", suffix_output, prefix_output.shape, device)
    _check("prefix_lse", prefix_lse, (heads, tokens), device)
    _check("suffix_lse", suffix_lse, (heads, tokens), device)
    if output_lse is not None:
        _check("output_lse", output_lse, (heads, tokens), device)
        if output_lse.dtype != torch.float32:
            raise TypeError(f"merge_attn_states: output_lse must be float32, got {output_lse.dtype}")
    if output.dtype != prefix_output.dtype:
        raise TypeError(f"merge_attn_states: output is {output.dtype}, prefix_output {prefix_output.dtype}; one dtype")
    dispatch.merge_states([prefix_output, suffix_output], [prefix_lse.t(), suffix_lse.t()], backend,
                          out=output, lse_out=None if output_lse is None else output_lse.t())


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """vLLM's `apply_top_k_top_p` (vllm/v1/sample/ops/topk_topp_sampler.py): `logits`
    ``[batch, vocab]`` (already divided by the temperature) with -inf at the tokens top-k and
    then top-p (on the top-k renormalised distribution) filter out; `k` (integer) and `p`
    (floating) are tensors with one value per row, or None (that filter off). As in vLLM, the
    logits are updated in place and returned.

    The kept set is `anysoftmax.sampling`'s: ties at the k-th value all kept (as vLLM), a top-p
    tie group kept whole (vLLM's sort may split it), the top-p cut by the mass strictly above
    each token (vLLM: a float32 cumulative sum from the small end compared with ``1 - p``, the
    same set for distinct probabilities up to rounding). A token whose probability underflows
    float32 (``exp(z - max z) == 0``) becomes -inf too: its probability is 0 either way. A row
    holding NaN or +inf, or only -inf, is returned unchanged."""
    if k is None and p is None:
        return logits
    for name, t in (("k", k), ("p", p)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"apply_top_k_top_p: {name} must be a tensor with one value per row or None, got "
                            f"{type(t).__name__}")
    try:
        probs = sampling.probs(logits, top_k=k, top_p=p)
    except (TypeError, ValueError) as exc:  # (name vLLM's arguments: k is top_k, p is top_p)
        raise type(exc)(f"apply_top_k_top_p (k is top_k, p is top_p): {exc}") from None
    kept = (probs > 0) | torch.isnan(probs)  # (a row without a distribution is left as it is)
    return logits.masked_fill_(~kept, -math.inf)


__all__ = ["apply_top_k_top_p", "merge_attn_states"]
