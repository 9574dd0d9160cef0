"""The sampler on one GPU: GPU time per shape against the same-bytes copy and one read of the
logits, the torch sampler and FlashInfer, and the host cost per call at B = 1.

    python benchmarks/sampling_bench.py --out benchmarks/results/<device>/sampling [--quick]

Per shape (B = 1, 8, 32, 128, 512; V = 128256, 151936, 262144; bfloat16 and float32 logits;
`--quick`: B = 1, 32, 512 and V = 128256, 262144), `triton.testing.do_bench` medians in us of:

* `copy`: the same bytes as `probs` (read the logits, write float32 [B, V]);
* `logsumexp`: `anysoftmax.logsumexp(logits, -1)`, one read of the logits;
* `probs`: `anysoftmax.sampling.probs(logits, temperature=t, backend="triton")`, t per row;
* `sample`: `sample(..., temperature=t, top_k=50, top_p=0.9, min_p=0.05, seed=seeds,
  backend="triton")`, every keyword a per-row tensor;
* `logprobs_1` / `logprobs_top20`: `logprobs(logits, ids[:, None], temperature=t)` and with
  `top_n=20`;
* `torch_sample`: the same `sample` on `backend="torch"` (sorting);
* `flashinfer_softmax`, `flashinfer_sample`: FlashInfer's `sampling.softmax(logits,
  temperature=t)` and `top_k_top_p_sampling_from_logits(logits / t, 50, 0.9)` when it imports
  (else `flashinfer` in the JSON says why). Its first call JIT-compiles its CUDA sources
  (minutes; see shared/notes/sampling.md): warm its cache in an earlier call, or pass
  `--no-flashinfer`.

`host_us`: back-to-back wall time of 200 calls at B = 1 (V = 128256) of each provider. The
run stops adding shapes when `--budget` seconds have passed (default 330: the whole run within
6 minutes with its compiles) and says so in the JSON (`stopped_early`). Writes
`OUT/sampling.json`. Without a CUDA GPU it prints why and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BATCHES, VOCABS = (1, 8, 32, 128, 512), (128256, 151936, 262144)
QUICK_BATCHES, QUICK_VOCABS = (1, 32, 512), (128256, 262144)
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
HOST_CALLS = 200


def _flashinfer():
    """(the flashinfer.sampling module or None, why not)."""
    try:
        from flashinfer import sampling as fi
    except Exception as exc:  # any import failure is a reason to skip, reported as such
        return None, f"not importable: {type(exc).__name__}: {exc}"
    return fi, None


def _providers(x: torch.Tensor, fi) -> dict:
    """name -> a no-argument call, for logits `x` [B, V]."""
    import anysoftmax
    import anysoftmax.sampling as sampling

    rows, vocab = x.shape
    device = x.device
    g = torch.Generator(device=device).manual_seed(rows * 7 + vocab)
    t = torch.rand(rows, device=device, generator=g) + 0.5
    keys = dict(temperature=t, top_k=torch.full((rows,), 50, dtype=torch.int64, device=device),
                top_p=torch.full((rows,), 0.9, device=device), min_p=torch.full((rows,), 0.05, device=device),
                seed=torch.randint(0, 2**62, (rows,), device=device, generator=g))
    ids = torch.randint(0, vocab, (rows, 1), device=device, generator=g)
    out = torch.empty(rows, vocab, dtype=torch.float32, device=device)
    calls = {
        "copy": lambda: out.copy_(x),
        "logsumexp": lambda: anysoftmax.logsumexp(x, -1),
        "probs": lambda: sampling.probs(x, temperature=t, backend="triton"),
        "sample": lambda: sampling.sample(x, **keys, backend="triton"),
        "logprobs_1": lambda: sampling.logprobs(x, ids, temperature=t, backend="triton"),
        "logprobs_top20": lambda: sampling.logprobs(x, ids, temperature=t, top_n=20, backend="triton"),
        "torch_sample": lambda: sampling.sample(x, **keys, backend="torch"),
    }
    if fi is not None:
        calls["flashinfer_softmax"] = lambda: fi.softmax(x, temperature=t)
        calls["flashinfer_sample"] = lambda: fi.top_k_top_p_sampling_from_logits(x / t[:, None].to(x.dtype), 50, 0.9)
    return calls


def _time_us(call) -> float:
    from triton.testing import do_bench

    return float(do_bench(call, warmup=10, rep=40, return_mode="median")) * 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for sampling.json")
    parser.add_argument("--quick", action="store_true", help="B = 1, 32, 512 and V = 128256, 262144")
    parser.add_argument("--no-flashinfer", action="store_true", help="skip FlashInfer (its first call compiles)")
    parser.add_argument("--budget", type=float, default=330.0, help="seconds after which no new shape starts")
    parser.add_argument("--plot", type=Path, metavar="JSON", help="only draw sampling.png from a sampling.json")
    args = parser.parse_args(argv)
    if args.plot:
        return plot(json.loads(args.plot.read_text()), args.out / "sampling.png")
    if not torch.cuda.is_available():
        print("sampling_bench: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    start = time.perf_counter()
    device = torch.device("cuda")
    from anysoftmax.perf import back_to_back_us, warm_up

    fi, fi_reason = (None, "skipped (--no-flashinfer)") if args.no_flashinfer else _flashinfer()
    batches, vocabs = (QUICK_BATCHES, QUICK_VOCABS) if args.quick else (BATCHES, VOCABS)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "flashinfer": fi_reason or "ran",
              "unit": "us (do_bench median)", "shapes": [], "host_us": {}, "stopped_early": None}
    warm_up(device)
    for dtype_name, dtype in DTYPES.items():
        for vocab in vocabs:
            for rows in batches:
                if time.perf_counter() - start > args.budget:
                    result["stopped_early"] = f"--budget {args.budget:.0f} s reached before B={rows} V={vocab} " \
                                              f"{dtype_name}"
                    break
                x = (torch.randn(rows, vocab, device=device) * 4).to(dtype)
                row = {"B": rows, "V": vocab, "dtype": dtype_name}
                for name, call in _providers(x, fi).items():
                    try:
                        row[name] = _time_us(call)
                    except Exception as exc:  # one provider failing must not lose the run
                        row[name] = None
                        row.setdefault("errors", {})[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
                row["gbytes"] = rows * vocab * (x.element_size() + 4) / 1e9
                result["shapes"].append(row)
                print(json.dumps(row), flush=True)
    x = (torch.randn(1, VOCABS[0], device=device) * 4).to(torch.bfloat16)
    for name, call in _providers(x, fi).items():
        try:
            result["host_us"][name] = back_to_back_us(call, device, calls=HOST_CALLS)
        except Exception as exc:
            result["host_us"][name] = f"{type(exc).__name__}: {str(exc)[:300]}"
    result["seconds"] = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sampling.json").write_text(json.dumps(result, indent=1))
    plot(result, args.out / "sampling.png")
    print(json.dumps({"host_us": result["host_us"], "stopped_early": result["stopped_early"],
                      "seconds": result["seconds"]}))
    return 0


PLOTTED = ("logsumexp", "probs", "flashinfer_softmax", "sample", "flashinfer_sample", "logprobs_1", "logprobs_top20")


def plot(result: dict, path: Path) -> int:
    """sampling.png: GPU time over the same-bytes copy's, per shape and provider (log scale)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("sampling_bench: no plot (matplotlib is not installed: the `plot` extra)", file=sys.stderr)
        return 0
    rows = [r for r in result["shapes"] if r.get("copy")]
    labels = [f"{r['B']}x{r['V']}\n{r['dtype']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows)), 4.5))
    width = 0.8 / len(PLOTTED)
    for i, name in enumerate(PLOTTED):
        ratios = [r[name] / r["copy"] if r.get(name) else float("nan") for r in rows]
        ax.bar([j + i * width for j in range(len(rows))], ratios, width, label=name)
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], labels, fontsize=8)
    ax.set_ylabel("GPU time / same-bytes copy's")
    ax.set_title(f"anysoftmax.sampling on {result['device']} (FlashInfer: {result['flashinfer']})", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
