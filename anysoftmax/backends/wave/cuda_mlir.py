"""Rewriting Wave's MLIR (written for AMD GPUs) for IREE's CUDA backend (wave-lang 3.9.1, IREE 3.9):
vector cross-lane shuffles (`gpu.shuffle xor ... : vector<1xf32>`, which the NVVM lowering does not
take) become extract -> scalar shuffle -> broadcast, and `amdgpu.lds_barrier` becomes the workgroup
barrier `gpu.barrier`. Any other AMD-specific op is an error here rather than inside iree-compile.
Pure text processing.
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
