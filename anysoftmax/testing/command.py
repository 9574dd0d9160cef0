"""`anysoftmax conformance NAME [--plugin MODULE] [--device D] [--quick] [--seed N] [--fuzz N]`: the kit on
the command line, with the exit statuses of `EXIT_STATUSES`."""

from __future__ import annotations

import contextlib
import sys
import warnings

from .target import UsageError, load_plugin

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3
EXIT_STATUSES = (
    f"{EXIT_OK} every check passed (declared refusals are skips); "
    f"{EXIT_FAILED} a check failed, or every case was refused (nothing was proven); "
    f"{EXIT_USAGE} bad usage (an unknown backend, a plugin that does not import, a device that is not here); "
    f"{EXIT_UNAVAILABLE} the backend is not available here (its is_available() reason; nothing was checked)")


def check_device(device: str) -> str:
    """`device` when torch can place tensors there, else a UsageError saying why."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise UsageError(f"--device {device!r}: {exc}") from None
    if dev.type != "cpu":
        module = getattr(torch, dev.type, None)
        try:
            present = module is not None and module.is_available()
        except Exception:  # a broken driver stack: not usable here
            present = False
        if not present:
            raise UsageError(f"--device {device!r}: no {dev.type} device is present here")
    return device


@contextlib.contextmanager
def interpreter_numpy_warnings_ignored():
    """Numpy's floating-point warnings from inside Triton's interpreter, ignored in the block.
    The interpreter runs a kernel's arithmetic in numpy, which warns on overflow, invalid values
    and division by zero where the GPU computes IEEE inf and NaN silently; every result the kit
    checks is compared with the float64 reference, so a wrong inf or NaN still fails its check.
    Warnings raised anywhere else (the backend's own included) are shown as before."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"(overflow|invalid value|divide by zero|underflow) encountered",
                                RuntimeWarning, r"triton\.")
        yield


def run(args) -> int:
    """Run the kit as the parsed `args` ask; print the report; return the exit status."""
    from ..core import registry
    from ..plugins import use_interpreter_if_needed
    from .kit import check_backend

    note = use_interpreter_if_needed()  # before any Triton kernel exists, as `matrix` does
    for plugin in args.plugin or []:
        load_plugin(plugin)
    known = registry.registered()
    if args.backend not in known:
        raise UsageError(f"unknown backend {args.backend!r}{registry.did_you_mean(args.backend, known)}; "
                         f"known backends: {', '.join(known)} "
                         f"(a plugin's backends appear after --plugin MODULE or an installed entry point)")
    device = check_device(args.device) if args.device else None
    reason = registry.unavailable_reason(args.backend)
    if reason is not None:  # not a failure of the backend: it cannot run on this machine
        print(f"anysoftmax conformance: {args.backend!r} is not available here: {reason}; nothing was checked "
              f"(exit status {EXIT_UNAVAILABLE})", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if note:
        print(note)
    try:
        with interpreter_numpy_warnings_ignored():
            report = check_backend(args.backend, device=device, quick=args.quick, seed=args.seed, fuzz=args.fuzz)
    except AssertionError as exc:
        print(str(exc))
        return EXIT_FAILED
    print(report.text())
    return EXIT_OK


def add_parser(sub) -> None:
    """The `conformance` subcommand's arguments."""
    c = sub.add_parser("conformance", help="run the conformance kit on one backend (exit 0 pass, 1 fail, 2 usage, "
                                           "3 not available here)",
                       description="Run the shipped conformance cases (plain and fused-family, NaN-poisoned outputs, "
                                   "float64 reference, gradients, bad input) on one backend. Declared refusals "
                                   "(supports() reasons, the fused-family gate) are skips, never failures.",
                       epilog=f"exit status: {EXIT_STATUSES}.")
    c.add_argument("backend", metavar="NAME", help="a registered backend (see `anysoftmax backends`)")
    c.add_argument("--plugin", action="append", metavar="MODULE[:ATTR]",
                   help="import MODULE first (it registers its backends), or register MODULE:ATTR (a backend "
                        "class, factory or object); repeatable")
    c.add_argument("--device", metavar="D", help="where the inputs live: cpu, cuda, cuda:1, npu:0 (default: the "
                                                  "first accelerator the backend serves that is here, else cpu)")
    c.add_argument("--quick", action="store_true", help="one case of each kind, float32 and bfloat16")
    c.add_argument("--seed", type=int, help="the data's seed (default: random; the report prints it)")
    c.add_argument("--fuzz", type=int, default=0, metavar="N",
                   help="after the cases, N random calls of the call-sequence fuzzer (needs hypothesis); the "
                        "seed replays them too")


__all__ = ["EXIT_STATUSES", "EXIT_UNAVAILABLE", "UsageError", "add_parser", "load_plugin", "run"]
