"""The sampler on one GPU: GPU time per shape against the same-bytes copy and one read of the
logits, the torch sampler and FlashInfer, and the host cost per call at B = 1.

    python benchmarks/sampling_bench.py --out benchmarks/results/<device>/sampling [--quick]
    ... --dtypes bfloat16 --batches 1,32 --vocabs 262144     # a part of the grid

Per shape (`--batches` B = 1, 8, 32, 128, 512; `--vocabs` V = 128256, 151936, 262144;
`--dtypes` bfloat16,float32 logits; `--quick`: B = 1, 32, 512 and V = 128256, 262144),
`triton.testing.do_bench` medians in us of:

* `copy`: the same bytes as a softmax with float32 out (read the logits, write float32 [B, V]);
* `logsumexp`: `anysoftmax.logsumexp(logits, -1)`, one read of the logits;
* `softmax_t`: `anysoftmax.softmax(logits, -1, torch.float32, scale=inv_t[:, None])`, the
  per-row temperature in the kernel (inv_t = 1 / t computed once, outside the timed call);
* `torch_softmax_t`: `torch.softmax(logits.float().div_(t[:, None]), -1)`, what vLLM and SGLang
  run (float32 logits: an out-of-place division, the same kernels and bytes without dividing
  the benchmark's input again on every call);
* `probs`: `anysoftmax.sampling.probs(logits, temperature=t, backend="triton")`, t per row;
* `sample`: `sample(..., temperature=t, top_k=50, top_p=0.9, min_p=0.05, seed=seeds,
  backend="triton")`, every keyword a per-row tensor;
* `logprobs_1` / `logprobs_top20`: `logprobs(logits, ids[:, None], temperature=t)` and with
  `top_n=20`;
* `torch_sample`: the same `sample` on `backend="torch"` (sorting);
* `flashinfer_softmax`, `flashinfer_sample`: FlashInfer's `sampling.softmax(logits,
  temperature=t)` and `top_k_top_p_sampling_from_logits(logits / t, 50, 0.9)` when it imports
  (else `flashinfer` in the JSON says why).

Each shape's row also holds `frac_of_copy` (the copy's time over each provider's: 1 is the
copy's bandwidth) and `over_logsumexp` (the samplers' and logprobs' time over one read).
`host_us`: back-to-back wall time of 200 calls at B = 1 (V = 128256) of each provider.

Budget: FlashInfer JIT-compiles its CUDA sources on first use (about 2 minutes for its
sampling module, over 7 for top-k: shared/notes/sampling.md). `--warm-flashinfer` only does
that (`bash benchmarks/gpu_run.sh sampling_warm`, a call of its own; the cache stays under
FLASHINFER_WORKSPACE_BASE); a timed run first calls FlashInfer in a child process and leaves it
out, saying why, when that takes over `--flashinfer-timeout` seconds (a cold cache). No shape
starts that would end after `--budget` seconds from the start (default 270: the whole run
within about 5 minutes), judged by the longest shape so far; `stopped_early` in the JSON names
what was left out. Writes `OUT/sampling.json` and `OUT/sampling.png` (fractions of the copy,
and the samplers' time over one read). Without a CUDA GPU it prints why and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BATCHES, VOCABS = (1, 8, 32, 128, 512), (128256, 151936, 262144)
QUICK_BATCHES, QUICK_VOCABS = (1, 32, 512), (128256, 262144)
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
HOST_CALLS = 200
# The providers whose time is set against one read of the logits (the goals for them).
READ_RATIO = ("sample", "logprobs_1", "logprobs_top20", "torch_sample", "flashinfer_sample")


def _flashinfer():
    """(the flashinfer.sampling module or None, why not)."""
    try:
        from flashinfer import sampling as fi
    except Exception as exc:  # any import failure is a reason to skip, reported as such
        return None, f"not importable: {type(exc).__name__}: {exc}"
    return fi, None


def _warm_flashinfer() -> int:
    """Call each FlashInfer function the benchmark times once per dtype (its JIT compiles)."""
    fi, reason = _flashinfer()
    if fi is None:
        print(f"sampling_bench: FlashInfer {reason}", file=sys.stderr)
        return 1
    start = time.perf_counter()
    for dtype in DTYPES.values():
        x = torch.randn(4, 4096, device="cuda").to(dtype)
        t = torch.rand(4, device="cuda") + 0.5
        fi.softmax(x, temperature=t)
        fi.top_k_top_p_sampling_from_logits(x, 50, 0.9)
    torch.cuda.synchronize()
    print(f"sampling_bench: FlashInfer ready in {time.perf_counter() - start:.0f} s")
    return 0


def _flashinfer_ready(timeout: float) -> str | None:
    """None when FlashInfer's modules load within `timeout` seconds in a child process (their
    JIT cache is warm), else why it is left out: a cold compile would take the run's budget."""
    try:
        done = subprocess.run([sys.executable, __file__, "--warm-flashinfer"], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"its JIT compile did not finish in {timeout:.0f} s (warm it first: gpu_run.sh sampling_warm)"
    return None if done.returncode == 0 else f"failed to run: {(done.stderr or done.stdout).strip()[-300:]}"


def temperature_softmax_calls(x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """(inv_t, {"softmax_t", "torch_softmax_t": a no-argument call}): the softmax of x / t
    ([B, V] logits, t [B]) with float32 out, anysoftmax's and vLLM's / SGLang's."""
    import anysoftmax

    inv_t = 1.0 / t
    scale = inv_t[:, None]

    def torch_softmax_t():
        z = x.float()
        # float32 logits: x.float() is x itself, and dividing it in place would change the input
        # of every later call; an out-of-place division moves the same bytes in one kernel.
        z = z.div(t[:, None]) if z is x else z.div_(t[:, None])
        return torch.softmax(z, -1)

    return inv_t, {"softmax_t": lambda: anysoftmax.softmax(x, -1, torch.float32, scale=scale),
                   "torch_softmax_t": torch_softmax_t}


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
        **temperature_softmax_calls(x, t)[1],
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


def add_ratios(row: dict) -> dict:
    """Adds to a shape's `row` (provider -> us) `frac_of_copy` (the copy's time over each
    provider's) and `over_logsumexp` (READ_RATIO providers' time over one read's)."""
    timed = {k: v for k, v in row.items() if isinstance(v, float) and v > 0 and k not in ("copy", "gbytes")}
    row["frac_of_copy"] = {k: row["copy"] / v for k, v in timed.items()} if row.get("copy") else {}
    row["over_logsumexp"] = {k: v / row["logsumexp"] for k, v in timed.items()
                             if k in READ_RATIO} if row.get("logsumexp") else {}
    return row


def run_grid(shapes: list, measure, budget: float, clock) -> tuple[list, str | None]:
    """(`measure(shape)` of each shape in order, None or why the rest were left out): no shape
    starts when it would end after `budget` seconds of `clock` (seconds since the run began),
    were it to take as long as the longest shape so far."""
    rows, longest = [], 0.0
    for i, shape in enumerate(shapes):
        began = clock()
        if began + longest > budget:
            return rows, f"--budget {budget:.0f} s: {len(shapes) - i} shapes not measured, from {shape}"
        rows.append(measure(shape))
        longest = max(longest, clock() - began)
    return rows, None


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in DTYPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown dtype(s) {unknown}: choose from {', '.join(DTYPES)}")
    return names


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (module docstring); `--quick` fills the batches and vocabularies not given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for sampling.json (not with --warm-flashinfer)")
    parser.add_argument("--quick", action="store_true", help="B = 1, 32, 512 and V = 128256, 262144")
    parser.add_argument("--dtypes", type=_names, default=tuple(DTYPES), help="logits dtypes (comma-separated)")
    parser.add_argument("--batches", type=_ints, default=None, help="rows B (comma-separated)")
    parser.add_argument("--vocabs", type=_ints, default=None, help="vocabularies V (comma-separated)")
    parser.add_argument("--no-flashinfer", action="store_true", help="skip FlashInfer")
    parser.add_argument("--flashinfer-timeout", type=float, default=90.0,
                        help="seconds FlashInfer may take to load before it is left out (a cold JIT cache)")
    parser.add_argument("--warm-flashinfer", action="store_true", help="only JIT-compile FlashInfer's modules")
    parser.add_argument("--budget", type=float, default=270.0, help="seconds after which no shape may end")
    parser.add_argument("--plot", type=Path, metavar="JSON", help="only draw sampling.png from a sampling.json")
    args = parser.parse_args(argv)
    if args.out is None and not args.warm_flashinfer:
        parser.error("--out is required")
    args.batches = args.batches or (QUICK_BATCHES if args.quick else BATCHES)
    args.vocabs = args.vocabs or (QUICK_VOCABS if args.quick else VOCABS)
    return args


def grid(args) -> list[tuple[str, int, int]]:
    """(dtype name, V, B) of every shape, in the order measured."""
    return [(d, v, b) for d in args.dtypes for v in args.vocabs for b in args.batches]


def _measure(shape: tuple[str, int, int], fi, device) -> dict:
    dtype_name, vocab, rows = shape
    x = (torch.randn(rows, vocab, device=device) * 4).to(DTYPES[dtype_name])
    row = {"B": rows, "V": vocab, "dtype": dtype_name}
    for name, call in _providers(x, fi).items():
        try:
            row[name] = _time_us(call)
        except Exception as exc:  # one provider failing must not lose the run
            row[name] = None
            row.setdefault("errors", {})[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
    row["gbytes"] = rows * vocab * (x.element_size() + 4) / 1e9
    add_ratios(row)
    print(json.dumps(row), flush=True)
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plot:
        return plot(json.loads(args.plot.read_text()), args.out / "sampling.png")
    if not torch.cuda.is_available():
        print("sampling_bench: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    if args.warm_flashinfer:
        return _warm_flashinfer()
    start = time.perf_counter()
    device = torch.device("cuda")
    from anysoftmax.perf import back_to_back_us, warm_up

    fi, fi_reason = None, "skipped (--no-flashinfer)"
    if not args.no_flashinfer:
        fi_reason = _flashinfer_ready(args.flashinfer_timeout)
        fi, fi_reason = (None, fi_reason) if fi_reason else _flashinfer()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "flashinfer": fi_reason or "ran",
              "unit": "us (do_bench median)", "shapes": [], "host_us": {}, "stopped_early": None}
    warm_up(device)
    result["shapes"], result["stopped_early"] = run_grid(grid(args), lambda s: _measure(s, fi, device), args.budget,
                                                         lambda: time.perf_counter() - start)
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


SOFTMAXES = ("softmax_t", "flashinfer_softmax", "torch_softmax_t", "probs")
READS = ("sample", "flashinfer_sample", "logprobs_1", "logprobs_top20")


def plot(result: dict, path: Path) -> int:
    """sampling.png: per shape, the temperature softmaxes' fraction of the same-bytes copy
    (above), and the samplers' and logprobs' GPU time over one read of the logits (below)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("sampling_bench: no plot (matplotlib is not installed: the `plot` extra)", file=sys.stderr)
        return 0
    rows = [r if "frac_of_copy" in r else add_ratios(dict(r)) for r in result["shapes"] if r.get("copy")]
    labels = [f"{r['B']}x{r['V']}\n{r['dtype']}" for r in rows]
    fig, (top, below) = plt.subplots(2, 1, figsize=(max(6.0, 0.9 * len(rows)), 8))
    for ax, names, key in ((top, SOFTMAXES, "frac_of_copy"), (below, READS, "over_logsumexp")):
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            values = [r[key].get(name, float("nan")) for r in rows]
            ax.bar([j + i * width for j in range(len(rows))], values, width, label=name)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], labels, fontsize=7)
        ax.legend(fontsize=7, ncol=2)
    top.axhline(1.0, color="black", linewidth=0.8)
    top.axhline(0.9, color="grey", linewidth=0.8, linestyle="--")
    top.set_ylabel("fraction of the same-bytes copy")
    below.set_yscale("log")
    below.axhline(2.0, color="grey", linewidth=0.8, linestyle="--")
    below.set_ylabel("GPU time / one read (logsumexp)")
    top.set_title(f"anysoftmax.sampling on {result['device']} (FlashInfer: {result['flashinfer']})", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
