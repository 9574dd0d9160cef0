"""Conformance of one cell: forward output and backward gradient against float64 torch."""

from __future__ import annotations

import torch

from .. import api
from ..core.compare import Comparison, check_form, compare
from ..core.spec import SoftmaxSpec, parse_dtype
from .cells import Cell

# Logits spread like randn * 4 put softmax outputs across many orders of magnitude (so the
# exp range and the tolerance's atol region are both exercised) while no row degenerates.
SCALE = 4.0

OPS = {"softmax": api.softmax, "log_softmax": api.log_softmax}


def reference_device(device: str) -> str:
    """Where the float64 reference of a cell on `device` is evaluated: the float64 reference of
    a large tensor takes seconds on the CPU and milliseconds on a GPU, so on CUDA/ROCm it runs
    on the cell's device (in float64 all the same); elsewhere on the CPU (Ascend has no fast
    float64)."""
    return device if device.startswith("cuda") else "cpu"


def make_input(shape, dtype: torch.dtype, device: str, seed: int, scale: float = SCALE) -> torch.Tensor:
    """Fresh `randn * scale` data of `dtype` on `device`, reproducible from `seed`."""
    gen_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    try:
        g = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(shape, generator=g, device=device, dtype=gen_dtype)
    except RuntimeError:  # a device without its own generator: draw on the CPU, then move
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(shape, generator=g, dtype=gen_dtype).to(device)
    return (x * scale).to(dtype)


def _grad_reference(x: torch.Tensor, dy: torch.Tensor, spec: SoftmaxSpec,
                    device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 gradient of torch's op (on `device`) and the float64 forward output."""
    x64 = x.detach().to(device).to(spec.out_dtype).to(torch.float64).requires_grad_()
    op = torch.log_softmax if spec.log else torch.softmax
    y64 = op(x64, spec.dim if x64.dim() else 0)
    (dx64,) = torch.autograd.grad(y64, x64, dy.detach().to(device).to(torch.float64))
    return dx64, y64.detach()


def compare_grad(dx: torch.Tensor, x: torch.Tensor, dy: torch.Tensor, spec: SoftmaxSpec,
                 device: str = "cpu") -> Comparison:
    """Check a backend's input gradient `dx` (for upstream gradient `dy`) against float64 torch.

    The tolerance is the spec's (atol, rtol) applied to each element's sensitivity to the
    forward output's own allowed error, not to |dx| alone: the gradient is computed from the
    rounded output p, and dx = p * (dy - sum(p * dy)) cancels when dy_i ~ sum(p * dy), so a
    purely relative bound would reject correct kernels. Propagating |dp| <= rtol * p gives
        softmax:      |err_i| <= atol + rtol * p_i * (|dy_i| + 2 * sum_j p_j |dy_j|)
        log_softmax:  |err_i| <= atol + rtol * (|dy_i| + p_i * |sum_j dy_j| * (1 + |log p_i|))
    (for log_softmax the output y = log p carries |dy| <= rtol * |y|, so exp(y) carries
    rtol * |log p|). Both scales bound |dx_i| itself, so the final rounding is covered too.
    The float64 reference is evaluated on `device`.
    """
    early = check_form(dx, spec.shape, x.dtype, "gradient ")
    if early is not None:
        return early
    expected, y64 = _grad_reference(x, dy, spec, device)
    got = dx.detach().to(device).to(torch.float64)
    if not torch.isfinite(got).all():
        return Comparison(False, float("inf"), float("inf"), "non-finite values in the gradient")
    g = dy.detach().to(device).to(torch.float64)
    dim = spec.dim if y64.dim() else 0
    if spec.log:
        p = y64.exp()
        scale = g.abs() + p * g.sum(dim, keepdim=True).abs() * (1 + y64.abs())
    else:
        p = y64
        scale = p * (g.abs() + 2 * (p * g.abs()).sum(dim, keepdim=True))
    tol = spec.tolerance
    diff = (got - expected).abs()
    ratio = diff / (tol.atol + tol.rtol * scale)
    max_abs, max_rel = diff.max().item(), ratio.max().item()
    if max_rel <= 1.0:
        return Comparison(True, max_abs, max_rel)
    worst = ratio.argmax()
    got_w, exp_w = got.flatten()[worst].item(), expected.flatten()[worst].item()
    return Comparison(False, max_abs, max_rel, f"gradient error {max_abs:.3g} exceeds the tolerance by "
                                               f"{max_rel:.3g}x (worst: got {got_w:.8g}, expected {exp_w:.8g})")


def check_cell(cell: Cell, device: str) -> tuple[Comparison, SoftmaxSpec]:
    """Run `cell` once on fresh random data and compare with the reference."""
    dtype = parse_dtype(cell.dtype)
    op = OPS[cell.op]
    x = make_input(cell.shape, dtype, device, cell.seed)
    spec = SoftmaxSpec.from_tensor(x, cell.dim, log=cell.op == "log_softmax")
    ref = reference_device(device)
    if cell.direction == "forward":
        return compare(op(x, cell.dim, backend=cell.backend), x, spec, ref), spec
    x.requires_grad_()
    y = op(x, cell.dim, backend=cell.backend)
    if x.numel() == 0:  # nothing to differentiate (the forward returns a constant empty tensor)
        return Comparison(True, 0.0, 0.0), spec
    dy = make_input(cell.shape, dtype, device, cell.seed + 1, scale=1.0)
    (dx,) = torch.autograd.grad(y, x, dy)
    return compare_grad(dx, x, dy, spec, ref), spec
