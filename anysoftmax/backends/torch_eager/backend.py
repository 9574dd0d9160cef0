"""The `torch` backend: eager `torch.softmax` / `torch.log_softmax` on any device, and the fused
family and the pieces as the reference's own formulas, evaluated in the accumulation dtype."""

from __future__ import annotations

import torch

from ...core.backend import Backend
from ...core.lse_merge import MergeSpec, logsumexp_formula, merge_into
from ...core.reference import fused_forward
from ...core.spec import SoftmaxSpec
from ...core.variant import NO_OPERANDS, Operands


class TorchBackend(Backend):
    name = "torch"
    devices = ("*",)
    priority = 0
    fused = True
    row_scale = True

    def run(self, x: torch.Tensor, spec: SoftmaxSpec, operands: Operands = NO_OPERANDS):
        """y for a plain spec; (y, p_sink) for a fused one (p_sink None without sinks)."""
        if not spec.is_plain:
            v = spec.variant.with_values(operands.scale, operands.softcap)
            y, p_sink = fused_forward(x, v, spec.dim, spec.log, operands.mask, operands.sinks, spec.acc_dtype)
            return y.to(spec.out_dtype), p_sink
        op = torch.log_softmax if spec.log else torch.softmax
        if x.device.type == "cpu" and spec.out_dtype.itemsize == 2:
            # torch's CPU kernels for 16-bit dtypes do not keep the whole reduction in fp32
            # (fp16 log_softmax of 1823x781 was off by 1.6e-2, 8 ulps): the spec promises fp32
            # accumulation, so compute in fp32 and round once.
            return op(x, spec.dim, dtype=torch.float32).to(spec.out_dtype)
        if x.dtype == spec.out_dtype:  # torch's dtype= path costs ~50 us even when it changes nothing
            return op(x, spec.dim)
        return op(x, spec.dim, dtype=spec.out_dtype)

    # ---- the pieces ops (core.lse_merge): the formulas in the accumulation dtype ----

    def run_logsumexp(self, x: torch.Tensor, spec: SoftmaxSpec, operands: Operands = NO_OPERANDS) -> torch.Tensor:
        """lse with keepdim (x's shape with size 1 in `dim`) in the accumulation dtype."""
        v = spec.variant.with_values(operands.scale, operands.softcap)
        return logsumexp_formula(x, v, spec.dim, operands.mask, operands.sinks, spec.acc_dtype)

    def run_merge_states(self, outputs, lses, spec: MergeSpec, out=None, lse_out=None):
        """(out in the outputs' dtype, lse) of merge_states; copied into `out` / `lse_out` when given."""
        return merge_into(spec, outputs, lses, out, lse_out)
