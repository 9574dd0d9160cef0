"""triton-ascend's compiler front end, run on a CPU without CANN, and a check of how it lowers
every load of a kernel.

triton-ascend 3.2.0 compiles in three stages (triton/backends/ascend/compiler.py): `ttir`
(Triton's own passes), `ttadapter` (its bundled `triton-adapter-opt` binary lowers TTIR to
linalg/memref: `--triton-to-unstructure ... --triton-to-linalg`) and `npubin` (CANN's
bishengir-compile). The first two need no NPU and no CANN; this module runs them exactly as
`JITFunction.run` would on an NPU (same binder, same specialisation of integer arguments,
same options) and stops before `npubin`.

How a load lowers, in the `ttadapter` output:

* bounded (structured): `memref.reinterpret_cast` of the argument to the tile's shape, then a
  `memref.subview` whose sizes are clamped by the mask (`arith.minsi`), then `memref.copy`:
  only the elements inside the tensor are transferred.
* unbounded ("unstructured", from offsets the adapter cannot express as base + strides, e.g.
  div/mod row offsets): an `scf.for ... {ExtractedLoadOrStore}` copies the full static width
  of every row (`memref.copy` straight from the `reinterpret_cast`), and the mask is applied
  afterwards by an `arith.select {DiscreteMemAccess}`: masked lanes are still read from
  memory (an SMMU fault on the NPU past the end of the tensor, triton-ascend#2332).
* element-wise gathers (`memref.load` / `tensor.extract` from an argument in a loop) are
  unbounded as well.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# triton-ascend's NPU target; the arch string only reaches the npubin stage, never run here.
NPU_ARCH = "Ascend910B3"


def compile_ttadapter(kernel, args: tuple, kwargs: dict) -> str:
    """The `ttadapter` (linalg/memref) text of `kernel` specialised for `args`/`kwargs` (CPU
    tensors stand in for NPU tensors: only dtype and alignment matter to the binder)."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend

    backend = make_backend(GPUTarget("npu", NPU_ARCH, 0))
    if kernel.binder is None:
        kernel.create_binder(backend)
    bound, sig_and_spec, _, _, _ = kernel.binder(*args, **kwargs)
    options = backend.parse_options(kwargs)
    sigkeys = [kernel.params[i].name for i in kernel.non_constexpr_indices]
    signature = {k: ("*i8" if v == "none" else v) for k, v in zip(sigkeys, sig_and_spec[:len(sigkeys)])}
    values = tuple(bound.values())
    attrs = backend.get_attrs_descriptor(kernel.params, values)
    const_params = attrs.get_constants()
    constants = {p.name: v for v, p in zip(values, kernel.params)
                 if p.is_constexpr or p.num in const_params or v is None}
    src = ASTSource(kernel, signature, constants, attrs)
    metadata = {"hash": "frontend-check", "target": backend.target, **options.__dict__}
    stages: dict = {}
    backend.add_stages(stages, options)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(options, backend.get_codegen_implementation(), backend.get_module_map(), context)
    module = stages["ttir"](module, metadata)
    return stages["ttadapter"](module, metadata)


@dataclass(frozen=True)
class Lowering:
    """How the front end lowered a kernel's memory accesses."""

    unbounded: tuple[str, ...]  # one line per unbounded access (or marker), empty when all bounded
    bounded_copies: int  # copies whose sizes are clamped by a subview

    @property
    def ok(self) -> bool:
        return not self.unbounded


_LOC = re.compile(r"\s*loc\([^()]*(\([^()]*\))?[^()]*\)")
_DEF = re.compile(r"^\s*(%[\w.]+)(?::\d+)?\s*=\s*([\w.]+)")


def classify(text: str) -> Lowering:
    """Find the unbounded accesses in `ttadapter` text (see the module docstring)."""
    lines = [_LOC.sub("", line) for line in text.splitlines()]
    defs: dict[str, str] = {}
    for line in lines:
        m = _DEF.match(line)
        if m:
            defs[m.group(1)] = m.group(2)
    func = next((ln for ln in lines if "func.func" in ln), "")
    args = set(re.findall(r"(%arg\d+): memref<", func))
    bad: list[str] = []
    bounded = 0
    for line in lines:
        s = line.strip()
        if "ExtractedLoadOrStore" in s or "DiscreteMemAccess" in s:
            bad.append(s)
            continue
        m = re.match(r"memref\.copy\s+(%[\w.]+),", s)
        if m:
            op = defs.get(m.group(1), "")
            if op == "memref.reinterpret_cast":
                bad.append(s)  # full static tile copied from global memory, no clamp
            elif op == "memref.subview":
                bounded += 1
            continue
        m = re.search(r"(?:memref\.load|tensor\.extract)\s+(%[\w.]+)\[", s)
        if m and (m.group(1) in args or defs.get(m.group(1)) == "memref.reinterpret_cast"):
            bad.append(s)
    return Lowering(tuple(bad), bounded)
