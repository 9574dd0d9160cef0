"""Compile the sampler's Triton kernels for GPUs this machine does not have (no device needed).

`launches(op, ...)` runs the Triton sampler (`_triton_common/sampling.py`) on CPU tensors with
its launch engine replaced by a recorder: every launch the sampler would make (scan, select,
`probs`' second pass; the runs pre-pass with runs of 64 and of 32; a sharded vocabulary's scan
and select; the kernels around
the one-read paths of `sampling_one_read`) is captured with
the arguments the launch engine would pass by name, then compiled for a `GPUTarget` through the
JIT's own argument binder (`compile_targets.compile_launch`: the specialization a real launch
gets). Nothing runs.

Run as a script (`python tests/backends/triton/sampler_targets.py [--targets sm_90,gfx942]
[--dtypes float32,...]`) in a process WITHOUT TRITON_INTERPRET; it prints one JSON document
(one record per distinct compile, failures recorded with the compiler's message, not raised).
tests/backends/triton/test_sampler_compiles.py runs it and checks the document.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import traceback
from unittest import mock

import torch

from compile_targets import TARGETS, compile_launch, cuda_resources, hip_resources, report_targets

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
OPS = ("sample", "probs", "logprobs")
# Rows and vocabularies: one chunk per row, and several (the select merging chunk states).
SHAPES = ((3, 1000), (2, 20000))
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "launch_pdl", "maxnreg")


def _recording_bind(calls: list):
    """A stand-in for the launch engine's `bind_kernel`: its launcher records (kernel, the
    runtime arguments in the kernel's order, constexprs, options) for each launch instead of
    launching, naming the arguments exactly as `bind_kernel` does."""
    from anysoftmax.backends._triton_common.plan import runtime_params

    def bind_kernel(b, *, scratch=None, device=None, **_):
        def launch(args, values=b.values, per_call=()):
            if scratch is not None:
                args = (*args, *scratch(device))
            named = {**dict(zip(b.pointer_names, b.pointers(args))), **b.ints, **dict(zip(b.floats, values))}
            named.update(zip(b.per_call, per_call))
            for meta in b.metas:
                constexprs = {k: v for k, v in meta.items() if k not in LAUNCH_OPTIONS}
                options = {k: v for k, v in meta.items() if k in LAUNCH_OPTIONS}
                calls.append((b.kernel, tuple(named[n] for n in runtime_params(b.kernel)), constexprs, options))
        return launch

    return bind_kernel


def _keywords(op: str, rows: int, per_row: bool) -> dict:
    """Keywords of `op` as numbers, or as per-row tensors (every one the op takes)."""
    if op == "logprobs":
        return dict(temperature=torch.full((rows,), 0.8)) if per_row else dict(temperature=0.8)
    if not per_row:
        kw = dict(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05)
        return {**kw, "seed": 5, "offset": 3} if op == "sample" else kw
    kw = dict(temperature=torch.full((rows,), 0.7), top_k=torch.full((rows,), 20), top_p=torch.full((rows,), 0.9),
              min_p=torch.full((rows,), 0.05))
    if op == "sample":
        kw.update(seed=torch.arange(rows), offset=torch.full((rows,), 3))
    return kw


def launches(op: str, dtype: torch.dtype, rows: int, vocab: int, per_row: bool, short_runs: bool = False,
             pdl: bool = False, overlap: int = 0) -> list:
    """[(kernel, args, constexprs, options)] the Triton sampler launches for one request (with
    `short_runs`, on the plan whose runs pre-pass has runs of 32: `sampling.short_runs_window`;
    with `pdl`, each launch with programmatic dependent launch: `SamplingPlan.pdl`; with
    `overlap`, the runs pre-pass overlapping the collect, that many runs programs a collect
    program: `SamplingPlan.overlap`)."""
    from anysoftmax.backends._triton_common import sampling as s
    from anysoftmax.sampling.spec import SamplingSpec, check_ids

    x = torch.randn(rows, vocab).to(dtype)
    kw = _keywords(op, rows, per_row)
    spec = SamplingSpec.from_request(op, x, **kw)
    plan = dataclasses.replace(s.plan_for(rows, vocab, x.device, programs=4, short_runs=short_runs), pdl=pdl,
                               overlap=overlap)
    calls: list = []
    s._bound.clear()
    with mock.patch.object(s, "bind_kernel", _recording_bind(calls)):
        if op == "sample":
            s.sample(spec, x, True, plan=plan)
        elif op == "probs":
            s.probs(spec, x, plan=plan)
        else:
            ids = check_ids(op, spec, torch.randint(0, vocab, (rows, 3)))
            s.logprobs(spec, x, ids, 4, plan=plan)
    s._bound.clear()
    return calls


def sharded_launches(dtype: torch.dtype, rows: int, vocab: int, per_row: bool) -> list:
    """The launches of a vocabulary sharded in two: one shard's scan, the select of both."""
    from anysoftmax.backends._triton_common import sampling as s
    from anysoftmax.sampling.spec import SamplingSpec

    x = torch.randn(rows, vocab // 2).to(dtype)
    spec = SamplingSpec.from_request("sample", x, **_keywords("sample", rows, per_row))
    calls: list = []
    s._bound.clear()
    with mock.patch.object(s, "bind_kernel", _recording_bind(calls)):
        ws, space, plan = s.scan_shard(spec, x, 0, vocab)
        gathered = torch.zeros((2, space.shard_words), dtype=torch.int32)
        s.select_shards(spec, gathered, 2, vocab, plan)
    s._bound.clear()
    return calls


class _ReadStandIn:
    """A backend whose softmax and logsumexp launchers give outputs without launching (their
    kernels compile in their own tests): what `sampling_one_read.Sampler` needs around its own."""

    @staticmethod
    def launcher(x, spec):
        return lambda x, ops: (torch.zeros(x.shape, dtype=torch.float32), None)

    @staticmethod
    def logsumexp_launcher(x, spec, operands):
        return lambda x, ops: torch.zeros((x.shape[0], 1), dtype=torch.float32)


def one_read_launches(op: str, dtype: torch.dtype, rows: int, vocab: int, per_row: bool) -> list:
    """The launches of the one-read paths (`sampling_one_read`) around the softmax / logsumexp:
    `probs` with only a temperature, `logprobs` without top_n (its one launch, and the gather a
    backend with plans of its own takes)."""
    from anysoftmax.backends._triton_common import sampling_one_read as r
    from anysoftmax.sampling.spec import SamplingSpec, check_ids

    x = torch.randn(rows, vocab).to(dtype)
    t = torch.full((rows,), 0.8) if per_row else 0.8
    spec = SamplingSpec.from_request(op, x, temperature=t)
    calls: list = []
    r._bound.clear()
    with mock.patch.object(r.sampling, "bind_kernel", _recording_bind(calls)):
        if op == "probs":
            r.Sampler(_ReadStandIn()).probs(spec, x)
        else:
            for plans in (None, lambda spec: None):
                r.Sampler(_ReadStandIn(), plans).logprobs(spec, x, check_ids(op, spec, torch.randint(0, vocab,
                                                                                                    (rows, 3))))
    r._bound.clear()
    return calls


def _signature(kernel, args, constexprs) -> tuple:
    """What decides a compile: argument types, 16-divisibility of integers, constexprs."""
    def kind(a):
        if isinstance(a, torch.Tensor):
            return str(a.dtype)
        if isinstance(a, int) and not isinstance(a, bool):
            return ("int", a == 1, a % 16 == 0)
        return type(a).__name__
    return kernel.__name__, tuple(kind(a) for a in args), tuple(sorted(constexprs.items()))


def _error(exc: BaseException) -> str:
    """The exception and its causes (a CompilationError names the line; its cause says why)."""
    parts = []
    while exc is not None:
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__
    return "\ncaused by ".join(parts)


def compile_target(target: str, dtypes: dict, shapes: tuple = SHAPES) -> dict:
    """Compile every launch of every request (`OPS` and a sharded `sample`; keywords as numbers
    and per row) for `target`: {kernels: [...], errors: [...]}."""
    from anysoftmax.backends._triton_common import sampling

    kernels, errors, seen = [], [], set()
    cuda = TARGETS[target].backend == "cuda"
    # (the overlapping plans, `SamplingPlan.overlap`: the default's runs programs a collect
    # program, and 6 at the registers a thread that leaves them, `sampling.overlap_registers`)
    overlaps = tuple(f"sample-overlap{n}-pdl" for n in (sampling.OVERLAP_RUNS, 6))
    ops = (*OPS, "sample-short-runs", "sample-sharded", "probs-one-read", "logprobs-one-read",
           *(("sample-pdl", "probs-pdl", *overlaps) if cuda else ()))  # (programmatic dependent launch: CUDA only)
    # (the PDL launches with per-row keywords only, and `probs`' and the overlapping plan's on a
    # plan of several launches only: the attribute and the waits depend on neither, and the
    # one-launch kernel is `sample`'s)
    requests = [(op, d, rows, vocab, per_row) for op in ops for d in dtypes for rows, vocab in shapes
                for per_row in (False, True) if per_row or not op.endswith("-pdl")
                if op == "sample-pdl" or not op.endswith("-pdl") or rows > sampling.FUSED_MAX_ROWS]
    for op, dname, rows, vocab, per_row in requests:
        overlap = int(op.split("-overlap")[1].split("-")[0]) if "-overlap" in op else 0
        where = dict(target=target, op=op, dtype=dname, rows=rows, vocab=vocab, per_row=per_row, overlap=overlap)
        try:
            if op == "sample-sharded":
                calls = sharded_launches(dtypes[dname], rows, vocab, per_row)
            elif op.endswith("-one-read"):
                calls = one_read_launches(op.split("-")[0], dtypes[dname], rows, vocab, per_row)
            elif op == "sample-short-runs":
                calls = launches("sample", dtypes[dname], rows, vocab, per_row, short_runs=True)
            elif op.endswith("-pdl"):
                calls = launches(op.split("-")[0], dtypes[dname], rows, vocab, per_row, pdl=True, overlap=overlap)
            else:
                calls = launches(op, dtypes[dname], rows, vocab, per_row)
        except Exception as exc:
            errors.append(dict(where, stage="launch", error=f"{type(exc).__name__}: {exc}",
                               traceback=traceback.format_exc(limit=-4)))
            continue
        for kernel, args, constexprs, options in calls:
            key = (_signature(kernel, args, constexprs), options.get("launch_pdl", False), options.get("maxnreg"))
            if key in seen:
                continue
            seen.add(key)
            record = dict(where, kernel=kernel.__name__, constexprs={k: v for k, v in constexprs.items()},
                          num_warps=options.get("num_warps"))
            try:
                t0 = time.perf_counter()
                compiled, how = compile_launch(kernel, args, constexprs, target, options)
                res = cuda_resources(compiled) if cuda else hip_resources(compiled)
                # (PDL: the launch attribute Triton's and the native launcher read, and the waits
                # in the code; a launch that set one without the other would race or gain nothing)
                pdl = dict(launch_pdl=bool(getattr(compiled.metadata, "launch_pdl", False)),
                           gdc_wait="griddepcontrol.wait" in compiled.asm.get("ptx", ""),
                           gdc_launch="griddepcontrol.launch_dependents" in compiled.asm.get("ptx", ""))
                record.update(res, compile_s=round(time.perf_counter() - t0, 2), specialization=how,
                              shared=int(compiled.metadata.shared), **pdl)
                kernels.append(record)
            except Exception as exc:
                errors.append(dict(record, stage="compile", error=_error(exc),
                                   traceback=traceback.format_exc(limit=-6)))
    return dict(kernels=kernels, errors=errors)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="sm_90,gfx942", help="comma-separated keys of TARGETS")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated: " + ", ".join(DTYPES))
    parser.add_argument("--shapes", default=",".join(f"{r}x{v}" for r, v in SHAPES),
                        help="comma-separated ROWSxVOCAB requests")
    a = parser.parse_args(argv)
    shapes = tuple(tuple(int(n) for n in shape.split("x")) for shape in a.shapes.split(","))
    dtypes = {d: DTYPES[d] for d in a.dtypes.split(",")}
    json.dump(report_targets(a.targets, lambda target: compile_target(target, dtypes, shapes)), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
