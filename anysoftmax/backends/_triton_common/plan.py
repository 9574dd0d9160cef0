"""Kernel plans, pure data: which shared kernel, tile and grid, one type per kind of docs/kernels.md (forward
"tile", "online", "split", "cols", "cols_split"; backward "tile", "split"), each building its launch arguments."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch

from ...core.layout import RowLayout, cdiv, column_view, next_power_of_2

INT32_MAX = 2**31 - 1

MASK_CODES = {"none": 0, "bool": 1, "additive": 2}
EMPTY_CODES = {"zero": 0, "nan": 1, "uniform": 2}


@dataclass(frozen=True)
class Fusion:
    """The fused family's part of a plan (`fused.py`): the steps compiled in and the causal geometry;
    a row scale keeps HAS_SCALE on (each row's value stands in for the scalar one)."""

    has_scale: bool = False
    has_cap: bool = False
    mask: int = 0  # 0 none, 1 bool, 2 additive
    causal: bool = False
    has_sink: bool = False
    empty: int = 0  # 0 zero, 1 nan, 2 uniform
    sq: int = 1  # queries (the dim before the last) under causal
    c_off: int = 0  # kept: key j <= query q + c_off
    has_row_scale: bool = False  # the scale is one value per row (read at the sinks' row offsets)

    @classmethod
    def of(cls, spec) -> "Fusion":
        """The fusion of a request (`SoftmaxSpec` with its variant)."""
        v = getattr(spec, "variant", None)
        if v is None or spec.is_plain:
            return NO_FUSION
        causal = v.causal != "none"
        sq = spec.shape[-2] if causal else 1
        c_off = spec.shape[-1] - spec.shape[-2] if v.causal == "bottom_right" else 0
        row_scale = v.row_scale is not None
        return cls(v.scale is not None or row_scale, v.softcap is not None, MASK_CODES[v.mask_kind], causal,
                   v.sinks is not None, EMPTY_CODES[v.empty_rows] if v.has_empty_rows else 0, sq, c_off, row_scale)

    @property
    def stats_per_chunk(self) -> int:
        """Per chunk: max and sum, and with a bool mask the kept count (empty rows decided by the mask)."""
        return 3 if self.mask == 1 else 2

    def constexprs(self, out_dtype: torch.dtype, backward: bool = False) -> dict:
        """The kernels' flags (PRECISE: `fused.tanh`'s accurate form, for fp32/64 outputs)."""
        flags = dict(HAS_SCALE=self.has_scale, HAS_CAP=self.has_cap, MASK=self.mask, CAUSAL=self.causal,
                     HAS_SINK=self.has_sink, PRECISE=out_dtype.itemsize > 2)
        return flags if backward else dict(flags, HAS_EMPTY=self.mask == 1 or self.causal, EMPTY=self.empty,
                                           HAS_ROW_SCALE=self.has_row_scale)

    def operand_strides(self, layout: RowLayout) -> tuple[tuple, tuple, tuple]:
        """((mask row strides, mask column stride), sink row strides, p_sink row strides), zeros
        for an absent operand; a row scale is read with the sinks' row strides."""
        ops_rows, ops_cols = list(layout.op_row_strides), list(layout.op_col_strides)
        zero = (0,) * len(layout.row_sizes)
        per_row = self.has_sink or self.has_row_scale
        mask = (ops_rows.pop(0), ops_cols.pop(0)) if self.mask else (zero, 0)
        sink = ops_rows.pop(0) if per_row else zero
        p = ops_rows.pop(0) if per_row else zero
        return mask, sink, p

    def causal_args(self, layout: RowLayout) -> tuple[int, int, int]:
        """(SQ, Q_DIV, C_OFF): the query of row r is (r // Q_DIV) % SQ (`RowLayout.inner_div`)."""
        return self.sq, layout.inner_div if self.causal else 1, self.c_off


NO_FUSION = Fusion()
# Runtime values of a plain launch: (scale hi, lo, softcap hi, lo), unused.
PLAIN_SCALARS = (1.0, 0.0, 1.0, 0.0)


def split_value(v: float) -> tuple[float, float]:
    """`v` as float32 hi + lo (float arguments are float32; fp64 kernels add them back)."""
    import struct

    hi = struct.unpack("f", struct.pack("f", v))[0]
    return hi, float(v - hi)


def scalars(scale, softcap: float) -> tuple[float, float, float, float]:
    """The per-call floats of a fused launch (a row scale, read via `r_ptr`, passes 1.0)."""
    return (*split_value(1.0 if isinstance(scale, torch.Tensor) else scale), *split_value(softcap))


def row_strides(layout: RowLayout) -> dict:
    """The row kernels' row sizes and x / y strides (S1, S2, xs0..xsn, ys0..ysn), by name."""
    _, s1, s2 = layout.row_sizes
    (xs0, xs1, xs2), (ys0, ys1, ys2) = layout.in_row_strides, layout.out_row_strides
    return dict(S1=s1, S2=s2, xs0=xs0, xs1=xs1, xs2=xs2, xsn=layout.in_col_stride, ys0=ys0, ys1=ys1, ys2=ys2,
                ysn=layout.out_col_stride)


# The per-call float arguments of every kernel (`scalars`), by name.
VALUE_NAMES = ("scale_hi", "scale_lo", "cap_hi", "cap_lo")


def runtime_params(kernel) -> tuple[str, ...]:
    """`kernel`'s non-constexpr argument names in order (a JITFunction's, or an interpreted signature's)."""
    params = getattr(kernel, "params", None)
    if params is not None:
        return tuple(p.name for p in params if not p.is_constexpr)
    import inspect

    sig = inspect.signature(kernel.fn)
    return tuple(n for n, p in sig.parameters.items() if "constexpr" not in str(p.annotation))


def by_name(kernel, named: dict) -> tuple:
    """`named` (runtime arguments by name) in `kernel`'s order; ValueError naming missing or unknown ones."""
    names = runtime_params(kernel)
    missing = [n for n in names if n not in named]
    unknown = [n for n in named if n not in names]
    if missing or unknown:
        raise ValueError(f"{getattr(kernel, '__name__', kernel)}: arguments missing {missing}, unknown {unknown}")
    return tuple(named[n] for n in names)


def flat_rows(layout: RowLayout) -> bool:
    """True when the rows form one (size, stride) dimension: the tile kernel then addresses
    them as `rows * stride` (no div/mod), the form triton-ascend lowers to bounded loads."""
    return layout.row_sizes[0] == 1 and layout.row_sizes[1] == 1


def wide_cols(layout: RowLayout, block_n: int) -> bool:
    """Whether column offsets need 64 bits: the row's extent in elements could overflow int32."""
    extent = (layout.n_cols - 1) * max(abs(layout.in_col_stride), abs(layout.out_col_stride)) + block_n
    return extent > INT32_MAX


# Options passed as constexprs, not launch options: elements per causal-prefix load (0: 16 bytes'
# worth), and the cooperative split kernels' PHASE 0 forms (`stages`: the item loop's pipeline depth).
PHASE0_FORMS = ("prefetch", "relaxed_depart", "hold_input", "stages")
PLAN_CONSTEXPR_OPTIONS = ("causal_vec", *PHASE0_FORMS)


def _split_forms(options: dict, *names: str) -> dict:
    """The split kernels' PHASE 0 forms as constexprs (default False; STAGES default 1)."""
    return dict({name.upper(): bool(options.get(name, False)) for name in names}, STAGES=int(options.get("stages", 1)))


@dataclass(frozen=True)
class KernelPlan:
    """Common fields of every plan; `options`: launch options (`num_warps`, `multibuffer`), `causal_vec`."""

    block_m: int
    block_n: int
    grid: int
    options: dict = field(default_factory=dict)
    chunks: int = 1
    cooperative: bool = False
    fusion: Fusion = NO_FUSION
    states_only: bool = False  # the row kernels' logsumexp form (`lse_rows.py`): lse in place of the row

    kind: ClassVar[str] = ""
    kernel_name: ClassVar[str] = ""  # in bwd.py (backward), cols.py (cols kinds) or rows.py
    split: ClassVar[bool] = False  # programs of one row (group) combine partial statistics
    backward: ClassVar[bool] = False

    def kernel(self):
        """The @triton.jit function (imported late: Triton decides at definition if it is interpreted)."""
        from . import bwd, cols, rows

        module = bwd if self.backward else cols if self.kind.startswith("cols") else rows
        return getattr(module, self.kernel_name)

    def launch_options(self) -> dict:
        return {k: v for k, v in self.options.items() if k not in PLAN_CONSTEXPR_OPTIONS}

    def non_cooperative(self) -> "KernelPlan":
        """This plan without the cooperative grid (two launches, waiting on nothing) nor `PHASE0_FORMS`."""
        return replace(self, cooperative=False, options={k: v for k, v in self.options.items()
                                                         if k != "launch_cooperative_grid" and k not in PHASE0_FORMS})

    def phases(self) -> tuple:
        """PHASE values of the launches: one launch (0), or statistics then normalisation (1, 2)."""
        if self.states_only:  # a split plan's chunk states are its statistics pass alone
            return (1,) if self.split else (0,)
        return (1, 2) if self.split and not self.cooperative else (0,)

    def groups(self, layout: RowLayout) -> int:
        """Rows (or column groups) whose chunks meet at one barrier."""
        return layout.n_rows

    @property
    def counted(self) -> bool:
        """Whether the launch uses the row counters: the cooperative barrier, a split lse's last chunk."""
        return self.cooperative or (self.split and self.states_only)

    def work_items(self, layout: RowLayout) -> int:
        """The most programs that can have work (a split kernel's item is one chunk of a row)."""
        return cdiv(layout.n_rows, 1 if self.split else self.block_m) * self.chunks

    def stats_numel(self, layout: RowLayout) -> int:
        """Elements (fp32; fp64 for fp64 outputs) of partial statistics the launch needs."""
        return 0

    def row_constexprs(self, layout: RowLayout, log: bool, out_dtype: torch.dtype, **own) -> dict:
        """The forward row kernels' constexprs: the ones they share around the kind's `own`."""
        return dict(LOG=log, ACC_FP64=out_dtype == torch.float64, WIDE_COLS=wide_cols(layout, self.block_n), **own,
                    STATES_ONLY=self.states_only, **self.fusion.constexprs(out_dtype))

    def static_args(self, layout: RowLayout) -> dict:
        """The integer arguments, by the kernel's parameter names (the row kernels' here)."""
        chunks = dict(n_chunks=self.chunks) if self.split else {}
        return dict(n_rows=layout.n_rows, n_cols=layout.n_cols, **chunks, **row_strides(layout),
                    **self.fusion_args(layout))

    def pointer_names(self) -> tuple[str, ...]:
        """The kernel's names of the pointers `head` gives, in that order."""
        if self.backward:
            return ("y_ptr", "dy_ptr", "dx_ptr", "x_ptr", "m_ptr", "p_ptr", "ds_ptr", "stats_ptr", "count_ptr")
        names = ("x_ptr", "y_ptr", "m_ptr", "s_ptr", "p_ptr", "r_ptr")
        return names + ("stats_ptr", "count_ptr") if self.split else names

    def arguments(self, head: tuple, layout: RowLayout, values: tuple = PLAIN_SCALARS) -> dict:
        """Every runtime argument of a launch by name: pointers, integers, per-call floats."""
        return {**dict(zip(self.pointer_names(), head)), **self.static_args(layout), **dict(zip(VALUE_NAMES, values))}

    def tensors(self, given: tuple) -> tuple:
        """The kernel's tensor arguments from the launcher's (forward: x, y, mask, sinks, p_sink, row scale;
        backward: y, dy, dx, x, mask, p_sink, dsinks), x or the output standing in for an absent one."""
        if self.backward:
            y, dy, dx, x, m, p, ds = given
            return (y, dy, dx, y if x is None else x, y if m is None else m, dx if p is None else p,
                    dx if ds is None else ds)
        x, y, m, s, p, r = given
        return (x, y, x if m is None else m, x if s is None else s, y if p is None else p, x if r is None else r)

    def head(self, tensors: tuple, stats, counts) -> tuple:
        """The pointer arguments: the tensors, then the scratch where the kernel takes it."""
        return (*tensors, stats, counts) if self.split or self.backward else tensors

    def fusion_args(self, layout: RowLayout) -> dict:
        """Mask, sink and p_sink strides and the causal geometry of the row kernels."""
        (m_rows, m_col), s_rows, p_rows = self.fusion.operand_strides(layout)
        sq, q_div, c_off = self.fusion.causal_args(layout)
        return dict(ms0=m_rows[0], ms1=m_rows[1], ms2=m_rows[2], msn=m_col, ss0=s_rows[0], ss1=s_rows[1],
                    ss2=s_rows[2], ps0=p_rows[0], ps1=p_rows[1], ps2=p_rows[2], SQ=sq, Q_DIV=q_div, C_OFF=c_off)

    def calls(self, tensors: tuple, layout: RowLayout, log: bool, out_dtype: torch.dtype,
              stats=None, counts=None, values: tuple = PLAIN_SCALARS) -> list:
        """[(kernel, positional args, constexprs)] of the launches running this plan on `tensors`."""
        kernel = self.kernel()
        args = by_name(kernel, self.arguments(self.head(tensors, stats, counts), layout, values))
        return [(kernel, args, self.constexprs(layout, log, out_dtype, p)) for p in self.phases()]


@dataclass(frozen=True)
class TilePlan(KernelPlan):
    kind: ClassVar[str] = "tile"
    kernel_name: ClassVar[str] = "softmax_tile_kernel"

    def constexprs(self, layout, log, out_dtype, phase=0):
        return self.row_constexprs(layout, log, out_dtype, BLOCK_M=self.block_m, BLOCK_N=self.block_n,
                                   CAUSAL_VEC=self.options.get("causal_vec", 0), FLAT_ROWS=flat_rows(layout))


@dataclass(frozen=True)
class OnlinePlan(KernelPlan):
    kind: ClassVar[str] = "online"
    kernel_name: ClassVar[str] = "softmax_online_kernel"

    def constexprs(self, layout, log, out_dtype, phase=0):
        return self.row_constexprs(layout, log, out_dtype, BLOCK_N=self.block_n)


@dataclass(frozen=True)
class SplitPlan(KernelPlan):
    kind: ClassVar[str] = "split"
    kernel_name: ClassVar[str] = "softmax_split_kernel"
    split: ClassVar[bool] = True

    def stats_numel(self, layout):
        per_chunk = 1 if self.states_only else self.fusion.stats_per_chunk  # lse, or (max, sum[, kept])
        return layout.n_rows * self.chunks * per_chunk

    def constexprs(self, layout, log, out_dtype, phase=0):
        forms = _split_forms(self.options, "prefetch", "relaxed_depart", "hold_input")
        return self.row_constexprs(layout, log, out_dtype, CHUNK=self.block_n, G_POW2=next_power_of_2(self.chunks),
                                   PHASE=phase, **forms)


@dataclass(frozen=True)
class ColsPlan(KernelPlan):
    kind: ClassVar[str] = "cols"
    kernel_name: ClassVar[str] = "softmax_cols_kernel"

    def groups(self, layout):
        v = column_view(layout)
        return v.n_outer * cdiv(v.n_inner, self.block_m)

    def work_items(self, layout):
        return self.groups(layout) * self.chunks

    def fusion_args(self, layout):
        """Mask (outer, reduction, inner) and sink (outer, inner) strides, causal geometry (logical rows)."""
        (m_rows, m_col), s_rows, _ = self.fusion.operand_strides(layout)
        return dict(mso=m_rows[1], msn=m_col, msi=m_rows[2], sso=s_rows[1], ssi=s_rows[2], SQ=self.fusion.sq,
                    C_OFF=self.fusion.c_off)

    def static_args(self, layout):
        v = column_view(layout)
        chunks = dict(n_chunks=self.chunks) if self.split else {}
        return dict(n_outer=v.n_outer, n_red=v.n_red, n_inner=v.n_inner, **chunks, xso=v.in_outer_stride,
                    xsn=v.in_red_stride, yso=v.out_outer_stride, ysn=v.out_red_stride,
                    **self.fusion_args(layout))

    def constexprs(self, layout, log, out_dtype, phase=0):
        # Reduction steps past N are masked but still multiplied by the stride: cover the tile.
        reach = max(layout.n_cols, self.block_n * self.chunks) + layout.row_sizes[2]
        strides = [layout.in_col_stride, layout.out_col_stride]
        (m_rows, m_col), _, _ = self.fusion.operand_strides(layout)
        if self.fusion.mask:
            strides += [m_col, m_rows[1], m_rows[2]]
        wide = reach * max(max(abs(s) for s in strides), 1) > INT32_MAX
        own = dict(CHUNK=self.block_n, G_POW2=next_power_of_2(self.chunks), PHASE=phase) if self.split else \
            dict(BLOCK_N=self.block_n)
        return dict(LOG=log, ACC_FP64=out_dtype == torch.float64, WIDE=wide, BLOCK_I=self.block_m, **own,
                    **self.fusion.constexprs(out_dtype))


@dataclass(frozen=True)
class ColsSplitPlan(ColsPlan):
    kind: ClassVar[str] = "cols_split"
    kernel_name: ClassVar[str] = "softmax_cols_split_kernel"
    split: ClassVar[bool] = True

    def stats_numel(self, layout):
        # (max, sum[, kept]) per inner position
        return self.groups(layout) * self.chunks * self.fusion.stats_per_chunk * self.block_m


@dataclass(frozen=True)
class BackwardTilePlan(KernelPlan):
    """dx from (y, dy): whole rows, BLOCK_M rows per step."""

    kind: ClassVar[str] = "tile"
    kernel_name: ClassVar[str] = "softmax_bwd_kernel"
    backward: ClassVar[bool] = True

    def static_args(self, layout):
        r = row_strides(layout)  # (y, dy, dx and x share x's row layout; no sinks read)
        fusion = {k: v for k, v in self.fusion_args(layout).items() if not k.startswith("ss")}
        return dict(n_rows=layout.n_rows, n_cols=layout.n_cols, n_chunks=self.chunks, S1=r["S1"], S2=r["S2"],
                    s0=r["xs0"], s1=r["xs1"], s2=r["xs2"], sn=r["xsn"], **fusion)

    def constexprs(self, layout, log, out_dtype, phase=0):
        single = not self.split
        return dict(LOG=log, ACC_FP64=out_dtype == torch.float64, SINGLE=single,
                    BLOCK_M=self.block_m if single else 1, CHUNK=self.block_n,
                    CAUSAL_VEC=self.options.get("causal_vec", 0),
                    G_POW2=next_power_of_2(self.chunks), PHASE=phase,
                    **_split_forms(self.options, "prefetch", "relaxed_depart"),
                    **self.fusion.constexprs(out_dtype, backward=True))


@dataclass(frozen=True)
class BackwardSplitPlan(BackwardTilePlan):
    """dx from (y, dy): rows cut into chunks that share one partial sum per chunk."""

    kind: ClassVar[str] = "split"
    split: ClassVar[bool] = True

    def stats_numel(self, layout):
        return layout.n_rows * self.chunks


FORWARD_PLANS = {p.kind: p for p in (TilePlan, OnlinePlan, SplitPlan, ColsPlan, ColsSplitPlan)}
BACKWARD_PLANS = {p.kind: p for p in (BackwardTilePlan, BackwardSplitPlan)}


def make_plan(kind: str, block_m: int, block_n: int, grid: int, backward: bool = False, **fields) -> KernelPlan:
    """The plan type for `kind` (forward, or backward when `backward`) with these fields."""
    table = BACKWARD_PLANS if backward else FORWARD_PLANS
    if kind not in table:
        raise ValueError(f"unknown {'backward' if backward else 'forward'} kernel kind {kind!r}; "
                         f"known: {', '.join(table)}")
    return table[kind](block_m, block_n, grid, **fields)
