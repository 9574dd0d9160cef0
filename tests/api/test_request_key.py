"""One request, one key (`core.request`): every operand's alignment is part of the key, a
fused request that normalises to the plain softmax takes the plain path, and the first request
of a process is memoised under the key its second call computes.

Misaligned operands are views one element into a buffer (`buf[1:].view(...)`): on a GPU a
launcher compiled for 16-byte aligned pointers must never be reused for them (issue 34, bug 1);
here, through the interpreter, two such requests must get two memo entries, and both results
must match the float64 reference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import anysoftmax
from anysoftmax import dispatch
from anysoftmax.core.reference import backward_from_output, fused_backward, reference
from anysoftmax.core.request import ALIGN_BYTES, alignment, request_key
from anysoftmax.core.spec import SoftmaxSpec

ROOT = Path(__file__).resolve().parents[2]
SHAPE = (4, 48)


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` whose address is one element past a 16-byte boundary."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype)
    view = buf[1:].view(t.shape)
    view.copy_(t)
    assert alignment(view) != 0
    return view


def _close(out, want64, spec: SoftmaxSpec):
    tol = spec.tolerance
    torch.testing.assert_close(out.double(), want64, atol=tol.atol, rtol=tol.rtol)


def _assert_merged(got, outputs, lses) -> None:
    """(out, lse) of a float32 merge against the float64 reference."""
    from anysoftmax.core.lse_merge import merge_formula

    wo, wl = merge_formula([t.double() for t in outputs], [t.double() for t in lses], torch.float64, torch.float64,
                           torch.float64)
    torch.testing.assert_close(got[0].double(), wo, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1].double(), wl, atol=1e-5, rtol=1e-5)


def _new_entries(call) -> int:
    before = len(dispatch._memo)
    call()
    return len(dispatch._memo) - before


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_backward_grad_alignment_is_in_the_key(backend, gen):
    """The issue's sequence: the same backward request twice with an aligned gradient, then
    with a misaligned one: a new memo entry, and the right gradient."""
    x = torch.randn(SHAPE, generator=gen)
    y = anysoftmax.softmax(x, -1, backend=backend)
    g = torch.randn(SHAPE, generator=gen)
    spec = SoftmaxSpec.from_tensor(y, -1)
    dispatch.refresh()
    for _ in range(2):
        _close(anysoftmax.softmax_backward(y, g, -1, backend=backend), backward_from_output(y, g, -1), spec)
    gm = _misaligned(g)
    assert _new_entries(lambda: anysoftmax.softmax_backward(y, gm, -1, backend=backend)) == 1
    _close(anysoftmax.softmax_backward(y, gm, -1, backend=backend), backward_from_output(y, gm, -1), spec)


@pytest.mark.parametrize("operand", ["x", "mask", "sinks"])
def test_fused_forward_operand_alignment_is_in_the_key(operand, gen):
    x = torch.randn(SHAPE, generator=gen)
    mask = torch.rand(SHAPE, generator=gen) < 0.3
    sinks = torch.randn(SHAPE[0], 1, generator=gen)
    args = dict(x=x, mask=mask, sinks=sinks)

    def call(a):
        return anysoftmax.softmax(a["x"], -1, mask=a["mask"], sinks=a["sinks"], scale=0.7, backend="triton")

    dispatch.refresh()
    call(args)
    moved = dict(args, **{operand: _misaligned(args[operand])})
    assert _new_entries(lambda: call(moved)) == 1
    spec, _ = SoftmaxSpec.from_request(x, -1, fused=dict(mask=mask, sinks=sinks, scale=0.7))
    for a in (args, moved, args):
        _close(call(a), reference(a["x"], spec, mask=a["mask"], sinks=a["sinks"]), spec)


@pytest.mark.parametrize("operand", ["grad", "x", "p_sink"])
def test_fused_backward_operand_alignment_is_in_the_key(operand, gen):
    """The fused backward reads the gradient, the forward's input (softcap) and the sink
    shares: each one's alignment is in the key."""
    x = torch.randn(SHAPE, generator=gen)
    sinks = torch.randn(SHAPE[0], 1, generator=gen)
    a = dispatch.FusedArgs(scale=0.5, softcap=3.0, sinks=sinks)
    y, p = dispatch.forward_fused(x, -1, None, "triton", False, a)
    g = torch.randn(SHAPE, generator=gen)
    ops = dict(grad=g, x=x, p_sink=p)

    def call(o):
        return dispatch.backward_fused(o["grad"], y, o["x"], -1, False, a, o["p_sink"], backend="triton")

    spec, _ = SoftmaxSpec.from_request(y, -1, fused=a.as_kwargs())
    want_dx, want_ds, _ = fused_backward(g.double(), y.double(), x.double(), spec.variant, -1, False, None,
                                         p.double(), torch.float64)
    dispatch.refresh()
    call(ops)
    moved = dict(ops, **{operand: _misaligned(ops[operand])})
    assert _new_entries(lambda: call(moved)) == 1
    for o in (ops, moved, ops):
        dx, ds = call(o)
        _close(dx, want_dx, spec)
        _close(ds, want_ds, spec)


def test_every_operand_changes_the_key_with_its_alignment():
    """`request_key` itself, for every operand position it takes."""
    x, g, m, s, p = (torch.randn(SHAPE), torch.randn(SHAPE), torch.rand(SHAPE) < 0.5, torch.randn(SHAPE[0], 1),
                     torch.randn(SHAPE[0], 1))
    a = dispatch.FusedArgs(mask=m, sinks=s, softcap=2.0)

    def key(**o):
        t = {**dict(x=x, grad=g, mask=m, sinks=s, saved=x, p_sink=p), **o}
        b = a._replace(mask=t["mask"], sinks=t["sinks"])
        return request_key("fused_bwd", t["x"], -1, None, None, False, t["grad"], b, t["saved"], t["p_sink"])

    base = key()
    for name, t in (("x", x), ("grad", g), ("mask", m), ("sinks", s), ("saved", x), ("p_sink", p)):
        assert key(**{name: _misaligned(t)}) != base, name
        assert key(**{name: t.clone()}) == base, name  # a new address, the same alignment
    assert ALIGN_BYTES == 16


@pytest.mark.parametrize("backend", ["triton", "triton_ascend", "torch"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("kwargs", [dict(empty_rows="nan"), dict(empty_rows="uniform"),
                                    dict(empty_rows="nan", causal=False), dict(causal=False)],
                         ids=["nan", "uniform", "nan-causal-False", "causal-False"])
def test_fused_keywords_that_normalise_away_take_the_plain_path(backend, log, kwargs, gen):
    """`empty_rows` without a mask or causal changes nothing: the request is the plain softmax
    (issue 34, bug 2: the Triton backends called the plain launcher with the fused signature)."""
    x = torch.randn(SHAPE, generator=gen, requires_grad=True)
    op = anysoftmax.log_softmax if log else anysoftmax.softmax
    spec = SoftmaxSpec.from_tensor(x, -1, log=log)
    for _ in range(2):  # the first call and the memo hit
        y = op(x, -1, backend=backend, **kwargs)
        _close(y, reference(x, spec), spec)
        g = torch.randn(SHAPE, generator=gen)
        (dx,) = torch.autograd.grad(y, x, g)
        _close(dx, backward_from_output(reference(x, spec), g.double(), -1, log), spec)


def test_first_request_of_a_process_is_memoised_under_its_key():
    """In a fresh process the second identical call of every entry is a memo hit (issue 34,
    bug 5: the first entry was stored under the registry generation read before the backends
    loaded)."""
    code = (
        "import torch, anysoftmax; from anysoftmax import dispatch\n"
        "x = torch.randn(4, 8); m = torch.rand(4, 8) < 0.3\n"
        "calls = [lambda: anysoftmax.softmax(x, -1), lambda: anysoftmax.softmax_backward(x, x, -1),\n"
        "         lambda: anysoftmax.softmax(x, -1, mask=m)]\n"
        "out = []\n"
        "for c in calls:\n"
        "    c(); h = dispatch.stats['hits']; c(); out.append(dispatch.stats['hits'] - h)\n"
        "print(out)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[1, 1, 1]", res.stdout


def test_forward_key_is_request_key():
    """The plain forward's fast key is `request_key(FWD, ...)`, the key its miss stores under."""
    from anysoftmax.core.request import FWD, forward_key

    x = torch.randn(SHAPE)
    for args in ((x, -1, None, None, False), (x, 1, torch.float64, "torch", True), (_misaligned(x), 0, None, None, False)):
        assert forward_key(*args) == request_key(FWD, *args)
    assert forward_key(x, 1.0, None, None, False) is None and forward_key([x], 1, None, None, False) is None


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_repeated_pieces_are_memo_hits_and_alignment_is_in_their_key(backend, gen):
    """logsumexp and merge_states through dispatch's one memo: a repeated request is a hit
    (no new entry, the hit counter moves), a request that differs only in an operand's
    alignment or strides is a new entry, and every result matches the float64 reference."""
    from anysoftmax.testing.compare import compare_logsumexp
    from anysoftmax.core.lse_merge import logsumexp_request, merge_formula

    x = torch.randn(SHAPE, generator=gen)
    mask = torch.rand(SHAPE, generator=gen) < 0.3
    dispatch.refresh()

    def lse(t, **kw):
        out = anysoftmax.logsumexp(t, -1, keepdim=True, backend=backend, **kw)
        spec, _ = logsumexp_request(t, -1, **kw)
        c = compare_logsumexp(out, t, spec, kw.get("mask"), kw.get("sinks"))
        assert c.ok, c.detail

    for kw in ({}, {"mask": mask, "scale": 0.5}):
        assert _new_entries(lambda: lse(x, **kw)) == 1
        hits = dispatch.stats["hits"]
        assert _new_entries(lambda: lse(x, **kw)) == 0
        assert dispatch.stats["hits"] == hits + 1
        assert _new_entries(lambda: lse(_misaligned(x), **kw)) == 1
        xt = torch.randn(SHAPE[::-1], generator=gen).t()  # same shape, other strides
        assert _new_entries(lambda: lse(xt, **kw)) == 1
    assert _new_entries(lambda: lse(x, scale=2.0, mask=mask)) == 0  # a new scale value is an argument

    d = 16
    outs = [torch.randn(6, d, generator=gen) for _ in range(3)]
    lses = [torch.randn(6, generator=gen) for _ in range(3)]

    def merge(os_, ls_, **kw):
        o, l = anysoftmax.merge_states(os_, ls_, backend=backend, **kw)
        wo, wl = merge_formula([t.double() for t in os_], [t.double() for t in ls_], torch.float64, torch.float64,
                               torch.float64)
        torch.testing.assert_close(o.double(), wo, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(l.double(), wl, atol=1e-5, rtol=1e-5)

    assert _new_entries(lambda: merge(outs, lses)) == 1
    hits = dispatch.stats["hits"]
    assert _new_entries(lambda: merge(outs, lses)) == 0
    assert dispatch.stats["hits"] == hits + 1
    assert _new_entries(lambda: merge([outs[0], _misaligned(outs[1]), outs[2]], lses)) == 1
    assert _new_entries(lambda: merge(outs, [lses[0], _misaligned(lses[1]), lses[2]])) == 1
    strided = [torch.randn(d, 6, generator=gen).t() for _ in range(3)]
    assert _new_entries(lambda: merge(strided, lses)) == 1
    assert _new_entries(lambda: merge(outs[:2], lses[:2])) == 1  # K is in the key


_MERGE_CHANGES = {"shape": lambda t: torch.randn(t.shape[0] + 1, *t.shape[1:]),
                  "strides": lambda t: torch.randn(t.shape[::-1]).permute(*range(t.dim() - 1, -1, -1)),
                  "dtype": lambda t: t.double(), "alignment": _misaligned,
                  "device": lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta")}


@pytest.mark.parametrize("direction", ["merge", "merge_exact"])
def test_merge_request_tells_every_operand_apart(direction):
    """merge_states' request: a change to any one tensor's shape, strides, dtype, device or
    alignment, to K, or to the optional outputs is told apart, by the key or (`MERGE`, for the
    operands past the first partial and lse) by the guard its memo entry holds
    (`layout_guard`); new tensors of the same layouts and alignments give the same key and pass
    that guard. The exact form (`MERGE_EXACT`) tells every change apart by its key alone."""
    from anysoftmax.core.request import MERGE, layout_guard

    outs = [torch.randn(5, 2, 16) for _ in range(3)]
    lses = [torch.randn(5, 2) for _ in range(3)]

    def key(o, l_, out=None, lse_out=None):
        return request_key(direction, o, l_, None, "triton", False, out, None, lse_out)

    base = key(outs, lses)
    same = layout_guard((*outs, *lses)) if base[0] == MERGE else None

    def told_apart(o, l_):
        return key(o, l_) != base or (same is not None and not same(*o, *l_))

    o2, l2 = [t.clone() for t in outs], [t.clone() for t in lses]
    assert key(o2, l2) == base and (same is None or same(*o2, *l2))
    for name, change in _MERGE_CHANGES.items():
        for i in range(3):
            assert told_apart([*outs[:i], change(outs[i]), *outs[i + 1:]], lses), (name, "outputs", i)
            assert told_apart(outs, [*lses[:i], change(lses[i]), *lses[i + 1:]]), (name, "lses", i)
    assert key(outs[:2], lses[:2]) != base and key(outs[:2], [*lses, lses[0]]) != key(outs, lses[:2] + lses[:2])
    assert key(outs, lses, out=torch.empty(5, 2, 16)) != base and key(outs, lses, lse_out=torch.empty(5, 2)) != base
    # (not a list of tensors: no key, the call is validated every time)
    assert key(outs, [*lses[:2], 1.0]) is None and key(outs[0], lses) is None


def test_merge_hit_with_other_layouts_past_the_first_operand_takes_their_path(gen):
    """A merge request memoised first, then one that differs from it only past the first partial
    and lse (same key): the entry's guard refuses it, so it is bound for its own layouts (strides,
    dtype, alignment) and matches the float64 reference, or, on another device, raises the
    validation's error naming the operand, on every call; the first request still hits after."""

    outs = [torch.randn(6, 2, 8, generator=gen) for _ in range(3)]
    lses = [torch.randn(6, 2, generator=gen) for _ in range(3)]

    def merge(os_, ls_):
        _assert_merged(anysoftmax.merge_states(os_, ls_, backend="triton"), os_, ls_)

    dispatch.refresh()
    merge(outs, lses)
    for name in ("strides", "dtype", "alignment"):
        changed = [lses[0], _MERGE_CHANGES[name](lses[1]).copy_(lses[1]), lses[2]]
        for _ in range(2):  # (the second call: a hit of its own entry)
            merge(outs, changed)
        if name != "dtype":  # (the partials share one dtype: below)
            for _ in range(2):
                merge([outs[0], outs[1], _MERGE_CHANGES[name](outs[2]).copy_(outs[2])], lses)
    refused = {r"outputs\[2\] is torch.float64": ([outs[0], outs[1], outs[2].double()], lses),
               r"lses\[2\] is on meta": (outs, [lses[0], lses[1], torch.empty(6, 2, device="meta")])}
    for message, (os_, ls_) in refused.items():
        for _ in range(2):
            with pytest.raises((TypeError, ValueError), match=message):
                anysoftmax.merge_states(os_, ls_, backend="triton")
    hits = dispatch.stats["hits"]
    assert _new_entries(lambda: merge(outs, lses)) == 0 and dispatch.stats["hits"] == hits + 1


def test_merge_keys_every_operand_where_torch_has_no_layout_guard(monkeypatch, gen):
    """Where torch's tensor guard is missing or fails its probe, merge_states keys every operand
    (`MERGE_EXACT`), its entries hold no guard, and a change past the first partial is a new
    entry."""
    from anysoftmax.core import request

    monkeypatch.setattr(request, "_guard_state", [None])
    outs = [torch.randn(6, 8, generator=gen) for _ in range(2)]
    lses = [torch.randn(6, generator=gen) for _ in range(2)]
    dispatch.refresh()
    assert request_key("merge", outs, lses, None, "torch")[0] == request.MERGE_EXACT
    assert _new_entries(lambda: anysoftmax.merge_states(outs, lses, backend="torch")) == 1
    assert _new_entries(lambda: anysoftmax.merge_states(outs, lses, backend="torch")) == 0
    assert _new_entries(lambda: anysoftmax.merge_states(outs, [lses[0], _misaligned(lses[1])], backend="torch")) == 1
    assert all(v[1] is None for v in dispatch._memo._data.values() if isinstance(v, tuple))


def test_merge_on_two_devices_is_refused_on_every_call():
    """A partial on another device than the rest is never memoised: each call raises the
    validation's error naming it."""
    outs = [torch.randn(4, 8) for _ in range(2)]
    lses = [torch.randn(4), torch.randn(4, device="meta")]
    for _ in range(2):
        with pytest.raises(ValueError, match=r"lses\[1\] is on meta"):
            anysoftmax.merge_states(outs, lses, backend="torch")


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_plain_logsumexp_keys_in_the_plain_form(backend, monkeypatch, gen):
    """A logsumexp without fused keywords is memoised under the plain form of its key (the
    softmax's: no keyword is read on a hit, no `FusedArgs` is built) and stays correct; a call
    with fused keywords keeps its own entry, and so does keepdim=False (its launcher allocates
    the result without dim)."""
    from anysoftmax.testing.compare import compare_logsumexp
    from anysoftmax.core.lse_merge import logsumexp_request
    from anysoftmax.core.request import LSE, LSE_SQUEEZED

    x = torch.randn(SHAPE, generator=gen)
    dispatch.refresh()
    out = anysoftmax.logsumexp(x, -1, backend=backend)
    assert dispatch._memo.get(request_key(LSE_SQUEEZED, x, -1, None, backend)) is not None
    assert dispatch._memo.get(request_key(LSE, x, -1, None, backend)) is None
    assert compare_logsumexp(out.unsqueeze(-1), x, logsumexp_request(x, -1)[0]).ok
    anysoftmax.logsumexp(x, -1, keepdim=True, backend=backend)
    assert dispatch._memo.get(request_key(LSE, x, -1, None, backend)) is not None
    built = []
    monkeypatch.setattr(dispatch, "FusedArgs", lambda *a: built.append(a) or dispatch.FusedArgs(*a))
    for _ in range(2):
        out = anysoftmax.logsumexp(x, -1, keepdim=True, backend=backend)
        assert compare_logsumexp(out, x, logsumexp_request(x, -1)[0]).ok
    assert built == []
    monkeypatch.undo()
    assert _new_entries(lambda: anysoftmax.logsumexp(x, -1, scale=0.5, backend=backend)) == 1


@pytest.mark.gpu
def test_merge_hit_refuses_an_operand_moved_to_the_cpu(gen):
    """On a GPU: a memoised merge of CUDA operands, then the same request with one partial or lse
    on the CPU (same key: the first operands and every alignment unchanged): the entry's guard
    refuses it and the validation names the operand, on every call; the CUDA request still hits
    and matches the float64 reference (the fast path's raw pointers never see a host address)."""
    from anysoftmax.core.lse_merge import merge_formula

    outs = [torch.randn(4, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    lses = [torch.randn(4, 8, device="cuda") for _ in range(3)]
    dispatch.refresh()
    for _ in range(2):
        o, l_ = anysoftmax.merge_states(outs, lses)
    wo, wl = merge_formula([t.double() for t in outs], [t.double() for t in lses], torch.float64, torch.float64,
                           torch.float64)
    torch.testing.assert_close(o.double(), wo, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(l_.double(), wl, atol=1e-5, rtol=1e-5)
    for os_, ls_, name in (([*outs[:2], outs[2].cpu()], lses, r"outputs\[2\] is on cpu"),
                           (outs, [lses[0], lses[1].cpu(), lses[2]], r"lses\[1\] is on cpu")):
        for _ in range(2):
            with pytest.raises(ValueError, match=name):
                anysoftmax.merge_states(os_, ls_)
    hits = dispatch.stats["hits"]
    assert _new_entries(lambda: anysoftmax.merge_states(outs, lses)) == 0 and dispatch.stats["hits"] == hits + 1


def test_forward_proof_tells_every_change_apart():
    """The proof of a repeated plain forward (`forward_proof`) passes a new tensor of the same
    layout and alignment, and refuses what the key holds when it changes: x's shape, strides,
    dtype, device or alignment, dim (and its type), dtype=, backend, log, the process state;
    also a tensor subclass, a gradient requirement and what is no tensor."""
    from anysoftmax.core import registry
    from anysoftmax.core.request import forward_proof

    x = torch.randn(5, 16)
    proves = forward_proof(x, -1, None, "triton", False)
    assert proves(x.clone(), -1, None, "triton", False)
    for name, change in _MERGE_CHANGES.items():
        assert not proves(change(x), -1, None, "triton", False), name
    for args in ((1, None, "triton", False), (-1.0, None, "triton", False), (-1, torch.float64, "triton", False),
                 (-1, None, "torch", False), (-1, None, None, False), (-1, None, "triton", True)):
        assert not proves(x, *args), args
    assert not proves(torch.nn.Parameter(x.clone()), -1, None, "triton", False)
    assert not proves(x.clone().requires_grad_(), -1, None, "triton", False)
    assert not proves([x], -1, None, "triton", False) and not proves(None, -1, None, "triton", False)
    # (two misaligned addresses of different residues are two keys: the proof tells them apart)
    odd = _misaligned(x)
    proves_odd = forward_proof(odd, -1, None, "triton", False)
    assert proves_odd(_misaligned(x), -1, None, "triton", False) and not proves_odd(x, -1, None, "triton", False)
    buf = torch.empty(x.numel() + 2)
    assert not proves_odd(buf[2:].view(x.shape), -1, None, "triton", False)
    generation = registry.current_generation[0]
    try:
        registry.current_generation[0] = generation + 1  # (a backend registered since)
        assert not proves(x, -1, None, "triton", False)
    finally:
        registry.current_generation[0] = generation
    assert forward_proof([x], -1, None, "triton", False) is None and forward_proof(x, 1.0, None, None, False) is None


def test_a_repeated_forward_is_proved_without_its_key(monkeypatch, gen):
    """The last plain forward that hit, repeated with a new tensor of the same layout, is proved
    by its entry's proof: no key is built; every result matches the float64 reference, and a
    call that changes the layout, alignment, dtype, dim or log still takes the key."""
    from anysoftmax.core import request

    x = torch.randn(6, 40, generator=gen)
    spec = SoftmaxSpec.from_tensor(x, -1)
    dispatch.refresh()
    for _ in range(2):  # (a miss, then a key hit: its proof is kept)
        _close(dispatch.forward(x, -1, None, "triton"), reference(x, spec), spec)
    keys = []
    real = dispatch.forward_key
    monkeypatch.setattr(dispatch, "forward_key", lambda *a: keys.append(a) or real(*a))
    hits = dispatch.stats["hits"]
    fresh = torch.randn(6, 40, generator=gen)
    _close(dispatch.forward(fresh, -1, None, "triton"), reference(fresh, spec), spec)
    assert keys == [] and dispatch.stats["hits"] == hits + 1
    changed = {"strides": (torch.randn(40, 6, generator=gen).t(), -1, False),
               "alignment": (_misaligned(x), -1, False), "dtype": (x.double(), -1, False),
               "dim": (x, 0, False), "log": (x, -1, True)}
    for name, (t, dim, log) in changed.items():
        keys.clear()
        got = dispatch.forward(t, dim, None, "triton", log)
        _close(got, reference(t, SoftmaxSpec.from_tensor(t, dim, log=log)), SoftmaxSpec.from_tensor(t, dim, log=log))
        assert keys, name
    assert request.forward_proof is dispatch.forward_proof


def test_merge_proof_tells_every_change_apart():
    """The proof of a repeated merge request (`merge_proof`) passes new tensors of the same
    layouts and alignment, and refuses a change to any one operand's shape, strides, dtype,
    device or alignment, to K, to the backend, to which outputs are given (and their layouts),
    to the process state, and arguments that are not lists of tensors."""
    from anysoftmax.core.request import merge_proof

    outs = [torch.randn(5, 2, 16) for _ in range(3)]
    lses = [torch.randn(5, 2) for _ in range(3)]
    proves = merge_proof(outs, lses, "triton", None, None)
    assert proves([t.clone() for t in outs], [torch.randn(5, 2) for _ in range(3)], "triton", None, None)
    assert not proves(outs, [torch.randn(2, 5).t() for _ in range(3)], "triton", None, None)
    for name, change in _MERGE_CHANGES.items():
        for i in range(3):
            assert not proves([*outs[:i], change(outs[i]), *outs[i + 1:]], lses, "triton", None, None), (name, i)
            assert not proves(outs, [*lses[:i], change(lses[i]), *lses[i + 1:]], "triton", None, None), (name, i)
    assert not proves(outs[:2], lses[:2], "triton", None, None) and not proves(outs, lses[:2], "triton", None, None)
    assert not proves([*outs, outs[0]], [*lses[:2]], "triton", None, None)  # (as many tensors, split otherwise)
    assert not proves(outs, lses, "torch", None, None) and not proves(outs, lses, None, None, None)
    assert not proves(outs, lses, "triton", torch.empty(5, 2, 16), None)
    assert not proves(outs, lses, "triton", None, torch.empty(5, 2))
    assert not proves(outs[0], lses, "triton", None, None) and not proves(outs, [*lses[:2], 1.0], "triton", None, None)
    given = merge_proof(outs, lses, "triton", torch.empty(5, 2, 16), torch.empty(2, 5).t())
    assert given(outs, lses, "triton", torch.empty(5, 2, 16), torch.empty(2, 5).t())
    assert not given(outs, lses, "triton", torch.empty(5, 2, 16), torch.empty(5, 2))  # lse_out's strides
    assert not given(outs, lses, "triton", _misaligned(torch.empty(5, 2, 16)), torch.empty(2, 5).t())
    assert not given(outs, lses, "triton", None, torch.empty(2, 5).t())
    from anysoftmax.core import registry

    generation = registry.current_generation[0]
    try:
        registry.current_generation[0] = generation + 1  # (a backend registered since)
        assert not proves(outs, lses, "triton", None, None)
    finally:
        registry.current_generation[0] = generation
    # A misaligned operand gives no proof (its calls take the key path).
    assert merge_proof([_misaligned(outs[0]), *outs[1:]], lses, "triton", None, None) is None


def test_a_repeated_merge_is_proved_without_its_key_and_changes_still_rebind(gen, monkeypatch):
    """The last plain merge request, repeated, is proved by its entry's proof: no key is built
    and no memo read; every result matches the float64 reference. A call that changes any
    operand's layout, alignment, K or the given outputs still takes the key (a new entry where
    the request is new) and gets the right answer."""

    outs = [torch.randn(6, 2, 8, generator=gen) for _ in range(3)]
    lses = [torch.randn(2, 6, generator=gen).t() for _ in range(3)]

    def merge(os_, ls_, **kw):
        _assert_merged(dispatch.merge_states(os_, ls_, "triton", **kw), os_, ls_)

    dispatch.refresh()
    merge(outs, lses)
    merge(outs, lses)  # (a key hit: its proof is kept)
    keys = []
    real = dispatch.request_key
    monkeypatch.setattr(dispatch, "request_key", lambda *a: keys.append(a[0]) or real(*a))
    hits = dispatch.stats["hits"]
    merge([t.clone() for t in outs], [torch.randn(2, 6, generator=gen).t() for _ in range(3)])
    assert keys == [] and dispatch.stats["hits"] == hits + 1
    changed = {"strides": [lses[0], torch.randn(6, 2, generator=gen), lses[2]],
               "alignment": [lses[0], _misaligned(lses[1]), lses[2]],
               "dtype": [lses[0], lses[1].double(), lses[2]]}
    for name, ls_ in changed.items():
        keys.clear()
        merge(outs, ls_)
        assert keys, name
    for os_, ls_ in (([outs[0], _misaligned(outs[1]), outs[2]], lses), (outs[:2], lses[:2]),
                     ([outs[0], outs[1], torch.randn(2, 6, 8, generator=gen).transpose(0, 1)], lses)):
        keys.clear()
        merge(os_, ls_)
        assert keys
    keys.clear()
    merge(outs, lses, out=torch.empty(6, 2, 8), lse_out=torch.empty(6, 2))
    assert keys
