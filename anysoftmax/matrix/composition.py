"""The fused family written in torch as a user would: the `peer:torch` of a fused cell, and
(compiled) its `peer:torch.compile`.

    z = x * scale                          # scale
    z = softcap * tanh(z / softcap)        # softcap (Gemma2)
    z = z + mask                           # additive mask (HF)
    z = z.masked_fill(excluded, -inf)      # bool mask | causal (a [sq, sk] constant built once)
    y = softmax(cat([z, sink], dim)).narrow(dim, 0, n)   # sinks (gpt-oss: one more column)
    y = y.masked_fill(excluded, -inf)      # log_softmax: excluded outputs are constants (below)
    y = y.masked_fill(empty_rows, value)   # the empty-row policy (SDPA's _safe_softmax does this)

Arithmetic steps (scale, softcap, an added mask) run in float32 for 16-bit inputs and the
result is cast back (HF's `softmax(..., dtype=float32).to(dtype)`): rounding a 16-bit logit
after each step would compute something else than the spec, and every peer is checked
against the float64 reference before it is timed. Masking alone stays in the input's dtype.
(gpt-oss also subtracts the row max before its softmax; torch.softmax does that itself, so it
is left out.) Gradients flow to x and the sinks through autograd.

log_softmax: the spec takes an excluded output (-inf) as a constant, so its upstream gradient
goes nowhere; torch's `masked_fill(-inf).log_softmax` alone would still spread it over the
kept logits (d(z_j - lse)/dz_k = -p_k), so the composition fills the excluded outputs again,
whose backward drops it.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..core.reference import empty_row_value
from ..core.variant import BOTTOM_RIGHT, CAUSAL_NONE
from .variants import VariantSpec

Fused = Callable[[torch.Tensor, "torch.Tensor | None", "torch.Tensor | None"], torch.Tensor]


def causal_excluded(sq: int, sk: int, causal: str, device) -> torch.Tensor:
    """The [sq, sk] bool tensor of positions causal excludes (True above the kept diagonal)."""
    shift = sk - sq if causal == BOTTOM_RIGHT else 0
    return torch.ones(sq, sk, dtype=torch.bool, device=device).triu(1 + shift)


def _rows_all(excluded: torch.Tensor, neg_dim: int) -> torch.Tensor:
    """Rows (along `neg_dim`, counted from the end) that `excluded` leaves empty; a tensor
    broadcast over that dim is its own answer."""
    return excluded.all(neg_dim, keepdim=True) if excluded.dim() >= -neg_dim else excluded


def composition(spec: VariantSpec, dim: int, log: bool, shape: tuple[int, ...], device) -> Fused:
    """fn(x, mask, sinks) -> y for `spec` over `dim` of inputs of `shape` on `device`."""
    ndim = len(shape)
    d = dim % max(ndim, 1)
    n = shape[d] if shape else 1
    softmax = torch.log_softmax if log else torch.softmax
    causal = None if spec.causal == CAUSAL_NONE else causal_excluded(shape[-2], shape[-1], spec.causal, device)
    bool_mask = spec.mask is not None and spec.mask.kind == "bool"
    additive = spec.mask is not None and spec.mask.kind == "additive"
    arithmetic = spec.scale is not None or spec.softcap is not None or additive
    # Which empty-row policy the bare composition already gives: -inf everywhere is NaN
    # (without a sink); with a sink, the sink takes the whole row: 0 (log: -inf), as "zero";
    # log_softmax's refill of the excluded outputs leaves -inf, "zero" too.
    natural = "zero" if spec.sinks or log else "nan"
    value = empty_row_value(spec.policy, n, log)

    def fn(x, mask=None, sinks=None):
        z = x.float() if arithmetic and x.dtype in (torch.float16, torch.bfloat16) else x
        if spec.scale is not None:
            z = z * spec.scale
        if spec.softcap is not None:
            z = spec.softcap * torch.tanh(z / spec.softcap)
        if additive:
            z = z + mask
        excluded = mask if bool_mask else None
        if causal is not None:
            excluded = causal if excluded is None else excluded | causal
        if excluded is not None:
            z = z.masked_fill(excluded, -math.inf)
        if sinks is not None:
            s = sinks.to(z.dtype).expand(tuple(1 if i == d else size for i, size in enumerate(z.shape)))
            y = softmax(torch.cat([z, s], d), d).narrow(d, 0, n)
        else:
            y = softmax(z, d)
        if excluded is not None and log:
            y = y.masked_fill(excluded, -math.inf)
        if excluded is not None and spec.policy != natural:
            y = y.masked_fill(_rows_all(excluded, d - ndim), value)
        return y.to(x.dtype)

    return fn
