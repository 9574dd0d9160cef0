"""The runs pre-pass's run length on one CUDA GPU: `sample` with runs of 64, runs of 32 and the
default plan (`sampling.short_runs_window` picks the length by the bound and the rows), and
top-20 `logprobs` with runs of 64 and 32: per-kernel GPU time (torch.profiler,
`sampler_kernels_probe.kernel_times`), the rows the pre-pass served, and whether every plan
draws the same ids.

    python benchmarks/sampler_run_length_probe.py [OUT.txt]   # OUT.json and OUT.png beside it
    python benchmarks/sampler_run_length_probe.py --plot OUT.txt   # JSON and plot of a run's text

Runs of 32 give a chunk of 8192 twice the runs, so the pre-pass may serve top-k bounds up to 128
(runs of 64: up to 64); a row still goes to the scan where more runs than the collect gathers
reach its threshold. Shapes: bf16 and fp32 logits of 128256 tokens at 16-512 rows (randn x 3),
per-row temperature and seeds, top_k 50 and 100 as a number and as a per-row tensor, top_p 0.9,
min_p 0.05.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import warnings
from pathlib import Path

import torch

from benchmarks.figures import save

VOCAB = 128256


PLANS = ("run64", "run32", "default")
_CELL = re.compile(r"(?P<plan>\w+)\s+(?P<us>[\d.]+) us(?: served\s+(?P<served>\d+))? same(?:_ids)?=(?P<same>\w+)")


def parse(text: str) -> dict:
    """A run's text as {device, rows: [{dtype, B, case, plan, us, served, same}]}."""
    lines = text.splitlines()
    head = re.match(r"#\s*([^:(,]+)", lines[0]) if lines else None  # ("# NAME: ..." or "# NAME (...")
    device = head[1].strip() if head else ""
    rows = []
    for line in lines:
        if line.startswith("#") or " | " not in line:
            continue
        head, *cells = line.split(" | ")
        dtype, b, case = re.match(r"(\w+)\s+B=\s*(\d+)\s+(.*)", head).groups()
        case = "logprobs top_n=20" if case.startswith("logprobs") else "top_k=" + case.split("=", 1)[1].strip()
        for cell in cells:
            m = _CELL.match(cell.strip())
            rows.append(dict(dtype=dtype, B=int(b), case=case, plan=m["plan"], us=float(m["us"]),
                             served=None if m["served"] is None else int(m["served"]), same=m["same"] == "True"))
    return dict(device=device, header=lines[0].lstrip("# ") if lines else "", vocab=VOCAB,
                unit="GPU us a call (every kernel)", rows=rows)


def plot(text_path: Path) -> tuple[Path, Path]:
    """`text_path`'s run as JSON and as a plot beside it: GPU us by rows, a panel per dtype and case,
    a line per plan (runs of 64, runs of 32, the default's choice)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    run = parse(text_path.read_text())
    json_path = text_path.with_suffix(".json")
    json_path.write_text(json.dumps(run, indent=1) + "\n")
    dtypes = sorted({r["dtype"] for r in run["rows"]})
    cases = list(dict.fromkeys(r["case"] for r in run["rows"]))
    batches = sorted({r["B"] for r in run["rows"]})
    fig, axes = plt.subplots(len(dtypes), len(cases), figsize=(3.6 * len(cases), 3.2 * len(dtypes)), squeeze=False)
    for ax_row, dtype in zip(axes, dtypes):
        for ax, case in zip(ax_row, cases):
            for plan, style in zip(PLANS, ("o--", "s--", "^-")):
                points = sorted((r["B"], r["us"]) for r in run["rows"]
                                if r["dtype"] == dtype and r["case"] == case and r["plan"] == plan)
                if points:
                    ax.plot(*zip(*points), style, label=plan, markersize=4)
            ax.set(title=f"{dtype}, {case}", xlabel="rows", ylabel="GPU us", yscale="log")
            ax.set_xscale("log", base=2)
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.xaxis.set_minor_locator(ticker.NullLocator())
            ax.yaxis.set_major_formatter(ticker.ScalarFormatter())
            ax.yaxis.set_minor_formatter(ticker.ScalarFormatter())
            ax.legend(fontsize=7)
    return json_path, save(fig, text_path.with_suffix(".png"),
                           f"{run['device']}: the runs pre-pass's run length, V = {run['vocab']}")


def cell(plan: str, times: dict, what: str) -> str:
    """One plan's cell of a line: its total GPU us, `what`, then each kernel's us (`parse` reads it)."""
    return f"{plan} {sum(times.values()):7.1f} us {what} " + " ".join(f"{n[:8]}={v:.1f}" for n, v in times.items())


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--plot"]:
        for path in plot(Path(argv[1])):
            print(path)
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA GPU: torch.cuda.is_available() is False")
        return 2
    import anysoftmax  # noqa: F401  (before the repository goes on sys.path: PYTHONPATH's copy)
    sys.path.append(str(Path(__file__).resolve().parents[1]))
    from anysoftmax.backends._triton_common import sampling as ts
    from anysoftmax.sampling.spec import SamplingSpec
    from benchmarks.sampler_kernels_probe import kernel_times

    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    dev = torch.device("cuda")
    lines = [f"# {torch.cuda.get_device_name()}: sample / logprobs, GPU us a call (every kernel), rows served by the "
             f"runs pre-pass, same ids as runs of 64; V = {VOCAB}"]
    print(lines[0], flush=True)
    for dtype in (torch.bfloat16, torch.float32):
        for rows in (16, 32, 64, 128, 256, 512):
            g = torch.Generator(device="cuda").manual_seed(rows)
            x = (torch.randn(rows, VOCAB, device="cuda", generator=g) * 3).to(dtype)
            t = torch.rand(rows, device="cuda", generator=g) + 0.5
            seeds = torch.randint(0, 2**62, (rows,), device="cuda", generator=g)
            base = ts.plan_for(rows, VOCAB, dev)
            plans = (("run64", base), ("run32", dataclasses.replace(base, run=ts.SHORT_RUN)), ("default", None))
            for k in (50, 100, "t50", "t100"):
                top_k = torch.full((rows,), int(k[1:]), device="cuda") if isinstance(k, str) else k
                kw = dict(temperature=t, top_k=top_k, top_p=0.9, min_p=0.05)
                spec = SamplingSpec.from_request("sample", x, **kw, seed=seeds)
                pspec = SamplingSpec.from_request("probs", x, **kw)
                ref = ts.sample(spec, x, plan=base)
                line = [f"{str(dtype)[6:]:9s} B={rows:3d} top_k={k!s:>4s}"]
                for name, plan in plans:
                    same = torch.equal(ts.sample(spec, x, plan=plan), ref)
                    served, _ = ts.runs_rows(pspec, x, plan=plan)
                    times = kernel_times(lambda plan=plan: ts.sample(spec, x, plan=plan))
                    line.append(cell(name, times, f"served {len(served):3d} same={same}"))
                lines.append(" | ".join(line))
                print(lines[-1], flush=True)
            lspec = SamplingSpec.from_request("logprobs", x, temperature=t)
            ids = torch.randint(0, VOCAB, (rows, 1), device="cuda", generator=g)
            ref = ts.logprobs(lspec, x, ids, 20, plan=base)
            line = [f"{str(dtype)[6:]:9s} B={rows:3d} logprobs top_n=20"]
            for name, plan in plans:
                got = ts.logprobs(lspec, x, ids, 20, plan=plan)
                same = torch.equal(got[2], ref[2])
                times = kernel_times(lambda plan=plan: ts.logprobs(lspec, x, ids, 20, plan=plan))
                line.append(cell(name, times, f"same_ids={same}"))
            lines.append(" | ".join(line))
            print(lines[-1], flush=True)
    if argv:
        Path(argv[0]).write_text("\n".join(lines) + "\n")
        plot(Path(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
