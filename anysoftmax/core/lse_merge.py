"""Softmax in pieces (docs/semantics.md): the validation of `logsumexp` and `merge_states` and their formulas
in torch ops (the float64 reference; in the accumulation dtype, the `torch` backend and the autograd)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .spec import FLOAT_DTYPES, SoftmaxSpec, dtype_name
from .variant import MASK_ADDITIVE, Variant, keep_mask
from .reference import kept_values, prologue, prologue_chain, row_shape

SOFTMAX, LOGSUMEXP, MERGE_STATES = "softmax", "logsumexp", "merge_states"
OPS = (SOFTMAX, LOGSUMEXP, MERGE_STATES)


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a log-sum-exp: float64 for float64, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def logsumexp_request(x, dim, *, scale=None, mask=None, causal=False, softcap=None, sinks=None):
    """Validate a logsumexp request as softmax's (`SoftmaxSpec.from_request`): (spec, operands)."""
    fused = dict(scale=scale, mask=mask, causal=causal, softcap=softcap, sinks=sinks)
    return SoftmaxSpec.from_request(x, dim, None, log=False, fused=fused, op="logsumexp", arg="x")


def lse_shape(spec: SoftmaxSpec, keepdim: bool) -> tuple[int, ...]:
    """The shape of a logsumexp result: x's with `dim` of size 1 (keepdim) or without it."""
    if keepdim:
        return row_shape(spec.shape, spec.dim)
    return spec.shape[:spec.dim] + spec.shape[spec.dim + 1:]


def describe_logsumexp(spec: SoftmaxSpec) -> str:
    fused = "" if spec.is_plain else f", {spec.variant.describe()}"
    return f"logsumexp(shape={list(spec.shape)}, dim={spec.dim}, {dtype_name(spec.in_dtype)}{fused}, " \
           f"device={spec.device})"


@dataclass(frozen=True)
class MergeSpec:
    """One merge_states request: K partials of `shape` ([..., D]) in `dtype`, lses in `lse_dtypes`."""

    k: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    lse_dtypes: tuple[torch.dtype, ...]
    device: torch.device

    @property
    def out_lse_dtype(self) -> torch.dtype:
        """float64 when every lse is float64, float32 otherwise."""
        return torch.float64 if all(d == torch.float64 for d in self.lse_dtypes) else torch.float32

    @property
    def acc_dtype(self) -> torch.dtype:
        return torch.float64 if torch.float64 in (self.dtype, self.out_lse_dtype) else torch.float32

    @property
    def n_rows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def head_size(self) -> int:
        return self.shape[-1]

    def describe(self) -> str:
        return f"merge_states(k={self.k}, shape={list(self.shape)}, {dtype_name(self.dtype)}, device={self.device})"

    @classmethod
    def from_tensors(cls, outputs, lses) -> "MergeSpec":
        """Validate merge_states' arguments (errors name the argument) and describe them."""
        for name, seq in (("outputs", outputs), ("lses", lses)):
            if isinstance(seq, torch.Tensor) or not isinstance(seq, (list, tuple)):
                raise TypeError(f"merge_states: {name} must be a list or tuple of tensors, got {type(seq).__name__}")
            for i, t in enumerate(seq):
                if not isinstance(t, torch.Tensor):
                    raise TypeError(f"merge_states: {name}[{i}] must be a torch.Tensor, got {type(t).__name__}")
                if t.dtype not in FLOAT_DTYPES:
                    raise TypeError(f"merge_states: {name}[{i}] dtype {t.dtype} is not supported; allowed: "
                                    f"{', '.join(map(dtype_name, FLOAT_DTYPES))}")
        if len(outputs) == 0:
            raise ValueError("merge_states: outputs must hold at least one partial (K >= 1)")
        if len(lses) != len(outputs):
            raise ValueError(f"merge_states: lses has {len(lses)} tensors but outputs has {len(outputs)}; "
                             f"one lse per partial")
        first = outputs[0]
        if first.dim() < 1:
            raise ValueError("merge_states: outputs[0] must have at least one dim ([..., D])")
        shape = tuple(first.shape)
        for i, t in enumerate(outputs):
            if tuple(t.shape) != shape:
                raise ValueError(f"merge_states: outputs[{i}] has shape {list(t.shape)}, outputs[0] {list(shape)}; "
                                 f"all partials must have one shape")
            if t.dtype != first.dtype:
                raise TypeError(f"merge_states: outputs[{i}] is {t.dtype}, outputs[0] {first.dtype}; one dtype")
        for i, t in enumerate(lses):
            if tuple(t.shape) != shape[:-1]:
                raise ValueError(f"merge_states: lses[{i}] has shape {list(t.shape)}; it must be the outputs' "
                                 f"shape without the last dim, {list(shape[:-1])}")
        for name, seq in (("outputs", outputs), ("lses", lses)):
            for i, t in enumerate(seq):
                if t.device != first.device:
                    raise ValueError(f"merge_states: {name}[{i}] is on {t.device} but outputs[0] is on "
                                     f"{first.device}; all on one device")
        return cls(len(outputs), shape, first.dtype, tuple(t.dtype for t in lses), first.device)


def logsumexp_formula(x: torch.Tensor, variant: Variant, dim: int, mask, sinks, dtype: torch.dtype) -> torch.Tensor:
    """lse of the fused input with keepdim (x's shape with size 1 in `dim`), evaluated in `dtype`."""
    if x.dim() == 0:
        return logsumexp_formula(x.reshape(1), variant, 0, mask, sinks, dtype).reshape(())
    z = prologue(x, variant, mask, dtype)
    keep = keep_mask(tuple(z.shape), variant, mask, z.device)
    if keep is not None:
        z = z.masked_fill(~keep, -math.inf)
    if sinks is not None:
        z = torch.cat([z, sinks.to(dtype).expand(row_shape(tuple(z.shape), dim))], dim)
    return torch.logsumexp(z, dim, keepdim=True)


def logsumexp_backward_formula(g: torch.Tensor, lse: torch.Tensor, x: torch.Tensor, variant: Variant, dim: int,
                               mask, sinks, dtype: torch.dtype):
    """(dx, dmask_full, dsinks_rows): the gradients of lse (keepdim) given its gradient `g`, in
    `dtype`; an additive mask's before it is summed to its shape, the sinks' per row (None
    without them). Differentiable again in g, lse and x."""
    scalar = x.dim() == 0
    if scalar:
        x, g, lse, dim = x.reshape(1), g.reshape(1), lse.reshape(1), 0
    gw, lw = g.to(dtype), lse.to(dtype)
    keep = keep_mask(tuple(x.shape), variant, mask, x.device)
    z = prologue(kept_values(x, keep), variant, mask, dtype)
    dead = lw == -math.inf  # rows with nothing: zero gradient, never exp(-inf - -inf)
    live_lse = torch.where(dead, torch.zeros_like(lw), lw)
    dz = gw * torch.exp(z - live_lse).masked_fill(dead if keep is None else dead | ~keep, 0.0)
    dmask = dz if variant.mask_kind == MASK_ADDITIVE else None
    dx = prologue_chain(dz, x, variant.scale, variant.softcap, keep)
    ds = None
    if sinks is not None:
        s = sinks.to(dtype).expand(tuple(lw.shape))
        ds = (gw * torch.exp(s - live_lse)).masked_fill(dead, 0.0)
    return (dx.reshape(()) if scalar else dx), dmask, ds


def logsumexp_tangent(tx, tmask, tsinks, lse: torch.Tensor, x: torch.Tensor, variant: Variant, dim: int,
                      mask, sinks, dtype: torch.dtype) -> torch.Tensor:
    """The jvp of lse (keepdim) for tangents of x, an additive mask and the sinks (None: zero), in
    `dtype`: sum_j (d lse / d z_j) t_z_j + p_s t_s; rows at -inf and excluded positions give 0."""
    one = torch.ones(lse.shape, dtype=dtype, device=lse.device)
    dx, dmask, ds = logsumexp_backward_formula(one, lse, x, variant, dim, mask, sinks, dtype)
    tangent = torch.zeros(lse.shape, dtype=dtype, device=lse.device)
    if x.dim() == 0:
        return tangent if tx is None else tangent + dx * tx.to(dtype)
    if tx is not None:
        tangent = tangent + (dx * tx.to(dtype)).sum(dim, keepdim=True)
    if tmask is not None and dmask is not None:
        tangent = tangent + (dmask * tmask.to(dtype)).sum(dim, keepdim=True)
    if tsinks is not None and ds is not None:
        tangent = tangent + ds * tsinks.to(dtype)
    return tangent


def _read_if_weighed(o: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """`o` where its partial's weight `p` (broadcast over the head) is nonzero, else 0: an empty
    segment's output (NaN too) is never read, so no derivative carries 0 * NaN either (a where
    passes its unselected branch a zero gradient, where a product by 0 would pass 0 * NaN)."""
    return torch.where(p == 0, torch.zeros((), dtype=o.dtype, device=o.device), o)


def _merge_weights(lses, lse, acc):
    """p_i = exp(lse_i - lse) in `acc` per partial: 0 for -inf partials and for rows at -inf."""
    lw = lse.to(acc)
    dead = lw == -math.inf
    live = torch.where(dead, torch.zeros_like(lw), lw)
    return [torch.exp(li.to(acc) - live).masked_fill(dead | (li == -math.inf), 0.0) for li in lses]


def merge_formula(outputs, lses, acc: torch.Tensor.dtype, out_dtype, lse_out_dtype):
    """(out, lse) of merge_states in torch ops, accumulated in `acc` (docs/semantics.md's rules)."""
    L = torch.stack([t.to(acc) for t in lses])  # [K, ...]
    m = L.amax(0) if L.numel() else L.sum(0)  # NaN propagates through amax
    ms = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(L - ms)  # 0 for -inf partials; NaN only from NaN
    s = w.sum(0)
    lse = ms + torch.log(s)  # all -inf: 0 + log 0 = -inf; +inf: 0 + log inf = inf; NaN: NaN
    num = None
    for i, o in enumerate(outputs):
        wi = w[i].unsqueeze(-1)
        term = wi * _read_if_weighed(o.to(acc), wi)
        num = term if num is None else num + term
    sv = s.unsqueeze(-1)
    out = torch.where(sv == 0, torch.zeros((), dtype=acc, device=sv.device), num / sv)
    return out.to(out_dtype), lse.to(lse_out_dtype)


def merge_into(spec: MergeSpec, outputs, lses, out=None, lse_out=None):
    """(out, lse) of merge_states by `merge_formula`, copied into `out` / `lse_out` when given."""
    o, lse = merge_formula(list(outputs), list(lses), spec.acc_dtype, spec.dtype, spec.out_lse_dtype)
    return (o if out is None else out.copy_(o)), (lse if lse_out is None else lse_out.copy_(lse))


def merge_backward_formula(g_out, g_lse, outputs, lses, out, lse, acc):
    """(d outputs, d lses) of merge_states from (out, lse) and their gradients; differentiable again."""
    go = None if g_out is None else g_out.to(acc)
    gl = None if g_lse is None else g_lse.to(acc)
    d_outs, d_lses = [], []
    for o, li, p in zip(outputs, lses, _merge_weights(lses, lse, acc)):
        if go is not None:
            d_outs.append((p.unsqueeze(-1) * go).to(o.dtype))
            inner = ((_read_if_weighed(o.to(acc), p.unsqueeze(-1)) - out.to(acc)) * go).sum(-1)
        else:
            d_outs.append(torch.zeros_like(o))
            inner = torch.zeros_like(p)
        d_lses.append((p * (inner + (gl if gl is not None else 0.0))).to(li.dtype))
    return d_outs, d_lses


def merge_tangent(t_outs, t_lses, outputs, lses, out, lse, acc):
    """(t_out, t_lse): the jvp of merge_states at (outputs, lses) with result (out, lse), for
    tangents of the outputs and lses (None: zero), in out's and lse's dtypes:
    t_lse = sum_i p_i t_lse_i, t_out = sum_i p_i (t_out_i + t_lse_i (out_i - out)); partials
    and rows at -inf contribute 0."""
    t_lse = torch.zeros(lse.shape, dtype=acc, device=lse.device)
    t_out = torch.zeros(out.shape, dtype=acc, device=out.device)
    ow = out.to(acc)
    for i, (o, p) in enumerate(zip(outputs, _merge_weights(lses, lse, acc))):
        if t_lses[i] is not None:
            t_lse = t_lse + p * t_lses[i].to(acc)
            t_out = t_out + (p * t_lses[i].to(acc)).unsqueeze(-1) * (_read_if_weighed(o.to(acc), p.unsqueeze(-1)) - ow)
        if t_outs[i] is not None:
            t_out = t_out + p.unsqueeze(-1) * t_outs[i].to(acc)
    return t_out.to(out.dtype), t_lse.to(lse.dtype)
