"""apex / Megatron-LM fused softmax entry points, served by `anysoftmax.softmax` on any device,
for any length (apex dispatches its kernels only for sk <= 4096 (16384 unmasked) and Megatron
asks for sq, sk and b*np divisible by 4; none of that applies here).

    from anysoftmax.compat.megatron import FusedScaleMaskSoftmax      # Megatron's constructor
    from anysoftmax.compat.megatron import scaled_masked_softmax       # apex's functions

apex's semantics and how each maps onto the fused API (`anysoftmax.core.variant`):
* `scaled_softmax(x, scale)`: softmax(scale * x) over the last dim.
* `scaled_masked_softmax(x, mask, scale)`: mask True (or uint8 1) = masked, broadcastable to x
  (apex: [b or 1, 1, sq, sk]). apex writes -10000.0 into masked positions, so they get
  exp(-10000 - max) = 0 next to any ordinary logit, and a row with every position masked comes
  out as zeros. Mapped to `mask=` (excluded) with ``empty_rows="zero"``. Two corner cases are
  not reproduced, on purpose: apex decides "fully masked" by ``max == -10000`` (an unmasked
  row whose largest logit is exactly -10000.0 is zeroed too), and a row whose kept logits are
  all below about -10100 gives its weight to the masked positions (the fill outweighs them);
  here the mask alone decides, and masked positions are always out.
* `scaled_upper_triang_masked_softmax(x, scale)`: x is 3-D [attn_batches, sq, sk] with
  sq == sk; row i reads keys j <= i and writes exact zeros above the diagonal: ``causal=True``.
Outputs are in x's dtype, computed in float32 (apex's accumulation) or float64 for float64;
under autocast apex's three functions first cast x to the autocast dtype, and so do these.
A refused argument raises `MegatronArgumentError`: a ValueError that is also apex's
RuntimeError and Megatron's AssertionError.

`FusedScaleMaskSoftmax` is Megatron-LM's module (megatron/core/fusions/fused_softmax.py) with
the same constructor and `forward(input, mask[, softmax_offset])`. It takes Megatron's fused
path whenever Megatron would want it (`scaled_masked_softmax_fusion` and a float16 input flag),
with no shape condition, and otherwise Megatron's torch path (see the class).
"""

from __future__ import annotations

import torch

from ..torchop import api

# Megatron's AttnMaskType members. Only `causal` changes what this module does (Megatron's own
# rule); the others take the mask as given, `causal_bottom_right` included (Megatron leaves it
# to Transformer Engine and treats it here as it treats `padding`).
MASK_TYPES = ("padding", "causal", "no_mask", "padding_causal", "arbitrary", "causal_bottom_right")


class MegatronArgumentError(ValueError, RuntimeError, AssertionError):
    """A bad argument to a drop-in. apex raises RuntimeError and Megatron-LM asserts where these
    entry points refuse an argument (a scale without softmax_in_fp32, causal with sq != sk, ...):
    this error is all three types, so code written against either still catches it."""


def _autocast(x: torch.Tensor) -> torch.Tensor:
    """x in the autocast dtype when autocast is on for x's device, as apex's
    `_cast_if_autocast_enabled` casts its kernels' inputs (floating, not float64)."""
    kind = x.device.type
    if x.is_floating_point() and x.dtype != torch.float64 and torch.is_autocast_enabled(kind):
        return x.to(torch.get_autocast_dtype(kind))
    return x


def _bool_mask(mask: torch.Tensor, who: str) -> torch.Tensor:
    # apex reads a uint8 mask (1 = masked); torch code passes bool.
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{who}: mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        return mask
    if mask.dtype == torch.uint8:
        return mask == 1
    raise TypeError(f"{who}: mask dtype {mask.dtype} is not supported: bool or uint8 (True/1 = masked)")


def scaled_softmax(x: torch.Tensor, scale: float, *, backend: str | None = None) -> torch.Tensor:
    """apex `scaled_softmax`: softmax(scale * x) over the last dim, in x's dtype (under autocast,
    the autocast dtype)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"scaled_softmax: x must be a torch.Tensor, got {type(x).__name__}")
    return api.softmax(_autocast(x), -1, scale=scale, backend=backend)


def scaled_masked_softmax(x: torch.Tensor, mask: torch.Tensor | None, scale: float, *,
                          backend: str | None = None) -> torch.Tensor:
    """apex `scaled_masked_softmax`: softmax(scale * x) over the last dim with `mask` (bool or
    uint8, True/1 = masked, broadcastable to x) left out; a fully masked row is 0. `mask=None`
    is `scaled_softmax`, as in apex. Under autocast x is cast to the autocast dtype first."""
    if mask is None:
        return scaled_softmax(x, scale, backend=backend)
    mask = _bool_mask(mask, "scaled_masked_softmax")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"scaled_masked_softmax: x must be a torch.Tensor, got {type(x).__name__}")
    return api.softmax(_autocast(x), -1, scale=scale, mask=mask, empty_rows="zero", backend=backend)


def scaled_upper_triang_masked_softmax(x: torch.Tensor, scale: float, *, backend: str | None = None) -> torch.Tensor:
    """apex `scaled_upper_triang_masked_softmax`: x [attn_batches, sq, sk] with sq == sk; row i
    is the softmax of scale * x[i, :i+1], exact zeros after. Under autocast x is cast to the
    autocast dtype first."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[1] != x.shape[2]:
        shape = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise MegatronArgumentError(f"scaled_upper_triang_masked_softmax: x must be 3-D [attn_batches, sq, sk] "
                                    f"with sq == sk (causal mask is only for self attention), got {shape}")
    return api.softmax(_autocast(x), -1, scale=scale, causal=True, backend=backend)


def _mask_type_name(attn_mask_type) -> str:
    # Megatron's AttnMaskType enum (its members' names) or the same names as strings.
    name = getattr(attn_mask_type, "name", attn_mask_type)
    if name not in MASK_TYPES:
        raise MegatronArgumentError(f"FusedScaleMaskSoftmax: attn_mask_type must be an AttnMaskType or one of "
                         f"{', '.join(MASK_TYPES)}, got {attn_mask_type!r}")
    return name


def sliding_window_mask(sq: int, sk: int, window_size, device) -> torch.Tensor:
    """Megatron's sliding-window causal mask (True = masked): row i keeps keys j with
    -window_size[0] <= j - i - (sk - sq) <= window_size[1]."""
    left, right = window_size
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    offset = j - i - (sk - sq)
    return (offset < -left) | (offset > right)


class FusedScaleMaskSoftmax(torch.nn.Module):
    """Megatron-LM's fused scale + mask + softmax over the last dim of [b, np, sq, sk] scores.

    Fused path (Megatron's `forward_fused_softmax`), taken when `scaled_masked_softmax_fusion`
    is set and the input is declared fp16 or bf16, with no softmax_offset and no window: scale
    (None = 1) and, for ``causal`` mask types, the upper-triangular mask (sq == sk; the `mask`
    argument is ignored, as in Megatron), else `mask` (True = masked; a fully masked row is 0)
    or none: one fused call, output in the input's dtype.

    Torch path (Megatron's `forward_torch_softmax`), otherwise: the input upcast to float32 when
    declared fp16/bf16 with `softmax_in_fp32`, scaled, masked by `mask_func(scores, mask)`
    (Megatron's `attention_mask_func` fills -10000: a fully masked row is uniform) with the
    upper-triangular mask for causal types when no mask is given (sq > 1), or Megatron's
    sliding-window mask when `window_size` is set; then softmax, with `softmax_offset` ([np],
    Megatron's "softmax off by one" sink) in the denominator; cast back to fp16/bf16.
    `backend` (keyword only) picks the anysoftmax backend.
    """

    def __init__(self, input_in_fp16: bool, input_in_bf16: bool, attn_mask_type, scaled_masked_softmax_fusion: bool,
                 mask_func, softmax_in_fp32: bool, scale: float | None, window_size=None, *,
                 backend: str | None = None) -> None:
        super().__init__()
        if input_in_fp16 and input_in_bf16:
            raise MegatronArgumentError("FusedScaleMaskSoftmax: input_in_fp16 and input_in_bf16 cannot both be set")
        if scale is not None and not softmax_in_fp32:
            raise MegatronArgumentError("FusedScaleMaskSoftmax: a scale needs softmax_in_fp32=True (as in Megatron)")
        if window_size is not None and not (isinstance(window_size, (tuple, list)) and len(window_size) == 2
                                            and all(isinstance(w, int) for w in window_size)):
            raise MegatronArgumentError(f"FusedScaleMaskSoftmax: window_size must be (left, right) ints, got {window_size!r}")
        self.input_in_fp16, self.input_in_bf16 = bool(input_in_fp16), bool(input_in_bf16)
        self.input_in_float16 = self.input_in_fp16 or self.input_in_bf16
        self.attn_mask_type = attn_mask_type
        self.causal = _mask_type_name(attn_mask_type) == "causal"
        self.scaled_masked_softmax_fusion = scaled_masked_softmax_fusion
        self.mask_func = mask_func
        self.softmax_in_fp32 = softmax_in_fp32
        self.scale = scale
        self.window_size = window_size
        self.backend = backend

    def forward(self, input: torch.Tensor, mask: torch.Tensor | None,
                softmax_offset: torch.Tensor | None = None) -> torch.Tensor:
        """Probabilities [b, np, sq, sk] from scores `input` and `mask` (see the class)."""
        if not isinstance(input, torch.Tensor) or input.dim() != 4:
            got = list(input.shape) if isinstance(input, torch.Tensor) else type(input).__name__
            raise MegatronArgumentError(f"FusedScaleMaskSoftmax: input must be 4-D [b, np, sq, sk], got {got}")
        if self.is_kernel_available(mask, *input.shape) and softmax_offset is None:
            return self.forward_fused_softmax(input, mask)
        return self.forward_torch_softmax(input, mask, softmax_offset)

    def is_kernel_available(self, mask, b: int, np: int, sq: int, sk: int) -> bool:
        """Megatron's condition for its fused kernels, without its shape limits (a causal type
        still needs sq == sk: one query (decoding) takes the torch path, as in Megatron)."""
        return bool(self.scaled_masked_softmax_fusion and self.input_in_float16 and self.window_size is None
                    and (not self.causal or sq == sk))

    def forward_fused_softmax(self, input: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """apex's kernels' semantics in one fused call (see the class)."""
        scale = 1.0 if self.scale is None else self.scale
        if self.causal:
            b, np, sq, sk = input.shape
            probs = scaled_upper_triang_masked_softmax(input.reshape(-1, sq, sk), scale, backend=self.backend)
            return probs.view(b, np, sq, sk)
        if mask is not None:
            return scaled_masked_softmax(input, mask, scale, backend=self.backend)
        return scaled_softmax(input, scale, backend=self.backend)

    def forward_torch_softmax(self, input: torch.Tensor, mask: torch.Tensor | None,
                              softmax_offset: torch.Tensor | None = None) -> torch.Tensor:
        """Megatron's torch path: `mask_func` is the caller's code, so the scaling and the
        masking stay in torch around the (unfused) softmax."""
        upcast = self.input_in_float16 and self.softmax_in_fp32
        if upcast:
            input = input.float()
        if self.scale is not None:
            input = input * self.scale
        sq, sk = input.shape[-2:]
        if self.window_size is not None:
            mask = sliding_window_mask(sq, sk, self.window_size, input.device)
        elif self.causal and mask is None and sq > 1:
            if sq != sk:
                raise MegatronArgumentError(f"FusedScaleMaskSoftmax: a causal mask needs sq == sk (self attention), got "
                                 f"sq={sq}, sk={sk}")
            mask = torch.ones(sq, sk, dtype=torch.bool, device=input.device).triu(1)
        if mask is not None:
            if self.mask_func is None:
                raise MegatronArgumentError("FusedScaleMaskSoftmax: a mask was given but mask_func is None")
            input = self.mask_func(input, mask)
        sinks = None if softmax_offset is None else softmax_offset.to(input.device).reshape(1, -1, 1, 1)
        probs = api.softmax(input, -1, sinks=sinks, backend=self.backend)
        if upcast:
            probs = probs.half() if self.input_in_fp16 else probs.bfloat16()
        return probs
