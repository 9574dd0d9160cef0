"""The native launcher (`anysoftmax/backends/_triton_common/native_launch.py`) against Triton's,
on a CUDA host (< 60 s, no network): first correctness, then host time per call.

Correctness: forward and backward of several requests (8x1024 and 4096x4096 in fp32 and
bf16, a long-row split plan, a fused call with scale and mask), each computed with
ANYSOFTMAX_LAUNCHER=triton and =native (switched in this process: the memo is refreshed and
the launchers rebound): the two equal bit for bit, both close to torch's, and whether the
native launcher really launched (else its reason).

Timing (8x1024 fp32, as benchmarks/profile_hit_path.py: best of 3 loops of 5000 back-to-back
calls, then a synchronize; the median of 5 rounds alternating the launchers): torch.softmax and its backward, anysoftmax's forward, backward and
fused forward under each launcher, and the launches alone with preallocated tensors (Triton's
C extension, the native call).

    python3 benchmarks/native_launch_bench.py --out out/native_launch.json   # + .txt beside
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

# Every request to the triton backend (the one these launchers serve), whatever the automatic
# choice would be for a shape.
os.environ["ANYSOFTMAX_BACKEND"] = "triton"
import anysoftmax  # noqa: E402
from anysoftmax import dispatch  # noqa: E402
from anysoftmax.backends._triton_common import native_launch  # noqa: E402
from anysoftmax.core import request as core_request  # noqa: E402
from profile_hit_path import launch_states, per_call_us, raw_triton_launch  # noqa: E402

SCALE = 0.125
DEVICE = "cuda"
CASES = [  # (name, shape, dtype, fused with scale and mask)
    ("8x1024 fp32", (8, 1024), torch.float32, False),
    ("8x1024 bf16", (8, 1024), torch.bfloat16, False),
    ("4096x4096 fp32", (4096, 4096), torch.float32, False),
    ("4096x4096 bf16", (4096, 4096), torch.bfloat16, False),
    ("4x262144 bf16 (split)", (4, 262144), torch.bfloat16, False),
    ("4x262144 fp32 (split)", (4, 262144), torch.float32, False),
    ("2x4x128x1024 bf16 scale+mask", (2, 4, 128, 1024), torch.bfloat16, True),
    ("8x1024 fp32 scale+mask", (8, 1024), torch.float32, True),
]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def use(which: str) -> None:
    """Bind every request anew under launcher `which`."""
    native_launch.LAUNCHER = which
    anysoftmax.refresh()


def call(x, g, mask):
    """(y, dx) of one request: the plain ops, or the fused one and its autograd backward."""
    if mask is None:
        y = anysoftmax.softmax(x, -1)
        return y, anysoftmax.softmax_backward(y, g, -1)
    xr = x.detach().requires_grad_()
    y = anysoftmax.softmax(xr, -1, scale=SCALE, mask=mask)
    (dx,) = torch.autograd.grad(y, xr, g)
    return y.detach(), dx


def reference(x, g, mask):
    xr = x.detach().double().requires_grad_()
    z = xr * SCALE if mask is not None else xr
    if mask is not None:
        z = z.masked_fill(mask, float("-inf"))
    y = torch.softmax(z, -1)
    (dx,) = torch.autograd.grad(y, xr, g.double())
    return y, dx


def bound_states() -> list:
    return [s for entry in dispatch._memo._data.values() for _, s in launch_states(entry)]


def check(name, shape, dtype, fused) -> dict:
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(shape, device=DEVICE, dtype=dtype, generator=gen)
    g = torch.randn(shape, device=DEVICE, dtype=dtype, generator=gen)
    mask = (torch.rand(shape, device=DEVICE, generator=gen) < 0.2) if fused else None
    got, used = {}, {}
    for which in ("triton", "native"):
        use(which)
        for _ in range(3):  # (the first call compiles through Triton's JIT; later ones are bound)
            got[which] = call(x, g, mask)
        torch.cuda.synchronize()
        states = bound_states()
        natives = [s["fast"] is not None and s["fast"].native is not None for s in states]
        used[which] = dict(launchers=len(states), native=sum(natives),
                           reasons=sorted({s["native_reason"] for s, n in zip(states, natives) if not n}))
    ref = reference(x, g, mask)
    row = dict(case=name, shape=list(shape), dtype=str(dtype).replace("torch.", ""), fused=fused,
               native_launchers=used["native"])
    for i, part in enumerate(("forward", "backward")):
        t, n = got["triton"][i], got["native"][i]
        err = (n.double() - ref[i]).abs().max().item()
        row[part] = dict(bit_equal=bool(torch.equal(t, n)), max_abs_err=err,
                         close=bool(err <= TOL[dtype] * max(ref[i].abs().max().item(), 1.0)))
    row["ok"] = all(row[p]["bit_equal"] and row[p]["close"] for p in ("forward", "backward"))
    return row


def timings(rounds: int = 5) -> dict:
    """us per call, the median of `rounds` rounds that alternate the two launchers (this host's
    speed drifts by tens of percent between runs: only measurements taken side by side compare)."""
    x = torch.randn(8, 1024, device=DEVICE)
    g = torch.randn_like(x)
    mask = torch.rand(8, 1024, device=DEVICE) < 0.2
    y = torch.softmax(x, -1)
    seen: dict = {}

    def note(name, f):
        seen.setdefault(name, []).append(per_call_us(f))

    for _ in range(rounds):
        note("torch.softmax", lambda: torch.softmax(x, -1))
        note("torch._softmax_backward_data", lambda: torch._softmax_backward_data(g, y, -1, y.dtype))
        note("torch.empty_like", lambda: torch.empty_like(x))
        for which in ("triton", "native"):
            use(which)
            ya = anysoftmax.softmax(x, -1)
            note(f"anysoftmax forward [{which}]", lambda: anysoftmax.softmax(x, -1))
            note(f"anysoftmax backward [{which}]", lambda: anysoftmax.softmax_backward(ya, g, -1))
            note(f"anysoftmax fused forward, scale+mask [{which}]",
                 lambda: anysoftmax.softmax(x, -1, scale=SCALE, mask=mask))
            # The plain forward's bound launcher: the launches alone.
            entry = dispatch._memo._data.get(core_request.request_key(core_request.FWD, x, -1, None, None, False))
            _, state = next(launch_states(entry), (None, None))
            if state is None or state["fast"] is None:
                continue
            y0 = torch.empty_like(x)
            if which == "triton":
                note("raw Triton launch, preallocated", raw_triton_launch(state, (x, y0, None, None, None, None)))
            elif state["fast"].native is not None:
                fn = state["fast"].native
                note("raw native launch, preallocated", lambda: fn(x, y0, None, None, None, None))
    return {name: statistics.median(v) for name, v in seen.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file to write (a text table beside it, .txt)")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU (torch.cuda.is_available() is False)")
        return 2
    import triton

    reason = native_launch.unavailable()
    print(f"native launcher: {'available' if reason is None else 'UNAVAILABLE: ' + reason}", flush=True)
    doc = dict(device=torch.cuda.get_device_name(), python=platform.python_version(), torch=torch.__version__,
               triton=triton.__version__, tvm_ffi=_version("tvm_ffi"), native_unavailable=reason, cases=[])
    for case in CASES:
        row = check(*case)
        doc["cases"].append(row)
        print(f"{row['case']:32s} {'ok' if row['ok'] else 'MISMATCH'}  native launchers "
              f"{row['native_launchers']['native']}/{row['native_launchers']['launchers']} "
              f"{row['native_launchers']['reasons'] or ''}", flush=True)
    doc["us_per_call"] = timings()
    use(native_launch.AUTO)
    t = doc["us_per_call"]
    doc["goal_us"] = t["torch.softmax"] + 3.0
    lines = [f"{doc['device']}  torch {doc['torch']}  triton {doc['triton']}  tvm_ffi {doc['tvm_ffi']}",
             f"native launcher: {'available' if reason is None else 'unavailable: ' + reason}", "",
             "correctness (native vs Triton-launched: bit for bit; both vs float64 torch):"]
    for row in doc["cases"]:
        f, b = row["forward"], row["backward"]
        lines.append(f"  {row['case']:32s} fwd equal={f['bit_equal']} err={f['max_abs_err']:.2e}  "
                     f"bwd equal={b['bit_equal']} err={b['max_abs_err']:.2e}  native "
                     f"{row['native_launchers']['native']}/{row['native_launchers']['launchers']}")
    lines += ["", "us per call (8x1024 fp32, best of 3 x 5000, synchronized):"]
    lines += [f"  {k:48s} {v:7.2f}" for k, v in t.items()]
    lines.append(f"  {'goal: torch.softmax + 3':48s} {doc['goal_us']:7.2f}")
    text = "\n".join(lines)
    print(text)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".txt").write_text(text + "\n")
    return 0 if all(r["ok"] for r in doc["cases"]) else 1


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
