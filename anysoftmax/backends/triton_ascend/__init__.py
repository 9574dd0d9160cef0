"""`triton_ascend`: the shared persistent Triton kernels on Ascend NPUs through triton-ascend.

Modules: `settings` (tuning table, device profiles, environment), `planning` (grid and
unified-buffer arithmetic, pure), `npu` (torch_npu, CANN and triton-ascend host glue),
`backend` (the backend object).
"""

from .backend import TritonAscendBackend

__all__ = ["TritonAscendBackend"]
