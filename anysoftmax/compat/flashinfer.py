"""FlashInfer's sampling functions (``flashinfer.sampling``, the ones vLLM and SGLang call),
with FlashInfer's signatures, served by `anysoftmax.sampling` on every device:

    from anysoftmax.compat import flashinfer as fi
    probs = fi.softmax(logits, temperature=t)
    ids = fi.top_k_top_p_sampling_from_logits(logits, top_k, top_p, seed=seed, offset=step)

Functions taking probabilities sample from ``log(probs)`` as logits at temperature 1 (the
same distribution: ``softmax(log p) = p / sum(p)``; a probability 0 is a -inf logit, never
kept). The filters and the draw are `anysoftmax.sampling`'s (docs/sampling.md); where
FlashInfer's documented behaviour differs, the section "Drop-ins" there says how:

* ids are int32 (FlashInfer's), or the dtype of `indices` when given; a row whose
  distribution is undefined (NaN, +inf, every probability 0) gives id -1;
* ties at the k-th value are all kept, a top-p tie group is kept whole;
* `filter_apply_order="joint"` keeps the tokens both top-k and top-p keep on the original
  distribution (FlashInfer's documented meaning);
* `seed` / `offset` feed anysoftmax's Philox definition (the draws are reproducible and the
  same on every device, but not FlashInfer's bits); a `generator` supplies a seed and advances;
  `deterministic` is accepted (every draw here is deterministic); `enable_pdl` is a CUDA
  launch hint, accepted and unused.

FlashInfer is never imported.
"""

from __future__ import annotations

import math

import torch

from .. import sampling
from ..sampling.spec import SamplingSpec

_ORDERS = ("top_k_first", "joint")


def _logits_of(who: str, probs) -> torch.Tensor:
    """``log(probs)`` in float32 (float64 stays): the logits whose softmax is `probs`."""
    if not isinstance(probs, torch.Tensor):
        raise TypeError(f"{who}: probs must be a torch.Tensor, got {type(probs).__name__}")
    if not probs.is_floating_point():
        raise TypeError(f"{who}: probs must be a floating tensor, got {probs.dtype}")
    return torch.log(probs if probs.dtype == torch.float64 else probs.float())


def _per_request(value):
    """FlashInfer's seed/offset: an int, or an int64 tensor of length 1 (every row) or one per
    row; a length-1 tensor becomes the 0-dim tensor `anysoftmax.sampling` reads as every row."""
    if isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == 1:
        return value.reshape(())
    return value


def _draw(who: str, logits, *, indices=None, deterministic=True, generator=None, check_nan=False, seed=None,
          offset=None, joint=False, **filters) -> torch.Tensor:
    """One id per row of `logits` (rows picked by `indices`) under `filters`, as FlashInfer
    returns them: int32, or the dtype of `indices`. `joint`: top_k and top_p both on the
    original distribution."""
    if not isinstance(deterministic, bool):
        raise TypeError(f"{who}: deterministic must be a bool, got {type(deterministic).__name__}")
    if not isinstance(check_nan, bool):
        raise TypeError(f"{who}: check_nan must be a bool, got {type(check_nan).__name__}")
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError(f"{who}: expected a [batch_size, vocab_size] tensor, got "
                         f"{list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__}")
    out_dtype = torch.int32
    if indices is not None:
        if not isinstance(indices, torch.Tensor) or indices.dtype not in (torch.int32, torch.int64) \
                or indices.dim() != 1:
            raise TypeError(f"{who}: indices must be a 1-D int32 or int64 tensor (a row of logits per output)")
        if indices.device != logits.device:
            raise ValueError(f"{who}: indices are on {indices.device} but logits on {logits.device}")
        if indices.device.type == "cpu" and indices.numel() and bool(((indices < 0) | (indices >= len(logits))).any()):
            raise ValueError(f"{who}: indices must be in [0, {len(logits)}) (rows of logits)")
        logits, out_dtype = logits.index_select(0, indices.long()), indices.dtype
    if check_nan and bool(torch.isnan(logits).any()):  # (FlashInfer's check: a host read, as there)
        raise ValueError(f"{who}: input contains NaN (check_nan=True)")
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"{who}: generator must be a torch.Generator, got {type(generator).__name__}")
        if seed is None:  # the generator supplies the seed and advances
            seed = torch.randint(0, 2**63 - 1, (), generator=generator, device=generator.device).to(logits.device)
    if joint:
        logits = _joint_logits(logits, filters.pop("top_k"), filters.pop("top_p"))
    seed, offset = _per_request(seed), _per_request(offset)
    ids = sampling.sample(logits, seed=seed, offset=0 if offset is None else offset, **filters)
    return ids.to(out_dtype)


def softmax(logits: torch.Tensor, temperature=None, enable_pdl=None) -> torch.Tensor:
    """``softmax(logits / temperature)`` in float32 (temperature: a float or one per row).
    Temperature 0 is greedy here (probability 1 on the argmax), where FlashInfer divides by 0."""
    return sampling.probs(logits, temperature=temperature)


def sampling_from_logits(logits, indices=None, deterministic=True, generator=None, check_nan=False, seed=None,
                         offset=None) -> torch.Tensor:
    """One id per row drawn from ``softmax(logits)``."""
    return _draw("sampling_from_logits", logits, indices=indices, deterministic=deterministic, generator=generator,
                 check_nan=check_nan, seed=seed, offset=offset)


def sampling_from_probs(probs, indices=None, deterministic=True, generator=None, check_nan=False, seed=None,
                        offset=None) -> torch.Tensor:
    """One id per row drawn from `probs` (rows renormalised)."""
    who = "sampling_from_probs"
    return _draw(who, _logits_of(who, probs), indices=indices, deterministic=deterministic, generator=generator,
                 check_nan=check_nan, seed=seed, offset=offset)


def top_p_sampling_from_probs(probs, top_p, indices=None, deterministic=True, generator=None, check_nan=False,
                              seed=None, offset=None) -> torch.Tensor:
    """One id per row drawn from the top-p set of `probs`, renormalised."""
    who = "top_p_sampling_from_probs"
    return _draw(who, _logits_of(who, probs), indices=indices, deterministic=deterministic, generator=generator,
                 check_nan=check_nan, seed=seed, offset=offset, top_p=top_p)


def top_k_sampling_from_probs(probs, top_k, indices=None, deterministic=True, generator=None, check_nan=False,
                              seed=None, offset=None) -> torch.Tensor:
    """One id per row drawn from the top-k set of `probs` (ties at the k-th value kept)."""
    who = "top_k_sampling_from_probs"
    return _draw(who, _logits_of(who, probs), indices=indices, deterministic=deterministic, generator=generator,
                 check_nan=check_nan, seed=seed, offset=offset, top_k=top_k)


def min_p_sampling_from_probs(probs, min_p, indices=None, deterministic=True, generator=None, check_nan=False,
                              seed=None, offset=None) -> torch.Tensor:
    """One id per row drawn from the tokens with ``p >= min_p * max p``, renormalised."""
    who = "min_p_sampling_from_probs"
    return _draw(who, _logits_of(who, probs), indices=indices, deterministic=deterministic, generator=generator,
                 check_nan=check_nan, seed=seed, offset=offset, min_p=min_p)


def _joint_logits(logits, top_k, top_p) -> torch.Tensor:
    """`logits` with -inf outside the tokens top-k and top-p each keep on the original
    distribution (FlashInfer's "joint" order): then a plain draw from them."""
    kept = (sampling.probs(logits, top_k=top_k) > 0) & (sampling.probs(logits, top_p=top_p) > 0)
    return logits.masked_fill(~kept, -math.inf)


def _top_k_top_p(who: str, logits, top_k, top_p, indices, filter_apply_order, **draw) -> torch.Tensor:
    if filter_apply_order not in _ORDERS:
        raise ValueError(f"{who}: filter_apply_order must be one of {_ORDERS}, got {filter_apply_order!r}")
    return _draw(who, logits, indices=indices, top_k=top_k, top_p=top_p, joint=filter_apply_order == "joint", **draw)


def top_k_top_p_sampling_from_logits(logits, top_k, top_p, indices=None, filter_apply_order="top_k_first",
                                     deterministic=True, generator=None, check_nan=False, seed=None,
                                     offset=None) -> torch.Tensor:
    """One id per row drawn from ``softmax(logits)`` after top-k and top-p: with
    ``"top_k_first"``, top-p on the top-k renormalised distribution (`anysoftmax.sampling`'s
    order); with ``"joint"``, both on the original distribution."""
    return _top_k_top_p("top_k_top_p_sampling_from_logits", logits, top_k, top_p, indices, filter_apply_order,
                        deterministic=deterministic, generator=generator, check_nan=check_nan, seed=seed,
                        offset=offset)


def top_k_top_p_sampling_from_probs(probs, top_k, top_p, indices=None, filter_apply_order="top_k_first",
                                    deterministic=True, generator=None, check_nan=False, seed=None,
                                    offset=None) -> torch.Tensor:
    """As `top_k_top_p_sampling_from_logits`, from probabilities."""
    who = "top_k_top_p_sampling_from_probs"
    return _top_k_top_p(who, _logits_of(who, probs), top_k, top_p, indices, filter_apply_order,
                        deterministic=deterministic, generator=generator, check_nan=check_nan, seed=seed,
                        offset=offset)


def top_k_renorm_probs(probs, top_k) -> torch.Tensor:
    """`probs` with 0 outside the top-k (ties at the k-th value kept), renormalised; probs' dtype."""
    return sampling.probs(_logits_of("top_k_renorm_probs", probs), top_k=top_k).to(probs.dtype)


def top_p_renorm_probs(probs, top_p, is_deterministic=False) -> torch.Tensor:
    """`probs` with 0 outside the top-p set, renormalised; probs' dtype (`is_deterministic`:
    accepted, every result here is)."""
    return sampling.probs(_logits_of("top_p_renorm_probs", probs), top_p=top_p).to(probs.dtype)


def top_k_mask_logits(logits, top_k) -> torch.Tensor:
    """`logits` with -inf below the k-th largest value of each row (ties at it kept); logits'
    dtype. top_k 0 or >= vocab_size: unchanged."""
    spec = SamplingSpec.from_request("top_k_mask_logits", logits, top_k=top_k)
    rows = logits.reshape(spec.rows, spec.vocab)
    k = spec.column("top_k", logits.device)
    k = torch.where((k <= 0) | (k >= spec.vocab), spec.vocab, k)
    kth = rows.sort(dim=-1, descending=True).values.gather(-1, k - 1)
    return rows.masked_fill(rows < kth, -math.inf).reshape(logits.shape)


__all__ = ["min_p_sampling_from_probs", "sampling_from_logits", "sampling_from_probs", "softmax",
           "top_k_mask_logits", "top_k_renorm_probs", "top_k_sampling_from_probs", "top_k_top_p_sampling_from_logits",
           "top_k_top_p_sampling_from_probs", "top_p_renorm_probs", "top_p_sampling_from_probs"]
