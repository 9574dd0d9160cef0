"""A fused cell's data: the input and the variant's operands (mask, sinks), fresh from the
cell's seed, and the keywords of the call (`matrix.variants` says how they are drawn)."""

from __future__ import annotations

import zlib
from typing import NamedTuple

import torch

from .variants import Resolved, VariantSpec, resolve

EMPTY_ROW_SHARE = 10  # with empty_rows set, one mask row in this many is excluded entirely
SINK_SCALE = 1.5  # sinks ~ randn * 1.5: comparable to the logits' row maxima, so they matter


class Operands(NamedTuple):
    """The tensors of one fused call besides the input (None when the variant has none)."""

    mask: torch.Tensor | None
    sinks: torch.Tensor | None


def generator(device: str, seed: int) -> tuple[torch.Generator, str]:
    """(generator seeded with `seed`, the device it draws on): the device's own when it has one,
    else the CPU's (then the caller moves the result)."""
    try:
        return torch.Generator(device=device).manual_seed(seed), device
    except RuntimeError:
        return torch.Generator().manual_seed(seed), "cpu"


def _seed(base: int, what: str) -> int:
    return zlib.crc32(f"{base}/{what}".encode())


def _bool_mask(shape, dim_in_mask: int | None, density: float, empty: bool, g, dev) -> torch.Tensor:
    """True = excluded, about `density` of the positions; every row along `dim_in_mask` keeps
    one position at least, except (with `empty`) one row in EMPTY_ROW_SHARE, all excluded."""
    m = torch.rand(shape, generator=g, device=dev) < density
    if dim_in_mask is None:  # the mask broadcasts over the reduced dim: its rows are single positions
        m = m.unsqueeze(-1)
        dim_in_mask = m.dim() - 1
    rows = m.movedim(dim_in_mask, -1)  # a view: writes reach m
    flat = rows.reshape(-1, rows.shape[-1])
    n_rows, n = flat.shape
    keep_at = torch.randint(0, n, (n_rows,), generator=g, device=dev)
    fixed = flat.clone()
    fixed[torch.arange(n_rows, device=dev), keep_at] = False  # one kept position per row
    if empty:
        count = max(1, n_rows // EMPTY_ROW_SHARE)
        chosen = torch.randperm(n_rows, generator=g, device=dev)[:count]
        fixed[chosen] = True
    rows.copy_(fixed.view(rows.shape))
    return m.squeeze(-1) if m.dim() > len(shape) else m


def _additive_mask(shape, dtype: torch.dtype, density: float, g, dev) -> torch.Tensor:
    """randn, with about `density` of the entries at finfo(dtype).min (float32's for float64)."""
    m = torch.randn(shape, generator=g, device=dev, dtype=torch.float32).to(dtype)
    low = torch.finfo(torch.float32 if dtype == torch.float64 else dtype).min
    return m.masked_fill(torch.rand(shape, generator=g, device=dev) < density, low)


def make_operands(spec: VariantSpec, shape: tuple[int, ...], dim: int, dtype: torch.dtype, device: str,
                  seed: int, resolved: Resolved | None = None) -> Operands:
    """The variant's mask and sinks for an input of `shape` and `dtype`, drawn from `seed`."""
    r = resolved or resolve(spec, shape, dim)
    mask = sinks = None
    if r.mask_shape is not None:
        g, dev = generator(device, _seed(seed, "mask"))
        if spec.mask.kind == "bool":
            d = dim % len(shape)
            md = d - (len(shape) - len(r.mask_shape))
            mask = _bool_mask(r.mask_shape, md if md >= 0 else None, spec.mask.density, spec.empty_rows is not None,
                              g, dev)
        else:
            mask = _additive_mask(r.mask_shape, dtype, spec.mask.density, g, dev)
        mask = mask.to(device)
    if r.sinks_shape is not None:
        g, dev = generator(device, _seed(seed, "sinks"))
        draw = torch.float64 if dtype == torch.float64 else torch.float32
        sinks = (torch.randn(r.sinks_shape, generator=g, device=dev, dtype=draw) * SINK_SCALE).to(dtype).to(device)
    return Operands(mask, sinks)


def call_kwargs(spec: VariantSpec, ops: Operands) -> dict:
    """The fused keywords of `anysoftmax.softmax` for `spec` with operands `ops` (only those
    the variant sets, so a plain variant is the plain call)."""
    kw = {}
    if spec.scale is not None:
        kw["scale"] = spec.scale
    if spec.softcap is not None:
        kw["softcap"] = spec.softcap
    if spec.causal != "none":
        kw["causal"] = spec.causal
    if ops.mask is not None:
        kw["mask"] = ops.mask
    if ops.sinks is not None:
        kw["sinks"] = ops.sinks
    if spec.empty_rows is not None:
        kw["empty_rows"] = spec.empty_rows
    return kw
