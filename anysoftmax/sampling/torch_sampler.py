"""The `torch` sampler: the formula of `sampling.reference` in the compute dtype (float32, or
float64 for float64 logits) on the logits' device. Sorting, scans and gathers only: no host
synchronisation and no data-dependent Python branch, so any device runs it and a CUDA graph
can capture it (with seeds given as tensors or drawn from the device's generator)."""

from __future__ import annotations

import torch

from .reference import distribution, draw, log_softmax_rows, top_n_rows
from .rng import row_words
from .spec import SamplingSpec


def probs(spec: SamplingSpec, logits: torch.Tensor) -> torch.Tensor:
    """float32 probabilities of the filtered, renormalised distribution (logits' shape)."""
    dist = distribution(logits, spec, spec.compute_dtype)
    return dist.probs.to(torch.float32).reshape(logits.shape)


def sample(spec: SamplingSpec, logits: torch.Tensor, return_logprobs: bool = False):
    """int64 token ids of shape ``logits.shape[:-1]`` (and their float32 log-probabilities)."""
    ids, lp = draw(distribution(logits, spec, spec.compute_dtype), row_words(spec))
    ids = ids.reshape(spec.batch_shape)
    return (ids, lp.to(torch.float32).reshape(spec.batch_shape)) if return_logprobs else ids


def logprobs(spec: SamplingSpec, logits: torch.Tensor, ids: torch.Tensor, top_n: int = 0):
    """float32 log-probabilities of `ids` ([rows, K], validated), and with `top_n` the top-n
    values and ids."""
    lp = log_softmax_rows(logits, spec, spec.compute_dtype)
    in_range = (ids >= 0) & (ids < spec.vocab)  # out of range only on accelerators (not read there)
    picked = torch.where(in_range, lp.gather(-1, ids.clamp(0, spec.vocab - 1)), torch.nan).to(torch.float32)
    if not top_n:
        return picked
    values, top_ids = top_n_rows(lp, top_n)
    return picked, values.to(torch.float32), top_ids
