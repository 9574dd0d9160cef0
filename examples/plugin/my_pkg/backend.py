# my_pkg/backend.py: a complete (if slow) backend
import torch

import anysoftmax
from anysoftmax import SoftmaxSpec


class MyBackend:
    name = "mine"
    devices = ("cpu",)  # torch device types it serves ("*": any)
    priority = -10      # below torch (0): never the automatic choice; backend="mine" picks it

    def is_available(self) -> str | None:  # None, or why not ("package X missing")
        return None

    def supports(self, spec: SoftmaxSpec) -> str | None:  # None, or why not
        return None if spec.out_dtype != torch.float64 else "mine: no float64"

    def run(self, x: torch.Tensor, spec: SoftmaxSpec) -> torch.Tensor:
        op = torch.log_softmax if spec.log else torch.softmax  # your kernel here
        return op(x.float(), spec.dim).to(spec.out_dtype)


anysoftmax.register(MyBackend())  # importing the module registers it (`--plugin`, a matrix's `plugins:`)
