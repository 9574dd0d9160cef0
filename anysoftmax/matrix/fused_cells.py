"""Fused cells (a variant other than plain): conformance against the float64 reference and
the benchmark's inputs.

Conformance: the provider runs on fresh data (input and operands from the cell's seed); its
output is compared with `testing.compare.compare`, and for a backward cell the gradients that
autograd returns for x and the sinks with `compare_fused_backward`. An input too large for
one float64 comparison is compared in chunks of rows (`matrix.chunks`: every row is still
checked; a dim the sinks broadcast over stays whole, so each chunk's sinks gradient is complete).

Benchmark: forward x -> y; backward the gradient call autograd makes per step, timed on a
graph built once per input set (`retain_graph`), for anysoftmax and the peers alike (their
own saved tensors, their own backward). GB/s counts the bytes a fused kernel must move
(`matrix.traffic`); `peer:copy` is one device copy of those bytes: forward a clone of
(read + written) / 2 bytes, backward `a + b` of (read + written) / 3 bytes each (two reads,
one write, as the plain backward's copy).
"""

from __future__ import annotations

import math

import torch

from .. import perf
from ..testing.compare import Comparison, compare, compare_fused_backward
from ..core.spec import SoftmaxSpec, parse_dtype
from . import providers
from .cells import Cell
from .chunks import row_chunks, take, worst
from .conformance import make_input, reference_device
from .operands import Operands, call_kwargs, make_operands
from .traffic import fused_bytes
from .variants import Resolved, VariantSpec, resolve

def whole_dims(shape: tuple[int, ...], variant: VariantSpec, r: Resolved) -> set[int]:
    """Dims a chunked check of a fused cell may not cut: causal's (queries, keys), and the dims
    a sink is shared over (so each chunk's sinks gradient is complete)."""
    ndim = len(shape)
    whole = {ndim - 2, ndim - 1} if variant.causal != "none" else set()
    if r.sinks_shape is not None:
        off = ndim - len(r.sinks_shape)
        whole |= {i for i in range(ndim) if (r.sinks_shape[i - off] if i >= off else 1) == 1}
    return whole


def check_fused(cell: Cell, device: str) -> tuple[Comparison, SoftmaxSpec]:
    """Run the fused `cell` once on fresh data and compare with the float64 reference."""
    dtype = parse_dtype(cell.dtype)
    shape, log = tuple(cell.shape), cell.op == "log_softmax"
    r = resolve(cell.variant, shape, cell.dim)
    fwd = providers.fused_forward(cell.backend, cell.op, cell.dim, shape, device, cell.variant)  # may refuse
    x = make_input(shape, dtype, device, cell.seed)
    ops = make_operands(cell.variant, shape, cell.dim, dtype, device, cell.seed, r)
    spec, _ = SoftmaxSpec.from_request(x, cell.dim, None, log=log, fused=call_kwargs(cell.variant, ops))
    ref = reference_device(device)
    chunks = row_chunks(shape, cell.dim, whole_dims(shape, cell.variant, r))
    ndim = len(shape)

    def sub_spec(i):
        xi = x[i].detach()
        m, s = take(ops.mask, i, ndim), take(ops.sinks, i, ndim)
        sp, _ = SoftmaxSpec.from_request(xi, cell.dim, None, log=log, fused=call_kwargs(cell.variant, Operands(m, s)))
        return xi, m, s, sp

    def check_forward(y):
        return worst([compare(y[i], xi, sp, ref, mask=m, sinks=s) for i in chunks for xi, m, s, sp in [sub_spec(i)]])

    if cell.direction == "forward":
        with torch.no_grad():
            return check_forward(fwd(x, ops.mask, ops.sinks)), spec
    xg = x.detach().requires_grad_()
    sg = None if ops.sinks is None else ops.sinks.detach().requires_grad_()
    y = fwd(xg, ops.mask, sg)
    if x.numel() == 0:
        return Comparison(True, 0.0, 0.0), spec
    # The output the gradient flows from must itself be right (as for plain backward cells).
    first = check_forward(y)
    if not first.ok:
        return Comparison(False, first.max_abs_err, first.max_rel_err, f"forward output: {first.detail}"), spec
    dy = make_input(shape, dtype, device, cell.seed + 1, scale=1.0)
    grads = torch.autograd.grad(y, [xg] + ([sg] if sg is not None else []), dy)
    dx, ds = grads[0], (grads[1] if sg is not None else None)
    if ds is not None and tuple(ds.shape) != tuple(ops.sinks.shape):
        return Comparison(False, math.inf, math.inf, f"dsinks shape {tuple(ds.shape)} != {tuple(ops.sinks.shape)}"), spec
    return worst([compare_fused_backward(dx[i], y[i].detach(), dy[i], xi, sp, m, s, take(ds, i, ndim), device=ref)
                  for i in chunks for xi, m, s, sp in [sub_spec(i)]]), spec


def rotated_sets(per_set: int) -> int:
    # Rotated input sets keep a repeat from finding its input in L2; a set larger than the
    # rotation budget cannot be cached anyway, and two of them may not fit the device.
    return 1 if per_set >= perf.ROTATE_BYTES else perf.rotation_count(per_set)


def _copy_inputs(cell: Cell, device: str, dtype: torch.dtype, total: int):
    """The same-bytes copy: forward clone of total/2 bytes, backward a + b of total/3 bytes each."""
    parts = 2 if cell.direction == "forward" else 3
    elems = max(1, round(total / (parts * dtype.itemsize)))
    n = rotated_sets(parts * elems * dtype.itemsize)
    bufs = [make_input((elems,), dtype, device, cell.seed + k) for k in range(n * (parts - 1))]
    moved = parts * elems * dtype.itemsize
    if parts == 2:
        return [(b,) for b in bufs], (lambda t: t[0].clone()), moved
    return list(zip(bufs[::2], bufs[1::2])), (lambda t: torch.add(t[0], t[1])), moved


def fused_bench_inputs(cell: Cell, device: str):
    """(inputs to rotate, fn(input), bytes moved per call) of a fused cell."""
    dtype = parse_dtype(cell.dtype)
    shape = tuple(cell.shape)
    r = resolve(cell.variant, shape, cell.dim)
    mask_item = 1 if r.mask_shape is None or cell.variant.mask.kind == "bool" else dtype.itemsize
    traffic = fused_bytes(cell.variant, shape, dtype.itemsize, cell.direction, r.mask_shape, mask_item)
    if providers.is_reference_only(cell.backend):
        return _copy_inputs(cell, device, dtype, traffic.total)
    fwd = providers.fused_forward(cell.backend, cell.op, cell.dim, shape, device, cell.variant)
    numel = math.prod(shape)
    n = rotated_sets(numel * dtype.itemsize * (1 if cell.direction == "forward" else 3))
    inputs = []
    for k in range(n):
        x = make_input(shape, dtype, device, cell.seed + k)
        ops = make_operands(cell.variant, shape, cell.dim, dtype, device, cell.seed + k, r)
        if cell.direction == "forward":
            inputs.append((x, ops.mask, ops.sinks))
            continue
        xg = x.requires_grad_()
        sg = None if ops.sinks is None else ops.sinks.requires_grad_()
        y = fwd(xg, ops.mask, sg)
        inputs.append((y, (xg,) if sg is None else (xg, sg), make_input(shape, dtype, device, cell.seed + k + n,
                                                                       scale=1.0)))
    if cell.direction == "forward":
        return inputs, (lambda t: fwd(*t)), traffic.total
    return inputs, (lambda t: torch.autograd.grad(t[0], t[1], t[2], retain_graph=True)), traffic.total
