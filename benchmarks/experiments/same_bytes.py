"""The same-bytes copy the session-6 probes time each kernel against (half the bytes read, half
written), as `anysoftmax bench`'s `peer:copy` does, and the bytes a causal row's kernel moves."""

import torch
from triton.testing import do_bench


def copy_ms(nbytes: float) -> float:
    """Median ms of copying nbytes / 2 bytes into another nbytes / 2 on the current GPU."""
    half = int(nbytes) // 2
    src = torch.empty(2 * half, dtype=torch.uint8, device="cuda")
    return do_bench(lambda: src[half:].copy_(src[:half]), return_mode="median")


def causal_bytes(x: torch.Tensor, backward: bool) -> float:
    """Bytes a causal softmax of square scores `x` moves: the kept triangle of x (backward: of y
    and dy) read, all of y (dx) written."""
    S = x.shape[-1]
    kept = (S * (S + 1) // 2) / (S * S)
    n, e = x.numel(), x.element_size()
    return (2 if backward else 1) * n * e * kept + n * e
