"""The `anysoftmax` command line: `matrix`, `backends`, `conformance`, `bench`, `select`, `merge`,
`--version`.

Triton and the CPU: whether Triton kernels run compiled or through the CPU interpreter is
decided once per process, before the kernels are defined. `matrix`, `backends` and
`conformance` ask the backends (`anysoftmax.plugins.use_interpreter_if_needed`): when none has
its device here and the user did not set TRITON_INTERPRET, the kernels run on CPU tensors
through the interpreter (slow: small shapes only; TRITON_INTERPRET=0 keeps it off). All of them
print the same "runs here:" line, so they agree on what runs on this machine (in a Python
program of your own, set TRITON_INTERPRET=1 before importing anysoftmax for the same effect).

Output is for terminals and logs alike: the console is as wide as the terminal or $COLUMNS, and
200 columns when writing to a file or pipe; names are never cut.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import __version__
from .config import ENV_CONFIG_DIR, matrix_names

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A bad command-line argument (exit status 2), its message naming the problem."""


def _console(stderr: bool = False):
    from .output import make_console

    return make_console(stderr)


def runs_here() -> str:
    """One line, printed by `backends` and `matrix` alike: the backends that run in this
    process, and how ("triton: via the interpreter on CPU ...")."""
    from .core import list_backends

    here = [f"{b.name}: {b.note}" if b.note else b.name for b in list_backends() if b.available]
    return "runs here: " + ("; ".join(here) or "nothing")


def _resolve_config(name: str | None) -> Path:
    """A path, or a bare name of a shipped matrix ('h100' -> anysoftmax/configs/h100.yaml)."""
    from .config import matrix_names, matrix_path

    if name is None:
        return matrix_path("default")
    path = Path(name)
    if not (path.exists() or path.suffix in (".yaml", ".yml", ".json") or os.sep in name):
        path = matrix_path(name)
        if not path.is_file():
            raise UsageError(f"{name!r} is neither a file nor a shipped matrix; shipped: {', '.join(matrix_names())}")
    return check_readable(path, "configuration")


def check_readable(path: Path, what: str) -> Path:
    """`path` when it is a YAML/JSON file that exists, else a UsageError naming it."""
    if path.is_dir():
        raise UsageError(f"{path}: is a directory, not a {what} file")
    if not path.exists():
        raise UsageError(f"{path}: {what} file not found")
    if path.suffix.lower() not in (".yaml", ".yml", ".json"):
        raise UsageError(f"{path}: not a YAML or JSON file (expected .yaml, .yml or .json)")
    return path


def _progress(console, enabled: bool):
    """(on_start, on_result, stop): a rich progress bar with live pass/fail/skip counts."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    if not enabled:
        return None, None, lambda: None
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("ETA"), TimeRemainingColumn(),
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
    from .config import results_dir
    from .plugins import use_interpreter_if_needed
    from .matrix.report import print_report, write_reports

    # With --json, stdout carries the JSON document only; the other lines go to stderr.
    console = _console(stderr=args.json)
    note = use_interpreter_if_needed()
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
    console.print(runs_here(), markup=False, highlight=False, soft_wrap=True)
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
    out = Path(args.out) if args.out else results_dir() / "matrix" / config.name
    paths = write_reports(run, out)
    if args.json:
        from .matrix.report import summary_json
        print(json.dumps(summary_json(run), indent=1))
    else:
        print_report(run, console, details=True if args.details else None)
    console.print(f"reports: {out}/ ({', '.join(p.name for p in paths)})", markup=False, highlight=False,
                  soft_wrap=True)
    missing = [name for name, info in run.devices.items() if info["reason"]]
    if args.require_device and missing:
        console.print(f"--require-device: no device for {', '.join(missing)}", style="bold red")
    if run.interrupted:
        console.print(f"partial report: {run.interrupted}", style="bold red")
    bad = (run.interrupted or failed(run) or (args.strict and run.counts()["skipped"] > 0)
           or (args.require_device and missing))
    return EXIT_FAILED if bad else EXIT_OK


def parse_request(text: str, device: str):
    """'1024x131072[:bf16[:DIM]]' -> the SoftmaxSpec of such a request on `device` (no tensor
    is allocated); UsageError naming the part that is wrong."""
    from dataclasses import replace

    import torch

    from .core.spec import SoftmaxSpec, parse_dtype

    shape_text, _, rest = text.partition(":")
    dtype_text, _, dim_text = rest.partition(":")
    try:
        shape = tuple(int(v) for v in shape_text.lower().split("x"))
    except ValueError:
        raise UsageError(f"--explain {text!r}: shape must look like 1024x131072") from None
    try:
        dtype = parse_dtype(dtype_text or "float32")
        dim = int(dim_text) if dim_text else -1
        spec = SoftmaxSpec.from_tensor(torch.empty(shape, dtype=dtype, device="meta"), dim)
    except (ValueError, TypeError, IndexError) as exc:
        raise UsageError(f"--explain {text!r}: {exc}") from None
    return replace(spec, device=torch.device(device))


def explain_lines(args) -> list[str]:
    """`backends --explain`: the automatic choice for each request, and why. With --gpu-name,
    the choice on that GPU (its table) and, unless it is the GPU here, this machine's own."""
    from .core.registry import explain
    from .core.selection import device_name, resolve_name

    gpu = None
    if args.gpu_name:
        try:
            gpu = resolve_name(args.gpu_name)
        except ValueError as exc:
            raise UsageError(f"--gpu-name: {exc}") from None
    lines = []
    for text in args.explain:
        spec = parse_request(text, args.device)
        elsewhere = gpu is not None and gpu != device_name(spec.device)
        for direction in ("fwd", "bwd") if args.direction == "both" else (args.direction,):
            name, why = explain(spec, direction, gpu)
            lines.append(f"{text} {direction} on {gpu or args.device}: {name or 'none'} <- {why}")
            if elsewhere:
                name, why = explain(spec, direction)
                lines.append(f"{text} {direction} on {args.device} here: {name or 'none'} <- {why}")
    return lines


def cmd_backends(args) -> int:
    from dataclasses import asdict

    from rich.markup import escape
    from rich.table import Table

    from .core import list_backends
    from .plugins import use_interpreter_if_needed
    from .matrix.devices import locate
    from .output import print_table

    # The same process-wide Triton decision as `matrix` makes (before any kernel exists), so
    # the listing, --explain and the matrix say the same about this machine.
    note = use_interpreter_if_needed()
    if args.explain:
        if note:
            print(note, file=sys.stderr)
        for line in explain_lines(args):
            print(line)
        return EXIT_OK
    rows = list_backends()
    devices = {kind: locate(kind) for kind in ("cuda", "npu")}
    if args.json:
        print(json.dumps(dict(backends=[asdict(b) for b in rows],
                              devices={k: dict(found=f, reason=r) for k, (f, r) in devices.items()}), indent=1))
        return EXIT_OK
    console = _console()
    if note:
        console.print(note, style="dim")
    t = Table(title="anysoftmax backends", title_justify="left")
    t.add_column("backend", no_wrap=True, min_width=max(len("backend"), *(len(b.name) for b in rows)))
    t.add_column("available", no_wrap=True)
    t.add_column("devices", no_wrap=True)
    t.add_column("reason / note", overflow="fold", min_width=24)
    for b in rows:
        t.add_row(b.name, "[green]yes[/]" if b.available else "[red]no[/]", ", ".join(b.devices),
                  escape(b.reason or b.note))
    print_table(console, t)
    console.print(runs_here(), markup=False, highlight=False, soft_wrap=True)
    for kind, (found, reason) in devices.items():
        console.print(f"{kind}: {', '.join(found) if found else reason}", markup=False, highlight=False)
    return EXIT_OK


def cmd_bench(argv: list[str]) -> int:
    """`anysoftmax bench ARGS` = `python -m anysoftmax.bench.softmax ARGS`."""
    from .bench import softmax as bench

    return int(bench.main(argv, prog="anysoftmax bench") or 0)


def _candidates(device: str) -> list[str]:
    """`anysoftmax:<backend>` for every backend available here that serves `device`."""
    from .bench.harness import OURS, anysoftmax_names

    return [n for n in anysoftmax_names(device) if n != OURS]


def default_selection_dir() -> Path:
    """Where `select` writes without --out: a folder the user can write and the registry reads
    ($ANYSOFTMAX_CONFIG_DIR/selection), else the results folder's selection/; never into the
    installed package."""
    from .config import results_dir

    over = os.environ.get(ENV_CONFIG_DIR)
    return Path(over) / "selection" if over else results_dir() / "selection"


def cmd_select(args) -> int:
    """Write the selection table of the device the results (or a fresh run) measured."""
    from .bench import selection_table
    from .config import read_yaml_mapping

    paths = [Path(p) for p in args.results]
    if args.run:
        from .bench import softmax as bench

        out = Path(args.bench_out)
        providers = ",".join(_candidates("cuda:0"))
        extra = ["--quick"] if args.quick else []
        for direction in ([], ["--bwd"]):
            code = bench.main([*direction, *extra, "--providers", providers, "--out", str(out)])
            if code:
                return code
        paths += sorted(out.glob("*/softmax_fwd.json")) + sorted(out.glob("*/softmax_bwd.json"))
    if not paths:
        raise UsageError("give benchmark result files (softmax_fwd.json, softmax_bwd.json) or --run")
    docs = [read_yaml_mapping(check_readable(p, "results")) for p in paths]  # JSON is YAML
    try:
        table = selection_table.build_table(docs, args.margin, [str(p) for p in paths])
    except (ValueError, KeyError) as exc:
        print(f"anysoftmax select: {exc}", file=sys.stderr)
        return EXIT_FAILED
    out_dir = Path(args.out) if args.out else default_selection_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{table['key']}.yaml"
    target.write_text(selection_table.dump(table))
    for name, why in table["excluded"].items():
        print(f"excluded {name}: {why}")
    for r in table["rules"]:
        best = {b: v for m in r["measured"].values() for b, v in m.items()}
        print(f"{r['direction']} {r['dtype']:9s} {r['dim']:8s} n {r['n'][0]}..{r['n'][1] or 'inf'} "
              f"rows {r['rows'][0]}..{r['rows'][1] or 'inf'} -> {r['backend']}  {best}")
    print(f"wrote {target} ({len(table['rules'])} rules)")
    if not args.out and not os.environ.get(ENV_CONFIG_DIR):
        print(f"the automatic choice reads it with {ENV_CONFIG_DIR}={out_dir.parent}")
    return EXIT_OK


def cmd_conformance(args) -> int:
    """`anysoftmax conformance NAME`: the conformance kit (`anysoftmax.testing`) on one backend."""
    from .testing import command

    try:
        return command.run(args)
    except command.UsageError as exc:
        raise UsageError(str(exc)) from None


def cmd_merge(args) -> int:
    from .matrix import failed
    from .matrix.report import load_report, merge, print_report, write_reports

    try:
        run = merge([load_report(check_readable(Path(p), "report")) for p in args.reports], args.name)
    except (OSError, ValueError, KeyError) as exc:
        print(f"anysoftmax merge: {exc}", file=sys.stderr)
        return EXIT_USAGE
    paths = write_reports(run, args.out)
    console = _console()
    print_report(run, console)
    console.print(f"reports: {args.out}/ ({', '.join(p.name for p in paths)})", markup=False, highlight=False,
                  soft_wrap=True)
    return EXIT_FAILED if failed(run) else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="anysoftmax", description="One fused softmax on several accelerators: "
                                "device-matrix conformance and benchmark runs.")
    p.add_argument("--version", action="version", version=f"anysoftmax {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    m = sub.add_parser("matrix", help="run a device matrix (configs/*.yaml): conformance, then benchmarks",
                       description="Run every cell of a device-matrix YAML file; exit status 1 when any cell fails.")
    m.add_argument("config", nargs="?", help="YAML file, or the name of a shipped matrix "
                   f"({', '.join(matrix_names())}; default: default)")
    m.add_argument("--json", action="store_true", help="print the summary as JSON instead of tables")
    m.add_argument("--out", help="report folder (default: <results>/matrix/<config name>, <results> being "
                                 "$ANYSOFTMAX_RESULTS_DIR or ~/.local/share/anysoftmax/results)")
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
    b.add_argument("--json", action="store_true", help="print list_backends() and the devices as JSON")
    b.add_argument("--explain", action="append", metavar="SHAPE[:DTYPE[:DIM]]",
                   help="which backend the automatic choice takes for this request, and why (selection table "
                        "rule or priority); e.g. 1024x131072:bf16 or 8192x8192:fp32:0 (repeatable)")
    b.add_argument("--direction", choices=("fwd", "bwd", "both"), default="fwd", help="--explain: forward, backward")
    b.add_argument("--device", default="cuda", help="--explain: the request's device type (default cuda)")
    b.add_argument("--gpu-name", help="--explain: the choice on this GPU, from its selection table (and, unless it "
                                      "is the GPU here, this machine's own choice on a second line): its name "
                                      "('NVIDIA H100 80GB HBM3') or a unique part of it (H100)")
    b.set_defaults(func=cmd_backends)
    c = sub.add_parser("select", help="write the per-device selection table from benchmark results",
                       description="Build configs/selection/<device>.yaml: per shape class the backend the automatic "
                                   "choice takes, from `anysoftmax bench` results (anysoftmax:<backend> rows) of one "
                                   "device; only backends that passed conformance in that run are chosen.")
    c.add_argument("results", nargs="*", help="softmax_fwd.json / softmax_bwd.json of one device")
    c.add_argument("--run", action="store_true",
                   help="first run the benchmark (forward and backward) over every backend available here")
    c.add_argument("--quick", action="store_true", help="--run: a few shapes only")
    c.add_argument("--bench-out", default="benchmarks/results", help="--run: results folder (default "
                                                                      "benchmarks/results)")
    c.add_argument("--out", help="folder for <device>.yaml (default: $ANYSOFTMAX_CONFIG_DIR/selection, where the "
                                 "automatic choice reads it, else <results>/selection; a checkout's shipped tables: "
                                 "anysoftmax/configs/selection)")
    c.add_argument("--margin", type=float, default=0.02,
                   help="a backend beats the priority order's choice only when faster by more than this fraction "
                        "of its time (default 0.02: run-to-run noise)")
    c.set_defaults(func=cmd_select)
    from .testing.command import add_parser as add_conformance

    add_conformance(sub)
    sub.choices["conformance"].set_defaults(func=cmd_conformance)
    sub.add_parser("bench", help="the benchmark suite (anysoftmax.bench); `anysoftmax bench --help` for its options",
                   add_help=False)
    g = sub.add_parser("merge", help="merge report.json files (e.g. one CI job per device entry)")
    g.add_argument("reports", nargs="+", help="report.json files")
    g.add_argument("--out", required=True, help="folder for the merged reports")
    g.add_argument("--name", help="name of the merged report (default: the first report's)")
    g.set_defaults(func=cmd_merge)
    return p


def search_current_folder() -> None:
    """Let modules in the current folder import, as under `python -m anysoftmax`: a `--plugin
    my_pkg.backend` or a matrix's `plugins:` of the user's project. The console script's
    sys.path[0] is its bin folder, not the current one. Appended, not prepended: a folder named
    like an installed package never shadows it in the command's own imports."""
    try:
        here = os.getcwd()
    except OSError:  # the current folder was removed: nothing there to import
        return
    if not any(os.path.abspath(p or os.curdir) == here for p in sys.path):
        sys.path.append(here)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `anysoftmax` and `python -m anysoftmax`; returns the exit status."""
    if argv is None:  # run as the command (not called from Python): the current folder's modules import
        search_current_folder()
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
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"anysoftmax {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
