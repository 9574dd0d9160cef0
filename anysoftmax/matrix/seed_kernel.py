"""The project's seed: Triton's fused-softmax tutorial kernel, kept as the baseline to beat.

One row per program step, BLOCK_SIZE = next_power_of_2(N), 8 warps, a grid sized by the
tutorial's occupancy rule. It fails to compile from N = 32768 fp32 on an H100.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def seed_softmax_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_rows, n_cols,
                        BLOCK_SIZE: tl.constexpr, num_stages: tl.constexpr):
    row_start = tl.program_id(0)
    row_step = tl.num_programs(0)
    for row_idx in tl.range(row_start, n_rows, row_step, num_stages=num_stages):
        row_start_ptr = input_ptr + row_idx * input_row_stride
        col_offsets = tl.arange(0, BLOCK_SIZE)
        mask = col_offsets < n_cols
        row = tl.load(row_start_ptr + col_offsets, mask=mask, other=-float("inf"))
        row_minus_max = row - tl.max(row, axis=0)
        numerator = tl.exp(row_minus_max)
        denominator = tl.sum(numerator, axis=0)
        tl.store(output_ptr + row_idx * output_row_stride + col_offsets, numerator / denominator, mask=mask)


_grids = {}


def seed_softmax(x: torch.Tensor) -> torch.Tensor:
    """The tutorial's launcher for a 2-D tensor, softmax over the last dim."""
    from anysoftmax.backends.triton.device import device_props
    from anysoftmax.backends.triton.occupancy import KernelResources, persistent_programs

    n_rows, n_cols = x.shape
    block = triton.next_power_of_2(n_cols)
    y = torch.empty_like(x)
    props = device_props(x.device.index or 0)
    stages = 4 if props.max_shared_mem > 200000 else 2
    key = (block, x.dtype)
    if key not in _grids:
        k = seed_softmax_kernel.warmup(y, x, x.stride(0), y.stride(0), n_rows, n_cols, BLOCK_SIZE=block,
                                       num_stages=stages, num_warps=8, grid=(1,))
        k._init_handles()
        _grids[key] = KernelResources(k.n_regs, k.metadata.shared, 8)
    grid = persistent_programs(props, _grids[key], n_rows)
    seed_softmax_kernel[(grid,)](y, x, x.stride(0), y.stride(0), n_rows, n_cols, BLOCK_SIZE=block,
                                 num_stages=stages, num_warps=8)
    return y
