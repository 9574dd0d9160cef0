"""`logprobs` of one id per row on a GPU, by path: the one read the Triton sampler takes
(`one_read`: `logprobs_kernel`, one launch; `lse_gather`: what a backend with its own plans
takes, the row scale, `anysoftmax.logsumexp`'s kernel with it and the gather: three launches
with a temperature tensor, two with a number; `c<CHUNK>p<PROGRAMS>`: `logprobs_kernel` on
CHUNK-element items with PROGRAMS programs a multiprocessor) against the sampler's scan on `logprobs` (chunk states
only: no candidates without top_n) with its select in the same launch (`scan_select_kernel`, a
fused plan at any row count) or in a second launch, beside one read of the logits
(`anysoftmax.logsumexp`); `fused_8192`: the fused plan on 8192-element chunks at 16 warps. Per path and shape: GPU time per call (torch.profiler, every kernel),
host and wall time per call back to back, and the largest error against float64.

    python benchmarks/logprobs_paths_probe.py [--vocab 128256] [--batches 1,8,32,128,512] [--paths lse,one_read]
        [--out FILE.json]
    python benchmarks/logprobs_paths_probe.py --plot FILE.json   # FILE.png: GPU time over one read, wall time

Needs a CUDA GPU (exits 2 without).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.sampler_kernels_probe import kernel_times  # noqa: E402
from benchmarks.sampling_host_gpu import host_and_wall_us  # noqa: E402


def scan_plan(rows: int, vocab: int, device: torch.device, fused: bool, chunk: int | None = None):
    """The sampler's default plan for `rows`, fused at any row count where `fused` (on chunks of
    `chunk` elements where given)."""
    from anysoftmax.backends._triton_common import sampling as s

    kept = s.FUSED_MAX_ROWS, s.FUSED_CHUNK
    s.FUSED_MAX_ROWS = 1 << 30 if fused else 0
    s.FUSED_CHUNK = chunk or s.FUSED_CHUNK
    s.plan_for.cache_clear()
    try:
        return s.plan_for(rows, vocab, device)
    finally:
        s.FUSED_MAX_ROWS, s.FUSED_CHUNK = kept
        s.plan_for.cache_clear()


API_PATHS = ("lse", "one_read")  # paths called through the API (its runner kept per request form)


def plot(path: Path) -> Path:
    """`path`'s rows (temperature tensor) drawn per dtype: each path's GPU time over one read's
    (`lse`) and its wall time a call back to back, by batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = json.loads(path.read_text())
    rows = [r for r in run["rows"] if r["temperature"] == "tensor"]
    dtypes = sorted({r["dtype"] for r in rows})
    fig, axes = plt.subplots(2, len(dtypes), figsize=(6 * len(dtypes), 7), squeeze=False)
    for col, dname in enumerate(dtypes):
        mine = [r for r in rows if r["dtype"] == dname]
        batches = sorted({r["B"] for r in mine})
        one_read = {r["B"]: r["gpu_us"] for r in mine if r["path"] == "lse"}
        for i, path_name in enumerate(dict.fromkeys(r["path"] for r in rows)):
            got = sorted(((r["B"], r) for r in mine if r["path"] == path_name), key=lambda pair: pair[0])
            xs, color = [b for b, _ in got], f"C{i}"
            if path_name != "lse":
                axes[0][col].plot(xs, [r["gpu_us"] / one_read[b] for b, r in got], "o-", color=color, label=path_name)
            if path_name in API_PATHS:  # (the others build their runner on every call: host time not comparable)
                axes[1][col].plot(xs, [r["wall_us"] for _, r in got], "o-", color=color, label=path_name)
        axes[0][col].axhline(1.2, color="gray", linestyle=":", label="goal 1.2")
        axes[0][col].set(title=f"{run['device']}, logprobs of 1 id, {dname}, V={run['vocab']}",
                         ylabel="GPU time / one read")
        axes[1][col].set(xlabel="rows (B)", ylabel="wall us a call, back to back")
        for ax in axes[:, col]:
            ax.set_xscale("log", base=2)
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.legend(fontsize=7)
    out = path.with_suffix(".png")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--batches", default="1,8,32,128,512")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--paths", default="lse,one_read,scan_two,scan_fused,fused_8192", help="which paths to time")
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None, help="a run's JSON: draw it (FILE.png) and exit")
    args = ap.parse_args()
    if args.plot:
        print(plot(Path(args.plot)))
        return
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        sys.exit(2)
    import anysoftmax
    from anysoftmax import sampling
    from anysoftmax.backends._triton_common import sampling as s
    from anysoftmax.backends._triton_common import sampling_one_read as one
    from anysoftmax.core import registry
    from anysoftmax.core.backend import as_backend
    from anysoftmax.sampling.spec import SamplingSpec

    backend = as_backend(registry.get_backend("triton"))
    lse_gather = one.Sampler(backend, lambda spec: None)  # (plans of its own: the three-launch path)

    def swept(path: str):
        """`logprobs` through a `Sampler` whose logprobs_kernel takes the chunk and programs
        `path` names (read when it binds and when a call makes its runner: set before each call;
        a backend object of its own: the bound launchers are keyed by the backend)."""
        chunk, per_sm = map(int, path[1:].split("p"))
        sampler = one.Sampler(type(backend)())

        def call(spec, x, ids):
            one.LOGPROBS_CHUNK, one.LOGPROBS_PROGRAMS_PER_SM = chunk, per_sm
            return sampler.logprobs(spec, x, ids)
        return call

    samplers = {p: swept(p) for p in args.paths.split(",") if p.startswith("c")}
    default_chunk = one.LOGPROBS_CHUNK, one.LOGPROBS_PROGRAMS_PER_SM

    dev, v = torch.device("cuda", torch.cuda.current_device()), args.vocab
    name = torch.cuda.get_device_name()
    rows_out = []
    print(f"{name}: logprobs of one id, V={v}")
    print(f"{'dtype':9s} {'B':>4s} {'temperature':11s} {'path':10s} {'gpu us':>8s} {'host us':>8s} {'wall us':>8s} "
          f"{'max err':>9s}")
    for dname in args.dtypes.split(","):
        dtype = getattr(torch, dname)
        for b in map(int, args.batches.split(",")):
            gen = torch.Generator(device=dev).manual_seed(b)
            x = (torch.randn(b, v, device=dev, generator=gen) * 3).to(dtype)
            ids = torch.randint(0, v, (b, 1), device=dev, generator=gen)
            for t_name, t in (("tensor", torch.rand(b, device=dev, generator=gen) + 0.5), ("number", 0.8)):
                tt = t if isinstance(t, torch.Tensor) else torch.full((b,), t, device=dev)
                want = torch.log_softmax(x.double() / tt.double()[:, None], -1).gather(-1, ids)
                spec = SamplingSpec.from_request("logprobs", x, temperature=t)
                fused, two = scan_plan(b, v, dev, True), scan_plan(b, v, dev, False)
                fused_8192 = scan_plan(b, v, dev, True, 8192)
                calls = {"lse": lambda: anysoftmax.logsumexp(x, -1),
                         "one_read": lambda: sampling.logprobs(x, ids, temperature=t, backend="triton"),
                         "lse_gather": lambda: lse_gather.logprobs(spec, x, ids),
                         "scan_two": lambda: s.logprobs(spec, x, ids, plan=two),
                         "scan_fused": lambda: s.logprobs(spec, x, ids, plan=fused),
                         "fused_8192": lambda: s.logprobs(spec, x, ids, plan=fused_8192)}
                for p in samplers:
                    calls[p] = lambda p=p: samplers[p](spec, x, ids)
                for path, f in ((p, calls[p]) for p in args.paths.split(",")):
                    one.LOGPROBS_CHUNK, one.LOGPROBS_PROGRAMS_PER_SM = default_chunk
                    err = None if path == "lse" else float((f().double() - want).abs().max())
                    gpu = sum(kernel_times(f, reps=20).values())
                    host, wall = host_and_wall_us(f)
                    rows_out.append(dict(dtype=dname, B=b, temperature=t_name, path=path, gpu_us=round(gpu, 2),
                                         host_us=round(host, 2), wall_us=round(wall, 2), max_err=err))
                    print(f"{dname:9s} {b:4d} {t_name:11s} {path:10s} {gpu:8.1f} {host:8.1f} {wall:8.1f} "
                          f"{'' if err is None else f'{err:9.2e}'}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(dict(device=name, vocab=v, rows=rows_out), indent=1))


if __name__ == "__main__":
    main()
