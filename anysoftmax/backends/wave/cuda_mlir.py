"""Rewriting Wave's MLIR (written for AMD GPUs) so that IREE's CUDA backend compiles it.

Two constructs stand in the way, as seen with wave-lang 3.9.1 / IREE 3.9:

1. Wave emits cross-lane reductions as `gpu.shuffle xor %v, %off, %w : vector<1xf32>`. The
   NVVM lowering only handles scalar shuffles, so each becomes extract -> scalar shuffle ->
   broadcast (the same value, one lane at a time: no change in what is computed).
2. Block reductions synchronise the waves with `amdgpu.lds_barrier`, an AMD-only op; on CUDA
   it is the workgroup barrier `gpu.barrier` (bar.sync), which also orders shared memory.

Anything else AMD-specific left in the text is an error here rather than an obscure failure
inside iree-compile. Pure text processing; no Wave or IREE import.
"""

from __future__ import annotations

import re

_VALUE = r"%[\w.$-]+"
_VECTOR_SHUFFLE = re.compile(
    rf"^(?P<indent>\s*)(?P<result>{_VALUE}), (?P<valid>{_VALUE}) = gpu\.shuffle\s+(?P<mode>\w+)\s+"
    rf"(?P<value>{_VALUE}), (?P<offset>{_VALUE}), (?P<width>{_VALUE})\s*:\s*vector<1x(?P<type>\w+)>\s*$")
_AMD_OP = re.compile(r"\b(amdgpu|rocdl)\.[\w.]+")


class CudaRewriteError(ValueError):
    """Wave's MLIR contains something the CUDA rewrite does not handle."""


def to_cuda(mlir: str) -> str:
    """`mlir` with vector shuffles scalarised and AMD barriers replaced (see the module doc)."""
    out: list[str] = []
    count = 0
    for line in mlir.splitlines():
        m = _VECTOR_SHUFFLE.match(line)
        if m:
            count += 1
            g = m.groupdict()
            ind, ty, name = g["indent"], g["type"], f"%cuda_shuffle{count}"
            out.append(f"{ind}{name}_in = vector.extract {g['value']}[0] : {ty} from vector<1x{ty}>")
            out.append(f"{ind}{name}_out, {g['valid']} = gpu.shuffle {g['mode']} {name}_in, "
                       f"{g['offset']}, {g['width']} : {ty}")
            out.append(f"{ind}{g['result']} = vector.broadcast {name}_out : {ty} to vector<1x{ty}>")
            continue
        if "gpu.shuffle" in line and "vector<" in line:
            raise CudaRewriteError(f"unsupported vector shuffle for CUDA: {line.strip()}")
        line = line.replace("amdgpu.lds_barrier", "gpu.barrier")
        amd = _AMD_OP.search(line)
        if amd:
            raise CudaRewriteError(f"AMD-specific op {amd.group(0)} has no CUDA rewrite: {line.strip()}")
        out.append(line)
    return "\n".join(out) + "\n"
