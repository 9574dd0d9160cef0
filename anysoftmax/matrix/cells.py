"""Cells (one device entry × backend × op × direction × dtype × variant × shape × dim) and
their results."""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass, field, fields, replace

from .schema import MatrixConfig
from .variants import PLAIN, PLAIN_NAME, VariantSpec

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass(frozen=True)
class Cell:
    """One run of one backend on one request. Plain data: it travels to worker processes."""

    index: int
    entry: str  # device entry name
    device: str  # device string of the entry ("cuda" = any visible GPU)
    backend: str
    op: str  # softmax | log_softmax | logsumexp | merge_states (matrix.lse_merge_cells)
    direction: str  # forward | backward
    dtype: str  # canonical name, e.g. "bfloat16"
    shape: tuple[int, ...]
    dim: int
    benchmark: bool
    warmup_ms: float
    rep_ms: float
    bench_cpu: bool
    seed: int
    variant: VariantSpec = PLAIN  # the fused family's member (matrix.variants)

    @property
    def id(self) -> str:
        """'<entry>/<backend>/<op>/<direction>/<dtype>/<shape>/dim<d>[/<variant>]': the variant's
        name is appended unless it is `plain` (so plain cells keep their ids and seeds)."""
        shape = "x".join(map(str, self.shape)) or "scalar"
        tail = "" if self.variant.name == PLAIN_NAME else f"/{self.variant.name}"
        return f"{self.entry}/{self.backend}/{self.op}/{self.direction}/{self.dtype}/{shape}/dim{self.dim}{tail}"


@dataclass
class Result:
    """The outcome of a cell. `err_ratio` is max |err| / tolerance (<= 1 passes); `gbps` is
    (bytes read + written) / median time and `frac_copy` that over the copy bandwidth measured
    in the same run on the same device. `timer` says how time was taken ("gpu" events or "cpu"
    wall clock). `host_us` is the host's wall time per call with calls issued back to back and
    one synchronize at the end: above `ms` the provider is host-bound."""

    cell: Cell
    status: str
    reason: str = ""
    ran_on: str = ""  # concrete device, e.g. "cuda:1"
    host: str = ""  # hostname of the machine that ran it
    node: str = ""  # Ray node id when run on Ray ("" for local workers)
    device_name: str = ""
    max_abs_err: float | None = None
    err_ratio: float | None = None
    atol: float | None = None
    rtol: float | None = None
    ms: float | None = None
    gbps: float | None = None
    copy_gbps: float | None = None
    frac_copy: float | None = None
    host_us: float | None = None  # back-to-back wall time per call (perf.back_to_back_us)
    timer: str = ""
    note: str = ""
    seconds: float = 0.0
    traceback: str = field(default="", repr=False)

    def as_row(self) -> dict:
        """Flat dict (cell fields first) for JSON and CSV."""
        row = {k: v for k, v in asdict(self.cell).items()}
        row["shape"] = list(self.cell.shape)
        row["variant"] = self.cell.variant.name
        row["variant_desc"] = self.cell.variant.describe()
        row["variant_spec"] = self.cell.variant.as_dict()  # JSON only (report.CSV_SKIP)
        row["id"] = self.cell.id
        for f in fields(self):
            if f.name != "cell":
                row[f.name] = getattr(self, f.name)
        return row

    @classmethod
    def from_row(cls, row: dict) -> "Result":
        """Inverse of `as_row` (used to merge reports)."""
        cell_names = {f.name for f in fields(Cell)} - {"variant"}
        cell = Cell(**{k: (tuple(v) if k == "shape" else v) for k, v in row.items() if k in cell_names},
                    variant=VariantSpec.from_dict(row.get("variant_spec")))  # reports before variants: plain
        own = {f.name for f in fields(cls)} - {"cell"}
        return cls(cell=cell, **{k: v for k, v in row.items() if k in own})


def cell_seed(base: int, cell_id: str) -> int:
    """A seed fixed by the cell's identity, so a cell reproduces whatever ran before it."""
    return zlib.crc32(f"{base}/{cell_id}".encode())


def expand(config: MatrixConfig, entries: list[str] | None = None) -> list[Cell]:
    """Every cell of `config` (of the named entries only, when given), in run order."""
    cells: list[Cell] = []
    for e in config.devices:
        if entries is not None and e.name not in entries:
            continue
        bench = "benchmark" in e.checks
        for backend in e.backends:
            for op in e.ops:
                for direction in e.directions:
                    for dtype in e.dtypes:
                        for variant in e.variants:
                            for case in e.shapes:
                                for dim in case.dims:
                                    cell = Cell(len(cells), e.name, e.device, backend, op, direction, dtype,
                                                case.shape, dim, bench, e.benchmark.warmup_ms, e.benchmark.rep_ms,
                                                e.benchmark.cpu, 0, variant)
                                    cells.append(replace(cell, seed=cell_seed(config.seed, cell.id)))
    return cells
