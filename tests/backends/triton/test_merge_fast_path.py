"""merge_states' bound launcher (`merge_states.merge_launcher`): after its first launch it calls
Triton's low-level launcher positionally (grid, stream, function, packed metadata, the 18
pointers, the 13 integers, the constexpr tail) and nothing else; a stand-in for that launcher
runs the kernel from exactly those arguments, so results are checked against the float64
reference on operands at new addresses."""

from __future__ import annotations

import pytest
import torch

import anysoftmax
from anysoftmax import dispatch
from anysoftmax.backends._triton_common import merge_states
from anysoftmax.core.lse_merge import merge_formula
from anysoftmax.core.request import MERGE, request_key
from helpers import active_launch_hook

SHAPE = (2, 3, 8)  # [batch, heads, D]: 6 rows, S1 = 3


class _Launcher:
    """Stands in for Triton's generic compiled launcher: records its arguments and runs
    `merge_kernel` (interpreted) on the tensors whose addresses it was given."""

    def __init__(self):
        self.seen, self.tensors = [], None

    def __call__(self, *a):
        self.seen.append(a)
        if self.tensors is None:  # (only recording: the test maps the addresses afterwards)
            return
        ptrs, ints, tail = a[9:27], a[27:40], a[40:]
        k, acc64, br, bd, wide = tail
        merge_states.merge_kernel[(a[0],)](*[self.tensors[p] for p in ptrs], *ints, K=k, ACC_FP64=acc64, BLOCK_R=br,
                                     BLOCK_D=bd, WIDE=wide)


def _merge(outputs, lses, out, lse_out):
    # The public op when the outputs are allocated; vLLM's in-place form (out=, lse_out=) otherwise.
    if out is None:
        return anysoftmax.merge_states(outputs, lses, backend="triton")
    return dispatch.merge_states(outputs, lses, backend="triton", out=out, lse_out=lse_out)


def _operands(k, dtype):
    outputs = [torch.randn(SHAPE, dtype=torch.float64).to(dtype) for _ in range(k)]
    # The lses as vLLM keeps them ([heads, tokens] storage, viewed [tokens, heads]): strides (1, 2).
    lses = [torch.randn(SHAPE[1], SHAPE[0], dtype=torch.float32).t() for _ in range(k)]
    lses[0][0, 1] = float("-inf")  # (a partial of weight 0: it weighs nothing)
    return outputs, lses


@pytest.mark.parametrize("given", [False, True], ids=["allocated", "out="])
@pytest.mark.parametrize("k", [1, 3])
def test_merge_fast_path_passes_what_triton_launch_takes(k, given, monkeypatch):
    launcher = _Launcher()
    allocated = []

    def recording_like(t, dtype):
        allocated.append(torch.empty(t.shape, dtype=dtype, device=t.device))
        return allocated[-1]

    def recording_maker(shape, dtype, device):
        return lambda: recording_like(torch.empty(shape, device=device), dtype)

    monkeypatch.setattr(merge_states, "new_output_like", recording_like)
    monkeypatch.setattr(merge_states, "output_maker", recording_maker)
    dtype = torch.bfloat16

    def outs():
        if not given:
            return None, None
        # out transposed in storage ([heads, batch, D]): row strides (8, 16); lse_out (1, 2).
        return (torch.empty(SHAPE[1], SHAPE[0], SHAPE[2], dtype=dtype).transpose(0, 1),
                torch.empty(SHAPE[1], SHAPE[0]).t())

    outputs, lses = _operands(k, dtype)
    out, lse_out = outs()
    first = _merge(outputs, lses, out, lse_out)  # binds (interpreted)
    run, *_ = dispatch._memo.get(request_key(MERGE, outputs, lses, None, "triton", False, out, None, lse_out))
    assert run.state["how"] == (False, False, False, False)  # one dtype each, shared strides: nothing copied
    launch = run.state["launch"]
    # Worked out by hand: n_rows, D, S1, partials (r0, r1, d), lses (r0, r1), out (r0, r1, d), lse_out;
    # the rows numbered in the operands' order ([batch, heads]), the lses read across their storage.
    y_st, z_st = ((8, 16), (1, 2)) if given else ((24, 8), (3, 1))
    static = (6, 8, 3, 24, 8, 1, 1, 2, *y_st, 1, *z_st)
    tail = (k, False, 4, 8, False)  # K, ACC_FP64, BLOCK_R, BLOCK_D (the interpreter's merge plan), WIDE
    grid = 2
    # The fast path as a GPU process has it after the first (compiling) launch.
    from types import SimpleNamespace
    launch.prime([SimpleNamespace(run=launcher, function="fn", packed_metadata="packed")], (*outputs, *lses, *first),
                 stream_of=lambda index: 7)

    for _ in range(2):  # new operands: only their addresses (and values) change
        outputs, lses = _operands(k, dtype)
        out, lse_out = outs()
        allocated.clear()
        launcher.seen.clear()
        launcher.tensors = None
        got_out, got_lse = _merge(outputs, lses, out, lse_out)
        assert len(allocated) == (0 if given else 2)
        if given:
            assert got_out is out and got_lse is lse_out
        pad = 8 - k
        ptrs = ([t.data_ptr() for t in outputs] + [outputs[0].data_ptr()] * pad + [t.data_ptr() for t in lses]
                + [lses[0].data_ptr()] * pad + [got_out.data_ptr(), got_lse.data_ptr()])
        (args,) = launcher.seen
        assert args == (grid, 1, 1, 7, "fn", "packed", None, None, None, *ptrs, *static, *tail)
        # Run what the launcher was given: the reference in float64.
        launcher.tensors = {t.data_ptr(): t for t in (*outputs, *lses, got_out, got_lse)}
        got_out.fill_(float("nan"))
        got_lse.fill_(float("nan"))
        launcher(*args)
        ref_out, ref_lse = merge_formula([t.double() for t in outputs], [t.double() for t in lses], torch.float64,
                                         torch.float64, torch.float64)
        torch.testing.assert_close(got_out.double(), ref_out, rtol=1e-2, atol=1e-2)  # (bf16 output)
        torch.testing.assert_close(got_lse.double(), ref_lse, rtol=1e-6, atol=1e-6)

    with active_launch_hook(launch.state["fast"]) as active:
        if active:  # an active launch hook needs Triton's own path: the fast path stands aside
            launcher.seen.clear()
            launcher.tensors = None
            outputs, lses = _operands(k, dtype)
            got_out, got_lse = _merge(outputs, lses, out, lse_out)
            assert launcher.seen == []
            ref_out, ref_lse = merge_formula([t.double() for t in outputs], [t.double() for t in lses],
                                             torch.float64, torch.float64, torch.float64)
            torch.testing.assert_close(got_lse.double(), ref_lse, rtol=1e-6, atol=1e-6)


def test_merge_offsets_widen_only_past_int32():
    # merge_kernel's offsets are 32-bit unless an operand's furthest element or the row count
    # passes 2**31 - 1 (meta tensors: the strides alone, no memory).
    small = torch.empty_strided((4, 32, 64), (2048, 64, 1), device="meta")
    lse = torch.empty_strided((4, 32), (1, 4), device="meta")
    assert not merge_states._wide(small, lse, small, lse, rows=128)
    far = torch.empty_strided((2, 32, 64), (2**31, 64, 1), device="meta")
    assert merge_states._wide(far, lse, small, lse, rows=128)
    assert merge_states._wide(small, torch.empty_strided((4, 32), (2**30, 1), device="meta"), small, lse, rows=128)
    assert merge_states._wide(small, lse, small, lse, rows=2**31)
