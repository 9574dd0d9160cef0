"""Subtly wrong backends: the conformance kit must fail each of them and name the cases.

Each is a small change to a correct torch-based backend (`Right`, as the README's example): an
error of a few float32 ulps in long rows, a mask ignored, the last element never written, a
buffer reused across calls, the input scaled in place, a `supports()` answering with a bool.
Importing this module registers nothing: tests pass an object to `check_backend`, or the CLI
`--plugin wrong_backends:CLASS`.
"""

from __future__ import annotations

import torch

from anysoftmax.core.reference import fused_forward
from anysoftmax.core.variant import NO_OPERANDS


class Right:
    """Correct: torch in float32 (float64 refused, as the README's example)."""

    name = "right"
    devices = ("cpu",)
    priority = -100

    def is_available(self):
        return None

    def supports(self, spec):
        return None if spec.out_dtype != torch.float64 else "right: no float64"

    def run(self, x, spec):
        op = torch.log_softmax if spec.log else torch.softmax
        return op(x.float(), spec.dim).to(spec.out_dtype)


class LongRowOff(Right):
    """3e-5 relative too large in float32 softmax rows longer than 500: ~250 float32 ulps, far
    inside any plot, caught by the 1e-5 tolerance."""

    name = "long_row_off"

    def run(self, x, spec):
        y = super().run(x, spec)
        return y * (1 + 3e-5) if spec.n_cols > 500 and spec.out_dtype == torch.float32 and not spec.log else y


class IgnoresMask(Right):
    """Declares the fused family but applies only scale and softcap: every mask case fails."""

    name = "ignores_mask"
    fused = True

    def run(self, x, spec, operands=NO_OPERANDS):
        if spec.is_plain:
            return super().run(x, spec)
        from dataclasses import replace

        v = replace(spec.variant, mask=None, mask_kind="none", scale=None if spec.variant.scale is None else
                    operands.scale, softcap=None if spec.variant.softcap is None else operands.softcap)
        y, p = fused_forward(x, v, spec.dim, spec.log, None, operands.sinks, torch.float32)
        return y.to(spec.out_dtype), p


class SkipsLastElement(Right):
    """Allocates with torch.empty and never writes the very last element (stale memory often
    holds the right value; NaN poisoning makes it fail)."""

    name = "skips_last"

    def run(self, x, spec):
        y = torch.empty(spec.shape, dtype=spec.out_dtype)
        full = super().run(x, spec)
        if full.numel() > 1:
            y.view(-1)[:-1] = full.reshape(-1)[:-1]
        else:
            y.copy_(full)
        return y


class ReusesOutput(Right):
    """A launcher that keeps one output buffer for its request: the second call overwrites the
    first call's result."""

    name = "reuses_output"

    def launcher(self, x, spec):
        out = torch.empty(spec.shape, dtype=spec.out_dtype)
        run = super().run

        def launch(t):
            out.copy_(run(t, spec))
            return out
        return launch


class ScalesInputInPlace(Right):
    """Right results, but the caller's input comes back halved."""

    name = "scales_input"

    def run(self, x, spec):
        y = super().run(x, spec)
        if x.dtype.is_floating_point and x.numel() and x.is_contiguous():
            x.mul_(0.5)
        return y


class BoolSupports(Right):
    """`supports()` answers True/False instead of None or a reason."""

    name = "bool_supports"

    def supports(self, spec):
        return spec.out_dtype != torch.float64


class StaleStrides(Right):
    """Memoises a launcher per request (shape, dim, dtypes) that reads its input with the
    strides and storage offset of the first call, as a kernel compiled for them would: the same
    request with a transposed, strided or offset input reads the wrong elements. Every
    single-call case passes; a sequence of calls fails (the fuzzer's target)."""

    name = "stale_strides"

    def __init__(self):
        self._launchers = {}

    def run(self, x, spec):
        key = (tuple(x.shape), spec.dim, spec.log, x.dtype, spec.out_dtype)
        stride, offset = self._launchers.setdefault(key, (x.stride(), x.storage_offset()))
        try:
            view = x.as_strided(x.shape, stride, offset)
        except RuntimeError:  # the stale layout does not fit the new storage: what a kernel would read
            view = x.as_strided(x.shape, stride, 0)
        return super().run(view, spec)


class LseOff(Right):
    """logsumexp 3e-5 too large (relative to the row's scale): a few float32 ulps of |z|."""

    name = "lse_off"

    def run_logsumexp(self, x, spec, operands):
        from anysoftmax.core.pieces import logsumexp_formula

        lse = logsumexp_formula(x, spec.variant, spec.dim, operands.mask, operands.sinks, spec.acc_dtype)
        return lse + 3e-5 * (1 + lse.abs())


class NaiveMerge(Right):
    """merge_states by the textbook formula (vLLM's Triton kernel's arithmetic): right for
    finite LSEs, NaN where every partial is -inf (an empty row) instead of 0 and -inf."""

    name = "naive_merge"

    def run_merge_states(self, outputs, lses, spec):
        L = torch.stack([t.float() for t in lses])
        m = L.amax(0)
        w = torch.exp(L - m)
        s = w.sum(0)
        out = sum(w[i].unsqueeze(-1) * o.float() for i, o in enumerate(outputs)) / s.unsqueeze(-1)
        return out.to(spec.dtype), m + torch.log(s)
