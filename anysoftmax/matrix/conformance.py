"""Conformance of one cell: forward output and backward gradient against float64 torch.

Inputs larger than one float64 comparison holds are compared in chunks of whole rows
(`matrix.chunks`); every row is checked. (Fused cells: `matrix.fused_cells`.)"""

from __future__ import annotations

import torch

from ..testing.compare import Comparison, compare, compare_backward
from ..core.reference import reference
from ..core.spec import SoftmaxSpec, parse_dtype
from . import providers
from .cells import Cell
from .chunks import row_chunks, worst

# Logits spread like randn * 4 put softmax outputs across many orders of magnitude (so the
# exp range and the tolerance's atol region are both exercised) while no row degenerates.
SCALE = 4.0


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


def rounded_output(x: torch.Tensor, spec: SoftmaxSpec, device: str) -> torch.Tensor:
    """The float64 reference output of `x`, rounded to the output dtype, on `device`: the `y`
    that backward-only providers (peers, benchmark inputs) start from (chunk by chunk)."""
    out = torch.empty(tuple(x.shape), dtype=spec.out_dtype, device=device)
    for i in row_chunks(tuple(x.shape), spec.dim):
        out[i] = reference(x[i], spec, reference_device(device)).to(spec.out_dtype).to(device)
    return out


def check_cell(cell: Cell, device: str) -> tuple[Comparison, SoftmaxSpec]:
    """Run `cell` once on fresh random data and compare with the reference.

    An anysoftmax backend's gradient goes through autograd (what users run) after its forward
    output is checked; a peer's backward runs on (y, dy) directly, y the rounded reference."""
    dtype = parse_dtype(cell.dtype)
    x = make_input(cell.shape, dtype, device, cell.seed)
    log = cell.op == "log_softmax"
    spec = SoftmaxSpec.from_tensor(x, cell.dim, log=log)
    ref = reference_device(device)
    chunks = row_chunks(tuple(x.shape), spec.dim)

    def each(check):  # check(index, spec of that chunk) over every chunk of rows
        return worst([check(i, SoftmaxSpec.from_tensor(x[i], cell.dim, log=log)) for i in chunks])

    if cell.direction == "forward":
        y = providers.forward(cell.backend, cell.op, cell.dim, x.dim(), device)(x)
        return each(lambda i, sp: compare(y[i], x[i], sp, ref)), spec
    dy = make_input(cell.shape, dtype, device, cell.seed + 1, scale=1.0)
    if providers.is_peer(cell.backend):
        bwd = providers.backward(cell.backend, cell.op, cell.dim, x.dim(), device)
        y = rounded_output(x, spec, device)
        dx = bwd(y, dy)
        return each(lambda i, sp: compare_backward(dx[i], y[i], dy[i], sp, ref)), spec
    x.requires_grad_()
    y = providers.forward(cell.backend, cell.op, cell.dim, x.dim(), device)(x)
    if x.numel() == 0:  # nothing to differentiate (the forward returns a constant empty tensor)
        return Comparison(True, 0.0, 0.0), spec
    # The output the gradient flows from must itself be right (the forward cells check it too,
    # but a backward cell must not pass on a wrong output), then the gradient from that output.
    fwd = each(lambda i, sp: compare(y[i], x[i].detach(), sp, ref))
    if not fwd.ok:
        return Comparison(False, fwd.max_abs_err, fwd.max_rel_err, f"forward output: {fwd.detail}"), spec
    (dx,) = torch.autograd.grad(y, x, dy)
    return each(lambda i, sp: compare_backward(dx[i], y[i], dy[i], sp, ref)), spec
