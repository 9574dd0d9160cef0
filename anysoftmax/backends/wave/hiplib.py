"""Finding libamdhip64.so for IREE's `hip` driver and passing it to IREE (docs/wave.md, "HIP library")."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

LIB = "libamdhip64.so"
FLAG = "--hip_dylib_path"


def search_dirs(env: Mapping[str, str], torch_lib: str | None) -> list[Path]:
    """Folders searched, in order: $ROCM_PATH/lib, /opt/rocm/lib, torch's lib folder."""
    dirs = []
    if env.get("ROCM_PATH", "").strip():
        dirs.append(Path(env["ROCM_PATH"].strip()) / "lib")
    dirs.append(Path("/opt/rocm/lib"))
    if torch_lib:
        dirs.append(Path(torch_lib))
    return dirs


def find_hip_dylib(dirs: Sequence[Path]) -> Path:
    """The first `libamdhip64.so` (or `libamdhip64.so.N`) in `dirs`; FileNotFoundError naming them."""
    for d in dirs:
        exact = d / LIB
        if exact.is_file():
            return exact
        versioned = sorted(d.glob(LIB + ".*")) if d.is_dir() else []
        if versioned:
            return versioned[0]
    raise FileNotFoundError(
        f"{LIB} not found (IREE's hip driver needs it); searched: {', '.join(str(d) for d in dirs)}. "
        f"Set $ROCM_PATH to the ROCm install (its lib/ holds {LIB})")


@lru_cache(maxsize=None)
def configure() -> Path:
    """Find the library and hand it to IREE (once per process, before the first hip device)."""
    import iree.runtime as rt
    import torch

    path = find_hip_dylib(search_dirs(os.environ, str(Path(torch.__file__).parent / "lib")))
    rt.flags.parse_flags(f"{FLAG}={path}")
    return path
