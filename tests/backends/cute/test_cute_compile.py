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
from anysoftmax.backends.cute.plan import DTYPE_BYTES, KernelKey, make_plan, overrides, table, vector_width

NEEDS_DSL = pytest.mark.skipif(env.dsl_missing(check_import=False) is not None,
                               reason=f"{env.dsl_missing(check_import=False)}: the cute kernels cannot compile here")

ARCH = "sm_90a"
# Row lengths that reach every kind with the shipped table: one small CTA, one full CTA,
# clusters of 2, 4, 8 and 16, two passes, and odd lengths (narrower vectors).
ROW_LENGTHS = [128, 781, 16384, 32768, 65536, 131072, 262144, 1048576, 65538]
DTYPE_PAIRS = [("float32", "float32"), ("bfloat16", "bfloat16"), ("float16", "float16"), ("float16", "float32")]


def _kinds():
    """Distinct plans over directions, dtypes, log and row lengths (one compile each)."""
    seen = {}
    for backward, (src, dst), log, n in itertools.product((False, True), DTYPE_PAIRS, (False, True), ROW_LENGTHS):
        if backward and src != dst:
            continue  # backward reads y, dy and writes dx in one dtype
        key = make_plan(backward, src, dst, log, n, 64, ARCH, True)
        seen.setdefault(key, n)
    return list(seen.items())


KINDS = _kinds()


def test_kinds_cover_every_path():
    clusters = {k.cluster for k, _ in KINDS}
    assert clusters == {1, 2, 4, 8, 16}
    assert any(k.two_pass for k, _ in KINDS) and any(not k.two_pass for k, _ in KINDS)
    assert {k.vec for k, _ in KINDS} >= {1, 2, 4, 8}
    assert {k.backward for k, _ in KINDS} == {False, True}


@NEEDS_DSL
@pytest.mark.parametrize("key,n", KINDS, ids=[f"{k.describe()} N={n}" for k, n in KINDS])
def test_compiles(key: KernelKey, n: int):
    from anysoftmax.backends.cute import compiler, cubin

    compiled = compiler.compile_kernel(key, keep=True)
    ptx = compiled.__ptx__
    assert f".target {ARCH}" in ptx
    # Cluster kernels reduce through distributed shared memory with the cluster barrier;
    # single-CTA kernels must not pay for either.
    assert ("mapa.shared::cluster" in ptx) == (key.cluster > 1)
    assert ("barrier.cluster.wait" in ptx) == (key.cluster > 1)
    # 16-byte vectors where the row allows them (4 fp32 / 8 16-bit values).
    if key.vec * DTYPE_BYTES[key.in_dtype] == 16:
        assert re.search(r"ld\.global(\.[a-z0-9:]+)*\.v4\.b32", ptx)
    # One exp an element in one pass (softmax keeps exp(x - m); log_softmax needs only the
    # sum), plus those of the reductions (a few dozen, whatever the row).
    if not key.backward and not key.two_pass:
        assert ptx.count("ex2.approx") <= key.vec * key.vectors + 64, ptx.count("ex2.approx")
    # The row stays in registers: no local memory (spills) anywhere.
    assert not re.search(r"\b(ld|st)\.local", ptx)
    res = cubin.resources(compiled.__cubin__)
    assert res.frame_bytes == 0
    # Two CTAs of 256 threads fit one SM's 65536 registers (the table's premise): <= 128 each.
    assert res.registers <= 65536 // (2 * 256) or key.threads < 256, res


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
    else:
        assert key.elems_per_tile >= n
        # No bigger than needed: one vector fewer a thread would not hold the row.
        assert key.cluster * key.threads * key.vec * (key.vectors - 1) < n


def test_plan_is_pure_and_keyed_by_what_changes_code():
    a = make_plan(False, "float32", "float32", False, 65536, 64, ARCH, True)
    assert a == make_plan(False, "float32", "float32", False, 65536, 64, ARCH, True)
    assert a != make_plan(False, "float32", "float32", True, 65536, 64, ARCH, True)
    assert a != make_plan(False, "float32", "float32", False, 65536, 64, ARCH, False)
    assert a != make_plan(False, "float32", "float32", False, 65536, 2, ARCH, True)
    assert a != make_plan(False, "float32", "float32", False, 65536, 64, "sm_100a", True)
    # Row counts are not in the key, and neither are row lengths that need the same vectors.
    assert a == make_plan(False, "float32", "float32", False, 65536 - 4, 64, ARCH, True)


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
