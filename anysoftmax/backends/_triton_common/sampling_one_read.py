"""The Triton sampler as a backend hands it out (`Sampler`): requests that need no filter read
the logits once, through the backend's own softmax and logsumexp launchers with the per-row
scale 1/temperature (docs/sampling.md, "Backends"; kernels: `sampling_one_read_kernels.py`), or
for `logprobs` of ids one kernel (`logprobs_kernel`) where the backend has no plans of its own;
every other request runs the scan and select of `sampling.py`, as do a temperature of 0 given as
a number (the scan's argmax serves it) and a tensor top_k, top_p or min_p (never read on the host).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton

from ...core.cache import OnceCache
from ...core.layout import cdiv, output_maker
from ...core.lse_merge import logsumexp_request
from ...core.spec import SoftmaxSpec
from ...core.variant import Operands
from ...sampling.spec import SamplingSpec
from . import sampling
from .launcher import per_stream, row_counters

SCALE_BLOCK = 1024  # rows per program of row_scale_kernel
TILE = 1024  # logits per step where a kernel reads a whole row (greedy rows)
ID_BLOCK = 64  # ids per step of the gather
# logprobs_kernel (NVIDIA H200, docs/speed.md): 4096 logits a work item, 32 programs of 4 warps a
# multiprocessor (as many as its items at most), while a request holds at most
# LOGPROBS_ONE_LAUNCH_MAX logits; above that the logsumexp kernel and the gather take less GPU
# time than its host saves (at 512 x 128256 bf16: 61 against 73 us).
LOGPROBS_CHUNK = 4096
LOGPROBS_PROGRAMS_PER_SM = 32
LOGPROBS_ONE_LAUNCH_MAX = 1 << 25

_bound = OnceCache(maxsize=128)


def _temperature_operand(t) -> tuple[torch.Tensor | None, int]:
    """(the temperature `t` (checked) as a contiguous float32 tensor or None for a number, its row stride)."""
    if not isinstance(t, torch.Tensor):
        return None, 0
    # (checked first: a conversion that returns its input still costs ~1 us a call)
    t = t if t.dtype == torch.float32 else t.to(torch.float32)
    return t if t.is_contiguous() else t.contiguous(), 1 if t.dim() else 0


def programs_for_logprobs(device: torch.device) -> int:
    """logprobs_kernel's programs: LOGPROBS_PROGRAMS_PER_SM a multiprocessor on a GPU; two
    elsewhere (the interpreter, one program after another: two loop over the items as a GPU's
    grid does at larger sizes)."""
    if device.type != "cuda":
        return 2
    return LOGPROBS_PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def one_launch_logprobs(sampler: "Sampler", spec: SamplingSpec) -> bool:
    """Whether `logprobs` of ids without top_n takes logprobs_kernel: for a backend without plans
    of its own (triton_ascend's: the NPU's atomics are not verified) and up to
    LOGPROBS_ONE_LAUNCH_MAX logits."""
    return sampler.plans is None and spec.rows * spec.vocab <= LOGPROBS_ONE_LAUNCH_MAX


class _Launchers(NamedTuple):
    """One request's bound launches (see the module): `scale` (or None), `read` (the fused
    softmax or logsumexp launcher: a scale operand), `after` (the fix-up or the gather, or None),
    `new_scale` (the per-row scale's allocation, or None)."""

    scale: object
    read: object
    after: object
    new_scale: object = None


def _read(run: _Launchers, x: torch.Tensor, t: torch.Tensor | None, scale: float):
    """(the one read's output, the scale it applied): `scale` where the temperature is a number,
    else the per-row scale the scale kernel writes from `t`."""
    if t is not None:
        scale = run.new_scale()
        run.scale((t, scale))
    got = run.read(x, Operands(None, None, scale, 1.0))
    # (y, p_sink) / lse [rows, 1]: contiguous, row r at element r as the gather reads it
    return (got[0] if isinstance(got, tuple) else got), scale


class Sampler:
    """`probs`, `sample` and `logprobs` (the signatures of `sampling.py`'s functions) of a backend
    whose `launcher(x, spec)` binds the softmax and `logsumexp_launcher(x, spec, operands)` the
    logsumexp (see the module). `plans(spec) -> SamplingPlan`: the backend's plan of a request
    (None: `sampling.plan_for`'s); its grid also caps the one-read paths' kernels."""

    def __init__(self, backend, plans=None):
        self.backend = backend
        self.plans = plans

    def plan(self, spec: SamplingSpec) -> sampling.SamplingPlan | None:
        """The plan the backend gives `spec`, or None for `sampling.plan_for`'s."""
        return None if self.plans is None else self.plans(spec)

    # ---- the API's functions: each through its form's runner ----

    def probs(self, spec: SamplingSpec, logits: torch.Tensor):
        """float32 probabilities of the filtered, renormalised distribution (logits' shape)."""
        return self.runner("probs", spec)(logits, sampling.keyword_values(spec))

    def sample(self, spec: SamplingSpec, logits: torch.Tensor, return_logprobs: bool = False):
        """int64 token ids of shape ``logits.shape[:-1]`` (and their float32 log-probabilities)."""
        return sampling.sample(spec, logits, return_logprobs, plan=self.plan(spec))

    def logprobs(self, spec: SamplingSpec, logits: torch.Tensor, ids: torch.Tensor, top_n: int = 0):
        """float32 log-probabilities of `ids` ([rows, K], validated) under log_softmax(logits /
        temperature), and with `top_n` the top-n values and ids (`sampling.logprobs`)."""
        return self.runner("logprobs", spec, top_n, ids.shape[-1])(logits, sampling.keyword_values(spec), ids)

    def runner(self, op: str, spec: SamplingSpec, top_n: int = 0, n_ids: int = 0):
        """`sampling.runner`'s functions for every request of `spec`'s form, sending a call that
        needs no filter to the one read (see the module); which keywords are tensors is the
        form's, so only the numbers' values are looked at per call."""
        scan = sampling.runner(op, spec, top_n, n_ids, plan=self.plan(spec))
        row_t = isinstance(spec.temperature, torch.Tensor)
        filters_are_numbers = not any(isinstance(v, torch.Tensor) for v in (spec.top_k, spec.top_p, spec.min_p))
        if op == "probs" and spec.rows and filters_are_numbers:
            return self._probs_one_read(spec, row_t, scan)
        if op == "logprobs" and not top_n and spec.rows and n_ids:
            return self._logprobs_one_read(spec, row_t, n_ids)
        return scan

    def _one_read_launchers(self, op: str, spec: SamplingSpec, row_t: bool, n_ids: int = 0):
        def bound(x: torch.Tensor, t_stride: int) -> _Launchers:
            key = (id(self.backend), op, spec.rows, spec.vocab, x.dtype, x.stride(0), x.device, row_t, t_stride,
                   n_ids, x.data_ptr() % 16 == 0, one_launch_logprobs(self, spec), self.plan(spec))
            return _bound.get(key, lambda: self._bind(op, spec, x, row_t, t_stride, n_ids))
        launchers = sampling.remembered(bound)
        return lambda x, t_stride: launchers((x.stride(0), x.data_ptr() % 16 == 0, t_stride), x, t_stride)

    def _probs_one_read(self, spec: SamplingSpec, row_t: bool, scan):
        launchers = self._one_read_launchers("probs", spec, row_t)
        vocab, flat = spec.vocab, len(spec.batch_shape) == 1

        def probs(logits, values):
            temperature, k, p, mp = values[:4]  # (top_k, top_p, min_p are numbers here)
            if not ((k == 0 or k >= vocab) and p >= 1.0 and mp == 0.0 and (row_t or temperature > 0)):
                return scan(logits, values)
            x = sampling.rows_view(logits, spec)
            t, t_stride = _temperature_operand(temperature)
            run = launchers(x, t_stride)
            y, _ = _read(run, x, t, None if t is not None else 1.0 / temperature)
            if t is not None:
                run.after((x, y, t))
            return y if flat else y.reshape(logits.shape)  # (a reshape to its own shape still costs ~1 us)
        return probs

    def _logprobs_one_read(self, spec: SamplingSpec, row_t: bool, n_ids: int):
        launchers = self._one_read_launchers("logprobs", spec, row_t, n_ids)
        new_out = output_maker((spec.rows, n_ids), torch.float32, spec.device)
        one_launch = one_launch_logprobs(self, spec)
        if one_launch:  # (logprobs_kernel's chunk lses and arrival counts: per stream, as its launches)
            items = spec.rows * cdiv(spec.vocab, LOGPROBS_CHUNK)
            stats = per_stream(lambda device: torch.empty(items, dtype=torch.float32, device=device))
            counts = per_stream(lambda device: row_counters(device, spec.rows))

        def logprobs(logits, values, ids):
            x = sampling.rows_view(logits, spec)
            t, t_stride = _temperature_operand(values[0])
            run = launchers(x, t_stride)
            out = new_out()
            ids = ids if ids.is_contiguous() else ids.contiguous()
            number = 1.0 if t is not None else float(values[0])
            scale = 1.0 / number if number > 0 else 1.0
            if one_launch:
                run.read((x, t, ids, out, stats(x.device), counts(x.device)), (number, scale))
                return out
            lse, s = _read(run, x, t, scale)
            if t is None:
                run.after((x, lse, None, None, ids, out), (number, scale))
            else:
                run.after((x, lse, s, t, ids, out))
            return out
        return logprobs

    def _bind(self, op: str, spec: SamplingSpec, x: torch.Tensor, row_t: bool, t_stride: int,
              n_ids: int) -> _Launchers:
        from . import sampling_one_read_kernels as k

        device, rows = x.device, spec.rows
        if op == "logprobs" and one_launch_logprobs(self, spec):
            n_chunks = cdiv(spec.vocab, LOGPROBS_CHUNK)
            ints = dict(n_rows=rows, vocab=spec.vocab, xs=x.stride(0), n_ids=n_ids, t_stride=t_stride,
                        n_chunks=n_chunks)
            meta = dict(ROW_T=row_t, CHUNK=LOGPROBS_CHUNK, G_P2=triton.next_power_of_2(n_chunks), TILE=TILE,
                        ID_BLOCK=ID_BLOCK, num_warps=4)
            grid = max(1, min(rows * n_chunks, programs_for_logprobs(device)))
            return _Launchers(None, sampling.launcher(k.logprobs_kernel, grid, ints, meta, device), None)
        scale = new_scale = None
        if row_t:
            scale = sampling.launcher(k.row_scale_kernel, cdiv(rows, SCALE_BLOCK), dict(n_rows=rows, t_stride=t_stride),
                                      dict(BLOCK=SCALE_BLOCK, num_warps=4), device)
            new_scale = output_maker((rows, 1), torch.float32, device)
        # The scale the softmax or logsumexp is bound with: its layout, never its values (those come
        # per call; a number other than 1 keeps the request fused, so every call passes its scale).
        stand_in = torch.ones((rows, 1), dtype=torch.float32, device=device) if row_t else 0.5
        plan = self.plan(spec)
        grid = max(1, min(rows, sampling.default_programs(device, rows) if plan is None else plan.grid))
        if op == "probs":
            soft, _ = SoftmaxSpec.from_request(x, -1, torch.float32, fused=dict(scale=stand_in))
            read = self.backend.launcher(x, soft)
            after = None
            if row_t:
                ints = dict(n_rows=rows, vocab=spec.vocab, xs=x.stride(0), ys=spec.vocab, t_stride=t_stride)
                after = sampling.launcher(k.probs_fixup_kernel, grid, ints, dict(TILE=TILE, num_warps=4), device)
            return _Launchers(scale, read, after, new_scale)
        lse_spec, _ = logsumexp_request(x, -1, scale=stand_in)
        read = self.backend.logsumexp_launcher(x, lse_spec, Operands(None, None, 1.0, 1.0))
        after = sampling.launcher(k.logprobs_gather_kernel, grid,
                                  dict(n_rows=rows, vocab=spec.vocab, xs=x.stride(0), n_ids=n_ids, t_stride=t_stride),
                                  dict(ROW_T=row_t, TILE=TILE, ID_BLOCK=ID_BLOCK, num_warps=4), device)
        return _Launchers(scale, read, after, new_scale)


@functools.lru_cache(maxsize=8)
def sampler_for(backend, plans=None) -> Sampler:
    """The `Sampler` of `backend` (one per backend object and plan function; `Sampler`'s `plans`)."""
    return Sampler(backend, plans)


__all__ = ["Sampler", "sampler_for"]
