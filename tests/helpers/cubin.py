"""Registers per thread and stack frame (where spills go) of a compiled kernel, read from its
cubin's `.nv.info` records without a GPU or CUDA tools: EIATTR_REGCOUNT (0x2f) and
EIATTR_FRAME_SIZE (0x11), each an (ELF symbol index, value) pair of 32-bit words.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_REGCOUNT, _FRAME_SIZE = 0x2F, 0x11
_EIFMT_SVAL, _EIFMT_HVAL = 0x04, 0x03


@dataclass(frozen=True)
class Resources:
    registers: int  # per thread (the largest over the cubin's kernels)
    frame_bytes: int  # stack frame per thread: 0 means nothing spilled to local memory


def _sections(data: bytes):
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not a 64-bit ELF file (cubin)")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    entsize, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * entsize) for i in range(count)]
    names_off = heads[names_index][4]
    for h in heads:
        name_end = data.index(b"\0", names_off + h[0])
        yield data[names_off + h[0]:name_end].decode(), data[h[4]:h[4] + h[5]]


def _records(info: bytes):
    """(attribute, value bytes) of an .nv.info section."""
    p = 0
    while p + 2 <= len(info):
        fmt, attr = info[p], info[p + 1]
        if fmt == _EIFMT_SVAL:
            size = struct.unpack_from("<H", info, p + 2)[0]
            yield attr, info[p + 4:p + 4 + size]
            p += 4 + size
        elif fmt == _EIFMT_HVAL:
            yield attr, info[p + 2:p + 4]
            p += 4
        else:
            p += 2


def resources(cubin: bytes) -> Resources:
    """Registers and stack frame of the kernels in `cubin` (the largest of each)."""
    regs = frame = 0
    found = False
    for name, body in _sections(cubin):
        if not name.startswith(".nv.info"):
            continue
        for attr, value in _records(body):
            if attr in (_REGCOUNT, _FRAME_SIZE) and len(value) >= 8:
                number = struct.unpack_from("<I", value, 4)[0]
                if attr == _REGCOUNT:
                    regs, found = max(regs, number), True
                else:
                    frame = max(frame, number)
    if not found:
        raise ValueError("no register count in this cubin (.nv.info EIATTR_REGCOUNT)")
    return Resources(regs, frame)
