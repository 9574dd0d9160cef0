"""The logsumexp and merge_states kernels (`_triton_common/logsumexp.py`: lse_kernel,
`_triton_common/merge_states.py`: merge_kernel) compile ahead of
time for Hopper (sm_90) and CDNA3 (gfx942) in the variants the backends launch, without
spilling to local memory on sm_90, and rounding float64 to 16-bit outputs through float32 as
the interpreter does. Nothing runs: results are checked through the interpreter
(tests/api/test_lse_merge.py) and the kit; this proves the real compiler accepts the kernels.
Compiled in a subprocess: this suite sets TRITON_INTERPRET=1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton.backends

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = r'''
import json, re, sys
import triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from anysoftmax.backends._triton_common.logsumexp import lse_kernel
from anysoftmax.backends._triton_common.merge_states import merge_kernel

def sig(fn, types, consts):
    return {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}

target = {"sm_90": GPUTarget("cuda", 90, 32), "gfx942": GPUTarget("hip", "gfx942", 64)}[sys.argv[1]]
out = []
lse_types = dict(x_ptr="*bf16", o_ptr="*fp32", m_ptr="*u8", s_ptr="*fp32", r_ptr="*fp32", scale_hi="fp32",
                 scale_lo="fp32", cap_hi="fp32", cap_lo="fp32")
plain = dict(ACC_FP64=False, BLOCK_M=1, BLOCK_N=4096, CHUNKS=1, HAS_SCALE=False, HAS_CAP=False, MASK=0,
             CAUSAL=False, HAS_SINK=False, PRECISE=False, HAS_ROW_SCALE=False)
everything = dict(plain, BLOCK_M=4, BLOCK_N=512, CHUNKS=4, HAS_SCALE=True, HAS_CAP=True, MASK=1, CAUSAL=True,
                  HAS_SINK=True, PRECISE=True)
additive = dict(plain, BLOCK_M=2, BLOCK_N=1024, MASK=2, ACC_FP64=True)
for name, c, types in (("lse plain", plain, lse_types), ("lse everything", everything, lse_types),
                       ("lse everything, row scale", dict(everything, HAS_ROW_SCALE=True), lse_types),
                       ("lse additive fp64", additive, dict(lse_types, x_ptr="*fp64", o_ptr="*fp64", m_ptr="*fp64"))):
    k = triton.compile(ASTSource(lse_kernel, sig(lse_kernel, types, c), c), target=target,
                       options=dict(num_warps=8))
    out.append(dict(kernel=name, spills="st.local" in k.asm.get("ptx", "")))
m_types = {f"o{i}": "*bf16" for i in range(8)} | {f"l{i}": "*fp32" for i in range(8)} | dict(out_ptr="*bf16",
                                                                                           lse_ptr="*fp32")
for K, wide in ((1, False), (2, False), (8, False), (2, True)):
    c = dict(K=K, ACC_FP64=False, BLOCK_R=8, BLOCK_D=256, WIDE=wide)
    k = triton.compile(ASTSource(merge_kernel, sig(merge_kernel, m_types, c), c), target=target,
                       options=dict(num_warps=4))
    out.append(dict(kernel=f"merge K={K}{' WIDE' if wide else ''}", spills="st.local" in k.asm.get("ptx", "")))
# float64 lses with bfloat16 outputs: a float64 accumulator rounded to the outputs' dtype.
c = dict(K=2, ACC_FP64=True, BLOCK_R=8, BLOCK_D=256, WIDE=False)
f64_types = m_types | {f"l{i}": "*fp64" for i in range(8)} | dict(lse_ptr="*fp64")
k = triton.compile(ASTSource(merge_kernel, sig(merge_kernel, f64_types, c), c), target=target,
                   options=dict(num_warps=4))
ptx = k.asm.get("ptx", "")
out.append(dict(kernel="merge K=2 fp64 lses bf16 out", spills="st.local" in ptx,
                f64_to_16bit=sorted(set(re.findall(r"cvt\.rn\.b?f16x?2?\.f64", ptx)))))
print(json.dumps(out))
'''


@pytest.mark.parametrize("target,backend", [("sm_90", "nvidia"), ("gfx942", "amd")])
def test_pieces_kernels_compile(target, backend):
    if backend not in triton.backends.backends:
        pytest.skip(f"Triton {triton.__version__} has no {backend!r} backend: cannot compile for {target}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, target], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["kernel"] for r in results] == ["lse plain", "lse everything", "lse everything, row scale",
                                              "lse additive fp64", "merge K=1", "merge K=2", "merge K=8",
                                              "merge K=2 WIDE",
                                              "merge K=2 fp64 lses bf16 out"]
    assert not [r for r in results if r["spills"]], results
    # The compiled kernel rounds float64 to a 16-bit output through float32, as the interpreter
    # does (one code path: tests/api/test_lse_merge.py checks the values through the interpreter).
    assert results[-1]["f64_to_16bit"] == [], results[-1]
