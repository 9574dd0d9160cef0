"""Whether Triton kernels run compiled or through Triton's CPU interpreter: Triton decides when a
kernel is defined (TRITON_INTERPRET=1), so it is decided here once, before any kernel is imported."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

ENV = "TRITON_INTERPRET"
# Triton is an extra: CUDA and ROCm builds of torch bring it, the CPU build does not.
TRITON_EXTRA = "pip install 'anysoftmax[triton]'"


def triton_missing(extra: str = TRITON_EXTRA) -> str | None:
    """Why the `triton` package cannot be imported here, naming what to install (`extra`), or None
    (found without importing it: that would fix the interpreter choice)."""
    try:
        if importlib.util.find_spec("triton") is not None:
            return None
        why = ""
    except (ImportError, ValueError) as exc:  # a finder refused it, or a broken partial install
        why = f" ({type(exc).__name__}: {exc})"
    return f"the `triton` package is not installed{why}: {extra}"


def needs_interpreter() -> bool:
    """True when the kernels run here only interpreted: no CUDA/ROCm GPU, no `torch_npu` (not imported)."""
    import torch

    return not torch.cuda.is_available() and importlib.util.find_spec("torch_npu") is None


def use_interpreter_if_no_device() -> str | None:
    """Set TRITON_INTERPRET=1 where no Triton device is visible, undecided yet; a line saying so, or None."""
    # (too late once Triton is imported: every kernel, its library's too, was defined compiled)
    if ENV in os.environ or "triton" in sys.modules or not needs_interpreter():
        return None
    os.environ[ENV] = "1"
    return ("no GPU or NPU visible: Triton kernels run on the CPU through the Triton interpreter "
            f"({ENV}=1; set {ENV}=0 to keep it off)")


def interpreting() -> bool:
    """True when Triton runs the kernels through its CPU interpreter."""
    from .interpreted_launch import interpreted
    from .rows import softmax_tile_kernel

    return interpreted(softmax_tile_kernel)


def status_note() -> str:
    """A Triton backend's status line when the interpreter is what makes it usable here."""
    return "via the interpreter on CPU (TRITON_INTERPRET=1; slow, for testing)" if interpreting() else ""


@functools.lru_cache(maxsize=None)
def interpreter_problem() -> str | None:
    """Why this machine's Triton interpreter cannot run the kernels, or None: probed once on a tiny
    tensor (some Triton/numpy pairs break it) so that it reads as unavailable, not as wrong."""
    import torch
    import triton

    from ...core.layout import RowLayout
    from .launcher import bind
    from .plan import TilePlan

    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    y = torch.empty_like(x)
    layout = RowLayout.from_strides((2, 3), (3, 1), (3, 1), 1)
    try:
        bind(TilePlan(1, 4, 1), layout, False, torch.float32)((x, y, None, None, None, None))
    except Exception as exc:  # the interpreter's own failure, reported as the reason
        import numpy
        return (f"the Triton {triton.__version__} interpreter fails here with numpy {numpy.__version__} "
                f"({type(exc).__name__}: {exc}); upgrade triton")
    return None if torch.allclose(y, torch.softmax(x, 1)) else \
        f"the Triton {triton.__version__} interpreter computes wrong results on this machine"
