"""torch_npu's `npu_scaled_masked_softmax`, served by `anysoftmax.softmax` on every device and
for any shape (torch_npu takes the last two dims in 32..4096, multiples of 32).

    from anysoftmax.compat.torch_npu import npu_scaled_masked_softmax
    y = npu_scaled_masked_softmax(scores, mask, scale, fixed_triu_mask)   # MindSpeed's call

torch_npu's semantics and their mapping onto the fused API (`anysoftmax.core.variant`):
softmax over the last dim of scale * x with masked positions (bool mask, True = masked,
broadcastable to x) filled with -10000. That fill is the NPU kernel's (CANN's open operator
source, hicann/ops-nn `vfusion/scaled_masked_softmax_v2`, which `aclnnScaledMaskedSoftmax`
runs: `MASK_VAL = -10000.0f` selected into masked positions before the softmax). Ascend's
migration guide writes the op as ``softmax((x * scale).masked_fill(mask, -inf))``: the same on
every row that keeps a position, but NaN on a fully masked row, which the kernel does not give;
the kernel decides. Next to any ordinary logit a filled position weighs exp(-10000 - max) = 0;
a row with every position masked is -10000 everywhere, so it comes out uniform, 1/N:
``mask=`` (excluded) with ``empty_rows="uniform"``. (As with apex, a row whose kept logits are all below about -10100
would give its weight to the filled positions there; here masked positions are always out.)
`fixed_triu_mask=True` replaces the mask by the generated upper-triangular one (row i keeps
keys j <= i): ``causal=True``; `mask` is then not read. Output in x's dtype.
"""

from __future__ import annotations

import torch

from ..torchop import api


def npu_scaled_masked_softmax(x: torch.Tensor, mask: torch.Tensor | None, scale: float = 1.0,
                              fixed_triu_mask: bool = False, *, backend: str | None = None) -> torch.Tensor:
    """torch_npu.npu_scaled_masked_softmax (see the module docstring); `backend` (keyword only,
    not in torch_npu) picks the anysoftmax backend."""
    if not isinstance(fixed_triu_mask, bool):
        raise TypeError(f"npu_scaled_masked_softmax: fixed_triu_mask must be a bool, got "
                        f"{type(fixed_triu_mask).__name__}")
    if fixed_triu_mask:
        return api.softmax(x, -1, scale=scale, causal=True, backend=backend)
    if mask is None:
        return api.softmax(x, -1, scale=scale, backend=backend)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"npu_scaled_masked_softmax: mask must be a bool tensor (True = masked), got {got}")
    return api.softmax(x, -1, scale=scale, mask=mask, empty_rows="uniform", backend=backend)
