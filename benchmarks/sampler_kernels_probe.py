"""Per-kernel GPU time of the Triton sampler (torch.profiler), beside one read of the logits
and the same-bytes copy, and the scan under other plans: what to look at when tuning the
sampler's kernels.

    python benchmarks/sampler_kernels_probe.py [--budget 200] [--out FILE.json]

Shapes: bfloat16 B = 1, 32, 512 at V = 128256 and B = 32 at V = 262144; float32 B = 1, 32, 512
at V = 128256. Per shape, the GPU time per call (us, mean of 10 profiled calls after 3
warm-ups) of every kernel a call launches, for:

* `sample`: top_k = 50, top_p = 0.9, min_p = 0.05, temperature and seeds per row (tensors);
* `probs_t`: `probs` with only a per-row temperature (the softmax kernel with the row scale);
* `probs_all`: `probs` with the three filters as numbers;
* `logprobs1` / `lp_top20`: `logprobs` of one id per row, and with top_n = 20;
* `lse`: `anysoftmax.logsumexp(x, -1)` (one read); `copy`: read the logits, write float32;
* bfloat16 at V = 128256 only: `sample` with one scan program per multiprocessor (`1/SM`), at
  8 warps (`w8`; `w8_4/SM`: with twice the programs), with smaller chunks (`c4096` at 8 warps, `c2048` at 4 warps), through the module functions'
  `plan=`; and `sample` with one filter at a time (`s_plain`: temperature only, `s_topk`,
  `s_topp`, `s_minp`).

At the end, the registers, spills and shared memory of every scan and select kernel compiled.

Stops adding shapes after `--budget` seconds (compiles included) and says so. Prints one line
per measurement and writes the rows as JSON with `--out`. Needs a CUDA GPU (exits 2 without).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = ((torch.bfloat16, 1, 128256), (torch.bfloat16, 32, 128256), (torch.bfloat16, 512, 128256),
          (torch.bfloat16, 32, 262144), (torch.float32, 1, 128256), (torch.float32, 32, 128256),
          (torch.float32, 512, 128256))


def kernel_times(call, reps: int = 10) -> dict:
    """{kernel name: GPU us per call} of `call`, from torch.profiler over `reps` calls."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    times = {}
    for event in prof.key_averages():
        if event.device_time_total > 0:
            times[event.key[:48]] = event.device_time_total / reps
    return times


def calls(dtype, rows: int, vocab: int) -> dict:
    """name -> a zero-argument call, for one shape."""
    import anysoftmax
    import anysoftmax.sampling as sampling
    from anysoftmax.backends._triton_common import sampling as triton_sampling
    from anysoftmax.sampling.spec import SamplingSpec

    dev = "cuda"
    x = (torch.randn(rows, vocab, device=dev) * 3).to(dtype)
    t = torch.rand(rows, device=dev) + 0.5
    keys = dict(temperature=t, top_k=torch.full((rows,), 50, device=dev), top_p=torch.full((rows,), 0.9, device=dev),
                min_p=torch.full((rows,), 0.05, device=dev))
    seeds = torch.randint(0, 2**62, (rows,), device=dev)
    ids = torch.randint(0, vocab, (rows, 1), device=dev)
    out = torch.empty(rows, vocab, dtype=torch.float32, device=dev)
    made = {
        "sample": lambda: sampling.sample(x, **keys, seed=seeds, backend="triton"),
        "probs_t": lambda: sampling.probs(x, temperature=t, backend="triton"),
        "probs_all": lambda: sampling.probs(x, temperature=t, top_k=50, top_p=0.9, min_p=0.05, backend="triton"),
        "logprobs1": lambda: sampling.logprobs(x, ids, temperature=t, backend="triton"),
        "lp_top20": lambda: sampling.logprobs(x, ids, temperature=t, top_n=20, backend="triton"),
        "lse": lambda: anysoftmax.logsumexp(x, -1),
        "copy": lambda: out.copy_(x),
    }
    if dtype == torch.bfloat16 and vocab == 128256:
        spec = SamplingSpec.from_request("sample", x, **keys, seed=seeds)
        base = triton_sampling.plan_for(rows, vocab, x.device)
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        variants = [("sample_1/SM", dataclasses.replace(base, grid=max(1, min(base.grid, sms)))),
                    ("sample_w8", dataclasses.replace(base, num_warps=8)),
                    ("sample_w8_4/SM", dataclasses.replace(base, num_warps=8, grid=max(1, min(2 * base.grid, 4 * sms))))]
        for chunk, warps in ((4096, 8), (2048, 4)):
            groups = -(-vocab // chunk)
            g2 = 1 << (groups - 1).bit_length()
            slots = min(256, max(32, 1 << ((4096 // g2).bit_length() - 1)))
            variants.append((f"sample_c{chunk}", dataclasses.replace(base, chunk=chunk, slots=slots, num_warps=warps)))
        for name, plan in variants:
            made[name] = lambda plan=plan: triton_sampling.sample(spec, x, plan=plan)
        made["s_plain"] = lambda: sampling.sample(x, temperature=t, seed=seeds, backend="triton")
        made["s_topk"] = lambda: sampling.sample(x, temperature=t, top_k=50, seed=seeds, backend="triton")
        made["s_topp"] = lambda: sampling.sample(x, temperature=t, top_p=0.9, seed=seeds, backend="triton")
        made["s_minp"] = lambda: sampling.sample(x, temperature=t, min_p=0.05, seed=seeds, backend="triton")
    return made


def compiled_kernels() -> list[dict]:
    """Registers, spills and shared memory of every sampler kernel Triton compiled here."""
    from anysoftmax.backends._triton_common import sampling_kernels as k

    found = []
    for fn in (k.scan_kernel, k.select_kernel, k.probs_kernel):
        for cache in getattr(fn, "device_caches", {}).values():
            kernels = cache[0] if isinstance(cache, tuple) else cache
            for compiled in getattr(kernels, "values", lambda: [])():
                meta = compiled.metadata
                consts = {k2: v for k2, v in getattr(compiled.src, "constexprs", {}).items()} \
                    if hasattr(compiled, "src") else {}
                found.append(dict(kernel=fn.__name__, n_regs=getattr(compiled, "n_regs", None),
                                  n_spills=getattr(compiled, "n_spills", None), shared=getattr(meta, "shared", None),
                                  num_warps=getattr(meta, "num_warps", None), constexprs=str(consts)[:200]))
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=200.0, help="seconds before no new shape starts")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    a = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU: torch.cuda.is_available() is False")
        return 2
    import warnings
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    start = time.perf_counter()
    rows_out, stopped = [], None
    print(torch.cuda.get_device_name(), flush=True)
    for dtype, rows, vocab in SHAPES:
        if time.perf_counter() - start > a.budget:
            stopped = f"budget of {a.budget:.0f} s spent before {dtype} B={rows} V={vocab}"
            print(stopped, flush=True)
            break
        for name, call in calls(dtype, rows, vocab).items():
            try:
                times = kernel_times(call)
            except Exception as exc:  # (a failing provider is reported, the others still run)
                print(f"{str(dtype)[6:]:9s} B={rows:4d} V={vocab} {name:15s} FAILED {type(exc).__name__}: "
                      f"{str(exc)[:300]}", flush=True)
                continue
            total = sum(times.values())
            rows_out.append(dict(dtype=str(dtype)[6:], rows=rows, vocab=vocab, call=name, total_us=total,
                                 kernels=times))
            print(f"{str(dtype)[6:]:9s} B={rows:4d} V={vocab} {name:15s} total {total:8.1f}us  " +
                  "  ".join(f"{k}={v:.1f}" for k, v in sorted(times.items(), key=lambda kv: -kv[1])[:4]), flush=True)
    try:
        kernels = compiled_kernels()
    except Exception as exc:  # (Triton's caches are not a public interface: report, go on)
        kernels = [dict(error=f"{type(exc).__name__}: {exc}")]
    for entry in kernels:
        print(entry, flush=True)
    print(f"elapsed {time.perf_counter() - start:.0f} s", flush=True)
    if a.out is not None:
        a.out.write_text(json.dumps(dict(device=torch.cuda.get_device_name(), stopped_early=stopped, rows=rows_out,
                                         kernels=kernels), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
