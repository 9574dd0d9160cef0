"""Sampling from the vocabulary: per-row temperature, top-k / top-p / min-p, seeded draws and
log-probabilities (docs/sampling.md).

    import anysoftmax.sampling as sampling
    ids = sampling.sample(logits, temperature=t, top_k=50, top_p=0.9, seed=seeds, offset=step)
    p = sampling.probs(logits, temperature=t, top_p=0.9)          # float32, 0 outside the kept set
    lp, top, top_ids = sampling.logprobs(logits, ids[:, None], top_n=5)

`SamplingSpec` is the validated request, `sampling.reference` the float64 reference and the one
formula, `sampling.rng` the definition of the draw's randomness (Philox4x32-10 keyed by seed,
counted by the global token index), `anysoftmax.testing.sampling` the kit that checks a sampler.
"""

from .api import logprobs, probs, sample
from .spec import SamplingSpec

__all__ = ["SamplingSpec", "logprobs", "probs", "sample"]
