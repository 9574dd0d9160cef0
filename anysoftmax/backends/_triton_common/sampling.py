"""The sampler on Triton (CUDA and HIP; Ascend NPUs on `triton_ascend`'s own plan): plans,
launchers, and `probs`, `sample`, `logprobs` of a validated request (`anysoftmax.sampling.spec`),
handed out through `sampling_one_read.Sampler`. Kernels: `sampling_kernels.py`; the algorithm,
its launches and the semantics: docs/sampling.md. Per-call values (keyword numbers, the seed and
offset as 32-bit words, flags) are kernel arguments, never compiled in; nothing reads a device
value on the host.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from ...core.cache import OnceCache
from ...core.layout import cdiv, next_power_of_2, output_maker
from ...sampling.rng import generator_seed
from ...sampling.spec import KEYWORDS, SamplingSpec
from .interpreted_launch import interpreted
from .launcher import Binding, bind_kernel, per_stream, row_counters
from .plan import runtime_params

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_CHUNK = 8192  # elements of a row one program holds
# Warps of a MAX_CHUNK program: 16 elements a thread, held in 128 registers without spilling
# (sm_90); 8 and 32 warps are slower on the H100 (docs/speed.md, the sampler).
MAX_CHUNK_WARPS = 16
MAX_SELECT_BLOCK = 4096  # candidates one select holds: chunks (to a power of two) x slots
MIN_SLOTS, MAX_SLOTS = 32, 256
# The runs pre-pass (`runs_kernel`, `collect_kernel`) serves top-k bounds and top-n up to half of
# a chunk's runs, on plans of full chunks up to RUNS_MAX_GROUPS chunks a row (the collect holds
# the row's runs as one block), from RUNS_MIN_ROWS rows (below, the one-row collect's chain of
# steps costs more than the scan it saves).
RUN_CAP, RUNS_BLOCK = 128, 4096  # (sampling_kernels.RUN_CAP; elements a runs program reads)
RUNS_MAX_GROUPS = 32
RUNS_MIN_ROWS = 16
# Runs of 32 elements serve bounds up to 128 (runs of 64: up to 64) at twice the collect's reads.
# NVIDIA H200, V = 128256, GPU us (docs/speed.md, "Runs of 32"): `sample` with a top-k bound of
# 100 at 64 / 128 / 512 rows 104 -> 100 / 199 -> 161 / 679 -> 473 (bf16); a bound of 50 up to 128
# rows 0.8-1.8 us less, at 256-512 rows 6-12 % more; a bound of 100 at 16 rows 16 us more; top-20
# `logprobs` 0.2-0.5 us more up to 128 rows, 10-17 % more beyond. So runs of 32 serve a top-k
# number of 65-128 from SHORT_RUNS_WIDE_ROWS rows and one up to 64 up to SHORT_RUNS_NARROW_ROWS
# rows; a per-row top_k tensor (its values unseen on the host) from SHORT_RUNS_WIDE_ROWS rows,
# where serving bounds past 64 saves far more than a bound of 50 loses; top-n past 64 only.
LONG_RUN, SHORT_RUN = 64, 32
SHORT_RUNS_WIDE_ROWS, SHORT_RUNS_NARROW_ROWS = 32, 128
# An overlapping plan (`SamplingPlan.overlap`) puts `overlap` runs programs of 4 warps beside one
# collect program of 4 warps (255 registers a thread, 256 allocated) on each multiprocessor: the
# runs get at most 256 // overlap registers a thread of an sm_90 multiprocessor's 64K
# (`overlap_registers`); one too many would keep the collect's programs off until the runs end.
# The persistent runs kernel takes 61 unbounded, so OVERLAP_RUNS (4) fit as compiled; 6 fit at
# 40. A collect program reads a row's count at most OVERLAP_SPINS times before it waits for the
# whole runs launch instead.
OVERLAP_RUNS = 4
OVERLAP_SPINS = 1 << 16
# Up to FUSED_MAX_ROWS rows the scan and the select are one launch (`scan_select_kernel`): a
# launch costs the host 5-8 us on the H200 hosts, most of a call's GPU time at a few rows. Its
# chunks hold FUSED_CHUNK elements at 8 warps: the select's code then keeps its registers (at
# 16 warps, 128 a thread, it spills: float32 rows took 1.5-2x the GPU time). NVIDIA H200, V =
# 128256: host -7 to -8 us a call, GPU time -0.3 to +3.4 us up to 4 rows, +8 to +11 us at 8
# (docs/speed.md, "A few rows in one launch").
FUSED_MAX_ROWS = 4
FUSED_CHUNK = 4096
STATE_WORDS, RESULT_WORDS = 16, 8  # (sampling_kernels.NS, NR)
# Keyword flags (sampling_kernels.FL_*): bit 2i from a tensor, bit 2i + 1 one value per row.
KEYWORD_BITS = {"temperature": 0, "top_k": 2, "top_p": 4, "min_p": 6, "seed": 8, "offset": 10}
OPS = {"sample": 0, "probs": 1, "logprobs": 2}
INT32_MAX = 2**31 - 1


def _prev_power_of_2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


@dataclass(frozen=True)
class SamplingPlan:
    """How a request is cut: `chunk` elements of a row per work item (a power of two), `slots`
    candidates per chunk (a power of two; top-k bounds and top-n up to `slots // 2` are served
    from candidates, larger top-k bounds by the exact general path), `grid` persistent programs
    of the scan and of `probs`' second pass, `tile` the elements per step of the select's loops
    (the race, the general path, the ids)."""

    chunk: int
    slots: int
    grid: int
    num_warps: int = 8
    select_warps: int = 8
    tile: int = 1024
    runs: bool = False  # the runs pre-pass serves the top-k rows it can
    run: int = LONG_RUN  # elements of its runs (a power of two dividing `chunk`)
    collect_warps: int = 8
    fused: bool = False  # the scan and the select in one launch (`scan_select_kernel`)
    # Each launch with programmatic dependent launch (CUDA sm_90+ only): its programs are placed
    # while the launch before it finishes, and wait for it (`sampling_kernels._after_previous_launch`).
    # `plan_for` sets it where it can (`dependent_launch`): 2-4 us less a call from 16 rows on.
    pdl: bool = False
    # The runs pre-pass overlapping the collect: a persistent runs launch of `overlap` programs a
    # collect program (one collect program a multiprocessor: half of `grid`) counting each row's
    # stored blocks, and the collect reading a row as soon as its count is full: with `pdl`, the
    # collect's programs start while the runs go on (`sampling_kernels.collect_kernel`). 0: off.
    overlap: int = 0

    def chunks(self, vocab: int) -> int:
        return cdiv(vocab, self.chunk)

    def groups_pow2(self, vocab: int, shards: int = 1) -> int:
        return next_power_of_2(self.chunks(vocab) * shards)

    @property
    def k_cap(self) -> int:
        """The largest top-k bound (and top-n) the candidates serve."""
        return self.slots // 2


@dataclass(frozen=True)
class Workspace:
    """Word offsets (int32 words) of one launch's workspace: per (row, chunk) the state words
    and the candidates' z bits and global ids, per row the select's scratch and its result.
    The first `shard_words` words (states and candidates) are what a sharded vocabulary
    all-gathers."""

    state_off: int
    cz_off: int
    ci_off: int
    scr_off: int
    res_off: int
    words: int
    # A plan with the runs pre-pass: per row the runs' max, sum and finite count, and scratch; the
    # rows the collect left to the scan and those it served (each: a count, then the rows); the
    # served rows' state words and candidates, one chunk of `slots` a row.
    run_off: int = 0
    left_off: int = 0
    served_off: int = 0
    compact_off: int = 0

    def compact(self, rows: int, slots: int) -> "Workspace":
        """This workspace with the states and candidates of the served rows' one-chunk layout."""
        at = self.compact_off
        return dataclasses.replace(self, state_off=at, cz_off=at + rows * STATE_WORDS,
                                   ci_off=at + rows * (STATE_WORDS + slots))

    @property
    def shard_words(self) -> int:
        return self.scr_off

    @classmethod
    def of(cls, plan: SamplingPlan, rows: int, vocab: int, shards: int = 1) -> "Workspace":
        items = rows * plan.chunks(vocab)
        cz = items * STATE_WORDS
        ci = cz + items * plan.slots
        scr = ci + items * plan.slots
        res = scr + rows * 2 * plan.groups_pow2(vocab, shards) * plan.slots
        end = res + rows * RESULT_WORDS
        if not plan.runs:
            return cls(0, cz, ci, scr, res, end)
        left = end + rows * (3 * plan.chunks(vocab) * (plan.chunk // plan.run) + RUN_CAP)
        served = left + 1 + rows
        compact = served + 1 + rows
        return cls(0, cz, ci, scr, res, compact + rows * (STATE_WORDS + 2 * plan.slots), end, left, served, compact)


@functools.lru_cache(maxsize=None)
def _programs_at(index: int) -> int:
    return 2 * torch.cuda.get_device_properties(index).multi_processor_count


def default_programs(device: torch.device, items: int) -> int:
    """Persistent programs on `device`: two per multiprocessor on a GPU (a program's chunk loads
    overlap another's compute), one per work item (`items`) elsewhere."""
    if device.type != "cuda":
        return items
    return _programs_at(device.index if device.index is not None else torch.cuda.current_device())


def overlap_registers(overlap: int) -> int:
    """Registers a thread (`maxnreg`, a multiple of 8) of a runs program of an overlapping plan
    with `overlap` runs programs a collect program: what a multiprocessor holds beside the collect."""
    return min(255, 256 // overlap // 8 * 8)


@functools.lru_cache(maxsize=None)
def dependent_launch(device: torch.device) -> bool:
    """Whether the sampler's launches on `device` take programmatic dependent launch: an NVIDIA
    GPU of sm_90 or later, compiled kernels (not the interpreter) and a Triton that has its
    `griddepcontrol` instructions."""
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    from . import sampling_kernels as k

    index = device.index if device.index is not None else torch.cuda.current_device()
    return (k.DEPENDENT_LAUNCH and not interpreted(k.runs_kernel)
            and torch.cuda.get_device_capability(index) >= (9, 0))


# (memoised: a call's plan is then the same object, which its launcher key compares by identity;
# callers pass a tensor's device, whose CUDA index is set)
@functools.lru_cache(maxsize=1024)
def plan_for(rows: int, vocab: int, device: torch.device, programs: int | None = None, top_n: int = 0,
             one_launch: bool = True, wide_k: bool = False, short_runs: bool = False) -> SamplingPlan:
    """The default plan: chunks of up to MAX_CHUNK elements (FUSED_CHUNK on a fused plan: up to
    FUSED_MAX_ROWS rows, where its candidates serve `top_n`, unless not `one_launch`: a sharded
    vocabulary's scan, or `wide_k`: a top-k bound past its candidates, `wide_top_k`); as many
    candidate slots per chunk as keep the select's block at MAX_SELECT_BLOCK; a grid of
    `programs` (default: `default_programs`); with the runs pre-pass, runs of SHORT_RUN elements
    where `short_runs` (`short_runs_window`), else LONG_RUN; programmatic dependent launch where
    `dependent_launch` allows it, but not on a sharded vocabulary's scan (`one_launch` False:
    the collectives' kernels come between its launches)."""
    def cut(most: int) -> tuple[int, int]:
        chunk = min(most, max(16, next_power_of_2(vocab)))
        return chunk, min(MAX_SLOTS, max(MIN_SLOTS, _prev_power_of_2(MAX_SELECT_BLOCK // next_power_of_2(
            cdiv(vocab, chunk)))))
    chunk, slots = cut(FUSED_CHUNK)
    fused = one_launch and not wide_k and rows <= FUSED_MAX_ROWS and top_n <= slots // 2
    if not fused:
        chunk, slots = cut(MAX_CHUNK)
    groups = next_power_of_2(cdiv(vocab, chunk))
    items = max(1, rows * cdiv(vocab, chunk))
    programs = default_programs(device, items) if programs is None else programs
    warps = MAX_CHUNK_WARPS if chunk >= MAX_CHUNK else 8 if chunk >= 4096 else 4
    runs = chunk == MAX_CHUNK and groups <= RUNS_MAX_GROUPS and rows >= RUNS_MIN_ROWS
    grid = max(1, min(items, programs))
    pdl = one_launch and dependent_launch(device)
    if not runs:
        return SamplingPlan(chunk=chunk, slots=slots, grid=grid, num_warps=warps, fused=fused, pdl=pdl)
    # The collect (one row a program, ~255 registers a thread) fits one 8-warp program a
    # multiprocessor or two of 4 warps: 8 warps while every row has a multiprocessor, 4 beyond;
    # the select at 4 (H100: docs/speed.md, the runs pre-pass).
    return SamplingPlan(chunk=chunk, slots=slots, grid=grid, num_warps=warps, runs=True,
                        run=SHORT_RUN if short_runs else LONG_RUN,
                        collect_warps=4 if rows > programs // 2 else 8, select_warps=4, pdl=pdl)


def short_runs_window(rows: int, vocab: int, device: torch.device, top_n: int = 0) -> tuple[int, int, bool]:
    """(lo, hi, tensor): on these rows a top-k number (with `top_n`: that top-n) b with lo < b <=
    hi takes `plan_for`'s runs of SHORT_RUN elements (`short_runs`), as a per-row top_k tensor
    does where `tensor` (the measured rule above); (0, 0, False) without the runs pre-pass."""
    if not plan_for(rows, vocab, device, programs=1, top_n=top_n).runs:
        return 0, 0, False
    long_cap, short_cap = MAX_CHUNK // LONG_RUN // 2, MAX_CHUNK // SHORT_RUN // 2
    wide = rows >= SHORT_RUNS_WIDE_ROWS
    hi = short_cap if wide else long_cap
    if top_n:
        return long_cap, hi, False
    return (0 if rows <= SHORT_RUNS_NARROW_ROWS else long_cap), hi, wide


def wide_top_k(rows: int, vocab: int, device: torch.device, top_n: int = 0) -> tuple[int, int]:
    """(lo, hi): a top-k number k with lo < k <= hi is past the candidates of the fused plan
    `plan_for` gives these rows but within those of the two-launch plan, which then serves it
    (`wide_k`), as it serves every per-row top_k tensor (its values are not seen on the host):
    on the fused plan such a row would take the general path, a search over the whole row
    (NVIDIA H200, 1-4 rows of 128256: 1.0-3.1 ms against 29-85 us; docs/speed.md). (0, 0)
    where the plan is not fused."""
    fused = plan_for(rows, vocab, device, programs=1, top_n=top_n)
    if not fused.fused:
        return 0, 0
    return fused.k_cap, plan_for(rows, vocab, device, programs=1, top_n=top_n, wide_k=True).k_cap


def supports(spec: SamplingSpec, top_n: int = 0, plan: SamplingPlan | None = None) -> str | None:
    """Why these kernels do not take `spec` (a reason naming it), or None when they do."""
    if spec.dtype not in SUPPORTED_DTYPES:
        return f"the Triton sampler computes in float32: {spec.dtype} logits are not taken (the torch sampler is)"
    if spec.vocab > INT32_MAX:
        return f"a vocabulary of {spec.vocab} tokens exceeds the kernels' 32-bit token indices"
    plan = plan or plan_for(spec.rows, spec.vocab, spec.device, programs=1, top_n=top_n)
    if top_n > plan.k_cap:
        return f"logprobs' top_n {top_n} exceeds the {plan.k_cap} candidates a chunk keeps"
    return None


def _word_pair(value: int) -> tuple[int, int]:
    """A 64-bit value (signed int64 range) as two signed 32-bit words (low, high): kernel
    integer arguments keep one 32-bit type whatever the value."""
    lo, hi = value & 0xFFFFFFFF, (value >> 32) & 0xFFFFFFFF
    return lo - (1 << 32) if lo >= 1 << 31 else lo, hi - (1 << 32) if hi >= 1 << 31 else hi


# ---- bound launchers -----------------------------------------------------------------------------

PER_CALL = ("top_k", "seed_lo", "seed_hi", "off_lo", "off_hi", "flags")
# The kernels' per-call floats: their values where a call gives none (each keyword off).
FLOATS = {"temperature": 1.0, "top_p": 1.0, "min_p": 0.0, "scale": 1.0}


# The element type each pointer operand a call may leave absent is loaded or stored as. Its
# stand-in must have that type: the compiled kernel types a load even where a flag skips it at
# run time, and `if flag: k = tl.load(k_ptr)` must give `k` the type its other branch gives.
OPERAND_DTYPES = {"x_ptr": torch.float32, "out_i_ptr": torch.int64, "out_f_ptr": torch.float32,
                  "out_f2_ptr": torch.float32, "ids_ptr": torch.int64, "t_ptr": torch.float32, "k_ptr": torch.int64,
                  "p_ptr": torch.float32, "mp_ptr": torch.float32, "seed_ptr": torch.int64, "off_ptr": torch.int64,
                  "s_ptr": torch.float32, "undecided_ptr": torch.int64,
                  "count_ptr": torch.int64}  # (int32 row counts: absent only where no kernel reads them)


@functools.lru_cache(maxsize=None)
def stand_ins(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32, int64) one-element tensors on `device` standing in for absent pointer operands
    (never read): every launcher's scratch ends with them."""
    return torch.zeros(1, dtype=torch.float32, device=device), torch.zeros(1, dtype=torch.int64, device=device)


def operand_pointers(operands: tuple):
    """A `Binding.pointers` for a call's `operands` (pointer names; None where absent), then its
    scratch, ending with `stand_ins`: each operand, an absent one stood in for by the stand-in of
    its element type (`OPERAND_DTYPES`), then the scratch before the stand-ins. It only picks
    positions, so the launch engine can map argument indices through it (its fast path)."""
    picks = tuple({torch.float32: -2, torch.int64: -1}.get(OPERAND_DTYPES.get(name)) for name in operands)
    n = len(operands)

    def pointers(args: tuple) -> tuple:
        return (*(a if a is not None else args[pick] for a, pick in zip(args, picks)), *args[n:-2])
    return pointers


def launcher(kernel, grid: int, ints: dict, meta: dict, device: torch.device, pdl: bool = False):
    """A sampler `kernel` bound through the launch engine on `grid` programs: its pointers (`*_ptr`)
    a call's operands, its integers by name from `ints` (`PER_CALL`'s given per call), its
    floats (`FLOATS`) per call; a kernel with a PDL constexpr launched with programmatic
    dependent launch where `pdl` (`SamplingPlan.pdl`)."""
    if pdl and interpreted(kernel):
        raise ValueError("SamplingPlan.pdl: programmatic dependent launch needs a CUDA GPU of sm_90 or later; "
                         "the Triton interpreter has no launches to overlap")
    if "PDL" in kernel.arg_names:
        meta = {**meta, "PDL": pdl, **({"launch_pdl": True} if pdl else {})}
    params = runtime_params(kernel)
    pointers = tuple(n for n in params if n.endswith("_ptr"))
    floats = tuple(n for n in params if n in FLOATS)
    named = {n: ints[n] for n in params if n not in pointers and n not in floats}
    return bind_kernel(Binding(kernel, grid, pointers, operand_pointers(pointers), named, (meta,), floats,
                               tuple(FLOATS[n] for n in floats), tuple(n for n in PER_CALL if n in named)),
                       scratch=stand_ins, device=device)


def _ints(spec: SamplingSpec, plan: SamplingPlan, space: Workspace, request: dict, shards: int = 1, **given) -> dict:
    """Every integer argument of the sampler's kernels by name: the request's (`request`: xs, top_n,
    n_ids, vocab_start, vocab_total), its layout (`plan`, `space`), `given`; 0 for the per-call ones."""
    chunks = plan.chunks(spec.vocab)
    return {"n_rows": spec.rows, "vocab": spec.vocab, "ys": spec.vocab, "n_chunks": chunks, "n_groups": chunks * shards,
            "shard_stride": 0, "rows_off": 0, **dataclasses.asdict(space), **dict.fromkeys(PER_CALL, 0), **request,
            **given}


@dataclass(frozen=True)
class Bound:
    """A request's launchers: `scan`, `select`, `second` (probs' pass 2); with the runs
    pre-pass, `runs`, `collect` and the scan that skips the rows the collect served; on a fused
    plan, `scan_select` (the scan and the select in one launch) in `select`'s place."""

    plan: SamplingPlan
    space: Workspace
    scan: object
    select: object
    second: object
    runs: object = None
    collect: object = None  # (serving rows as one chunk each: `select_served` reads them)
    collect_chunks: object = None  # (serving rows in the scan's layout: a sharded vocabulary's)
    scan_rest: object = None
    select_served: object = None
    select_rest: object = None
    scan_select: object = None

    @property
    def counted(self) -> bool:
        """Whether a call takes per-row counters (`row_counters`): a fused plan, an overlapping one."""
        return self.scan_select is not None or (self.runs is not None and self.plan.overlap > 0)

    def takes_runs(self, ints, top_n: int) -> bool:
        """Whether the runs pre-pass serves this call: the plan has it, and the call has a top-k
        bound (a tensor, or a number up to half a chunk's runs) or such a top-n."""
        top_k, flags, cap = ints[0], ints[-1], self.plan.chunk // self.plan.run // 2
        return self.runs is not None and (0 < top_n <= cap or (not top_n and (
            flags & (1 << KEYWORD_BITS["top_k"]) or 0 < top_k <= cap)))

    def run(self, x, ws, tensors, floats, ints, outs: tuple | None = None, top_n: int = 0, counts=None) -> None:
        """Pass one, after the runs pre-pass where it serves the call, then the select of every row
        into `outs` (out_i, out_f, out_f2, ids), the rows the pre-pass served from their one-chunk
        layout; on a fused plan both in one launch, `counts` its per-row arrival counts (int32,
        zero), on an overlapping plan the runs' row counts (`counted`). Without `outs`, pass one
        alone, every row in the scan's layout (what a sharded vocabulary's select reads)."""
        if outs is not None and self.scan_select is not None:
            self.scan_select((x, ws, counts, *outs, *tensors), floats, ints)
            return
        runs = self.takes_runs(ints, top_n)
        if runs:
            if self.plan.overlap and counts is None:
                raise ValueError("SamplingPlan.overlap: the runs' row counts are a whole call's; a sharded "
                                 "vocabulary's scan (no select here) takes a plan without it")
            self.runs((x, ws, counts, *tensors[:4]), floats, ints)
            (self.collect_chunks if outs is None else self.collect)((x, ws, counts, *tensors[:4]), floats, ints)
        (self.scan_rest if runs else self.scan)((x, ws, counts if runs else None, *tensors), floats, ints)
        if outs is None:
            return
        selected = (x, ws, ws, *outs, *tensors, None)
        if runs:
            self.select_served(selected, floats, ints)
            self.select_rest(selected, floats, ints)
        else:
            self.select(selected, floats, ints)


_bound = OnceCache(maxsize=128)


def _bind(op: str, spec: SamplingSpec, plan: SamplingPlan, request: dict, device: torch.device) -> Bound:
    from . import sampling_kernels as k

    space = Workspace.of(plan, spec.rows, spec.vocab)
    ints = _ints(spec, plan, space, request)
    items = spec.rows * plan.chunks(spec.vocab)
    grid = max(1, min(plan.grid, items))
    scan_meta = dict(OP=OPS[op], CHUNK=plan.chunk, C_SLOT=plan.slots, TILE=plan.tile, num_warps=plan.num_warps)
    scan = launcher(k.scan_kernel, grid, ints, {**scan_meta, "RUNS": False, "OVERLAP": False}, device, plan.pdl)
    select = None if plan.fused else _select_launcher(op, spec, plan, space, request, device)
    second = None
    if op == "probs":
        second = launcher(k.probs_kernel, grid, ints, dict(CHUNK=plan.chunk, num_warps=plan.num_warps), device,
                          plan.pdl)
    if not plan.runs:
        scan_select = None
        if plan.fused:
            scan_select = launcher(k.scan_select_kernel, grid, ints, dict(
                OP=OPS[op], CHUNK=plan.chunk, C_SLOT=plan.slots, G_P2=plan.groups_pow2(spec.vocab),
                KP=next_power_of_2(plan.k_cap), TILE=plan.tile, num_warps=plan.num_warps), device, plan.pdl)
        return Bound(plan, space, scan, select, second, scan_select=scan_select)
    block = min(RUNS_BLOCK, plan.chunk)
    blocks = items * (plan.chunk // block)
    row_blocks = blocks // spec.rows
    ints = {**ints, "row_blocks": row_blocks}
    runs_meta = dict(CHUNK=plan.chunk, BLOCK=block, RUN=plan.run, OVERLAP=plan.overlap > 0, num_warps=4)
    if plan.overlap:
        runs_meta["maxnreg"] = overlap_registers(plan.overlap)
    collectors = max(1, plan.grid // 2)  # (overlapping: one collect program a multiprocessor)
    runs = launcher(k.runs_kernel, min(blocks, plan.overlap * collectors) if plan.overlap else blocks, ints,
                    runs_meta, device, plan.pdl)
    # The collect writes the rows it serves as one chunk each (`compact`, which `select_served`
    # reads) or in the scan's layout (`collect_chunks`: what a sharded vocabulary all-gathers).
    compact = space.compact(spec.rows, plan.slots)
    # (overlapping: one collect program a multiprocessor, as the registers allow beside the runs
    # programs; a second would start only once the runs launch has ended)
    collect_grid = max(1, min(collectors if plan.overlap else plan.grid, spec.rows))
    collect_meta = dict(OP=OPS[op], CHUNK=plan.chunk, C_SLOT=plan.slots, G_P2=plan.groups_pow2(spec.vocab),
                        RUN=plan.run, COMPACT=False, OVERLAP=plan.overlap > 0, SPINS=OVERLAP_SPINS,
                        num_warps=plan.collect_warps)
    collect = launcher(k.collect_kernel, collect_grid, _ints(spec, plan, compact, request, row_blocks=row_blocks),
                        {**collect_meta, "COMPACT": True}, device, plan.pdl)
    collect_chunks = launcher(k.collect_kernel, collect_grid, ints, collect_meta, device, plan.pdl)
    scan_rest = launcher(k.scan_kernel, grid, ints, {**scan_meta, "RUNS": True, "OVERLAP": plan.overlap > 0}, device,
                         plan.pdl)
    one_chunk = dataclasses.replace(plan, chunk=next_power_of_2(spec.vocab))
    select_served = _select_launcher(op, spec, one_chunk, compact, request, device, rows_off=space.served_off)
    select_rest = _select_launcher(op, spec, plan, space, request, device, rows_off=space.left_off)
    return Bound(plan, space, scan, select, second, runs, collect, collect_chunks, scan_rest, select_served,
                 select_rest)


def _select_launcher(op: str, spec: SamplingSpec, plan: SamplingPlan, space: Workspace, request: dict,
                     device: torch.device, shards: int = 1, has_x: bool = True, shard_stride: int = 0,
                     rows_off: int | None = None):
    from . import sampling_kernels as k

    ints = _ints(spec, plan, space, request, shards, shard_stride=shard_stride, rows_off=rows_off or 0)
    meta = dict(OP=OPS[op], HAS_X=has_x, C_SLOT=plan.slots, G_P2=plan.groups_pow2(spec.vocab, shards),
                KP=next_power_of_2(plan.k_cap), TILE=plan.tile, ROWS=rows_off is not None,
                num_warps=plan.select_warps)
    return launcher(k.select_kernel, max(1, min(spec.rows, plan.grid)), ints, meta, device, plan.pdl)


def rows_view(logits: torch.Tensor, spec: SamplingSpec) -> torch.Tensor:
    """The logits as [rows, V] with unit stride along V (a copy only when they have none)."""
    # (each step only where it does something: a no-op detach or reshape still costs ~1 us a call)
    x = logits.detach() if logits.requires_grad else logits
    x = x if x.dim() == 2 else x.reshape(spec.rows, spec.vocab)
    return x if x.stride(-1) == 1 or spec.vocab == 1 else x.contiguous()


def _aligned(*tensors) -> tuple:
    """Each operand's presence and 16-byte alignment (None: absent), for the request's key."""
    return tuple(None if t is None else t.data_ptr() % 16 == 0 for t in tensors)


def _launchers(op: str, spec: SamplingSpec, x: torch.Tensor, plan: SamplingPlan | None, top_n: int = 0,
               n_ids: int = 0, tensors: tuple = (), vocab_start: int = 0, vocab_total: int | None = None,
               wide_k: bool = False, short_runs: bool = False) -> Bound:
    vocab_total = spec.vocab if vocab_total is None else vocab_total
    # (no plan given: the key holds None, `plan_for`'s plan being fixed by the rows, vocabulary,
    # device, `wide_k` and `short_runs` keyed beside it; hashing a plan costs ~1 us a lookup)
    key = (op, spec.rows, spec.vocab, x.dtype, x.stride(0), x.device, plan, top_n, n_ids, vocab_start, vocab_total,
           _aligned(x, *tensors), wide_k, short_runs)
    request = dict(xs=x.stride(0), top_n=top_n, n_ids=n_ids, vocab_start=vocab_start, vocab_total=vocab_total)
    return _bound.get(key, lambda: _bind(op, spec, plan or plan_for(spec.rows, spec.vocab, x.device, top_n=top_n,
                                                                    wide_k=wide_k, short_runs=short_runs),
                                         request, x.device))


# ---- the API's functions ------------------------------------------------------------------------------

# The keyword operands in the kernels' order: (name, the dtype the kernels read a tensor of, the
# shift of its flag bits); seed and offset only for `sample`.
KEYWORD_OPERANDS = tuple((name, torch.int64 if name in ("top_k", "seed", "offset") else torch.float32,
                          KEYWORD_BITS[name]) for name in KEYWORDS)


def keyword_values(spec: SamplingSpec) -> list:
    """`spec`'s checked keyword values in `spec.KEYWORDS` order: what a runner takes per call."""
    return [getattr(spec, name) for name in KEYWORDS]


def _operand(v: torch.Tensor, dtype: torch.dtype):
    """How a call's tensor of the form of `v` becomes the kernels' operand (a conversion that
    returns its input still costs ~1 us a call: each step only where the form needs it)."""
    cast = v.dtype != dtype
    if not v.dim():
        return (lambda t: t.to(dtype)) if cast else None
    if cast:
        return lambda t: t.to(dtype).contiguous()
    return lambda t: t if t.is_contiguous() else t.contiguous()


def _keyword_caller(form_values, with_seed: bool, device: torch.device):
    """`call(values)` -> (keyword tensors t, k, p, mp, seed, off; floats; per-call integers with
    the flags) for every call whose checked keyword values (`KEYWORDS` order) have the form of
    `form_values` (which are tensors, of which dtype and shape: what a request's key fixes), so
    the flags and each operand's conversion are decided once."""
    names = KEYWORD_OPERANDS if with_seed else KEYWORD_OPERANDS[:4]
    flags, preps = 0, []
    for (name, dtype, bit), v in zip(names, form_values):
        if name == "seed" and v is None:
            v = torch.zeros((), dtype=torch.int64)  # (drawn per call: a 0-dim int64 tensor)
        if isinstance(v, torch.Tensor):
            flags |= (3 if v.dim() else 1) << bit
            preps.append(_operand(v, dtype) or (lambda t: t))
        else:
            preps.append(None)
    t_prep, k_prep, p_prep, mp_prep, seed_prep, off_prep = preps + [None] * (6 - len(preps))
    draw = with_seed and form_values[4] is None

    def call(values):
        t, k, p, mp, seed, offset = values
        floats = (1.0 if t_prep else float(t), 1.0 if p_prep else float(p), 0.0 if mp_prep else float(mp))
        top_k = 0 if k_prep else min(int(k), INT32_MAX)
        keyword_tensors = (t_prep and t_prep(t), k_prep and k_prep(k), p_prep and p_prep(p), mp_prep and mp_prep(mp))
        if not with_seed:
            return (*keyword_tensors, None, None), floats, (top_k, 0, 0, 0, 0, flags)
        given_flags = flags
        if draw:  # (from torch's default generator on the device, advancing it as torch.multinomial does)
            seed = generator_seed(device)
            if seed is None:
                seed = torch.randint(0, 2**63 - 1, (), dtype=torch.int64, device=device)
            else:  # (a number: the form's seed operand left out of this call)
                given_flags = flags & ~(3 << KEYWORD_BITS["seed"])
        seed_tensor = isinstance(seed, torch.Tensor)
        seed_words = (0, 0) if seed_tensor else _word_pair(seed)
        off_words = (0, 0) if off_prep else _word_pair(offset)
        return (*keyword_tensors, seed_prep(seed) if seed_tensor else None, off_prep and off_prep(offset)), floats, \
            (top_k, *seed_words, *off_words, given_flags)
    return call


def remembered(bind):
    """`get(guard, *args)`: `bind(*args)`, reused while calls pass the `guard` the call that bound
    it passed (what a request's key does not fix: row strides, operand alignment)."""
    last = [(None, None)]  # (one tuple, swapped whole: a racing thread reads a matching pair)

    def get(guard, *args):
        seen, bound = last[0]
        if seen != guard:
            bound = bind(*args)
            last[0] = (guard, bound)
        return bound
    return get


def _selector(op: str, spec: SamplingSpec, plan: SamplingPlan | None, top_n: int = 0, n_ids: int = 0):
    """`select(x, outs, values, extra=())` running pass 1 and the select of `op` on the rows `x` of
    a request of `spec`'s form, writing `outs` (out_i, out_f, out_f2, ids; None where absent),
    the keyword `values` checked: (bound launchers, workspace, keyword tensors, floats, ints)."""
    device = spec.device
    keyword_call = _keyword_caller(keyword_values(spec), op == "sample", device)
    launchers = remembered(lambda x, tensors, wide, short: _launchers(op, spec, x, plan, top_n, n_ids, tensors,
                                                                      wide_k=wide, short_runs=short))
    # A top-k number in this window takes the two-launch plan (`wide_top_k`): per call, as numbers
    # are; a per-row top_k tensor always (on the H200 its top_k 50 then takes -1.6 to +0.1 us of GPU
    # time and one launch more of host time).
    k_lo, k_hi = wide_top_k(spec.rows, spec.vocab, device, top_n) if plan is None else (0, 0)
    k_tensor = k_hi > 0 and isinstance(spec.top_k, torch.Tensor)
    # The runs' length, per call as well: a top-n bound, else a top-k number, in the window of
    # runs of SHORT_RUN; a per-row top_k tensor where the window says.
    r_lo, r_hi, r_tensor = short_runs_window(spec.rows, spec.vocab, device, top_n) if plan is None else (0, 0, False)
    r_tensor = r_tensor and isinstance(spec.top_k, torch.Tensor)
    # The workspace (chunk states, candidates) is the scan's and select's of one call: kept per stream.
    kept = per_stream(lambda device: [torch.empty(0, dtype=torch.int32, device=device)])
    # A fused plan's per-row arrival counts (`scan_select_kernel`), an overlapping plan's runs'
    # row counts: the stream's row counters, which every kernel using them leaves zero.
    counts = per_stream(lambda device: row_counters(device, spec.rows))

    def workspace(words: int) -> torch.Tensor:
        box = kept(device)
        if box[0].numel() < words:
            box[0] = torch.empty(words, dtype=torch.int32, device=device)
        return box[0]

    def select(x, outs, values, extra=()):
        tensors, floats, ints = keyword_call(values)
        present = (*extra, *tensors)
        # (`outs` are fresh allocations, aligned, present as `op`, top_n and n_ids say: keyed by
        # those; every operand 16-byte aligned, the common case, is one test of their addresses.
        # The seed is the one operand whose presence a form leaves open: without a seed, a number
        # from the host or a tensor drawn on the device, call by call)
        ored = x.data_ptr()
        for t in present:
            if t is not None:
                ored |= t.data_ptr()
        wide = k_tensor or k_lo < ints[0] <= k_hi
        short = r_tensor or r_lo < (top_n or ints[0]) <= r_hi
        guard = (x.stride(0), tensors[4] is None, wide, short, ored % 16 == 0 or _aligned(x, *present))
        bound = launchers(guard, x, present, wide, short)
        ws = workspace(bound.space.words)
        bound.run(x, ws, tensors, floats, ints, outs, top_n, counts(device) if bound.counted else None)
        return bound, ws, tensors, floats, ints
    return select


def runner(op: str, spec: SamplingSpec, top_n: int = 0, n_ids: int = 0, *, plan: SamplingPlan | None = None):
    """The scan and select of every request of `spec`'s form (its op, logits' dtype, shape and
    device, which keywords are tensors of which dtype and shape, `top_n`, the ids per row
    `n_ids`): `sample`: f(logits, values, return_logprobs), `probs`: f(logits, values),
    `logprobs`: f(logits, values, ids), `values` a call's checked keyword values
    (`keyword_values`), `ids` its [rows, K] int64 ids. Bound once; a call builds no request."""
    shape, device, rows = spec.batch_shape, spec.device, spec.rows
    select = _selector(op, spec, plan, top_n, n_ids)
    if op == "sample":
        # (the kernels write each row's logprob: one not asked for goes to a buffer kept per stream)
        unread = per_stream(lambda device: torch.empty(shape, dtype=torch.float32, device=device))
        # (outputs in the batch's shape: contiguous, so row r is element r, and no reshape a call)
        new_ids, new_lp = output_maker(shape, torch.int64, device), output_maker(shape, torch.float32, device)

        def run(logits, values, return_logprobs=False):
            ids = new_ids()
            lp = new_lp() if return_logprobs else unread(device)
            if rows:
                select(rows_view(logits, spec), (ids, lp, None, None), values)
            return (ids, lp) if return_logprobs else ids
    elif op == "probs":
        def run(logits, values):
            y = torch.empty(logits.shape, dtype=torch.float32, device=device)  # (contiguous: [rows, V] rows)
            if rows:
                x = rows_view(logits, spec)
                bound, ws, tensors, floats, ints = select(x, (None,) * 4, values)
                bound.second((x, ws, y, tensors[0]), floats[:1], ints[-1:])
            return y
    else:
        new_out = output_maker((rows, n_ids), torch.float32, device)
        new_top = (output_maker((rows, top_n), torch.float32, device),
                   output_maker((rows, top_n), torch.int64, device))

        def run(logits, values, ids):
            out = new_out()
            top_values, top_ids = (new_top[0](), new_top[1]()) if top_n else (None, None)
            if rows:
                # (empty operands are stood in for: a kernel never gets a pointer to nothing)
                ids = ids.contiguous() if n_ids else None
                select(rows_view(logits, spec), (top_ids, out if n_ids else None, top_values, ids), values, (ids,))
            return (out, top_values, top_ids) if top_n else out
    return run


def sample(spec: SamplingSpec, logits: torch.Tensor, return_logprobs: bool = False, *,
           plan: SamplingPlan | None = None):
    """int64 token ids of shape ``logits.shape[:-1]`` drawn as `spec` says (and their float32
    log-probabilities under the distribution drawn from)."""
    return runner("sample", spec, plan=plan)(logits, keyword_values(spec), return_logprobs)


def probs(spec: SamplingSpec, logits: torch.Tensor, *, plan: SamplingPlan | None = None) -> torch.Tensor:
    """float32 probabilities of the filtered, renormalised distribution (logits' shape)."""
    return runner("probs", spec, plan=plan)(logits, keyword_values(spec))


def logprobs(spec: SamplingSpec, logits: torch.Tensor, ids: torch.Tensor, top_n: int = 0, *,
             plan: SamplingPlan | None = None):
    """float32 log-probabilities of `ids` ([rows, K], validated) under log_softmax(logits /
    temperature), and with `top_n` the top-n values and ids (`torch_sampler.logprobs`' contract)."""
    return runner("logprobs", spec, top_n, ids.shape[-1], plan=plan)(logits, keyword_values(spec), ids)


PATHS = ("none", "race", "candidates", "general")  # (sampling_kernels.PATH_*)


def row_paths(spec: SamplingSpec, logits: torch.Tensor, *, plan: SamplingPlan | None = None) -> list[str]:
    """Which path each row's select took for `probs` of `spec` (the same as `sample`'s): "race"
    (no filter), "candidates", "general" (the whole row re-read), "none" (greedy, invalid).
    For tests and benchmarks: it runs the scan and the select, then reads the result (a sync)."""
    bound, ws, *_ = _selector("probs", spec, plan)(rows_view(logits, spec), (None,) * 4, keyword_values(spec))
    words = ws[bound.space.res_off:bound.space.res_off + spec.rows * RESULT_WORDS].view(spec.rows, RESULT_WORDS)[:, 4]
    return [PATHS[w] for w in words.tolist()]


def runs_rows(spec: SamplingSpec, logits: torch.Tensor, *, plan: SamplingPlan | None = None) -> tuple[list, list]:
    """(rows the runs pre-pass served, rows it left to the scan) for `probs` of `spec`, each in no
    particular order; both empty where the call does not take it. For tests and benchmarks: it
    runs the passes, then reads the lists (a sync)."""
    bound, ws, _, _, ints = _selector("probs", spec, plan)(rows_view(logits, spec), (None,) * 4, keyword_values(spec))
    if not bound.takes_runs(ints, 0):
        return [], []

    def listed(at: int) -> list:
        return ws[at + 1:at + 1 + int(ws[at])].tolist()
    return listed(bound.space.served_off), listed(bound.space.left_off)


# ---- a vocabulary sharded across ranks ------------------------------------------------------------

def _shards_select(spec, plan, space, shards: int, vocab_total: int, gathered: torch.Tensor, tensors: tuple):
    """The select launcher over every shard's gathered workspace prefix (bound once a form)."""
    request = dict(xs=0, top_n=0, n_ids=0, vocab_start=0, vocab_total=vocab_total)
    key = ("select_shards", spec.rows, spec.vocab, shards, vocab_total, gathered.device, gathered.stride(0), plan,
           _aligned(gathered, *tensors))
    return _bound.get(key, lambda: _select_launcher("sample", spec, plan, space, request, gathered.device, shards,
                                                    False, gathered.stride(0)))


def shard_runner(spec: SamplingSpec, vocab_start: int, vocab_total: int, shards: int):
    """`scan_shard` and `select_shards` bound once for every request of `spec`'s form (the
    shard's): (`scan(logits_shard, values) -> (prefix, call)`, `select(gathered, call, undecided)
    -> (ids, lp)`, the prefix's words), `values` a call's checked keyword values
    (`keyword_values`; the seed given), `call` what the same call's select takes, `undecided` an
    int64 word the select sets to 1 when a row needs the whole row. Both workspaces are kept per
    stream: a call's exchange reads the scan's before the next call's scan writes it (stream order)."""
    device, rows = spec.device, spec.rows
    plan = plan_for(rows, spec.vocab, device, one_launch=False)
    keyword_call = _keyword_caller(keyword_values(spec), True, device)
    scans = remembered(lambda x, tensors: _launchers("sample", spec, x, plan, tensors=tensors,
                                                     vocab_start=vocab_start, vocab_total=vocab_total))
    space = Workspace.of(plan, rows, spec.vocab, shards)
    selects = remembered(lambda gathered, tensors: _shards_select(spec, plan, space, shards, vocab_total, gathered,
                                                                  tensors))
    scan_box = per_stream(lambda device: [torch.empty(0, dtype=torch.int32, device=device)])
    select_ws = per_stream(lambda device: torch.empty(space.words, dtype=torch.int32, device=device))
    new_ids = output_maker(spec.batch_shape, torch.int64, device)  # (contiguous: row r at element r)
    new_lp = output_maker(spec.batch_shape, torch.float32, device)

    def scan(logits, values):
        tensors, floats, ints = keyword_call(values)
        x = rows_view(logits, spec)
        bound = scans((x.stride(0), _aligned(x, *tensors)), x, tensors)
        box = scan_box(device)
        if box[0].numel() < bound.space.words:
            box[0] = torch.empty(bound.space.words, dtype=torch.int32, device=device)
        bound.run(x, box[0], tensors, floats, ints)
        return box[0][:bound.space.shard_words], (tensors, floats, ints)

    def select(gathered, call, undecided):
        tensors, floats, ints = call
        launch = selects((gathered.stride(0), _aligned(gathered, *tensors)), gathered, tensors)
        ids, lp = new_ids(), new_lp()
        launch((None, gathered, select_ws(device), ids, lp, None, None, *tensors, undecided), floats, ints)
        return ids, lp

    return scan, select, space.shard_words


def scan_shard(spec: SamplingSpec, logits_shard: torch.Tensor, vocab_start: int, vocab_total: int, *,
               plan: SamplingPlan | None = None) -> tuple[torch.Tensor, Workspace, SamplingPlan]:
    """Pass 1 on this rank's shard of the vocabulary (`spec` describes the shard: its vocab is
    the shard's; tokens numbered from `vocab_start` of `vocab_total`): (workspace, its layout,
    the plan). Its first `Workspace.shard_words` words are what every rank all-gathers; then
    `select_shards` runs the same select on every rank (the same ids everywhere). Every shard
    must have the same size (and plan): their workspaces then line up word for word."""
    x = rows_view(logits_shard, spec)
    plan = plan or plan_for(spec.rows, spec.vocab, spec.device, one_launch=False)
    values = keyword_values(spec)
    tensors, floats, ints = _keyword_caller(values, True, spec.device)(values)
    bound = _launchers("sample", spec, x, plan, tensors=tensors, vocab_start=vocab_start, vocab_total=vocab_total)
    ws = torch.empty(bound.space.words, dtype=torch.int32, device=logits_shard.device)
    bound.run(x, ws, tensors, floats, ints)
    return ws, bound.space, plan


def select_shards(spec: SamplingSpec, gathered: torch.Tensor, shards: int, vocab_total: int, plan: SamplingPlan,
                  return_logprobs: bool = False):
    """`sample`'s ids from the shards' all-gathered states: `gathered` is [shards, shard_words]
    int32 (each rank's `scan_shard` workspace prefix, in rank order), `spec` the shard's request
    (the same `seed`: drawn on rank 0 and broadcast when None). Rows whose candidates cannot
    decide (top-k above `plan.k_cap`, ties past a chunk's capacity, top-p / min-p cutting
    below what the chunks kept) get id -2: they need the whole row."""
    space = Workspace.of(plan, spec.rows, spec.vocab, shards)
    device = gathered.device
    values = keyword_values(spec)
    tensors, floats, ints = _keyword_caller(values, True, device)(values)
    launch = _shards_select(spec, plan, space, shards, vocab_total, gathered, tensors)
    ws = torch.empty(space.words, dtype=torch.int32, device=device)
    ids = torch.empty(spec.batch_shape, dtype=torch.int64, device=device)  # (contiguous: row r at element r)
    lp = torch.empty(spec.batch_shape, dtype=torch.float32, device=device)
    undecided = torch.zeros(1, dtype=torch.int64, device=device)
    launch((None, gathered, ws, ids, lp, None, None, *tensors, undecided), floats, ints)
    return (ids, lp) if return_logprobs else ids


__all__ = ["OPERAND_DTYPES", "PATHS", "SamplingPlan", "Workspace", "default_programs", "keyword_values", "launcher",
           "logprobs", "operand_pointers", "plan_for", "probs", "remembered", "row_paths", "runner", "runs_rows",
           "sample", "scan_shard", "select_shards", "shard_runner", "short_runs_window", "stand_ins", "supports"]
