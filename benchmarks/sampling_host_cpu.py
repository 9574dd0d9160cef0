"""The sampler's host cost per call, measured on the CPU with the kernel launches stubbed (issue
47: <= 20 us a call at B = 1). Runs anywhere, no GPU needed.

Each request runs once through the Triton interpreter (the Triton sampler, `backend="triton"`),
then every launch-engine launcher it bound is primed with a no-op in place of Triton's compiled
launcher (as `hit_path_cpu.py` does for softmax): later calls walk the whole host path of a GPU
process (api checks, the request's key and its runner, the values' checks, output and workspace
allocation, argument assembly, the launcher's fast path) and stop where the C launcher would start.
Printed: us per call (CPU time of the thread), the fastest of 20 loops; `--profile NAME` adds cProfile of that request.

CPU tensors are not a GPU's: per-row keyword tensors on the CPU have their values checked
(free on the host, skipped on an accelerator), and CPU allocations are cheaper than CUDA ones.

    python benchmarks/sampling_host_cpu.py [--n 5000] [--profile sample_tensors]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import time
import pstats

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from anysoftmax import sampling  # noqa: E402
from anysoftmax.backends._triton_common import launcher, logsumexp, sampling as triton_sampling  # noqa: E402
from anysoftmax.backends._triton_common import sampling_one_read as one_read  # noqa: E402
from benchmarks.hit_path_cpu import _Compiled  # noqa: E402


def per_call_us(f, n: int) -> float:
    """The fastest of 20 loops of n // 20 calls, per call, in this thread's CPU time: the host
    is shared, and time spent waiting for a core is not the path's cost."""
    for _ in range(min(n // 10, 500)):
        f()
    best, loop = float("inf"), max(1, n // 20)
    for _ in range(20):
        t = time.thread_time()
        for _ in range(loop):
            f()
        best = min(best, time.thread_time() - t)
    return best / loop * 1e6


def _recording_binds():
    """Patch `bind_kernel` where the sampler's launches are bound (the scan and select, the one
    read's small kernels, the softmax and logsumexp it reads through) so that each launcher
    records its first call's arguments: [(launcher, args)] filled as requests run."""
    seen: list = []
    real = launcher.bind_kernel

    def bind(*a, **kw):
        launch = real(*a, **kw)
        first = [True]

        def run(args, values=launch.binding.values, per_call=()):
            if first[0]:  # (one check a call: the wrapper stays on the measured path)
                first[0] = False
                seen.append((launch, args))
            return launch(args, values, per_call)
        run.binding, run.state, run.prime = launch.binding, launch.state, launch.prime
        return run
    for module in (launcher, triton_sampling, one_read, logsumexp):
        module.bind_kernel = bind
    return seen


def requests(vocab: int, rows: int = 1) -> dict:
    """name -> a call of the sampler, B = `rows`, V = `vocab` (float32 logits)."""
    x = torch.randn(rows, vocab)
    t = torch.rand(rows) + 0.5
    tensors = dict(temperature=t, top_k=torch.full((rows,), 50), top_p=torch.full((rows,), 0.9),
                   min_p=torch.full((rows,), 0.05), seed=torch.randint(0, 2**62, (rows,)))
    numbers = dict(temperature=0.8, top_k=50, top_p=0.9, min_p=0.05, seed=1234)
    ids = torch.randint(0, vocab, (rows, 1))
    return {
        "sample_tensors": lambda: sampling.sample(x, **tensors, backend="triton"),
        "sample_numbers": lambda: sampling.sample(x, **numbers, backend="triton"),
        "sample_no_seed": lambda: sampling.sample(x, temperature=0.8, top_k=50, backend="triton"),
        "probs_temperature": lambda: sampling.probs(x, temperature=t, backend="triton"),
        "logprobs_1": lambda: sampling.logprobs(x, ids, temperature=t, backend="triton"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--profile", default=None, help="a request's name: cProfile it")
    args = ap.parse_args()
    seen = _recording_binds()
    calls = requests(args.vocab)
    for f in calls.values():
        f()  # (through the interpreter: binds the launchers)
    for launch, call_args in seen:
        launch.prime([_Compiled()] * len(launch.binding.metas), call_args, stream_of=lambda index: 0)
    print(f"sampler host path on the CPU, B=1 V={args.vocab} fp32, launches stubbed, fastest of 20 loops of "
          f"{args.n // 20} calls")
    for name, f in calls.items():
        print(f"{name:32s} {per_call_us(f, args.n):7.2f} us/call")
    x = torch.randn(1, args.vocab)
    rows = [("  sample_tensors' key and lookup", lambda: sampling.api._ready("sample", "triton", x, keywords)),
            ("torch.empty (for scale)", lambda: torch.empty(1, dtype=torch.int64)),
            ("torch.softmax (for scale)", lambda: torch.softmax(x, -1))]
    keywords = (*(torch.rand(1) + 0.5, torch.full((1,), 50), torch.full((1,), 0.9), torch.full((1,), 0.05)),
                torch.randint(0, 2**62, (1,)), 0)
    sampling.api._ready("sample", "triton", x, keywords)
    for name, f in rows:
        print(f"{name:32s} {per_call_us(f, args.n):7.2f} us/call")
    if args.profile:
        f = calls[args.profile]
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.n):
            f()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
