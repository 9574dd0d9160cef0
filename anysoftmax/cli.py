"""The `anysoftmax` command line: `matrix`, `backends`, `bench`, `merge`, `--version`.

Triton and the CPU: Triton decides when a kernel is *defined* whether it runs compiled or
through its CPU interpreter (TRITON_INTERPRET=1). So `matrix` and `backends` choose before
anything imports anysoftmax's kernels: with no GPU visible (and no Ascend torch_npu
installed) and TRITON_INTERPRET unset, they set TRITON_INTERPRET=1, and the `triton` backend
runs on CPU tensors through the interpreter (slow: small shapes only). Set TRITON_INTERPRET=0
to keep it off. On a GPU host the GPU cells run compiled and the CPU cells run in a worker
process of their own with the interpreter.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path

from . import __version__

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def use_interpreter_if_no_gpu() -> str | None:
    """Set TRITON_INTERPRET=1 when no GPU is visible and the user did not decide; return a
    line saying so, or None when nothing was changed."""
    if "TRITON_INTERPRET" in os.environ or "anysoftmax.kernels.softmax" in sys.modules:
        return None
    import torch

    if torch.cuda.is_available() or importlib.util.find_spec("torch_npu") is not None:
        return None
    os.environ["TRITON_INTERPRET"] = "1"
    return ("no GPU visible: Triton kernels run on the CPU through the Triton interpreter "
            "(TRITON_INTERPRET=1; set TRITON_INTERPRET=0 to keep it off)")


def _console():
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # CI logs: do not squeeze the tables into 80 columns
        console = Console(width=max(console.width, 180))
    return console


def _resolve_config(name: str | None) -> Path:
    """A path, or a bare name looked up in the configs folder ('h100' -> configs/h100.yaml)."""
    from .config import config_dir

    if name is None:
        return config_dir() / "default.yaml"
    path = Path(name)
    if path.exists() or path.suffix in (".yaml", ".yml") or os.sep in name:
        return path
    return config_dir() / f"{name}.yaml"


def _progress(console, enabled: bool):
    """(on_start, on_result, stop): a rich progress bar with live pass/fail/skip counts."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not enabled:
        return None, None, lambda: None
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=console.is_terminal)
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    task = {}

    def on_start(n: int) -> None:
        bar.start()
        task["id"] = bar.add_task("cells", total=n)

    def on_result(r) -> None:
        counts[r.status] += 1
        desc = f"[green]{counts['passed']} passed[/] [red]{counts['failed']} failed[/] " \
               f"[yellow]{counts['skipped']} skipped[/] {r.cell.entry}/{r.cell.backend}"
        bar.update(task["id"], advance=1, description=desc)

    return on_start, on_result, bar.stop


def cmd_matrix(args) -> int:
    from .matrix import ConfigError, expand, failed, load_config, run_matrix
    from .matrix.devices import locate
    from .matrix.report import print_report, write_reports

    console = _console()
    note = use_interpreter_if_no_gpu()
    path = _resolve_config(args.config)
    try:
        config = load_config(path)
    except ConfigError as exc:
        print(f"anysoftmax matrix: invalid configuration ({len(exc.errors)} error(s)):", file=sys.stderr)
        for line in exc.errors:
            print(f"  {line}", file=sys.stderr)
        return EXIT_USAGE
    names = [e.name for e in config.devices]
    if args.list_devices:  # flat objects: a CI job matrix (`include:`) can use them as they are
        print(json.dumps([{**e.properties, "entry": e.name, "device": e.device} for e in config.devices]))
        return EXIT_OK
    unknown = [d for d in args.device or [] if d not in names]
    if unknown:
        print(f"anysoftmax matrix: {path}: no device entry named {', '.join(map(repr, unknown))}; "
              f"allowed: {', '.join(map(repr, names))}", file=sys.stderr)
        return EXIT_USAGE
    entries = args.device or None
    if note:
        console.print(note, style="dim")
    if args.dry_run:
        cells = expand(config, entries)
        for e in config.devices:
            if entries is None or e.name in entries:
                found, reason = locate(e.device, e.match)
                n = sum(c.entry == e.name for c in cells)
                console.print(f"{e.name} ({e.device}): {n} cells, " + (f"runs on {', '.join(found)}" if found
                                                                         else f"skipped: {reason}"))
        console.print(f"{len(cells)} cells in {path}")
        return EXIT_OK
    console.print(f"anysoftmax matrix {path} ({config.name})")
    on_start, on_result, stop = _progress(console, not args.no_progress)
    ray = args.ray if args.ray is not None else config.ray
    try:
        if ray and ray != "off":  # imports Ray only here: local runs never do
            from .matrix.ray_runner import run_matrix_ray
            console.print(f"on Ray ({ray})", style="dim")
            run = run_matrix_ray(config, ray, entries=entries, workers=args.workers, cell_timeout=args.cell_timeout,
                                 on_start=on_start, on_result=on_result)
        else:
            run = run_matrix(config, entries=entries, workers=args.workers, cell_timeout=args.cell_timeout,
                             on_start=on_start, on_result=on_result)
    finally:
        stop()
    out = Path(args.out) if args.out else Path("out") / "matrix" / config.name
    paths = write_reports(run, out)
    print_report(run, console, details=True if args.details else None)
    console.print(f"reports: {out}/ ({', '.join(p.name for p in paths)})", markup=False, highlight=False)
    missing = [name for name, info in run.devices.items() if info["reason"]]
    if args.require_device and missing:
        console.print(f"--require-device: no device for {', '.join(missing)}", style="bold red")
    if run.interrupted:
        console.print(f"partial report: {run.interrupted}", style="bold red")
    bad = (run.interrupted or failed(run) or (args.strict and run.counts()["skipped"] > 0)
           or (args.require_device and missing))
    return EXIT_FAILED if bad else EXIT_OK


def cmd_backends(args) -> int:
    from rich.table import Table

    from .core import list_backends
    from .matrix.devices import locate

    console = _console()
    note = use_interpreter_if_no_gpu()
    if note:
        console.print(note, style="dim")
    t = Table(title="anysoftmax backends", title_justify="left")
    for col in ("backend", "available", "devices", "reason"):
        t.add_column(col)
    for b in list_backends():
        t.add_row(b.name, "[green]yes[/]" if b.available else "[red]no[/]", ", ".join(b.devices), b.reason)
    console.print(t)
    for kind in ("cuda", "npu"):
        found, reason = locate(kind)
        console.print(f"{kind}: {', '.join(found) if found else reason}", markup=False, highlight=False)
    return EXIT_OK


def cmd_bench(argv: list[str]) -> int:
    """`anysoftmax bench ARGS` = `python -m benchmarks.softmax ARGS` (needs the repository)."""
    repo = Path(__file__).resolve().parent.parent
    if (repo / "benchmarks" / "softmax.py").exists() and str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    try:
        module = importlib.import_module("benchmarks.softmax")
    except ModuleNotFoundError as exc:
        if exc.name not in ("benchmarks", "benchmarks.softmax"):
            raise
        print("anysoftmax bench: the benchmark suite (benchmarks/softmax.py) ships with the repository, not "
              "with the package: run it from a checkout (git clone ...; pip install -e '.[bench]')",
              file=sys.stderr)
        return EXIT_USAGE
    rc = module.main(argv)
    return int(rc or 0)


def cmd_merge(args) -> int:
    from .matrix import failed
    from .matrix.report import load_report, merge, print_report, write_reports

    try:
        run = merge([load_report(p) for p in args.reports], args.name)
    except (OSError, ValueError, KeyError) as exc:
        print(f"anysoftmax merge: {exc}", file=sys.stderr)
        return EXIT_USAGE
    paths = write_reports(run, args.out)
    console = _console()
    print_report(run, console)
    console.print(f"reports: {args.out}/ ({', '.join(p.name for p in paths)})", markup=False, highlight=False)
    return EXIT_FAILED if failed(run) else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="anysoftmax", description="One fused softmax on several accelerators: "
                                "device-matrix conformance and benchmark runs.")
    p.add_argument("--version", action="version", version=f"anysoftmax {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    m = sub.add_parser("matrix", help="run a device matrix (configs/*.yaml): conformance, then benchmarks",
                       description="Run every cell of a device-matrix YAML file; exit status 1 when any cell fails.")
    m.add_argument("config", nargs="?", help="YAML file, or a name in configs/ (default: configs/default.yaml)")
    m.add_argument("--out", help="report folder (default: out/matrix/<config name>)")
    m.add_argument("--device", action="append", metavar="ENTRY", help="run only this device entry (repeatable)")
    m.add_argument("--workers", type=int, metavar="N",
                   help="worker processes for CPU cells (default 1: in this process); GPU cells always use one "
                        "worker per GPU")
    m.add_argument("--cell-timeout", type=float, default=900.0, metavar="S",
                   help="kill a worker whose cell runs longer than S seconds (default 900)")
    m.add_argument("--ray", nargs="?", const="auto", metavar="auto|local|ADDRESS",
                   help="run on a Ray cluster (needs anysoftmax[ray]): 'auto' joins the running one or starts one "
                        "on 127.0.0.1, 'local' always starts one, ADDRESS joins host:port; 'off' runs locally even "
                        "when the config says `ray:`")
    m.add_argument("--details", action="store_true", help="print every cell, however many")
    m.add_argument("--no-progress", action="store_true", help="no progress bar")
    m.add_argument("--strict", action="store_true", help="exit status 1 when any cell was skipped, too")
    m.add_argument("--require-device", action="store_true",
                   help="exit status 1 when a selected entry's device is missing (CI jobs on dedicated runners)")
    m.add_argument("--dry-run", action="store_true", help="validate, count cells, locate devices; run nothing")
    m.add_argument("--list-devices", action="store_true",
                   help="print the entries as JSON objects (entry, device, properties) for CI job matrices")
    m.set_defaults(func=cmd_matrix)
    b = sub.add_parser("backends", help="list backends with their availability and reasons")
    b.set_defaults(func=cmd_backends)
    sub.add_parser("bench", help="the benchmark suite (benchmarks/softmax.py); arguments pass through",
                   add_help=False)
    g = sub.add_parser("merge", help="merge report.json files (e.g. one CI job per device entry)")
    g.add_argument("reports", nargs="+", help="report.json files")
    g.add_argument("--out", required=True, help="folder for the merged reports")
    g.add_argument("--name", help="name of the merged report (default: the first report's)")
    g.set_defaults(func=cmd_merge)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of `anysoftmax` and `python -m anysoftmax`; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "bench":  # everything after `bench` belongs to the benchmark suite
        return cmd_bench(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    if getattr(args, "workers", None) is not None and args.workers < 1:
        parser.error("--workers must be at least 1")
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
