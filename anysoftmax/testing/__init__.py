"""The conformance kit: prove a backend computes what `torch.softmax` computes, on the cases the
project's own suite uses (as scikit-learn's `check_estimator` is to estimators).

    from anysoftmax.testing import check_backend
    report = check_backend(MyBackend())          # AssertionError naming every failed case
    print(report.summary())

Command line: `anysoftmax conformance NAME [--plugin MODULE] [--device D] [--quick] [--fuzz N]` (exit 0 on
pass, 1 on failures, 2 on bad usage). pytest: `pytest --anysoftmax-backend NAME` adds one test
per check to a suite. The cases are data (`anysoftmax.testing.cases`); `check_forward` and
`check_backward` check one request. Declared refusals (`supports()` reasons, the fused-family
gate) are skips, never failures. `fuzz_backend(backend, calls=N, seed=S)` (or
`check_backend(..., fuzz=N)`) drives random call sequences through every public entry
(`anysoftmax.testing.fuzz`). `check_distributed` (`anysoftmax.testing.distributed`) checks
`anysoftmax.distributed` on every rank of a process group. `check_sampler`
(`anysoftmax.testing.sampling`) checks a sampler against `anysoftmax.sampling`'s definition.
"""

from .checks import check_backward, check_forward
from .distributed import check_distributed
from .kit import Check, KitReport, check_backend, conformance_checks, default_device, registered, run_checks
from .poison import poisoned_allocations
from .sampling import check_sampler

__all__ = ["Check", "FuzzReport", "KitReport", "check_backend", "check_backward", "check_distributed", "check_forward",
           "check_sampler",
           "conformance_checks", "default_device", "fuzz_backend", "poisoned_allocations", "registered", "run_checks"]


def __getattr__(name: str):
    # The fuzzer loads on first use: `python -m anysoftmax.testing.fuzz` must not find it
    # imported already (runpy warns), and the kit itself does not need it.
    if name in ("FuzzReport", "fuzz_backend"):
        from . import fuzz

        return getattr(fuzz, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
