"""`scale` and `softcap` that torch.compile traces as symbols: applied in torch ops before the operator and
checked when the graph runs by ``anysoftmax::check_temperature`` (docs/kernels.md, "torch.compile")."""

from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..core.reference import kept_values, scaled_and_capped
from ..core.variant import MASK_BOOL, MASK_NONE, Variant, causal_name, is_row_scale, keep_mask, runtime_values


def _number(value):
    # Dynamo traces a NumPy scalar as a 0-dim array, whose float() is a symbol.
    return value if value is None or isinstance(value, (float, int, str, bytes, torch.Tensor)) else float(value)


def _is_symbol(value) -> bool:
    # A constant compares with 0 one way or the other while tracing; a symbol (no guard on
    # its value) neither way. A NaN constant neither way either: the graph's check names it.
    value = _number(value)
    return type(value) in (float, int) and not (statically_known_true(value > 0) or statically_known_true(value <= 0))


def traced_as_symbols(scale, softcap) -> bool:
    """True while torch.compile traces a call whose scale or softcap is a symbol."""
    return torch.compiler.is_compiling() and (_is_symbol(scale) or _is_symbol(softcap))


@torch.library.custom_op("anysoftmax::check_temperature", mutates_args=())
def check_temperature(value: torch.Tensor, name: str) -> torch.Tensor:
    """Raise eager mode's ValueError unless the one-element `value` is a valid `name`; else True."""
    if name not in ("scale", "softcap"):
        raise ValueError(f"check_temperature: name must be 'scale' or 'softcap', got {name!r}")
    if value.numel() != 1:
        raise ValueError(f"check_temperature: value must have one element, got {value.numel()}")
    number = value.item()
    if name == "scale":  # (eager mode's checks and messages)
        runtime_values(number, None)
    else:
        runtime_values(None, number)
    return torch.ones((), dtype=torch.bool)


@check_temperature.register_fake
def _check_temperature_fake(value, name):
    return torch.empty((), dtype=torch.bool, device=value.device)


def _check_in_graph(name: str, value) -> None:
    verdict = check_temperature(torch.ones((), dtype=torch.float64, device="cpu") * value, name)
    # The assert keeps the check in the graph (an operator whose output nothing reads is
    # dropped); it reads the verdict on the CPU, so it stays a host check too.
    torch._assert_async(verdict, f"softmax: {name} is not valid")


def scaled_logits(x: torch.Tensor, out_dtype: torch.dtype, scale, softcap, mask, causal) -> torch.Tensor:
    """softcap * tanh(scale * x / softcap) in torch ops (`scale` a number, a symbol or a row scale)
    in `out_dtype`'s accumulation dtype, the values checked in the graph. Positions a bool mask or
    causal excludes read 0: a NaN there must not reach tanh's derivative."""
    scale, softcap = _number(scale), _number(softcap)
    if scale is not None and not is_row_scale(scale):  # (a row scale's values are not checked)
        _check_in_graph("scale", scale)
    if softcap is not None:
        _check_in_graph("softcap", softcap)
    kind = MASK_BOOL if mask is not None and mask.dtype == torch.bool else MASK_NONE
    keep = keep_mask(tuple(x.shape), Variant(mask_kind=kind, causal=causal_name(causal)), mask, x.device)
    acc = torch.float64 if out_dtype == torch.float64 else torch.float32
    return scaled_and_capped(kept_values(x, keep).to(acc), scale, softcap)
