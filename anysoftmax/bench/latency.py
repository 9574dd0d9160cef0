"""Per-call cost on small tensors: what an eager model pays for each softmax.

    anysoftmax bench --latency [--out DIR] [--calls 2000]

Two figures per (provider, shape, direction):
* host us per call: the same tensor called `calls` times back to back, then one synchronize,
  divided by `calls`, the best of `REPEATS` rounds (CPU-side launch cost; for small tensors
  the GPU finishes each kernel before the host has the next one ready, so this is also the
  eager wall time per call);
* over torch: the median over rounds of the provider's host us minus torch's in the same round;
* GPU us: the median of `triton.testing.do_bench` (device events, L2 flushed between calls),
  the kernel's own time.

Forward calls `softmax(x, -1)`; backward calls the provider's softmax-backward operation on
(y, dy) directly (torch: `torch._softmax_backward_data`), i.e. what autograd runs per call.
Results: <out>/<gpu>/latency.{json,csv,png}.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..core import SoftmaxSpec
from ..testing.compare import compare, compare_backward
from ..perf import back_to_back_us

SHAPES = [(1, 128), (8, 1024), (32, 4096), (4, 32, 1, 2048), (1, 32768), (512, 512), (1, 32, 1, 128),
          (8, 32, 1, 4096), (64, 151936)]
REPEATS = 5  # rounds of back-to-back calls per cell (the best counts)
PROVIDERS = ["torch", "torch.compile", "torch.compile:reduce-overhead", "liger", "anysoftmax",
             "anysoftmax:triton", "anysoftmax.compile", "anysoftmax.compile:reduce-overhead", "anysoftmax:wave"]


def _compiled(fn, mode: str | None):
    return torch.compile(fn, dynamic=False, mode=mode) if mode else torch.compile(fn, dynamic=False)


# Providers the benchmark and the matrix share (`anysoftmax.matrix.providers`); the compiled
# variants with their modes are this benchmark's own.
SHARED = ("torch", "liger", "anysoftmax", "anysoftmax:triton", "anysoftmax:wave")


def _shared(build, name: str, ndim: int):
    """The shared provider's function (softmax over the last dim on CUDA), or None."""
    from ..core.registry import BackendUnavailableError, UnsupportedRequestError
    from .harness import to_backend

    try:
        return build(to_backend(name)[1], "softmax", -1, ndim, "cuda")
    except (BackendUnavailableError, UnsupportedRequestError):
        return None


def forward_fn(name: str, ndim: int = 2):
    """fn(x) -> softmax(x, -1) of provider `name` for an `ndim`-d input, or None when it cannot run here."""
    import anysoftmax

    from ..matrix import providers

    if name in SHARED:
        return _shared(providers.forward, name, ndim)
    mode = name.split(":", 1)[1] if ":" in name else None
    if name.startswith("torch.compile"):
        return _compiled(lambda x: torch.softmax(x, -1), mode)
    if name.startswith("anysoftmax.compile"):
        return _compiled(lambda x: anysoftmax.softmax(x, -1), mode)
    return None


def backward_fn(name: str, ndim: int = 2):
    """fn(y, dy) -> dx of provider `name` (softmax over the last dim), or None."""
    import anysoftmax

    from ..matrix import providers

    if name in SHARED:
        return _shared(providers.backward, name, ndim)
    mode = name.split(":", 1)[1] if ":" in name else None
    if name.startswith("torch.compile"):
        return _compiled(lambda y, dy: torch._softmax_backward_data(dy, y, -1, y.dtype), mode)
    if name.startswith("anysoftmax.compile"):
        return _compiled(lambda y, dy: anysoftmax.softmax_backward(y, dy, -1), mode)
    return None


def measure(calls: int = 2000, dtype=torch.float32, providers: list[str] = PROVIDERS, repeats: int = REPEATS) -> list[dict]:
    """Every provider x shape x direction that runs here. A host figure is the best of `repeats`
    rounds, the providers of a cell taking turns within each round: the host's clocks and other
    processes move single rounds by several microseconds, the same way for every provider of a
    round (`host_us_rounds` keeps them all)."""
    from triton.testing import do_bench

    rows = []
    for shape in SHAPES:
        torch._dynamo.reset()  # each shape compiles afresh (no recompile limit across shapes)
        x = torch.randn(shape, device="cuda", dtype=dtype) * 3
        y = torch.softmax(x, -1)
        dy = torch.randn_like(y)
        for direction in ("fwd", "bwd"):
            timed = []
            for name in providers:
                fn = forward_fn(name, len(shape)) if direction == "fwd" else backward_fn(name, len(shape))
                row = dict(provider=name, shape=list(shape), direction=direction, dtype=str(dtype).split(".")[-1])
                rows.append(row)
                if fn is None:
                    row.update(status="unavailable")
                    continue
                call = (lambda fn=fn: fn(x)) if direction == "fwd" else (lambda fn=fn: fn(y, dy))
                try:
                    out = call()
                    spec = SoftmaxSpec.from_tensor(x, -1)
                    check = compare(out, x, spec, "cuda") if direction == "fwd" else \
                        compare_backward(out, y, dy, spec, "cuda")
                    row.update(status="ok" if check.ok else "wrong",
                               gpu_us=do_bench(call, warmup=25, rep=100, return_mode="median") * 1e3,
                               host_us_rounds=[])
                    timed.append((row, call))
                except Exception as exc:  # a provider failing one shape is recorded, not fatal
                    row.update(status="failed", detail=f"{type(exc).__name__}: {str(exc)[:200]}")
            for _ in range(repeats):
                for row, call in timed:
                    row["host_us_rounds"].append(back_to_back_us(call, "cuda", calls, warmup=20))
            for row, _ in timed:
                row["host_us"] = min(row["host_us_rounds"])
            paired_over_torch(timed)
    return rows


def paired_over_torch(timed: list) -> None:
    """Set `over_torch_us` on each timed row but torch's: the median over rounds of its time
    minus torch's in the same round. The host's speed drifts by tens of percent within a run
    (both providers of a round alike), so best-of-rounds of each alone can pair a fast round
    of one with a slow round of the other; the same round's difference does not."""
    import statistics

    base = next((row["host_us_rounds"] for row, _ in timed if row["provider"] == "torch"), None)
    if not base:
        return
    for row, _ in timed:
        if row["provider"] != "torch" and len(row["host_us_rounds"]) == len(base):
            row["over_torch_us"] = statistics.median(a - b for a, b in zip(row["host_us_rounds"], base))


def write(rows: list[dict], out_dir: Path, device: str) -> list[Path]:
    """latency.json / .csv / .png under `out_dir`."""
    import csv

    out_dir.mkdir(parents=True, exist_ok=True)
    doc = dict(device=device, torch=torch.__version__, results=rows)
    paths = [out_dir / "latency.json", out_dir / "latency.csv", out_dir / "latency.png"]
    paths[0].write_text(json.dumps(doc, indent=1))
    keys = ["provider", "direction", "shape", "dtype", "status", "host_us", "over_torch_us", "gpu_us", "detail"]
    with open(paths[1], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, "shape": "x".join(map(str, r["shape"]))})
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: matplotlib is not installed (pip install 'anysoftmax[plot]')")
        return paths[:2]
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), squeeze=False)
    labels = ["x".join(map(str, s)) for s in SHAPES]
    for ax, direction in zip(axes[0], ("fwd", "bwd")):
        for name in PROVIDERS:
            pts = {"x".join(map(str, r["shape"])): r["host_us"] for r in rows
                   if r["provider"] == name and r["direction"] == direction and r.get("status") == "ok"}
            if pts:
                ax.plot([labels.index(k) for k in pts], list(pts.values()), marker="o", label=name)
        ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("host us per call (back to back)")
        ax.set_yscale("log")
        ax.set_title(f"{device}: {direction}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(paths[2], dpi=110)
    return paths


def main(out: str, calls: int, providers: list[str] | None = None) -> int:
    if not torch.cuda.is_available():
        print("the latency benchmark needs a CUDA GPU (torch.cuda.is_available() is False)")
        return 2
    from .report import gpu_dir_name

    device = torch.cuda.get_device_name()
    rows = measure(calls, providers=providers or PROVIDERS)
    paths = write(rows, Path(out) / gpu_dir_name(device), device)
    from .tables import latency_table

    print(latency_table(dict(device=device, results=rows)))
    print("wrote " + ", ".join(map(str, paths)))
    return 0
