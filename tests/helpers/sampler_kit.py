"""The kit's sampler section as the interpreter runs it: every check but those drawing thousands
of rows (minutes through the interpreter; the GPU tests run the whole section)."""

from __future__ import annotations

from anysoftmax.testing.sampling import sampler_checks

GPU_ONLY_KINDS = ("chi-square", "definition", "position", "advancing")
GPU_ONLY_NAMES = ("determinism same seed and offset, same ids", "determinism another offset changes the draw",
                  "determinism another seed changes the draw")


def interpreter_checks(sample_fn, probs_fn, logprobs_fn) -> list:
    """The sampler section's checks for these functions on the CPU, less the GPU-only ones."""
    return [c for c in sampler_checks(sample_fn, probs_fn, logprobs_fn)
            if c.kind not in GPU_ONLY_KINDS and c.name not in GPU_ONLY_NAMES]
