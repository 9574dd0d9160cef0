"""The Python cost of a cached call, measured on the CPU (issue 34: a cached call at most
torch + 3 us on the H100 host). Runs anywhere, no GPU needed.

The triton backend's launcher is bound for an 8x1024 fp32 request, run once (through the
Triton interpreter), then its fast path is given a no-op in place of Triton's compiled
launcher: every later call walks the whole hit path of a GPU process (api checks, key, memo
lookup, output allocation, argument assembly, stream lookup, launch-hook checks) and stops
where the C launcher would start. merge_states (K=2 and K=8, 1 and 128 tokens of 32 heads x 128
bf16, lses in vLLM's [heads, tokens] layout) likewise, its
bound launcher's fast path around the no-op (a repeat of the last request is proved by its entry's
proof, another request keyed), and logsumexp on a tile plan (8x1024) and a split
plan (2x65536 fp32: 16 chunks a row). Printed: us per call of that path, of its pieces alone, and
of torch's own CPU calls for scale.

    python benchmarks/hit_path_cpu.py [--n 20000]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import anysoftmax  # noqa: E402
from anysoftmax import dispatch  # noqa: E402
from anysoftmax.bench.lse_merge import merge_sets  # noqa: E402
from anysoftmax.core import request as core_request  # noqa: E402


def per_call_us(f, n: int) -> float:
    for _ in range(min(n // 10, 2000)):
        f()
    best = float("inf")
    for _ in range(5):  # best of 5, in this thread's CPU time: the host is shared
        t = time.thread_time()
        for _ in range(n):
            f()
        best = min(best, time.thread_time() - t)
    return best / n * 1e6


def _noop(*args, **kwargs):
    return None


def _engine_launchers(fn, seen=None):
    """Every launch-engine launcher (`launcher.bind_kernel`: it has `prime`) reachable from `fn`
    through closures and `state` dicts."""
    seen = set() if seen is None else seen
    if id(fn) in seen:
        return []
    seen.add(id(fn))
    if hasattr(fn, "prime"):
        return [fn]
    found = []
    state = getattr(fn, "state", None)
    values = list(state.values()) if isinstance(state, dict) else []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:
            continue
    for v in values:
        if callable(v):
            found += _engine_launchers(v, seen)
    return found


class _Compiled:
    """Stands in for a compiled Triton kernel: its `run` is the no-op."""
    run = staticmethod(_noop)
    function = 0
    packed_metadata = ()


def _install_noop(entry, args: tuple) -> int:
    # The fast path as a GPU process has it after the first launch, around the no-op.
    found = _engine_launchers(entry)
    for launch in found:
        launch.prime([_Compiled()] * len(launch.binding.metas), args, stream_of=lambda index: 0)
    return len(found)


def _key_fn():
    fk = getattr(core_request, "forward_key", None)
    if fk is not None:
        return lambda x: fk(x, -1, None, "triton", False)
    return lambda x: core_request.request_key(core_request.FWD, x, -1, None, "triton", False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    n = ap.parse_args().n
    x = torch.randn(8, 1024)
    y = anysoftmax.softmax(x, -1, backend="triton")
    g = torch.randn_like(y)
    anysoftmax.softmax_backward(y, g, -1, backend="triton")
    memo = dispatch._memo
    fwd_key = core_request.request_key(core_request.FWD, x, -1, None, "triton", False)
    bwd_key = core_request.request_key(core_request.BWD, y, -1, None, "triton", False, g)
    assert _install_noop(memo.get(fwd_key)[0], (x, y, None, None, None, None)) == 1, "no forward launcher found to stub"
    assert _install_noop(memo.get(bwd_key), (y, g, y, None, None, None, None)) == 1, "no backward launcher found"
    merges = {}
    for k in (2, 8):
        for tokens in (1, 128):
            # vLLM's layout, as `anysoftmax.bench.lse_merge` times it: partials [tokens, 32, 128] bf16,
            # lses [32, tokens] float32 read as [tokens, 32]
            outs, lses = merge_sets(tokens, 32, 128, k, torch.bfloat16, "cpu", 1)[0]
            out = anysoftmax.merge_states(outs, lses, backend="triton")
            merge_key = core_request.request_key(core_request.MERGE, outs, lses, None, "triton", False, None, None,
                                                 None)
            bound, *_, proof = memo.get(merge_key)
            assert _install_noop(bound, (*outs, *lses, *out)) == 1, "no merge launcher found to stub"
            merges[k, tokens] = (outs, lses, bound, proof)
    long = torch.randn(2, 65536)
    # (keepdim=False, as timed, keys apart from keepdim where the launcher allocates the result's shape)
    lse_direction = getattr(core_request, "LSE_SQUEEZED", core_request.LSE)
    for t in (x, long):
        lse = anysoftmax.logsumexp(t, -1, keepdim=lse_direction is core_request.LSE, backend="triton")
        # (a call without fused keywords keys in the plain form)
        lse_key = core_request.request_key(lse_direction, t, -1, None, "triton")
        if memo.get(lse_key) is None:
            lse_key = core_request.request_key(lse_direction, t, -1, None, "triton", False, None,
                                               dispatch.FusedArgs(None, None, False, None, None))
        assert _install_noop(memo.get(lse_key), (t, lse, None, None, None, None)) == 1, "no logsumexp launcher found"
    key = _key_fn()
    lookup = memo.get
    rows = [
        ("anysoftmax.softmax (hit, no-op launch)", lambda: anysoftmax.softmax(x, -1, backend="triton")),
        ("anysoftmax.softmax_backward (hit, no-op)", lambda: anysoftmax.softmax_backward(y, g, -1, backend="triton")),
        ("  dispatch.forward (no api checks)", lambda: dispatch.forward(x, -1, None, "triton", False)),
        ("  key alone (forward)", lambda: key(x)),
        ("  key alone (backward)", lambda: core_request.request_key(core_request.BWD, y, -1, None, "triton", False, g)),
        ("  key + memo lookup", lambda: lookup(key(x))),
        ("  bound launcher alone (no-op launch)", lambda: memo.get(fwd_key)[0](x)),
        ("  torch.empty_like", lambda: torch.empty_like(x)),
        ("  torch.empty(shape, dtype=, device=)", lambda: torch.empty((8, 1024), dtype=torch.float32, device=x.device)),
        *[row for (k, tokens), (outs, lses, bound, proof) in merges.items() for row in (
            (f"anysoftmax.merge_states K={k} {tokens} tok (hit, no-op)",
             lambda outs=outs, lses=lses: anysoftmax.merge_states(outs, lses, backend="triton")),
            ("  bound merge launcher alone", lambda outs=outs, lses=lses, bound=bound: bound(outs, lses, None, None)),
            ("  proof alone (merge: a repeat of the last request)",
             lambda outs=outs, lses=lses, proof=proof: proof(outs, lses, "triton", None, None)),
            ("  key alone (merge: another request)", lambda outs=outs, lses=lses: core_request.request_key(
                core_request.MERGE, outs, lses, None, "triton", False, None, None, None)))],
        ("anysoftmax.logsumexp 8x1024 (tile, hit, no-op)", lambda: anysoftmax.logsumexp(x, -1, backend="triton")),
        ("anysoftmax.logsumexp 2x65536 (split, hit, no-op)",
         lambda: anysoftmax.logsumexp(long, -1, backend="triton")),
        ("torch.softmax (CPU kernel, for scale)", lambda: torch.softmax(x, -1)),
    ]
    print(f"hit path on the CPU, 8x1024 fp32, best of 5 x {n} calls (thread CPU time); merge_states K x "
          f"[tokens, 32, 128] bf16")
    for name, f in rows:
        print(f"{name:52s} {per_call_us(f, n):7.2f} us/call")


if __name__ == "__main__":
    main()
