"""Validating a call of the sharded functions as `anysoftmax.softmax` validates it, memoised by the
request's key, and the `functions.Call` the formulas, Functions and operators take."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..core.cache import BoundedDict
from ..core.request import request_key
from ..core.spec import SoftmaxSpec
from ..core.variant import is_row_scale, runtime_values
from ..dispatch import FusedArgs
from ..torchop.grad_mode import plain_eager
from .collective import group_rank_and_size
from .functions import Call


class Checked(NamedTuple):
    """What validating a request leaves for every call of it."""

    dim: int  # normalised
    cast: torch.dtype | None  # dtype= to convert x to first
    empty_rows: str  # normalised ("zero" where no row can be empty)
    no_rows: bool  # (not `spec.n_rows`: an empty shard has rows all the same, and must take part)
    acc: torch.dtype


# request key -> Checked: a repeated request is not validated again.
memo: BoundedDict = BoundedDict(maxsize=1024)
_lookup = memo.get


def check(who: str, x, dim, dtype, log: bool, a: FusedArgs) -> Checked:
    """The validated request (raises naming the argument `who` was called with)."""
    spec, _ = SoftmaxSpec.from_request(x, dim, dtype, log=log, fused=a.as_kwargs())
    if not spec.shape:
        raise ValueError(f"{who}: x must have at least one dim (the sharded one), got a 0-dim tensor")
    no_rows = any(s == 0 for d, s in enumerate(spec.shape) if d != spec.dim)
    return Checked(spec.dim, None if spec.out_dtype == x.dtype else spec.out_dtype, spec.variant.empty_rows,
                   no_rows, spec.acc_dtype)


def refuse_causal(who: str, causal) -> None:
    """`causal` names key positions a shard does not know: refused (a bool mask states them)."""
    if causal not in (False, None):
        raise ValueError(f"{who}: causal={causal!r} is not supported over a sharded dim (a shard does not know its "
                         f"keys' global positions); pass the shard of a bool mask instead")


def prepare(who, direction, x, dim, dtype, log, keepdim, group, scale, mask, causal, softcap, sinks, empty_rows,
            backend) -> tuple[torch.Tensor, Call, Checked]:
    """(x converted to `dtype=`, the call, what validating it left)."""
    if is_row_scale(scale):  # (its gradient would need a reduction across the ranks)
        raise ValueError(f"{who}: scale as a tensor (one value per row) is not supported over a sharded dim; "
                         f"pass a number, or scale the shard first (x * scale)")
    rank, world = group_rank_and_size(group, who)
    refuse_causal(who, causal)
    a = FusedArgs(scale, mask, False, softcap, sinks, empty_rows)
    # Plain eager: local calls go straight to dispatch, and the request is memoised by its key
    # (which reads pointers: torch.func's wrappers have none).
    eager = plain_eager(x, mask, sinks, gradients=False)
    key = request_key(direction, x, dim, dtype, backend, log, None, a) if eager else None
    checked = _lookup(key) if key is not None else None
    if checked is None:
        checked = check(who, x, dim, dtype, log, a)
        if key is not None:
            memo.put(key, checked)
    s, c = runtime_values(scale, softcap)
    if checked.cast is not None:
        x = x.to(checked.cast)  # torch's dtype=: convert first
    return x, Call(checked.dim, log, None if scale is None else s, None if softcap is None else c, checked.empty_rows,
                   keepdim, backend, group, rank, world, eager), checked
