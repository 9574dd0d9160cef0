"""The one-read sharded softmax (`anysoftmax.distributed.one_read`, the kernel
`backends/_triton_common/sharded.py`) without GPUs.

* The mailbox protocol, run: 2 and 3 processes, each a "rank" running the kernel through the
  Triton interpreter on its CPU shard, their mailboxes one shared-memory tensor that every
  process maps (the role NVLink and symmetric memory play on GPUs). Each rank calls several
  times in a row (the epochs move on, the mailbox halves alternate) with fresh data each time,
  uneven and empty shards and rows of many chunks; rank 0 checks every call's gathered result
  and the global lse against the float64 softmax of the whole rows.
* The sharded kernel compiles for sm_90 in its three phases, with the memory operations its
  protocol needs: a system-scope 64-bit exchange to publish, volatile 64-bit loads to wait.
* Which calls take the path: the refusals, each with its reason, and the mailbox's epochs.

What this does not prove: that two GPUs exchange through NVLink (benchmarks/one_read_smoke.py
and the conformance kit over NCCL, on two GPUs: docs/speed.md), nor the one-launch form's
row barrier across a GPU's programs: the interpreter runs programs one after another, so it
takes the one-launch form (PHASE 0) only for shard rows of one chunk.
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch

TRITON_MISSING = None
try:
    import triton  # noqa: F401
except ImportError as exc:  # pragma: no cover - the test extra installs it
    TRITON_MISSING = f"triton is not installed ({exc})"

# (name, leading dims, shard lengths, dtype, keywords; "tuning": triton tuning overrides). A
# shard row of one chunk takes the one-launch form (PHASE 0, with or without the prefetch of
# the next item), one of many chunks the two-launch form.
CASES = [
    ("plain-uneven", (3, 4), [7, 10], torch.float32, {}),
    ("three-ranks-empty-shard", (5,), [6, 0, 11], torch.float32, {"log": True}),
    ("bf16-scale-sinks", (2, 3), [9, 8], torch.bfloat16, {"scale": 0.6, "sinks": True}),
    ("fp16-softcap-mask", (4,), [5, 12], torch.float16, {"softcap": 3.0, "mask": True}),
    ("log-fp16-prefetch", (7,), [3, 12], torch.float16, {"log": True, "tuning": {"sharded_prefetch_16bit": True}}),
    ("many-chunks", (3,), [70, 45], torch.float32,
     {"tuning": {"split_chunk_bytes": 64, "split_min_chunk_elems": 1}, "sinks": True}),
    ("specials-no-prefetch", (4,), [8, 8], torch.float32,
     {"special": True, "sinks": True, "tuning": {"sharded_prefetch_32bit": False}}),
]
CALLS = 3


def _global(case, call: int):
    """Every rank's copy of call `call`'s global operands (x, mask, sinks), from one seed."""
    name, rows, sizes, dtype, kw = case
    seed = os.environ.get("ANYSOFTMAX_TEST_SEED", "0")
    g = torch.Generator().manual_seed(zlib.crc32(f"{name} {call} {seed}".encode()))
    n = sum(sizes)
    x = (torch.randn(*rows, n, generator=g) * 3).to(dtype)
    if kw.get("special"):
        x = x.clone()
        x.view(-1, n)[0, 1] = float("nan")  # (on rank 0's shard: NaN everywhere in that row)
        x.view(-1, n)[1, n - 1] = float("inf")  # (on the last rank's: NaN everywhere in that row)
        x.view(-1, n)[2, : sizes[0]] = float("-inf")  # (rank 0 holds nothing of that row)
    mask = torch.randn(*rows, n, generator=g).to(dtype) if kw.get("mask") else None
    sinks = torch.randn(*rows, 1, generator=g) if kw.get("sinks") else None
    return x, mask, sinks


def _rank(rank: int, world: int, words_all, cap: int, cases, out: str) -> None:
    from anysoftmax.backends.triton import heuristics
    from anysoftmax.distributed.functions import Call
    from anysoftmax.distributed.mailbox import Mailbox
    from anysoftmax.distributed.one_read import sharded_softmax

    peers = torch.tensor([words_all[r].data_ptr() for r in range(world)], dtype=torch.int64)
    box = Mailbox(words_all[rank], peers, cap, world)
    results = {}
    for case in cases:
        name, rows, sizes, dtype, kw = case
        lo = sum(sizes[:rank])
        got = []
        for call in range(CALLS):
            x, mask, sinks = _global(case, call)
            xs = x[..., lo:lo + sizes[rank]]
            ms = None if mask is None else mask[..., lo:lo + sizes[rank]]
            c = Call(x.dim() - 1, kw.get("log", False), kw.get("scale"), kw.get("softcap"), "zero", False, None, None,
                     rank, world, True)
            with heuristics.override(**kw.get("tuning", {})):
                y, st = sharded_softmax(xs, ms, sinks, c, box)
            got.append((y, st.lse))
        results[name] = got
    torch.save(results, f"{out}.{rank}")


def _run_ranks(world: int, cases, tmp_path) -> list[dict]:
    # (spawned, not forked: a fork of the test process, whose other tests started threads, can
    # crash in the child)
    from anysoftmax.testing.distributed import run_ranks

    cap = 64
    words_all = torch.zeros(world, 2 * cap * world, dtype=torch.int64).share_memory_()
    out = str(tmp_path / "ranks")
    run_ranks(_rank, world, (world, words_all, cap, cases, out), 300)
    return [torch.load(f"{out}.{r}") for r in range(world)]


def _reference(case, call: int):
    """(softmax or log_softmax of the whole rows, their lse), the float64 reference of the fused
    family (`core.reference.fused_forward`, `core.lse_merge.logsumexp_formula`)."""
    from anysoftmax.core.lse_merge import logsumexp_formula
    from anysoftmax.core.reference import fused_forward
    from anysoftmax.core.variant import build

    name, rows, sizes, dtype, kw = case
    x, mask, sinks = _global(case, call)
    dim = x.dim() - 1
    v, _ = build(tuple(x.shape), x.device, dim, scale=kw.get("scale"), mask=mask, softcap=kw.get("softcap"),
                 sinks=sinks)
    y, _ = fused_forward(x, v, dim, kw.get("log", False), mask, sinks, torch.float64)
    return y, logsumexp_formula(x, v, dim, mask, sinks, torch.float64)


def _check(case, ranks: list[dict]) -> None:
    from anysoftmax.core.spec import TOLERANCES

    name, rows, sizes, dtype, kw = case
    tol = TOLERANCES[dtype]
    atol = max(tol.atol, tol.rtol) if kw.get("log") else tol.atol
    for call in range(CALLS):
        want, want_lse = _reference(case, call)
        got = torch.cat([r[name][call][0] for r in ranks], -1).double()
        assert got.shape == want.shape, (name, call)
        same_nan = got.isnan() == want.isnan()
        assert bool(same_nan.all()), f"{name} call {call}: NaN where the reference has none, or the reverse"
        ok = want.isnan() | ((got - want).abs() <= atol + tol.rtol * want.abs())
        assert bool(ok.all()), f"{name} call {call}: max error {float((got - want)[~want.isnan()].abs().max()):.3e}"
        for r in ranks:
            lse = r[name][call][1]
            if kw.get("sinks"):
                assert lse is not None and lse.dtype == torch.float32
                # (the normaliser of a row whose softmax is NaN: NaN, where the lse of +inf is +inf)
                close = ((lse.double() - want_lse).abs() <= 1e-5 * (1 + want_lse.abs())) | \
                    (lse.isnan() & want.isnan().any(-1, keepdim=True))
                assert bool(close.all()), f"{name} call {call}: the global lse {lse} against {want_lse}"
            else:
                assert lse is None


pytestmark = pytest.mark.skipif(TRITON_MISSING is not None, reason=TRITON_MISSING or "")


@pytest.mark.parametrize("world", [2, 3])
def test_mailbox_protocol_through_the_interpreter(world, tmp_path):
    from anysoftmax.backends._triton_common import interpreter

    if not interpreter.interpreting():
        pytest.skip("the ranks here run the kernel on CPU tensors through the Triton interpreter (TRITON_INTERPRET=1)")
    cases = []
    for name, rows, sizes, dtype, kw in CASES:
        if len(sizes) != world:  # (spread over `world` ranks: cut the row anew, an empty shard kept empty)
            n = sum(sizes)
            cut = [n // world] * (world - 1)
            sizes = [*cut, n - sum(cut)] if 0 not in sizes else [0, *[n // (world - 1)] * (world - 2),
                                                                   n - n // (world - 1) * (world - 2)]
        cases.append((name, rows, sizes, dtype, kw))
    ranks = _run_ranks(world, cases, tmp_path)
    for case in cases:
        _check(case, ranks)


COMPILE = r'''
import json
import triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from anysoftmax.backends._triton_common.sharded import sharded_split_kernel as k

types = dict(x_ptr="*bf16", y_ptr="*bf16", m_ptr="*bf16", s_ptr="*fp32", lse_ptr="*fp32", stats_ptr="*fp32",
             count_ptr="*i32", words_ptr="*i64", peers_ptr="*i64", scale_hi="fp32", scale_lo="fp32", cap_hi="fp32",
             cap_lo="fp32")
out = []
for phase in (0, 1, 2):
    c = dict(LOG=False, WIDE_COLS=False, CHUNK=8192, G_POW2=8, W_POW2=4, PHASE=phase, PREFETCH=phase == 0,
             HAS_SCALE=True, HAS_CAP=True, MASK=2, HAS_SINK=True, WRITE_LSE=True, PRECISE=False)
    sig = {n: "constexpr" if n in c else types.get(n, "i32") for n in k.arg_names}
    ptx = triton.compile(ASTSource(k, sig, c), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=8)).asm["ptx"]
    out.append(dict(phase=phase, publish=ptx.count("atom.global.sys.relaxed.exch.b64"),
                    wait=ptx.count("ld.volatile.global.b64"), spills="st.local" in ptx))
print(json.dumps(out))
'''


def test_sharded_kernel_compiles_for_sm90_with_its_protocol():
    from helpers.sm90 import compile_script_json

    got = {d["phase"]: d for d in compile_script_json(COMPILE)}
    # PHASE 0 publishes and waits, PHASE 1 only publishes, PHASE 2 only waits.
    assert got[0]["publish"] >= 1 and got[0]["wait"] >= 1, got[0]
    assert got[1]["publish"] >= 1 and got[1]["wait"] == 0, got[1]
    assert got[2]["publish"] == 0 and got[2]["wait"] >= 1, got[2]
    assert not any(d["spills"] for d in got.values()), got


def _call(**kw):
    from anysoftmax.distributed.functions import Call

    base = dict(dim=1, log=False, scale=None, softcap=None, empty_rows="zero", keepdim=False, backend=None, group=None,
                rank=0, world=2, eager=True)
    return Call(**{**base, **kw})


@pytest.mark.parametrize("what,kw,x,mask,reason", [
    ("one rank", dict(world=1), "cpu32", None, "one rank"),
    ("a CPU shard", {}, "cpu32", None, "NVIDIA GPUs"),
    ("an explicit other backend", dict(backend="torch"), "meta32", None, "backend='torch'"),
    ("float64", {}, "meta64", None, "float64"),
    ("a bool mask", {}, "meta32", "bool", "bool mask"),
    ("traced", dict(eager=False), "meta32", None, "torch.compile"),
])
def test_refusals_name_their_reason(monkeypatch, what, kw, x, mask, reason):
    from anysoftmax.distributed import one_read

    monkeypatch.setattr(one_read, "ENABLED", True)
    device = "cpu" if x.startswith("cpu") else "meta"
    t = torch.empty(2, 8, dtype=torch.float64 if x.endswith("64") else torch.float32, device=device)
    m = None if mask is None else torch.zeros(2, 8, dtype=torch.bool, device=device)
    if device == "meta":  # (stands in for a CUDA tensor: the checks read the device type first)
        monkeypatch.setattr(one_read, "_is_nvidia", lambda t: True)
    why = one_read.refusal(t, m, _call(**kw))
    assert why is not None and reason in why, (what, why)


@pytest.mark.parametrize("env,backend,refused", [
    ("torch", None, "$ANYSOFTMAX_BACKEND='torch'"),  # the environment's choice is explicit
    (" cute ", None, "$ANYSOFTMAX_BACKEND='cute'"),
    ("torch", "triton", None),  # backend= comes first, as in every other call
    ("triton", None, None),
    ("", None, None),  # (unset: the automatic choice)
])
def test_a_backend_named_by_the_environment_is_explicit_here_too(monkeypatch, env, backend, refused):
    """$ANYSOFTMAX_BACKEND is an explicit choice everywhere (core.registry): a call it sends to
    another backend never launches the triton backend's one-read kernel."""
    from anysoftmax.distributed import one_read

    monkeypatch.setattr(one_read, "ENABLED", True)
    monkeypatch.setattr(one_read, "_is_nvidia", lambda t: True)  # (a meta tensor stands for a CUDA one)
    monkeypatch.setattr(one_read, "_symmetric_memory_missing", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setenv("ANYSOFTMAX_BACKEND", env)
    why = one_read.refusal(torch.empty(2, 8, device="meta"), None, _call(backend=backend))
    assert why == refused if refused is None else (why is not None and refused in why), why


def test_the_switch_turns_the_path_off(monkeypatch):
    from anysoftmax.distributed import one_read

    monkeypatch.setattr(one_read, "ENABLED", False)
    assert one_read.ENV in one_read.refusal(torch.empty(2, 8), None, _call())


def test_mailbox_epochs_alternate_halves_and_are_checked():
    from anysoftmax.distributed.mailbox import MAX_EPOCH, Mailbox

    box = Mailbox(torch.zeros(2 * 5 * 3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), 5, 3)
    assert [box.next_call() for _ in range(3)] == [(1, 15), (2, 0), (3, 15)]
    box.epoch = MAX_EPOCH
    with pytest.raises(RuntimeError, match="ANYSOFTMAX_SHARDED_ONE_READ=0"):
        box.next_call()
    with pytest.raises(ValueError, match="words"):
        Mailbox(torch.zeros(4, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), 5, 3)
    with pytest.raises(ValueError, match="peers"):
        Mailbox(torch.zeros(30, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), 5, 3)
