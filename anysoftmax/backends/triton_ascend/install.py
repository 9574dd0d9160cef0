"""Which installed distributions provide the `triton` package (both triton-ascend and stock Triton
install as `triton`, the last overwriting the other's files), and the fix when not triton-ascend alone."""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping

DIST = "triton-ascend"
# Tested together upstream (triton-ascend 3.2.0): in step with requirements-ascend.txt, docs/ascend.md.
PINS = {"triton-ascend": "3.2.0", "torch": "2.7.1", "torch-npu": "2.7.1", "CANN": "8.5.0"}
FIX = ("pip uninstall -y triton triton-ascend && pip install --no-deps --force-reinstall "
       f"triton-ascend=={PINS['triton-ascend']}, then anysoftmax without its dependencies (pip install --no-deps "
       "-e . in a clone, or the wheel): its `triton` extra, or a CUDA build of torch, pulls stock Triton back")
# The whole install order in the message itself (a wheel user has no docs/ folder to look in).
INSTALL_ORDER = (f"install in this order: CANN {PINS['CANN']} (source its set_env.sh), then pip install "
                 f"torch=={PINS['torch']} torch-npu=={PINS['torch-npu']} triton-ascend=={PINS['triton-ascend']} "
                 "pybind11, then anysoftmax with pip install --no-deps (never its `triton` extra: stock Triton "
                 "overwrites triton-ascend)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def triton_owners() -> list[str]:
    """Normalised names of the installed distributions with files in the `triton` package."""
    return sorted({_norm(d) for d in importlib.metadata.packages_distributions().get("triton", [])})


def owner_problem(owners: list[str], versions: Mapping[str, str]) -> str | None:
    """None when triton-ascend alone provides `triton`, else what is wrong and the fix (`versions`)."""
    owners = sorted({_norm(o) for o in owners})
    if owners == [DIST]:
        return None
    if not owners:
        return f"no installed distribution provides the `triton` package; install it: {FIX}"
    if DIST not in owners:
        named = ", ".join(f"{o} {versions.get(o, '?')}" for o in owners)
        return f"triton-ascend is not installed (the `triton` package comes from {named}); replace it: {FIX}"
    others = ", ".join(f"{o} {versions.get(o, '?')}" for o in owners if o != DIST)
    return (f"both triton-ascend {versions.get(DIST, '?')} and {others} installed files into the "
            f"`triton` package (the last one installed overwrote the other's); reinstall: {FIX}")


def version_note(versions: Mapping[str, str]) -> str | None:
    """A note when installed versions differ from the tested pins (not an error: untested)."""
    diffs = [f"{d} {versions[d]} (tested: {PINS[d]})" for d in ("triton-ascend", "torch-npu")
             if versions.get(d) and versions[d].split("+")[0] != PINS[d]]
    return "untested versions: " + ", ".join(diffs) if diffs else None


def installed_versions(names) -> dict[str, str]:
    """Installed version of each distribution in `names` that is installed."""
    out = {}
    for name in names:
        try:
            out[_norm(name)] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def triton_problem() -> str | None:
    """`owner_problem` for this environment."""
    owners = triton_owners()
    return owner_problem(owners, installed_versions([*owners, DIST, "torch-npu"]))
