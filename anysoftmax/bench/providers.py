"""The implementations a benchmark compares, each built lazily: a missing package makes a
provider unavailable (recorded with the reason), never a crash of the run.

Forward providers are built for a reduced `dim` and called as fn(x) -> softmax(x, dim); backward
ones as fn(y, dy) -> dx over the last dim.
"""

from __future__ import annotations

import torch


class Unavailable(Exception):
    """The provider cannot run here (package missing, backend unavailable)."""


def anysoftmax_names() -> list[str]:
    """'anysoftmax' (automatic choice) and 'anysoftmax:<backend>' for every backend that runs CUDA tensors."""
    import anysoftmax
    from anysoftmax.core import SoftmaxSpec

    probe = SoftmaxSpec.from_tensor(torch.empty(2, 2, device="cuda"), 1)
    names = ["anysoftmax"]
    for status in anysoftmax.list_backends():
        if status.available and anysoftmax.get_backend(status.name).supports(probe) is None:
            names.append(f"anysoftmax:{status.name}")
    return names


# "copy" is not a softmax: it moves the same bytes (forward: clone; backward: y + dy, two reads
# and one write) and shows what any kernel can reach on that shape, launch overhead included.
PEERS = ["copy", "torch", "torch.compile", "seed", "liger", "quack"]
REFERENCE_ONLY = {"copy"}


def forward(name: str, dim: int = -1):
    """The forward function of provider `name`, reducing over `dim` of a 2-D input."""
    import anysoftmax

    if name == "anysoftmax":
        return lambda x: anysoftmax.softmax(x, dim)
    if name.startswith("anysoftmax:"):
        backend = name.split(":", 1)[1]
        return lambda x: anysoftmax.softmax(x, dim, backend=backend)
    if name == "copy":
        return lambda x: x.clone()
    if name == "torch":
        return lambda x: torch.softmax(x, dim)
    if name == "torch.compile":
        return torch.compile(lambda x: torch.softmax(x, dim), dynamic=False)
    if dim not in (-1, 1):
        raise Unavailable(f"{name} reduces over the last dim only")
    if name == "seed":
        from .seed import seed_softmax
        return seed_softmax
    if name == "liger":
        try:
            from liger_kernel.ops.softmax import LigerSoftmaxFunction
        except ImportError as exc:
            raise Unavailable(f"liger-kernel not installed ({exc})") from None
        return LigerSoftmaxFunction.apply
    if name == "quack":
        try:
            from quack.softmax import softmax_fwd
        except ImportError as exc:
            raise Unavailable(f"quack-kernels not installed ({exc})") from None
        return softmax_fwd
    raise Unavailable(f"unknown provider {name!r}")


def backward(name: str):
    """The backward function (y, dy) -> dx of provider `name` (softmax over the last dim)."""
    from anysoftmax.api import softmax_backward

    if name == "anysoftmax" or name.startswith("anysoftmax:"):
        backend = None if name == "anysoftmax" else name.split(":", 1)[1]
        return lambda y, dy: softmax_backward(y, dy, -1, backend=backend)
    if name == "copy":
        return lambda y, dy: torch.add(y, dy)
    if name == "torch":
        return lambda y, dy: torch._softmax_backward_data(dy, y, -1, y.dtype)
    if name == "torch.compile":
        return torch.compile(lambda y, dy: torch._softmax_backward_data(dy, y, -1, y.dtype), dynamic=False)
    if name == "liger":
        try:
            from liger_kernel.ops.softmax import _softmax_backward
            from liger_kernel.ops.utils import calculate_settings
        except ImportError as exc:
            raise Unavailable(f"liger-kernel not installed ({exc})") from None

        def liger_backward(y, dy):
            block, warps = calculate_settings(y.shape[-1])  # what its forward would have chosen
            return _softmax_backward(dy, y, block, warps, y.shape[-1] > block)
        return liger_backward
    if name == "quack":
        try:
            from quack.softmax import softmax_bwd
        except ImportError as exc:
            raise Unavailable(f"quack-kernels not installed ({exc})") from None
        return lambda y, dy: softmax_bwd(dy, y)
    raise Unavailable(f"{name} has no backward")
