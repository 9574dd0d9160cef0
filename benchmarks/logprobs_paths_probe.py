"""`logprobs` of one id per row on a GPU, by path: the one read the Triton sampler takes today
(the row scale, `anysoftmax.logsumexp`'s kernel with it, the gather: three launches with a
temperature tensor, two with a number) against the sampler's scan on `logprobs` (chunk states
only: no candidates without top_n) with its select in the same launch (`scan_select_kernel`, a
fused plan at any row count) or in a second launch, beside one read of the logits
(`anysoftmax.logsumexp`); `fused_8192`: the fused plan on 8192-element chunks at 16 warps. Per path and shape: GPU time per call (torch.profiler, every kernel),
host and wall time per call back to back, and the largest error against float64.

    python benchmarks/logprobs_paths_probe.py [--vocab 128256] [--batches 1,8,32,128,512] [--paths lse,one_read]
        [--out FILE.json]

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--batches", default="1,8,32,128,512")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--paths", default="lse,one_read,scan_two,scan_fused,fused_8192", help="which paths to time")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        sys.exit(2)
    import anysoftmax
    from anysoftmax import sampling
    from anysoftmax.backends._triton_common import sampling as s
    from anysoftmax.sampling.spec import SamplingSpec

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
                         "scan_two": lambda: s.logprobs(spec, x, ids, plan=two),
                         "scan_fused": lambda: s.logprobs(spec, x, ids, plan=fused),
                         "fused_8192": lambda: s.logprobs(spec, x, ids, plan=fused_8192)}
                for path, f in ((p, calls[p]) for p in args.paths.split(",")):
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
