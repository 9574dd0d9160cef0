"""The `cute` kernels compile without a GPU (CI): every kernel kind the planner chooses, checked
in its PTX and cubin, plus the planner's arithmetic.

Compiling needs `nvidia-cutlass-dsl` (the `cute` extra); without it the compile tests skip with
that reason. The target is $CUTE_DSL_ARCH, sm_90a unless set (anysoftmax.backends.cute.env).
"""

from __future__ import annotations

import itertools
import re

import pytest

from anysoftmax.backends.cute import env
from anysoftmax.backends.cute.plan import (DTYPE_BYTES, KernelKey, make_column_plan, make_plan, overrides,
                                          stage_budget, table, vector_width)

NEEDS_DSL = pytest.mark.skipif(env.dsl_missing(check_import=False) is not None,
                               reason=f"{env.dsl_missing(check_import=False)}: the cute kernels cannot compile here")

ARCH = "sm_90a"
# Row lengths that reach every kind with the shipped table: one small CTA, one full CTA,
# clusters of 2, 4, 8 and 16, two passes, and odd lengths (narrower vectors).
ROW_LENGTHS = [128, 781, 16384, 32768, 65536, 131072, 262144, 1048576, 65538]
DTYPE_PAIRS = [("float32", "float32"), ("bfloat16", "bfloat16"), ("float16", "float16"), ("float16", "float32")]
# The row and fused kinds compile float16 -> float16 backward only: its forward's loads are the
# float16 -> float32 forward's and its stores the backward's (the GPU tests run it whole).
PAIR_ON_ITS_PARTS = ("float16", "float16")


def _kinds():
    """Distinct plans over directions, dtypes, log and row lengths (one compile each)."""
    seen = {}
    for backward, (src, dst), log, n in itertools.product((False, True), DTYPE_PAIRS, (False, True), ROW_LENGTHS):
        if (backward and src != dst) or (not backward and (src, dst) == PAIR_ON_ITS_PARTS):
            continue  # backward reads y, dy and writes dx in one dtype
        key = make_plan(backward, src, dst, log, n, 64, ARCH, True)
        seen.setdefault(key, n)
    return list(seen.items())


# (reduced length, inner positions) of column requests reaching every strip width and cluster
# size with the shipped table: dim 0 of the benchmark's 8192^2 and 16384x1024, 32-byte strips
# (32768 rows), one CTA, a cluster of 2, odd inner counts (vec 1) and the padded strip of 20.
COLUMN_SHAPES = [(8192, 8192), (16384, 1024), (32768, 64), (300, 96), (1000, 33), (3000, 20)]


def _column_kinds():
    seen = {}
    for backward, (src, dst), log, (n, inner) in itertools.product((False, True), DTYPE_PAIRS, (False, True),
                                                                    COLUMN_SHAPES):
        if backward and src != dst:
            continue
        key = make_column_plan(backward, src, dst, log, n, inner, 64, ARCH, True)
        if not isinstance(key, str):
            seen.setdefault(key, (n, inner))
    return list(seen.items())


def _fused_kinds():
    """The fused prologue's kernels: scale, softcap and both, over one CTA, a cluster and two passes."""
    seen = {}
    for backward, (src, dst), log, n, (scaled, capped) in itertools.product(
            (False, True), DTYPE_PAIRS, (False, True), (781, 131072, 1048576), ((True, False), (False, True), (True, True))):
        if (backward and src != dst) or (not backward and (src, dst) == PAIR_ON_ITS_PARTS):
            continue
        key = make_plan(backward, src, dst, log, n, 64, ARCH, True, scaled=scaled, capped=capped)
        seen.setdefault(key, n)
    return list(seen.items())


def _states_kinds():
    """The logsumexp kernels (the forward plans' states form): every row length in float32 and
    bfloat16, a few in float16, and the fused prologue over one CTA, a cluster and streamed tiles."""
    seen = {}
    plain = [(d, n, False, False) for d in ("float32", "bfloat16") for n in ROW_LENGTHS]
    plain += [("float16", n, False, False) for n in (781, 131072, 1048576, 65538)]
    fused = [(d, n, *steps) for d in ("float32", "bfloat16") for n in (781, 131072, 1048576)
             for steps in ((True, False), (True, True))]
    fused += [("float16", 262144, False, True)]
    for dtype, n, scaled, capped in plain + fused:
        key = make_plan(False, dtype, dtype, False, n, 64, ARCH, True, scaled=scaled, capped=capped, states=True)
        seen.setdefault(key, n)
    return list(seen.items())


KINDS = _kinds()
COLUMN_KINDS = _column_kinds()
FUSED_KINDS = _fused_kinds()
STATES_KINDS = _states_kinds()


def test_kinds_cover_every_path():
    clusters = {k.cluster for k, _ in KINDS}
    assert clusters == {1, 2, 4, 8, 16}
    assert any(k.two_pass for k, _ in KINDS) and any(not k.two_pass for k, _ in KINDS)
    assert {k.vec for k, _ in KINDS} >= {1, 2, 4, 8}
    assert {k.backward for k, _ in KINDS} == {False, True}
    # Rows of 1M: CTAs of 512 threads (fp32) and tiles held in shared memory between the passes.
    assert any(k.threads == 512 for k, _ in KINDS) and any(k.staged for k, _ in KINDS)


def _compiled_ptx(key: KernelKey, frame_limit: int = 0) -> str:
    """Compile `key` and check what every kernel kind must hold; its PTX for the rest."""
    from anysoftmax.backends.cute import compiler
    from helpers import cubin

    compiled = compiler.compile_kernel(key, keep=True)
    ptx = compiled.__ptx__
    assert f".target {ARCH}" in ptx
    # Cluster kernels reduce through distributed shared memory: partials sent with st.async,
    # counted on the receiver's mbarrier, the cluster barrier only once (relaxed, at the top:
    # the peers have started). A release-fenced cluster arrive made every thread wait on a
    # memory fence (~40% of the stall cycles of the bf16 forward on an H100, 0.91 -> 0.99 of
    # copy without it). Single-CTA kernels pay for none of it.
    assert ("mapa.shared::cluster" in ptx) == (key.cluster > 1)
    assert ("barrier.cluster.wait" in ptx) == (key.cluster > 1)
    assert ("st.async.shared::cluster.mbarrier::complete_tx::bytes" in ptx) == (key.cluster > 1)
    assert ("mbarrier.try_wait" in ptx) == (key.cluster > 1)
    assert not re.search(r"barrier\.cluster\.arrive(?!\.relaxed)", ptx)
    # 16-byte vectors where the row allows them (4 fp32 / 8 16-bit values).
    if key.vec * DTYPE_BYTES[key.in_dtype] == 16:
        assert re.search(r"ld\.global(\.[a-z0-9:]+)*\.v4\.b32", ptx)
    # The row stays in registers: no local memory (spills) anywhere.
    assert not re.search(r"\b(ld|st)\.local", ptx)
    res = cubin.resources(compiled.__cubin__)
    assert res.frame_bytes <= frame_limit, res
    # Two CTAs of 256 threads, or one of 512, fit one SM's 65536 registers (the table's
    # premise): <= 128 each.
    assert res.registers <= 65536 // 512 or key.threads < 256, res
    # Tiles held between the passes go to shared memory and back in 16-byte vectors, each
    # thread its own (no barrier): one store and one load a vector of each staged tensor.
    shared_v4 = (len(re.findall(r"st\.shared\.v4", ptx)), len(re.findall(r"ld\.shared\.v4", ptx)))
    if key.vec * DTYPE_BYTES[key.in_dtype] == 16 and not key.lanes:  # row kernels
        staged_vectors = key.vectors * (2 if key.backward else 1) if key.staged else 0
        assert shared_v4 == (staged_vectors, staged_vectors), (shared_v4, key)
    return ptx


@NEEDS_DSL
@pytest.mark.parametrize("key,n", KINDS, ids=[f"{k.describe()} N={n}" for k, n in KINDS])
def test_compiles(key: KernelKey, n: int):
    ptx = _compiled_ptx(key)
    # One exp an element in one pass (softmax keeps exp(x - m); log_softmax needs only the
    # sum), plus those of the reductions (a few dozen, whatever the row).
    if not key.backward and not key.two_pass:
        assert ptx.count("ex2.approx") <= key.vec * key.vectors + 64, ptx.count("ex2.approx")
    # 16-bit values packed two a word take the packed max (half the instructions, no float32
    # copies): one max per word but the last (two passes: for the streamed and the last tile).
    if not key.backward and key.in_dtype != "float32" and key.vec % 2 == 0:
        words = key.vec * key.vectors // 2
        packed_max = ptx.count("max.NaN.bf16x2" if key.in_dtype == "bfloat16" else "max.NaN.f16x2")
        assert packed_max == (2 if key.two_pass else 1) * (words - 1), packed_max


def test_fused_kinds_cover_every_path():
    assert {k.cluster for k, _ in FUSED_KINDS} >= {1, 8, 16}
    assert any(k.two_pass for k, _ in FUSED_KINDS) and {k.backward for k, _ in FUSED_KINDS} == {False, True}
    assert {(k.scaled, k.capped) for k, _ in FUSED_KINDS} == {(True, False), (False, True), (True, True)}
    # x is an operand of the fused backward (softcap's derivative)
    assert all(len(k.operand_dtypes) == 4 for k, _ in FUSED_KINDS if k.backward)


@NEEDS_DSL
@pytest.mark.parametrize("key,n", FUSED_KINDS, ids=[f"{k.describe()} N={n}" for k, n in FUSED_KINDS])
def test_fused_kernels_compile(key: KernelKey, n: int):
    ptx = _compiled_ptx(key)
    # The run-time scale and softcap are kernel parameters (a new value never recompiles).
    assert len(re.findall(r"\.param \.f32", ptx)) >= 2
    # No IEEE division an element (softcap's tanh divides by approximate reciprocals; a
    # `fastmath` vector division still lowers to div.rn, a dozen instructions an element).
    assert ptx.count("div.rn") <= 2, ptx.count("div.rn")


def test_states_kinds_cover_every_path():
    assert {k.cluster for k, _ in STATES_KINDS} == {1, 2, 4, 8, 16}
    assert any(k.two_pass for k, _ in STATES_KINDS) and any(not k.two_pass for k, _ in STATES_KINDS)
    assert {k.vec for k, _ in STATES_KINDS} >= {1, 2, 4, 8} and any(k.threads == 512 for k, _ in STATES_KINDS)
    assert {(k.scaled, k.capped) for k, _ in STATES_KINDS} == {(False, False), (True, False), (True, True),
                                                                (False, True)}
    assert all(k.states and not k.staged and k.operand_dtypes[1] == "float32" for k, _ in STATES_KINDS)


@NEEDS_DSL
@pytest.mark.parametrize("key,n", STATES_KINDS, ids=[f"{k.describe()} N={n}" for k, n in STATES_KINDS])
def test_states_kernels_compile(key: KernelKey, n: int):
    """logsumexp's kernels: the forward's reads and reduction, one 32-bit store a row."""
    ptx = _compiled_ptx(key)  # (no tiles held: no shared-memory vectors)
    assert re.findall(r"st\.global\S*", ptx) == ["st.global.b32"]
    # The row is read once: the vectors of a tile (and, streamed, of the last tile's copy of the code).
    loads = re.findall(r"ld\.global\S*", ptx)
    assert len(loads) == (2 if key.two_pass else 1) * key.vectors, loads
    # One exp an element (two with softcap's tanh) plus those of the reductions.
    per_element = 2 if key.capped else 1
    exps = ptx.count("ex2.approx")
    assert exps <= per_element * (2 if key.two_pass else 1) * key.vec * key.vectors + 64, exps
    # Scale and softcap are run-time parameters of every logsumexp kernel (1.0 where it has no such step).
    assert len(re.findall(r"\.param \.f32", ptx)) >= 2


def test_column_kinds_cover_every_path():
    assert {k.cluster for k, _ in COLUMN_KINDS} >= {1, 2, 16}
    assert {k.lanes * k.vec * DTYPE_BYTES[k.in_dtype] for k, _ in COLUMN_KINDS if k.vec > 1} >= {32, 64, 128}
    assert {k.vec for k, _ in COLUMN_KINDS} >= {1, 4, 8}
    assert {k.backward for k, _ in COLUMN_KINDS} == {False, True}


@NEEDS_DSL
@pytest.mark.parametrize("key,shape", COLUMN_KINDS, ids=[f"{k.describe()} {n}x{i}" for k, (n, i) in COLUMN_KINDS])
def test_column_kernels_compile(key: KernelKey, shape):
    # ptxas keeps the 16-bit backward of 5 vectors at 64 registers (four CTAs an SM) by
    # spilling one 8-byte pair once the mbarrier exchange is in (sm_90a, CUDA 13.0's ptxas):
    # a few bytes of stack, not the strip. Every other column kernel has no stack frame.
    odd_16bit_backward = key.backward and key.in_dtype != "float32" and key.vectors % 2
    ptx = _compiled_ptx(key, frame_limit=8 if odd_16bit_backward else 0)
    # Maxima first, then one exp an element against the column's maximum: no exps in the
    # reductions (softmax keeps them; log_softmax only sums them; the log backward has one more).
    exps = ptx.count("ex2.approx")
    assert exps == (0 if key.backward and not key.log else key.vec * key.vectors), exps


@NEEDS_DSL
def test_compiled_once_per_key():
    from anysoftmax.backends.cute import compiler

    key = make_plan(False, "float32", "float32", False, 65536, 64, ARCH, True)
    before = compiler.compiled_count()
    assert compiler.kernel(key) is compiler.kernel(key)
    assert compiler.compiled_count() - before <= 1


# ---------------------------------------------------------------- planner (no DSL needed)

@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n", [1, 7, 128, 781, 4096, 16384, 16385, 65536, 100000, 262144, 1 << 20, 3 << 20])
def test_plan_holds_the_row(backward, dtype, n):
    key = make_plan(backward, dtype, dtype, False, n, 64, ARCH, True)
    assert n % key.vec == 0
    assert key.cluster in table()["clusters"]
    kind = "backward" if backward else "softmax"
    elems = max(table()["elems_per_thread"][kind].values())
    assert key.vec * key.vectors <= max(elems, key.vec)
    if key.two_pass:
        assert key.elems_per_tile < n and key.cluster == max(table()["clusters"])
        tiles = -(-n // key.elems_per_tile)
        # Equal tiles: one vector fewer a thread would need another tile.
        assert key.cluster * key.threads * key.vec * (key.vectors - 1) * tiles < n
        # Full tiles held in shared memory, as many as the table's bytes a CTA allow.
        budget = stage_budget(table(), key.threads)
        assert 0 < key.staged <= tiles - 1 and key.staged_bytes <= budget
        assert key.staged == tiles - 1 or key.staged_bytes + key.staged_bytes // key.staged > budget
    else:
        assert key.elems_per_tile >= n
        # No bigger than needed: one vector fewer a thread would not hold the row.
        assert key.cluster * key.threads * key.vec * (key.vectors - 1) < n


def test_states_plan_is_the_forward_plan():
    """logsumexp runs the softmax forward's plan (its CTAs, vectors and passes) minus the tiles
    held in shared memory: its kernel reads each tile once."""
    for dtype, n, capped in (("float32", 4096, False), ("bfloat16", 131072, True), ("float32", 1 << 20, False),
                             ("bfloat16", 1 << 20, True)):
        fwd = make_plan(False, dtype, dtype, False, n, 64, ARCH, True, capped=capped)
        assert make_plan(False, dtype, dtype, False, n, 64, ARCH, True, capped=capped, states=True) == \
            KernelKey(**{**fwd.__dict__, "states": True, "staged": 0})
    assert "lse bfloat16" in make_plan(False, "bfloat16", "bfloat16", False, 1 << 20, 64, ARCH, True,
                                       states=True).describe()


def test_plan_is_pure_and_keyed_by_what_changes_code():
    a = make_plan(False, "float32", "float32", False, 65536, 64, ARCH, True)
    assert a == make_plan(False, "float32", "float32", False, 65536, 64, ARCH, True)
    assert a != make_plan(False, "float32", "float32", True, 65536, 64, ARCH, True)
    assert a != make_plan(False, "float32", "float32", False, 65536, 64, ARCH, False)
    assert a != make_plan(False, "float32", "float32", False, 65536, 2, ARCH, True)
    assert a != make_plan(False, "float32", "float32", False, 65536, 64, "sm_100a", True)
    # Row counts are not in the key, and neither are row lengths that need the same vectors.
    assert a == make_plan(False, "float32", "float32", False, 65536 - 4, 64, ARCH, True)


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n,inner", [(1, 64), (100, 7), (2048, 20), (8192, 8192), (16384, 1024), (32768, 64),
                                     (32769, 64), (100000, 8)])
def test_column_plan_holds_the_column(backward, dtype, n, inner):
    key = make_column_plan(backward, dtype, dtype, False, n, inner, 64, ARCH, True)
    if isinstance(key, str):  # refused only when even the narrowest strip's largest cluster is short
        held = re.search(r"longer than a cluster holds \((\d+) of .*backend 'triton'", key)
        assert held and int(held.group(1)) < n, key
        return
    assert inner % key.vec == 0 and key.lanes >= 1 and key.threads % key.lanes == 0
    assert key.lanes * key.vec * DTYPE_BYTES[dtype] <= max(table()["column_strip_bytes"])
    assert key.lanes <= max(1, 1 << (-(-inner // key.vec) - 1).bit_length())  # no wider than the columns
    assert key.strip_rows >= n
    assert key.cluster * (key.threads // key.lanes) * (key.vectors - 1) < n  # no more vectors than needed


def test_vector_width():
    assert vector_width(65536, 64, 4) == 4
    assert vector_width(65536, 64, 2) == 8
    assert vector_width(65538, 64, 4) == 2
    assert vector_width(65537, 64, 4) == 1
    assert vector_width(65536, 3, 4) == 1  # an unaligned pointer


def test_overrides_change_the_plan():
    base = make_plan(False, "float32", "float32", False, 131072, 64, ARCH, True)
    with overrides(clusters=[1, 2]):
        two = make_plan(False, "float32", "float32", False, 131072, 64, ARCH, True)
    assert base.cluster == 8 and not base.two_pass
    assert two.cluster == 2 and two.two_pass
    with pytest.raises(KeyError, match="unknown cute tuning key"):
        with overrides(no_such_key=1):
            pass


def test_long_rows_take_wider_ctas_then_held_tiles():
    """Rows past 16 CTAs of 256 threads: CTAs of 512 where the table says so (one pass if that
    holds the row), then two passes over equal tiles with the full ones held in shared memory."""
    bwd = make_plan(True, "float32", "float32", False, 262144, 64, ARCH, True)
    assert (bwd.threads, bwd.cluster, bwd.two_pass) == (512, 16, False)  # y and dy: 32 fp32 a thread
    with overrides(long_row_threads=256):
        assert make_plan(True, "float32", "float32", False, 262144, 64, ARCH, True).two_pass
    fwd = make_plan(False, "bfloat16", "bfloat16", False, 1 << 20, 64, ARCH, True)
    assert fwd.threads == 256 and fwd.two_pass and fwd.staged == 2  # three equal tiles, two held
    with overrides(stage_bytes=0):
        assert make_plan(False, "bfloat16", "bfloat16", False, 1 << 20, 64, ARCH, True).staged == 0
    with overrides(balance_tiles=False):
        assert make_plan(False, "bfloat16", "bfloat16", False, 1 << 20, 64, ARCH, True).vectors == 12
    assert "2 tiles in shared memory" in fwd.describe()
    # Held tiles never cost occupancy: two CTAs of 256 threads an SM share `stage_bytes` (the
    # fused bf16 forward of 1M: six of its seven 16 KB tiles, not all seven in one CTA an SM).
    fused = make_plan(False, "bfloat16", "bfloat16", False, 1 << 20, 64, ARCH, True, capped=True)
    assert fused.threads == 256 and fused.staged_bytes <= table()["stage_bytes"] // 2
    assert (fused.staged, fused.staged_bytes) == (6, 6 * 16384)
