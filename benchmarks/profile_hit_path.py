"""Where a repeated request's host time goes (run on a CUDA host, < 60 s): us per call of
anysoftmax's forward and backward hit paths beside torch's calls, then the pieces of the
forward's hit path alone (key, key + lookup, a bare allocation, the bound launcher, the raw
Triton launch with preallocated tensors; the native launcher's call where it is used), then
cProfile. benchmarks/hit_path_cpu.py measures
the Python part of the same path without a GPU."""

import cProfile
import pstats
import time

import torch


def per_call_us(f, n=5000):
    """Best of 3 loops of `n` back-to-back calls, each closed by a synchronize, per call."""
    for _ in range(200):
        f()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            f()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best / n * 1e6


def launch_states(entry):
    """(launch, state) of every launch-engine launcher (`launcher.bind_kernel`) a memoised entry
    holds, found through its closures (and tuples)."""
    todo, seen = [entry], set()
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        if isinstance(fn, tuple):
            todo.extend(fn)
            continue
        state = getattr(fn, "state", None)
        if isinstance(state, dict) and "fast" in state:
            yield fn, state
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                v = cell.cell_contents
            except ValueError:
                continue
            if callable(v) or isinstance(v, tuple):
                todo.append(v)


def raw_triton_launch(state, tensors):
    """Triton's launcher alone, every argument assembled as the fast path calls it (a plan
    without scratch: `tensors` are all its arguments)."""
    fast = state["fast"]
    ptrs = fast.addresses(tensors)
    stream = fast.stream_of(fast.index)
    fn, before, after, _, rest = fast.calls[0]
    return lambda: fn(*before, stream, *after, *ptrs, *rest)


def main():
    import anysoftmax
    from anysoftmax import dispatch
    from anysoftmax.core import request as core_request

    x = torch.randn(8, 1024, device="cuda")
    y = anysoftmax.softmax(x, -1)
    g = torch.randn_like(y)
    anysoftmax.softmax_backward(y, g, -1)
    key = core_request.request_key(core_request.FWD, x, -1, None, None, False)
    entry = (dispatch._memo.get(key) or (None,))[0]  # (the plain forward: (launcher, proof))
    lookup = dispatch._memo.get
    rows = [("anysoftmax forward", lambda: anysoftmax.softmax(x, -1)),
            ("anysoftmax backward", lambda: anysoftmax.softmax_backward(y, g, -1)),
            ("torch.softmax", lambda: torch.softmax(x, -1)),
            ("torch._softmax_backward_data", lambda: torch._softmax_backward_data(g, y, -1, y.dtype)),
            ("  forward key alone", lambda: core_request.forward_key(x, -1, None, None, False)),
            ("  backward key alone", lambda: core_request.request_key(core_request.BWD, y, -1, None, None, False, g)),
            ("  key + memo lookup", lambda: lookup(core_request.forward_key(x, -1, None, None, False))),
            ("  torch.empty(shape, dtype=, device=)",
             lambda: torch.empty((8, 1024), dtype=torch.float32, device=x.device)),
            ("  torch.empty_like", lambda: torch.empty_like(x))]
    if entry is not None and not isinstance(entry, tuple):
        rows.append(("  bound launcher (alloc + launch)", lambda: entry(x)))
        launch, state = next(launch_states(entry), (None, None))
        if state and state["fast"]:
            out = torch.empty_like(x)
            given = (x, out, None, None, None, None)
            rows.append(("  launcher's launch (ptrs, stream, hooks)", lambda: launch(given)))
            rows.append(("  raw Triton launch (C extension)", raw_triton_launch(state, given)))
            native = state["fast"].native
            if native is None:
                print(f"(native launcher: {state['native_reason']})")
            else:
                rows.append(("  native launch (C++, preallocated)", lambda: native(*given)))
        else:
            print("(the forward's launcher has no fast path here: raw launch not timed)")
    for name, f in rows:
        print(f"{name:42s} {per_call_us(f):7.2f} us/call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(5000):
        anysoftmax.softmax(x, -1)
        anysoftmax.softmax_backward(y, g, -1)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
