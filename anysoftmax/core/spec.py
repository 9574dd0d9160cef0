"""`SoftmaxSpec`: the one statement of what every backend computes, torch's semantics (docs/semantics.md),
and the per-dtype `TOLERANCES`. A widening ``dtype=`` is folded into the kernels' loads; a narrowing one
rounds the input on the host (`needs_input_cast`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from .variant import PLAIN, Variant, build as build_variant

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DTYPE_NAMES: dict[str, torch.dtype] = {
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
}


@dataclass(frozen=True)
class Tolerance:
    """Allowed |out - expected| <= atol + rtol * |expected|, `expected` the rounded float64 reference."""

    atol: float
    rtol: float


# A kernel rounds once at the store, so it may land one ulp from the rounded reference: 16-bit
# rtol is one ulp at 1.0 with a 2x margin; float32 and float64 carry the accumulation error
# itself. The derivation of each number: docs/semantics.md ("The reference and the tolerances").
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float16: Tolerance(atol=1e-5, rtol=2 * 2.0**-10),
    torch.bfloat16: Tolerance(atol=1e-5, rtol=2 * 2.0**-7),
    torch.float32: Tolerance(atol=1e-6, rtol=1e-5),
    torch.float64: Tolerance(atol=1e-12, rtol=1e-10),
}


def dtype_name(dtype: torch.dtype) -> str:
    """'torch.float16' -> 'float16'."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """Map a dtype name ('bf16', 'float32', ...) or a torch dtype to a supported float dtype."""
    if isinstance(name, torch.dtype):
        dtype = name
    elif name in DTYPE_NAMES:
        dtype = DTYPE_NAMES[name]
    else:
        raise ValueError(f"unknown dtype {name!r}; allowed: {', '.join(sorted(DTYPE_NAMES))}")
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype {dtype} is not supported; allowed: {', '.join(map(dtype_name, FLOAT_DTYPES))}")
    return dtype


@dataclass(frozen=True)
class SoftmaxSpec:
    """One softmax request: what to compute, independent of any backend."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    in_dtype: torch.dtype
    dim: int  # normalised; 0 for a 0-dim tensor
    out_dtype: torch.dtype
    log: bool
    device: torch.device
    variant: Variant = PLAIN  # the fused family's steps (core.variant); PLAIN: torch's softmax

    @property
    def is_plain(self) -> bool:
        """True for torch's softmax without any fused step."""
        return self.variant is PLAIN or self.variant.is_plain

    def kernel_key(self) -> tuple:
        """Everything a plan or a compiled kernel depends on (`core.request.plan_key` adds the rest)."""
        return (self.shape, self.strides, self.in_dtype, self.out_dtype, self.dim, self.log, self.device,
                self.variant.key())

    def with_variant(self, variant: Variant) -> "SoftmaxSpec":
        return replace(self, variant=variant)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def n_cols(self) -> int:
        """Length of the reduced dimension (1 for a 0-dim tensor)."""
        return self.shape[self.dim] if self.shape else 1

    @property
    def n_rows(self) -> int:
        """Number of independent rows: the product of every other dimension."""
        return self.numel // self.n_cols if self.n_cols else 0

    @property
    def acc_dtype(self) -> torch.dtype:
        """float64 accumulation for float64 outputs, float32 otherwise."""
        return torch.float64 if self.out_dtype == torch.float64 else torch.float32

    @property
    def needs_input_cast(self) -> bool:
        """True when the input is converted to `out_dtype` on the host first (narrowing, or not floating)."""
        if self.in_dtype not in FLOAT_DTYPES:
            return True
        return self.out_dtype != self.in_dtype and self.out_dtype.itemsize <= self.in_dtype.itemsize

    @property
    def op_name(self) -> str:
        return "log_softmax" if self.log else "softmax"

    @property
    def tolerance(self) -> Tolerance:
        """The per-dtype tolerance; for log_softmax atol is at least rtol (see TOLERANCES)."""
        tol = TOLERANCES[self.out_dtype]
        return Tolerance(max(tol.atol, tol.rtol), tol.rtol) if self.log else tol

    def describe(self) -> str:
        fused = "" if self.is_plain else f", {self.variant.describe()}"
        return (f"{self.op_name}(shape={list(self.shape)}, dim={self.dim}, "
                f"{dtype_name(self.in_dtype)}->{dtype_name(self.out_dtype)}{fused}, device={self.device})")

    @classmethod
    def from_request(cls, x: object, dim: object, dtype: object = None, log: bool = False,
                     fused: dict | None = None, *, op: str | None = None,
                     arg: str = "input") -> tuple["SoftmaxSpec", object]:
        """`from_tensor` plus the fused keywords in `fused` (`core.variant.build`): (spec, `Operands`)."""
        op = op or ("log_softmax" if log else "softmax")
        spec = cls.from_tensor(x, dim, dtype, log=log, op=op, arg=arg)
        try:
            variant, operands = build_variant(spec.shape, spec.device, spec.dim, **(fused or {}))
        except (TypeError, ValueError) as exc:  # core.variant words its errors as softmax's
            if op == "softmax":
                raise
            raise type(exc)(str(exc).replace("softmax:", f"{op}:", 1)) from None
        return spec.with_variant(variant), operands

    @classmethod
    def from_tensor(cls, x: object, dim: object, dtype: object = None, log: bool = False, *,
                    op: str | None = None, arg: str = "input") -> "SoftmaxSpec":
        """Validate a user request and describe it (TypeError for a non-tensor `x`, a non-floating
        dtype or a non-int `dim`; IndexError for `dim` out of range). The message begins with `op`
        (softmax or log_softmax by `log` unless given) and calls `x` by `arg`."""
        op = op or ("log_softmax" if log else "softmax")
        allowed = ", ".join(map(dtype_name, FLOAT_DTYPES))
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{op}: {arg} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in FLOAT_DTYPES and (x.dtype.is_complex or not isinstance(dtype, torch.dtype)
                                            or dtype not in FLOAT_DTYPES):
            # torch accepts integer and bool inputs when dtype= names a floating type (it
            # converts first), and so do we; complex inputs are refused even then, because
            # torch would drop their imaginary part without an error.
            cast = ", or an integer/bool input with dtype= one of those" if op in ("softmax", "log_softmax") else ""
            raise TypeError(f"{op}: {arg} dtype {x.dtype} is not supported; allowed: {allowed}{cast}")
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}")
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"{op}: dtype must be a torch.dtype or None, got {dtype!r}")
        if dtype is not None and dtype not in FLOAT_DTYPES:
            raise TypeError(f"{op}: dtype={dtype} is not supported; allowed: {allowed}")
        ndim = x.dim()
        lo, hi = (-1, 0) if ndim == 0 else (-ndim, ndim - 1)
        if not lo <= dim <= hi:
            raise IndexError(
                f"{op}: dim {dim} out of range for a tensor of {ndim} dimension(s) "
                f"(expected to be in range of [{lo}, {hi}])")
        return cls(
            shape=tuple(x.shape), strides=tuple(x.stride()), in_dtype=x.dtype,
            dim=dim % max(ndim, 1), out_dtype=x.dtype if dtype is None else dtype, log=log, device=x.device,
        )


def check_backward_args(y, grad, dim, log: bool = False, fused: dict | None = None) -> SoftmaxSpec:
    """Validate `softmax_backward`'s arguments: y's spec, with the variant of the keywords `fused`."""
    spec = SoftmaxSpec.from_tensor(y, dim, log=log, op="softmax_backward", arg="y")
    if not isinstance(grad, torch.Tensor):
        raise TypeError(f"softmax_backward: grad must be a torch.Tensor, got {type(grad).__name__}")
    if grad.shape != y.shape:
        raise ValueError(f"softmax_backward: grad shape {tuple(grad.shape)} must equal the output's shape "
                         f"{tuple(y.shape)}")
    if grad.device != y.device:
        raise ValueError(f"softmax_backward: grad is on {grad.device} but the output is on {y.device}; "
                         f"both must be on one device")
    if not grad.dtype.is_floating_point:
        raise TypeError(f"softmax_backward: grad dtype {grad.dtype} is not floating")
    if fused is None:
        return spec
    return SoftmaxSpec.from_request(y, dim, log=log, fused=fused, op="softmax_backward", arg="y")[0]
