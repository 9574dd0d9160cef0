"""Samplers with one planted bug each, and the same sampler without one (`Sampler()`), for the
kit's own tests: `anysoftmax.testing.sampling.check_sampler` must fail every bugged one and
name a failing case.

Written apart from `anysoftmax.sampling`'s formula (top-p by a pairwise comparison, top-k by
value, the draw keyed on log-probabilities), so that the control passing the kit is a second
implementation agreeing with the package's. It validates through `SamplingSpec` and draws its
randomness from `anysoftmax.sampling.rng` (the definition).
"""

from __future__ import annotations

import torch

from anysoftmax.sampling import rng
from anysoftmax.sampling.spec import SamplingSpec

BUGS = ("topp-le", "topk-drops-ties", "temperature-after-softmax", "no-renorm-after-topk",
        "random-reused-across-rows", "offset-ignored", "stale-bound-operands", "stale-workspace")


class Sampler:
    """`sample` and `probs` with `anysoftmax.sampling`'s signatures; `bug` plants one of BUGS."""

    def __init__(self, bug: str | None = None):
        assert bug in BUGS + (None,), bug
        self.bug = bug
        self.bound = {}  # ("stale-bound-operands": which keywords were tensors, per logits shape)
        self.kept = {}  # ("stale-workspace": the first call's distribution, per logits shape)

    def _distribution(self, logits: torch.Tensor, spec: SamplingSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """(probs [rows, V] float32, invalid [rows, 1])."""
        x = logits.float().reshape(spec.rows, spec.vocab)
        t = spec.column("temperature", dtype=torch.float32)
        greedy = t == 0
        t = torch.where(greedy, 1.0, t)
        if self.bug == "temperature-after-softmax":
            p = torch.softmax(x, -1) / t  # scales probabilities instead of logits
        else:
            p = torch.softmax(x / t, -1)
        k = spec.column("top_k")
        k = torch.where((k <= 0) | (k >= spec.vocab), spec.vocab, k)
        if self.bug == "topk-drops-ties":
            rank = p.argsort(dim=-1, descending=True, stable=True).argsort(dim=-1)
            keep_k = rank < k  # exactly k tokens: ties at the k-th value cut arbitrarily
        else:
            keep_k = p >= p.sort(dim=-1, descending=True).values.gather(-1, k - 1)
        q = p * keep_k
        if self.bug != "no-renorm-after-topk":
            q = q / q.sum(-1, keepdim=True)
        # [r, i]: the mass of the q_j > q_i, as the suffix sum of q in increasing order from the
        # first value above q_i (the package sums a prefix in decreasing order instead)
        ascending = q.sort(dim=-1).values
        suffix = ascending.flip(-1).cumsum(-1).flip(-1)
        first_above = torch.searchsorted(ascending, q.contiguous(), right=True)
        above = torch.where(first_above < spec.vocab, suffix.gather(-1, first_above.clamp(max=spec.vocab - 1)), 0.0)
        top_p = spec.column("top_p", dtype=torch.float32)
        keep_p = (above <= top_p) if self.bug == "topp-le" else (above < top_p)
        keep_m = p >= spec.column("min_p", dtype=torch.float32) * p.amax(-1, keepdim=True)
        kept = keep_k & (keep_p | (top_p >= 1)) & keep_m & (p > 0)
        final = torch.where(kept, p, 0)
        final = final / final.sum(-1, keepdim=True)
        one_hot = torch.zeros_like(final).scatter_(-1, x.argmax(-1, keepdim=True), 1.0)
        final = torch.where(greedy, one_hot, final)
        invalid = (torch.isnan(x) | (x == torch.inf)).any(-1, keepdim=True) | (x == -torch.inf).all(-1, keepdim=True)
        return torch.where(invalid, torch.nan, final), invalid

    def probs(self, logits, *, temperature=None, top_k=None, top_p=None, min_p=None):
        spec = SamplingSpec.from_request("probs", logits, temperature=temperature, top_k=top_k, top_p=top_p,
                                         min_p=min_p)
        return self._distribution(logits, spec)[0].reshape(logits.shape)

    def sample(self, logits, *, temperature=None, top_k=None, top_p=None, min_p=None, seed=None, offset=0,
               return_logprobs=False):
        spec = SamplingSpec.from_request("sample", logits, temperature=temperature, top_k=top_k, top_p=top_p,
                                         min_p=min_p, seed=seed, offset=offset)
        if self.bug == "stale-bound-operands":
            # A launch bound per shape on the first call reads the operands that call passed:
            # a later call giving one of them as a number hands it a number (as a compiled
            # launcher's fast path would read an absent pointer).
            given = (temperature, top_k, top_p, min_p)
            tensors = self.bound.setdefault(tuple(logits.shape), tuple(isinstance(v, torch.Tensor) for v in given))
            [v.data_ptr() for v, was in zip(given, tensors) if was]
        final, invalid = self._distribution(logits, spec)
        if self.bug == "stale-workspace":
            # Statistics kept per shape and not rewritten: a later call draws from the first one's.
            final, invalid = self.kept.setdefault(tuple(logits.shape), (final, invalid))
        seeds, stream, offsets = rng.row_words(spec)
        if self.bug == "offset-ignored":
            offsets = torch.zeros_like(offsets)
        bits = rng.random_bits(seeds, stream, offsets, torch.arange(spec.vocab, device=logits.device))
        if self.bug == "random-reused-across-rows":
            bits = bits[:1].expand_as(bits)  # the first row's numbers serve every row
        keys = torch.where(final > 0, torch.log(final) - torch.log(rng.exponential(bits, torch.float32)), -torch.inf)
        ids = torch.where(invalid[:, 0], -1, keys.argmax(-1))
        lp = torch.where(invalid[:, 0], torch.nan, torch.log(final.gather(-1, ids.clamp_min(0)[:, None])[:, 0]))
        ids, lp = ids.reshape(spec.batch_shape), lp.reshape(spec.batch_shape)
        return (ids, lp) if return_logprobs else ids
