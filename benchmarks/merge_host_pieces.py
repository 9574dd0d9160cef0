"""Where a merge_states call's host time goes on a GPU host (issue 45: <= 15 us a call at decode
sizes): K = 2 and 8 partials of one token, 32 heads, head dim 128, bf16. Each piece is timed
alone, back to back, calls issued without waiting (the best of 9 loops of 300):

  api          anysoftmax.merge_states
  dispatch     the same without the API's checks
  proof        the repeated request's proof (`core.request.merge_proof`: the operands' guard and
               their addresses, read once)
  addressed    the bound launcher given those addresses (two allocations and the launch)
  at           the launch alone (`launch.at`: the addresses and the two outputs)
  tensors      the launch alone given the 18 tensors
  empty_like   one allocation; torch.add a whole small torch op, for scale

    python benchmarks/merge_host_pieces.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import time

import torch

import anysoftmax
from anysoftmax import dispatch
from anysoftmax.bench.lse_merge import merge_sets
from anysoftmax.core.lse_merge import MergeSpec
from anysoftmax.core.registry import get_backend
from anysoftmax.core.request import merge_proof


def host_us(f, calls: int = 300, repeats: int = 9) -> float:
    """us per call of `f` issued back to back without waiting (the best of `repeats` loops)."""
    for _ in range(50):
        f()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, time.perf_counter() - start)
        torch.cuda.synchronize()
    return best / calls * 1e6


def pieces(k: int) -> dict:
    """Each piece's host us for K partials (see the module)."""
    outs, lses = merge_sets(1, 32, 128, k, torch.bfloat16, "cuda", 1)[0]
    proof = merge_proof(outs, lses, None, None, None)
    run = get_backend("triton").merge_states_launcher(outs, lses, MergeSpec.from_tensors(outs, lses))
    for _ in range(3):  # (the first call compiles; the later ones take the fast path)
        out, lse = run(outs, lses, None, None)
    addresses = proof(outs, lses, None, None, None)
    launch = run.state["launch"]
    return dict(
        api=host_us(lambda: anysoftmax.merge_states(outs, lses)),
        dispatch=host_us(lambda: dispatch.merge_states(outs, lses)),
        proof=host_us(lambda: proof(outs, lses, None, None, None)),
        addressed=host_us(lambda: run.addressed(addresses, outs, lses, None, None)),
        at=host_us(lambda: launch.at(addresses, (out, lse))),
        tensors=host_us(lambda: launch((*outs, *lses, out, lse))),
        empty_like=host_us(lambda: torch.empty_like(outs[0])),
        torch_add=host_us(lambda: torch.add(out, out)),
    ), launch.state["fast"].native is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    rounds = ap.parse_args().rounds
    print(torch.cuda.get_device_name())
    for r in range(rounds):
        for k in (2, 8):
            row, native = pieces(k)
            print(f"round {r} K={k} native={native}: " + " ".join(f"{n}={v:.2f}" for n, v in row.items()))


if __name__ == "__main__":
    main()
