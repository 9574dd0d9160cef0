"""Plans of the `cute` backend (docs/cute.md): a pure function of the request, its tensors' alignment and
`tuning.yaml` (no GPU, no DSL import); a plan is the compiled kernel's key."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from ...config import Overrides, load_tuning
from ...core.layout import cdiv, next_power_of_2

TABLE = "cute"
# Tuning overrides for tests and sweeps: `with overrides(threads=128): ...`.
overrides = Overrides(TABLE)
VECTOR_BYTES = 16  # the widest global load/store (ld.global.v4.b32)
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
WARP_LANES = 32  # a strip row is read by at most one warp's lanes


@dataclass(frozen=True)
class KernelKey:
    """One compiled kernel (see `kernels.py` for what each number means)."""

    backward: bool
    in_dtype: str  # forward: x; backward: y and dy
    out_dtype: str
    log: bool
    cluster: int
    threads: int
    vec: int  # elements per vector (16 bytes where alignment allows)
    vectors: int  # vectors per thread per tile
    two_pass: bool
    arch: str  # compile target, e.g. sm_90a
    tvm_ffi: bool  # compiled for the TVM-FFI calling convention (else DLPack tensors)
    lanes: int = 0  # column kernels: vectors across one strip row; 0 for the row kernels
    scaled: bool = False  # the fused prologue's steps (their values are run-time arguments)
    capped: bool = False
    staged: int = 0  # two-pass row kernels: full tiles a CTA keeps in shared memory between the passes
    states: bool = False  # logsumexp (`kernels.states_entry`): one float32 a row out

    @property
    def fused(self) -> bool:
        return self.scaled or self.capped

    @property
    def elems_per_cta(self) -> int:
        return self.threads * self.vec * self.vectors

    @property
    def elems_per_tile(self) -> int:
        """Elements of a row one cluster holds at once."""
        return self.cluster * self.elems_per_cta

    @property
    def tile_bytes(self) -> int:
        """Shared memory one held tile of a CTA takes (forward x; backward y and dy)."""
        return self.elems_per_cta * DTYPE_BYTES[self.in_dtype] * (2 if self.backward else 1)

    @property
    def staged_bytes(self) -> int:
        """Shared memory of a CTA's staged tiles."""
        return self.staged * self.tile_bytes

    @property
    def operand_dtypes(self) -> tuple[str, ...]:
        """The kernel's tensors' dtypes in argument order: (x, y) forward, (x, lse) logsumexp,
        (y, dy, dx) backward, (y, dy, dx, x) a fused backward (x in y's dtype)."""
        if self.states:
            return self.in_dtype, "float32"
        if not self.backward:
            return self.in_dtype, self.out_dtype
        return (self.in_dtype, self.in_dtype, self.out_dtype) + ((self.in_dtype,) if self.fused else ())

    @property
    def strip_rows(self) -> int:
        """Column kernels: reduced positions one cluster holds (strip rows)."""
        return self.cluster * (self.threads // self.lanes) * self.vectors

    def describe(self) -> str:
        """'fwd fp32 cluster 8 x 256 threads x 16 vec4 (one pass)'; column kernels
        'fwd fp32 columns: cluster 16 x 256 threads (8 lanes) x 16 vec4'."""
        op = "lse" if self.states else ("log_" if self.log else "") + ("bwd" if self.backward else "fwd")
        dt = self.in_dtype if self.in_dtype == self.out_dtype else f"{self.in_dtype}->{self.out_dtype}"
        if self.lanes:
            return (f"{op} {dt} columns: cluster {self.cluster} x {self.threads} threads ({self.lanes} lanes) "
                    f"x {self.vectors} vec{self.vec}")
        passes = ("tiles streamed once" if self.states else "two passes") if self.two_pass else "one pass"
        if self.staged:
            passes += f", {self.staged} tile{'s' * (self.staged > 1)} in shared memory"
        op += "+scale" * self.scaled + "+softcap" * self.capped
        return f"{op} {dt} cluster {self.cluster} x {self.threads} threads x {self.vectors} vec{self.vec} ({passes})"


def table() -> dict:
    """The tuning table with the active overrides applied."""
    return {**load_tuning(TABLE), **overrides.active()}


def vector_width(n_cols: int, align_elems: int, elem_bytes: int) -> int:
    """Elements per vector: 16 bytes, halved until it divides the row length and the alignment."""
    vec = VECTOR_BYTES // elem_bytes
    while vec > 1 and (n_cols % vec or align_elems % vec):
        vec //= 2
    return vec


def _kind_bits(backward: bool, log: bool, in_dtype: str, out_dtype: str, vec: int) -> tuple[str, int]:
    """The tuning table's (kind, bits) entry for a kernel: 16-bit values count as 32-bit ones in odd
    vectors (they do not pack two to a register) or with a float32 output (kept as float32)."""
    kind = "backward" if backward else "log_softmax" if log else "softmax"
    bits = 16 if DTYPE_BYTES[in_dtype] == DTYPE_BYTES[out_dtype] == 2 and vec % 2 == 0 else 32
    return kind, bits


def _entry(t: dict, name: str, kind: str, bits: int) -> int:
    """Table entry `name`: one number for every kernel, or {kind: {bits: number}}."""
    value = t[name]
    return value if isinstance(value, int) else value[kind][bits]


def _max_vectors(t: dict, kind_bits: tuple[str, int], vec: int, entry: str) -> int:
    """Vectors one thread holds (per tensor), from the table's `entry`."""
    return max(1, int(_entry(t, entry, *kind_bits) * t["elems_scale"]) // vec)


def make_plan(backward: bool, in_dtype: str, out_dtype: str, log: bool, n_cols: int, align_elems: int, arch: str,
              tvm_ffi: bool, scaled: bool = False, capped: bool = False, states: bool = False) -> KernelKey:
    """The kernel for rows of `n_cols` elements aligned to `align_elems` (pointers and row strides),
    with the prologue's steps `scaled` / `capped`; `states`: the logsumexp kernel of the forward's
    plan (no tiles held: it reads every tile once)."""
    t = table()
    elem_bytes = max(DTYPE_BYTES[in_dtype], DTYPE_BYTES[out_dtype])
    vec = vector_width(n_cols, align_elems, elem_bytes)
    n_vec = n_cols // vec
    kind_bits = _kind_bits(backward, log, in_dtype, out_dtype, vec)
    max_vectors = _max_vectors(t, kind_bits, vec, "fused_elems_per_thread" if scaled or capped else "elems_per_thread")
    key = partial(KernelKey, backward, in_dtype, out_dtype, log, arch=arch, tvm_ffi=tvm_ffi, scaled=scaled,
                  capped=capped, states=states)  # (cluster, threads, vec, vectors, two_pass)
    threads = t["threads"]
    clusters = sorted(t["clusters"])
    need = cdiv(n_vec, threads * max_vectors)  # CTAs that hold the row
    if need <= 1:
        # One CTA: as few threads as hold the row, then as few vectors as suffice.
        threads = min(threads, max(t["min_threads"], next_power_of_2(cdiv(n_vec, max_vectors))))
        return key(1, threads, vec, cdiv(n_vec, threads), False)
    # Rows a cluster of `threads`-thread CTAs cannot hold take CTAs of `long_row_threads` (one
    # an SM: the same registers an SM as two of `threads`, in half the CTAs of a cluster).
    long_threads = max(threads, _entry(t, "long_row_threads", *kind_bits))
    for width in sorted({threads, long_threads}):
        fitting = [c for c in clusters if c * width * max_vectors >= n_vec]
        if fitting:
            cluster = fitting[0]
            return key(cluster, width, vec, cdiv(n_vec, cluster * width), False)
    threads, cluster = long_threads, clusters[-1]
    if (scaled or capped) and not backward:
        # The second pass recomputes the prologue (tanh) on reloaded tiles: fewer elements a tile.
        max_vectors = max(1, int(max_vectors * t["fused_two_pass_scale"]))
    tiles = cdiv(n_vec, cluster * threads * max_vectors)
    # Tiles of equal size (`balance_tiles`): as few vectors a thread as that many tiles need, so
    # that the last tile is not a sliver that leaves most threads idle.
    vectors = cdiv(n_vec, tiles * cluster * threads) if t["balance_tiles"] else max_vectors
    two = key(cluster, threads, vec, vectors, True)
    if states:
        return two
    # Full tiles (all but the last, which stays in registers; fewer vectors never add a tile)
    # kept in shared memory, as many as the CTA's share of `stage_bytes` holds: the second pass
    # then reads them there, not from memory again.
    return replace(two, staged=min(tiles - 1, stage_budget(t, threads) // two.tile_bytes))


def stage_budget(t: dict, threads: int) -> int:
    """Shared memory a CTA may fill with held tiles: `stage_bytes` (an SM's) over the CTAs an SM
    holds (two of 256 threads, one of 512), so that held tiles never cost occupancy."""
    return t["stage_bytes"] // max(1, 512 // threads)


def make_column_plan(backward: bool, in_dtype: str, out_dtype: str, log: bool, n_red: int, n_inner: int,
                     align_elems: int, arch: str, tvm_ffi: bool) -> KernelKey | str:
    """The column kernel for `n_red` strided positions of `n_inner` contiguous columns aligned to
    `align_elems`, or why there is none: a column longer than the largest cluster holds (one pass
    only; a second would read the strip again, as the triton column kernels do). Strips are the
    widest of `column_strip_bytes` that holds the column, no wider than the columns."""
    t = table()
    elem_bytes = max(DTYPE_BYTES[in_dtype], DTYPE_BYTES[out_dtype])
    vec = vector_width(n_inner, align_elems, elem_bytes)
    max_vectors = _max_vectors(t, _kind_bits(backward, log, in_dtype, out_dtype, vec), vec, "column_elems_per_thread")
    threads = t["threads"]
    clusters = sorted(t["clusters"])
    # Lanes per strip row: no more than the column vectors there are (a strip of 32 fp32
    # columns for 20 of them would leave a third of the threads idle).
    most = next_power_of_2(cdiv(n_inner, vec))
    for strip_bytes in sorted(t["column_strip_bytes"], reverse=True):  # the narrowest last
        lanes = min(WARP_LANES, most, max(1, strip_bytes // (vec * DTYPE_BYTES[in_dtype])))
        per_cta = (threads // lanes) * max_vectors
        fitting = [c for c in clusters if c * per_cta >= n_red]
        if fitting:
            cluster = fitting[0]
            vectors = cdiv(n_red, cluster * (threads // lanes))
            return KernelKey(backward, in_dtype, out_dtype, log, cluster, threads, vec, vectors, False, arch,
                             tvm_ffi, lanes)
    return (f"a column of {n_red} elements is longer than a cluster holds ({clusters[-1] * per_cta} of {in_dtype} "
            f"in {strip_bytes}-byte strips); backend 'triton' reduces it in passes")
