"""The sampling distribution, stated once as torch ops in a dtype of the caller's choice: float64
on the CPU is the reference every sampler is checked against (`reference_*`), the compute dtype
on the logits' device is the `torch` sampler. One formula, so the two cannot drift apart. What it
states (temperature, top_k, top_p on the top-k distribution, min_p, greedy and invalid rows):
docs/sampling.md, "Semantics".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .rng import exponential_race
from .spec import SamplingSpec, invalid_keyword_rows


@dataclass(frozen=True)
class Distribution:
    """The filtered distribution of every row, ``[rows, V]`` / ``[rows, 1]`` tensors:
    `z` (logits / temperature; logits on greedy rows), the `kept` set, `probs` (0 outside it),
    `lse` (log of the kept mass of exp(z): ``log p_i = z_i - lse``), `greedy`, `invalid`."""

    z: torch.Tensor
    kept: torch.Tensor
    probs: torch.Tensor
    lse: torch.Tensor
    greedy: torch.Tensor
    invalid: torch.Tensor


def scaled_logits(logits: torch.Tensor, spec: SamplingSpec, dtype: torch.dtype,
                  device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(z, greedy, invalid): ``z = logits / temperature`` as ``[rows, V]`` in `dtype` (the
    logits themselves on greedy rows), and the ``[rows, 1]`` greedy and invalid masks."""
    device = logits.device if device is None else device
    x = logits.detach().to(device=device, dtype=dtype).reshape(spec.rows, spec.vocab)
    t = spec.column("temperature", device, dtype)
    greedy = t == 0
    z = x / torch.where(greedy, torch.ones_like(t), t)
    invalid = (torch.isnan(z) | (z == torch.inf)).any(-1, keepdim=True) | (z == -torch.inf).all(-1, keepdim=True)
    invalid = invalid | invalid_keyword_rows(spec, device)
    return z, greedy, invalid


def mass_strictly_above(q_sorted: torch.Tensor) -> torch.Tensor:
    """For each entry of rows sorted in non-increasing order, the sum of the entries strictly
    greater than it: the exclusive prefix sum at the first entry of its run of equal values."""
    rows, n = q_sorted.shape
    before = torch.cat([q_sorted.new_zeros(rows, 1), q_sorted.cumsum(-1)[:, :-1]], -1)
    position = torch.arange(n, device=q_sorted.device).expand(rows, n)
    starts = torch.ones_like(q_sorted, dtype=torch.bool)
    starts[:, 1:] = q_sorted[:, 1:] != q_sorted[:, :-1]
    run_start = torch.where(starts, position, 0).cummax(-1).values
    return before.gather(-1, run_start)


def filter_rows(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> tuple[
        torch.Tensor, torch.Tensor]:
    """(kept, w) of steps 2-4 for finite-max rows of ``z`` [rows, V]; ``w = exp(z - max z)``.
    Tokens of probability 0 (a -inf z) are never kept.
    `top_k` is int64 ``[rows, 1]``, `top_p` and `min_p` ``[rows, 1]`` in z's dtype. Sorting
    only: no host synchronisation, any device."""
    vocab = z.shape[-1]
    z_sorted, order = z.sort(dim=-1, descending=True, stable=True)
    k = torch.where((top_k <= 0) | (top_k >= vocab), vocab, top_k)
    keep_k = z >= z_sorted.gather(-1, k - 1)
    w = torch.exp(z - z_sorted[:, :1])
    q = torch.where(keep_k, w, 0)
    q = q / q.sum(-1, keepdim=True)
    # q is non-increasing along z's order (exp is monotone), so equal q values are adjacent there.
    above = mass_strictly_above(q.gather(-1, order))
    keep_p_sorted = (above < top_p) | (top_p >= 1)
    keep_p = torch.empty_like(keep_k).scatter_(-1, order, keep_p_sorted)
    return keep_k & keep_p & (w >= min_p) & (w > 0), w


def distribution(logits: torch.Tensor, spec: SamplingSpec, dtype: torch.dtype,
                 device: torch.device | None = None) -> Distribution:
    """The filtered, renormalised distribution of every row of `logits` for `spec`, computed
    in `dtype` on `device` (default: the logits')."""
    z, greedy, invalid = scaled_logits(logits, spec, dtype, device)
    kept, w = filter_rows(z, spec.column("top_k", z.device), spec.column("top_p", z.device, dtype),
                          spec.column("min_p", z.device, dtype))
    greedy_id = z.argmax(-1, keepdim=True)  # (the first maximum)
    one_hot = torch.zeros_like(kept).scatter_(-1, greedy_id, True)
    kept = torch.where(greedy, one_hot, kept) & ~invalid
    weights = torch.where(kept, w, 0)
    mass = weights.sum(-1, keepdim=True)
    probs = torch.where(invalid, torch.nan, weights / mass)
    lse = torch.where(invalid, torch.nan, z.amax(-1, keepdim=True) + torch.log(mass))
    lse = torch.where(greedy & ~invalid, z.gather(-1, greedy_id), lse)
    return Distribution(z, kept, probs, lse, greedy, invalid)


def draw(dist: Distribution, words: tuple[torch.Tensor, ...], vocab_start: int = 0) -> tuple[torch.Tensor,
                                                                                              torch.Tensor]:
    """(ids, log-probabilities) of one draw per row from `dist` with the row words `words`
    (`rng.row_words`): ``[rows]`` int64 (-1 on invalid rows) and ``[rows]`` in z's dtype
    (the chosen token's log-probability under `dist`; NaN on invalid rows)."""
    ids, _ = exponential_race(dist.z, dist.kept, words, vocab_start)
    ids = torch.where(dist.invalid[:, 0], -1, ids)
    chosen = dist.z.gather(-1, (ids - vocab_start).clamp_min(0)[:, None])[:, 0]
    return ids, torch.where(dist.invalid[:, 0], torch.nan, chosen - dist.lse[:, 0])


def log_softmax_rows(logits: torch.Tensor, spec: SamplingSpec, dtype: torch.dtype,
                     device: torch.device | None = None) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` of every row ([rows, V] in `dtype`): on greedy rows
    its limit as the temperature goes to 0 (``-log n`` on the n tied maxima, -inf elsewhere);
    NaN on invalid rows."""
    z, greedy, invalid = scaled_logits(logits, spec, dtype, device)
    out = z - torch.logsumexp(z, -1, keepdim=True)
    top = z == z.amax(-1, keepdim=True)
    limit = torch.where(top, -torch.log(top.sum(-1, keepdim=True).to(dtype)), -torch.inf)
    return torch.where(invalid, torch.nan, torch.where(greedy, limit, out))


def top_n_rows(lp: torch.Tensor, top_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `top_n` largest log-probabilities of every row of `lp` and their ids: by value, the
    lower id first among exact ties; NaN values and id -1 on NaN rows."""
    nan_row = torch.isnan(lp).any(-1, keepdim=True)
    values, ids = torch.where(nan_row, 0, lp).sort(dim=-1, descending=True, stable=True)
    values, ids = values[:, :top_n], ids[:, :top_n]
    return torch.where(nan_row, torch.nan, values), torch.where(nan_row, -1, ids)


# ---- the float64 reference ----------------------------------------------------------------------

CPU = torch.device("cpu")


def reference_distribution(logits: torch.Tensor, spec: SamplingSpec) -> Distribution:
    """The float64 reference of `spec` on `logits`, on the CPU (``[rows, V]`` tensors)."""
    return distribution(logits, spec, torch.float64, CPU)


def reference_probs(logits: torch.Tensor, spec: SamplingSpec) -> torch.Tensor:
    """Probabilities of the filtered, renormalised distribution (float64, CPU, logits' shape)."""
    return reference_distribution(logits, spec).probs.reshape(logits.shape)


def reference_kept(logits: torch.Tensor, spec: SamplingSpec) -> torch.Tensor:
    """The kept set as a bool mask of the logits' shape (CPU); empty on invalid rows."""
    return reference_distribution(logits, spec).kept.reshape(logits.shape)


def reference_draw(logits: torch.Tensor, spec: SamplingSpec, words: tuple[torch.Tensor, ...]) -> tuple[
        torch.Tensor, torch.Tensor]:
    """The draw the definition gives for the row words `words` (`rng.row_words`), in float64:
    (ids, log-probabilities), shape ``logits.shape[:-1]``, CPU."""
    ids, lp = draw(reference_distribution(logits, spec), tuple(w.cpu() for w in words))
    return ids.reshape(spec.batch_shape), lp.reshape(spec.batch_shape)


def reference_logprobs(logits: torch.Tensor, spec: SamplingSpec) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` in float64 on the CPU (logits' shape), with the
    greedy limit and NaN rows of `log_softmax_rows`."""
    return log_softmax_rows(logits, spec, torch.float64, CPU).reshape(logits.shape)

