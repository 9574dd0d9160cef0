"""Subtly wrong backends: the conformance kit must fail each of them and name the cases.

Each is a small change to a correct torch-based backend (`Right`, as the README's example): an
error of a few float32 ulps in long rows, a mask ignored, the last element never written, a
buffer reused across calls, the input scaled in place, a `supports()` answering with a bool.
The `Planted` ones are the torch backend itself, wrong only under one condition (a bool mask
that excludes nothing, long rows, many rows, channels_last, merge_states' strided partials,
float64 lses or `out=`): each passes a kit that has no case meeting its condition.
Importing this module registers nothing: tests pass an object to `check_backend`, or the CLI
`--plugin wrong_backends:CLASS`.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from anysoftmax.backends.torch_eager import TorchBackend
from anysoftmax.core.reference import fused_backward, fused_forward
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


class WrongOnce(Right):
    """Wrong on its 2nd to 4th calls with a non-empty input only (a fuzz run's first calls are
    checked forwards; a few, so that one is whatever the sequence), right after: a failure that
    rests on state earlier calls left, so a replay of the failing sequence's steps passes
    (hypothesis calls it flaky); the fuzzer must still report the failing call and its
    sequence, once."""

    name = "wrong_once"
    FAILING_CALLS = range(2, 5)

    def __init__(self):
        self.calls = 0

    def run(self, x, spec):
        self.calls += x.numel() > 0
        y = super().run(x, spec)
        return y * 2 + 1 if self.calls in self.FAILING_CALLS else y


class LseOff(Right):
    """logsumexp 3e-5 too large (relative to the row's scale): a few float32 ulps of |z|."""

    name = "lse_off"

    def run_logsumexp(self, x, spec, operands):
        from anysoftmax.core.lse_merge import logsumexp_formula

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


# ---- planted defects: the torch backend, wrong only under one condition ------------------------

def nudged(y: torch.Tensor) -> torch.Tensor:
    """`y` with its largest finite element 1/8 too large: one wrong value, outside every dtype's
    tolerance, that only a case meeting the plant's condition computes."""
    y = y.clone()
    size = torch.where(torch.isfinite(y), y.abs(), torch.zeros_like(y))
    if y.numel():
        at = torch.unravel_index(size.argmax(), y.shape)
        y[at] = y[at] * (1 + 2.0**-3)
    return y


class Planted(TorchBackend):
    """The torch backend (correct) with one defect planted: a result `wrong_*` says is affected
    comes back `nudged`. Each subclass is a bug a kernel could have and the kit must catch."""

    name = "planted"
    devices = ("cpu",)
    priority = -100

    def wrong_softmax(self, x, spec, operands) -> bool:
        return False

    def wrong_merge(self, outputs, lses, spec, out) -> bool:
        return False

    def run(self, x, spec, operands=NO_OPERANDS):
        result = super().run(x, spec, operands)
        if not self.wrong_softmax(x, spec, operands):
            return result
        if isinstance(result, tuple):
            return nudged(result[0]), result[1]
        return nudged(result)

    def run_merge_states(self, outputs, lses, spec, out=None, lse_out=None):
        o, lse = super().run_merge_states(outputs, lses, spec)
        if self.wrong_merge(outputs, lses, spec, out):
            o = nudged(o)
        return (o if out is None else out.copy_(o)), (lse if lse_out is None else lse_out.copy_(lse))


class MaskAllKeptOff(Planted):
    """Wrong when a bool mask excludes nothing (a fast path for an all-False mask)."""

    name = "mask_all_kept_off"

    def wrong_softmax(self, x, spec, operands):
        m = operands.mask
        return m is not None and m.dtype == torch.bool and not bool(m.any())


class LastDimLongOff(Planted):
    """Wrong for rows along the last dim longer than 1000 (a looped kernel)."""

    name = "last_dim_long_off"

    def wrong_softmax(self, x, spec, operands):
        return spec.dim == spec.ndim - 1 and spec.n_cols > 1000


class HalfLongOff(Planted):
    """Wrong for 16-bit rows longer than 1000 (a 16-bit path's accumulator)."""

    name = "half_long_off"

    def wrong_softmax(self, x, spec, operands):
        return spec.in_dtype.itemsize == 2 and spec.n_cols > 1000


class Over2048Off(Planted):
    """Wrong for rows longer than 2048 (the split kernel)."""

    name = "over_2048_off"

    def wrong_softmax(self, x, spec, operands):
        return spec.n_cols > 2048


class FusedLongOff(Planted):
    """Wrong for fused-family rows longer than 512 (the fused online kernel)."""

    name = "fused_long_off"

    def wrong_softmax(self, x, spec, operands):
        return not spec.is_plain and spec.n_cols > 512


class ChannelsLastOff(Planted):
    """Wrong for channels_last inputs (NHWC strides read as another layout)."""

    name = "channels_last_off"

    def wrong_softmax(self, x, spec, operands):
        return x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


class ManyRowsOff(Planted):
    """Wrong with more than 4096 rows (a grid that wraps)."""

    name = "many_rows_off"

    def wrong_softmax(self, x, spec, operands):
        return spec.n_rows > 4096


class StridedMergeOff(Planted):
    """merge_states wrong for non-contiguous partials (outputs or lses read as contiguous)."""

    name = "strided_merge_off"

    def wrong_merge(self, outputs, lses, spec, out):
        return not all(t.is_contiguous() for t in (*outputs, *lses))


class Float64LseMergeOff(Planted):
    """merge_states wrong for float64 lses with 16- or 32-bit outputs (a cast between them)."""

    name = "float64_lse_merge_off"

    def wrong_merge(self, outputs, lses, spec, out):
        return spec.dtype != torch.float64 and any(t.dtype == torch.float64 for t in lses)


class MergeIntoOutOff(Planted):
    """merge_states wrong only when it writes into `out=` (the vLLM drop-in's path)."""

    name = "merge_into_out_off"

    def wrong_merge(self, outputs, lses, spec, out):
        return out is not None


PLANTED = (MaskAllKeptOff, LastDimLongOff, HalfLongOff, Over2048Off, FusedLongOff, ChannelsLastOff, ManyRowsOff,
           StridedMergeOff, Float64LseMergeOff, MergeIntoOutOff)


class SoftcapNanGradient(Planted):
    """A fused backward of its own that multiplies softcap's derivative in at every position,
    excluded ones too: where the mask excludes a NaN logit, 0 * NaN leaks into the gradient."""

    name = "softcap_nan_gradient"

    def fused_backward_launcher(self, y, spec):
        v, dim, log, acc = spec.variant, spec.dim, spec.log, spec.acc_dtype

        def run(grad, y_, x, ops, p_sink):
            variant = replace(v, scale=None if v.scale is None else ops.scale,
                              softcap=None if v.softcap is None else ops.softcap)
            dx, ds, _ = fused_backward(grad, y_, x, variant, dim, log, ops.mask, p_sink, acc)
            if variant.softcap is not None:
                dx = dx + 0.0 * torch.tanh(x.to(acc) / variant.softcap)
            return dx.to(y_.dtype), ds
        return run


class RowScalePerColumn(Planted):
    """Declares a tensor scale (the torch backend does) but indexes its values along the reduced
    dim: column j is scaled by the j-th value (cycling), not every element of row r by row r's."""

    name = "row_scale_per_column"

    def run(self, x, spec, operands=NO_OPERANDS):
        if spec.variant.row_scale is None:
            return super().run(x, spec, operands)
        flat = operands.scale.reshape(-1)
        n = spec.n_cols
        shape = [n if d == spec.dim else 1 for d in range(x.dim())]
        per_column = flat[torch.arange(n, device=flat.device) % flat.numel()].reshape(shape)
        return super().run(x, spec, operands._replace(scale=per_column))


class RowScaleAfterSoftmax(Planted):
    """Declares a tensor scale but applies it to the result: softmax(x) * scale (log:
    log_softmax(x) * scale), the temperature after the softmax instead of before it."""

    name = "row_scale_after_softmax"

    def run(self, x, spec, operands=NO_OPERANDS):
        if spec.variant.row_scale is None:
            return super().run(x, spec, operands)
        y, p = super().run(x, spec, operands._replace(scale=torch.ones_like(operands.scale)))
        return (y.float() * operands.scale.float()).to(y.dtype), p
