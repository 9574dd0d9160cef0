"""The CuTe DSL kernels: softmax / log_softmax forward and backward over a thread-block cluster.

The kernels are defined when first needed (`entries()`, which imports `cutlass`), so the module
imports without the DSL. One kernel body serves every plan; the plan's numbers
(`plan.KernelKey`) are compile-time constants.

A row belongs to one cluster of `cluster` CTAs of `threads` threads. Thread `t` of CTA `r`
holds `vectors` vectors of `vec` elements (16 bytes when the row allows it) in registers:
vector `k` of tile `i` is vector number

    i * (cluster * threads * vectors) + r * (threads * vectors) + k * threads + t

of the row, so that the 32 threads of a warp touch 32 consecutive vectors (512 coalesced bytes
per fp32 load instruction). A row that fits in one tile (`two_pass` False) is read once, reduced,
and written from the registers: one read and one write. A longer row is streamed tile by tile
(`two_pass`): the first pass only reduces (an online max and sum) and stores the first `staged`
full tiles to shared memory (each thread its own vectors, in the same order: it reads back only
what it wrote, so no barrier); the second pass takes those from shared memory, reads the others
again, newest first, so that they come from L2, and writes the result; the last tile stays in
the registers between the passes. (Bulk L2 prefetches of the coming tiles were tried on an
H100 and made these kernels hang or fault: "illegal instruction"; they are not used.)

logsumexp (`states_entry`) is the forward kernel with `states` set: the same plan, loads and
reduction of a row (its tiles read once, none held), then lse = M + log(S) written by one
thread, one float32 a row, instead of the second pass and the row's stores.

What a thread keeps from its loads to its stores: softmax keeps exp(x - m) against its own
maximum m (one exp an element; the output is that times exp(m - M) / S), as float16 for a 16-bit
output; log_softmax keeps x; backward y and dy. Two-pass tiles are exponentiated again against
the row's maximum (the last tile too: it is the one path measured correct in two passes). 16-bit values stay packed two to a register
(`_opaque` stops the compilers from keeping float32 copies across the reduction instead).

The reduction of a row (forward: the pair (max m, sum of exp(x - m)); backward: one sum) runs
thread -> warp (butterfly shuffles) -> cluster: lane l < cluster of every warp sends its warp's
partial result into slot [rank * warps + warp] of CTA l's shared memory with `st.async`, which
counts the slot's bytes on CTA l's mbarrier (set up at the kernel's top to expect
`cluster * warps` slots); every thread waits on its own CTA's mbarrier and then reduces all
`cluster * warps` slots itself, so every thread ends with the row's result. No fence and no
second cluster barrier: a cluster barrier with release semantics made every thread wait on a
memory fence (NVIDIA H100, ncu: fence and barrier stalls ~40% of the bf16 forward's), and
removing it took bf16 rows of 65536-262144 from 0.89-0.94 of copy to 0.99. A CTA only writes
into a peer's shared memory after the peer has started and set up its mbarrier: a relaxed
cluster arrive at the top of the kernel and its wait just before the first `st.async`
(overlapped with the loads) ensure that. 16-bit maxima are taken packed (`max.NaN.bf16x2`),
two values an instruction, without converting them first.

The fused family's prologue (`core.variant`: z = scale * x, then softcap * tanh(z / softcap))
runs after every load in the `fused_*` entries (scale and softcap are run-time float32
arguments); the forward then keeps z or exp(z - m) as float32, and the backward multiplies by
scale and 1 - tanh^2, reading x after the reduction. The plain entries pass constants and no
flags, so their code is the prologue-free kernel.

Numerics (see `core.spec`): exp2((x - m) * log2(e)) with x - m formed first (it is exact near
the maximum, where the outputs are large); accumulation in float32. Special values follow from
the formula: a thread whose values are all -inf contributes (m=-inf, s=0) and exponentiates
against 0 instead of -inf (else -inf - -inf = NaN would poison a finite row); partial results
combine as s1 * scale(m1) + s2 * scale(m2) with scale(m) = 1 when m is the larger maximum (so
-inf/-inf and inf/inf pairs never form NaN by themselves), else exp2((m - M) * log2(e)); a NaN
input makes its sum NaN and with it the whole row; a row of -inf ends with M = -inf and
(x - M) = NaN everywhere, as torch gives it. logsumexp (`core.pieces`) differs where +inf is
the maximum: its thread exponentiates against 0 instead, so S = +inf and lse = +inf (NaN when
the row also holds a NaN); a row of -inf gives -inf + log(0) = -inf.
"""

import math
import threading
from types import SimpleNamespace

LOG2_E = math.log2(math.e)
WARP = 32
# Shuffle distances of a full-warp butterfly reduction.
BUTTERFLY = (16, 8, 4, 2, 1)
_lock = threading.Lock()
_built: list = []


def entries() -> SimpleNamespace:
    """The host entry points `forward_entry`, `backward_entry`, their `fused_*` forms and
    `states_entry` (logsumexp) for `cute.compile`, and
    those of the column kernels (`column_kernels.py`), defined on first use: this module imports
    without the DSL (its kernels need it to compile)."""
    with _lock:
        if not _built:
            _built.append(_define())
        return _built[0]


def _define() -> SimpleNamespace:
    # The DSL, imported for the architecture chosen by `env` (sm_90a without a GPU).
    from .env import import_dsl

    cute = import_dsl()
    import cutlass
    from cutlass import Float32, Int32, const_expr

    # ---------------------------------------------------------------- combining partial results

    @cute.jit
    def _scale(m: Float32, big: Float32) -> Float32:
        """exp(m - big), 1 when m is the maximum itself (also for infinite maxima)."""
        r = cute.math.exp2((m - big) * LOG2_E, fastmath=True)
        if m == big:
            r = Float32(1.0)
        return r

    @cute.jit
    def _combine_pair(m1: Float32, s1: Float32, m2: Float32, s2: Float32):
        """(max, sum of exp(x - max)) of the union of two partial results."""
        big = cute.arch.fmax(m1, m2)
        return big, s1 * _scale(m1, big) + s2 * _scale(m2, big)

    @cute.jit
    def _warp_pair(m: Float32, s: Float32):
        """Every lane gets the warp's combined (max, sum)."""
        for off in cutlass.range_constexpr(len(BUTTERFLY)):
            m2 = cute.arch.shuffle_sync_bfly(m, BUTTERFLY[off])
            s2 = cute.arch.shuffle_sync_bfly(s, BUTTERFLY[off])
            m, s = _combine_pair(m, s, m2, s2)
        return m, s

    @cute.jit
    def _combine(a: Float32, b: Float32, is_max: cutlass.Constexpr[bool]) -> Float32:
        """max(a, b) or a + b."""
        r = a + b
        if const_expr(is_max):
            r = cute.arch.fmax(a, b)
        return r

    @cute.jit
    def _lanes_reduce(v: Float32, is_max: cutlass.Constexpr[bool], lanes: cutlass.Constexpr[int]) -> Float32:
        """Combine `v` over the lanes of the warp that share lane % lanes (every lane: lanes=1)."""
        for i in cutlass.range_constexpr(len(BUTTERFLY)):
            if const_expr(BUTTERFLY[i] >= lanes):
                v = _combine(v, cute.arch.shuffle_sync_bfly(v, BUTTERFLY[i]), is_max)
        return v

    def _send(addr: Int32, mbar: Int32, peer: Int32, *values: Float32):
        """Store `values` (one float32, or two as one 8-byte store) at shared address `addr` of
        cluster CTA `peer` (itself included) with `st.async`, which counts their bytes on the
        peer's mbarrier at `mbar`: the peer's wait on that barrier then sees them, with no fence
        on this side. Plain Python, inlined while the kernel is traced."""
        regs = ", ".join(f"{{$r{3 + i}}}" for i in range(len(values)))
        vec, data = (".v2", f"{{{regs}}}") if len(values) == 2 else ("", regs)
        cute.arch.inline_ptx(
            "{ .reg .b32 ra, rb; mapa.shared::cluster.u32 ra, {$r0}, {$r2}; "
            "mapa.shared::cluster.u32 rb, {$r1}, {$r2}; "
            f"st.async.shared::cluster.mbarrier::complete_tx::bytes{vec}.f32 [ra], {data}, [rb]; }}",
            read_only_args=[addr, mbar, peer, *values])

    @cute.jit
    def _wait_phase0(mbar: Int32) -> Int32:
        """Wait until the mbarrier at shared address `mbar` completes its first phase; returns 0,
        which the caller adds to the addresses it reads after the wait, so that no compiler can
        move those reads above it. The loop is inside the PTX: the DSL's wait, a loop in the
        kernel's code, made ptxas keep more values live across it (fused log_softmax bf16: 155
        registers against 113)."""
        return cute.arch.inline_ptx(
            "{ .reg .pred p; WAIT: mbarrier.try_wait.parity.shared::cta.b64 p, [{$r0}], 0; @!p bra WAIT; "
            "mov.u32 {$w0}, 0; }",
            write_only_types=[Int32], read_only_args=[mbar])

    @cute.jit
    def _expect_bytes(mbar, nbytes: cutlass.Constexpr[int]):
        """Thread 0 sets up the mbarrier at `mbar` (this CTA's shared memory) for one phase, which
        completes when `nbytes` have arrived by `st.async`. The kernel's relaxed cluster arrive
        comes after (peers wait for it before their first `st.async` here); the init fence
        orders the init before that arrive."""
        if cute.arch.thread_idx()[0] == 0:
            cute.arch.mbarrier_init(mbar, 1)
            cute.arch.mbarrier_init_fence()
            cute.arch.mbarrier_arrive_and_expect_tx(mbar, nbytes)

    @cute.jit
    def _row_reduce(a: Float32, b: Float32, slots: cute.Tensor, mbar, pair: cutlass.Constexpr[bool],
                    cluster: cutlass.Constexpr[int], warps: cutlass.Constexpr[int]):
        """The row's reduction of every thread's partial result, in every thread of the cluster.

        `pair`: (a, b) = (max, sum) combined by `_combine_pair`; else `b` is a sum (`a` ignored).
        `slots` is this CTA's (cluster * warps, 2) float32 shared buffer; `mbar` its mbarrier,
        expecting every slot's bytes (`_expect_bytes`; clusters only).

        Across a cluster the slots travel by `st.async`, counted on the receiver's mbarrier; a
        cluster barrier with release semantics instead made every thread wait on a memory fence
        (NVIDIA H100: the fence and barrier stalls were ~40% of the issue-stall cycles of the
        bf16 forward at 1024 x 131072, where the memory waits of a bandwidth-bound kernel belong).
        """
        lane, warp = cute.arch.lane_idx(), cute.arch.warp_idx()
        if const_expr(pair):
            a, b = _warp_pair(a, b)
        else:
            b = _lanes_reduce(b, False, 1)
        if const_expr(cluster > 1):
            rank = cute.arch.block_idx_in_cluster()
            cute.arch.cluster_wait()  # every peer has started and set up its mbarrier
            if lane < cluster:
                slot = (slots.iterator + (rank * warps + warp) * 2).toint()
                if const_expr(pair):
                    _send(slot, mbar.toint(), lane, a, b)
                else:  # a sum: the slot's second word, where the reads below take it
                    _send(slot + 4, mbar.toint(), lane, b)
            after = _wait_phase0(mbar.toint())  # every slot of this CTA has arrived
        else:
            if lane == 0:
                slots[warp, 0] = a
                slots[warp, 1] = b
            cute.arch.barrier()
            after = Int32(0)
        # Every warp reduces all slots: lane l takes slots l, l + 32, ... (identity elsewhere).
        ra, rb = -Float32.inf, Float32(0.0)
        for i in cutlass.range_constexpr((cluster * warps + WARP - 1) // WARP):
            idx = lane + i * WARP + after
            if idx < cluster * warps:
                if const_expr(pair):
                    ra, rb = _combine_pair(ra, rb, slots[idx, 0], slots[idx, 1])
                else:
                    rb = rb + slots[idx, 1]
        if const_expr(pair):
            ra, rb = _warp_pair(ra, rb)
        else:
            rb = _lanes_reduce(rb, False, 1)
        return ra, rb

    # ---------------------------------------------------------------- per-thread tiles

    @cute.jit
    def _load_tile(gv: cute.Tensor, frag: cute.Tensor, first: Int32, threads: cutlass.Constexpr[int],
                   n_vec: Int32, fill, guard: cutlass.Constexpr[bool]):
        """Vectors first + k * threads (k < vectors) of the row view `gv` (vec, n) into `frag`
        (vec, vectors); with `guard`, vectors past the row's end are `fill` instead."""
        if const_expr(guard):
            frag.fill(fill)
        for k in cutlass.range_constexpr(cute.size(frag, mode=[1])):
            j = first + k * threads
            if const_expr(guard):
                if j < n_vec:
                    cute.autovec_copy(gv[None, j], frag[None, k])
            else:
                cute.autovec_copy(gv[None, j], frag[None, k])

    @cute.jit
    def _store_tile(frag: cute.Tensor, gv: cute.Tensor, first: Int32, threads: cutlass.Constexpr[int],
                    n_vec: Int32, guard: cutlass.Constexpr[bool]):
        for k in cutlass.range_constexpr(cute.size(frag, mode=[1])):
            j = first + k * threads
            if const_expr(guard):
                if j < n_vec:
                    cute.autovec_copy(frag[None, k], gv[None, j])
            else:
                cute.autovec_copy(frag[None, k], gv[None, j])

    def _stage_buffer(smem, dtype, vec: int, n: int, none: cute.Tensor) -> cute.Tensor:
        """Shared memory for `n` vectors of `vec` elements (a thread's tiles held between the
        passes), or `none` (a tensor that is never read as one) for n = 0. Vector j is
        contiguous at j * vec: a warp's 32 consecutive vectors are one stretch, conflict-free
        like its global accesses."""
        if n == 0:
            return none
        return smem.allocate_tensor(dtype, cute.make_layout((vec, n)), byte_alignment=16)

    @cute.jit
    def _reload_tile(gv: cute.Tensor, sv: cute.Tensor, frag: cute.Tensor, start: Int32, tile: Int32,
                     per_cta: cutlass.Constexpr[int], tidx: Int32, threads: cutlass.Constexpr[int], n_vec: Int32,
                     staged: cutlass.Constexpr[int]):
        """Full tile `tile` (global vectors from `start`) for the second pass: from this thread's
        stretch of shared memory if the first pass staged it there (tiles below `staged`), else
        from global memory (L2 when it is still there). A thread reads back only what it wrote
        itself: no barrier."""
        if const_expr(staged > 0):
            if tile < staged:
                _load_tile(sv, frag, tile * per_cta + tidx, threads, n_vec, Float32(0.0), False)
            else:
                _load_tile(gv, frag, start, threads, n_vec, Float32(0.0), False)
        else:
            _load_tile(gv, frag, start, threads, n_vec, Float32(0.0), False)

    @cute.jit
    def _runtime_zero() -> Int32:
        """0, computed from the launch's dynamic shared memory size (a few hundred bytes, shifted
        right by 31): a value no compiler can fold, unlike a constant or a shape it has bounds of."""
        return Int32(cute.arch.dynamic_smem_size()) >> 31

    @cute.jit
    def _after(zero: Int32, value: Float32) -> Int32:
        """`zero` again, but computed from `value`: an `_opaque` with it cannot run before `value`
        exists (the row's reduction), so conversions of kept values cannot be hoisted above the
        cluster barrier, where they would keep float32 copies live across it."""
        return zero & Int32(value == value)

    @cute.jit
    def _opaque(frag: cute.Tensor, zero: Int32):
        """Make the compilers forget what `frag` (16-bit values) holds: each 32-bit word is XORed
        with `zero`, a run-time 0 that neither NVVM nor ptxas can prove to be 0 (a move or an
        identity they would see through). Values converted to float32 before this point cannot be
        reused after it, so the packed words (two values a register) stay live across the row
        reduction instead of the float32 copies (one value a register: twice the registers)."""
        words = cute.recast_tensor(frag, Int32)
        words.store(words.load() ^ zero)

    @cute.jit
    def _tile_stats(frag: cute.Tensor, fe: cute.Tensor, keep: cutlass.Constexpr[bool], packed: cutlass.Constexpr[bool],
                    states: cutlass.Constexpr[bool]):
        """(max m, sum of exp(x - m)) of one thread's tile; (-inf, 0) when it holds only -inf. With
        `keep`, exp(x - m) goes to `fe` (the forward output is then fe * exp(m - M) / S). `packed`
        (16-bit values, two a word): the maximum taken packed (`_packed_max`), the values
        converted to float32 only for the exponentials. `states`: see `_exp_sum`."""
        if const_expr(packed):
            m = _packed_max(frag)
        else:
            m = frag.load().to(Float32).reduce(cute.ReductionOp.MAX, -Float32.inf, 0)
        return m, _exp_sum(frag.load().to(Float32), m, fe, keep, states)

    @cute.jit
    def _packed_max(frag: cute.Tensor) -> Float32:
        """The maximum of 16-bit values `frag` (two a word) with the packed max (NaN-propagating,
        like the float32 max): half the instructions of converting every value first, and no
        float32 copies for the compilers to keep until the exponentials."""
        words = cute.recast_tensor(frag, Int32)
        op = "max.NaN.bf16x2" if const_expr(frag.element_type == cutlass.BFloat16) else "max.NaN.f16x2"
        pair = cute.make_rmem_tensor(cute.make_layout(2), frag.element_type)
        cute.recast_tensor(pair, Int32)[0] = _max_tree(op, [words[i] for i in range(cute.size(words))])
        return pair.load().to(Float32).reduce(cute.ReductionOp.MAX, -Float32.inf, 0)

    def _max_tree(op: str, level: list):
        """Packed words combined pairwise by `op` in a tree (log2 dependent steps, not a chain);
        plain Python, unrolled while the kernel is traced."""
        while len(level) > 1:
            pairs = [cute.arch.inline_ptx(f"{op} {{$w0}}, {{$r0}}, {{$r1}};", write_only_types=[Int32],
                                          read_only_args=[level[i], level[i + 1]])
                     for i in range(0, len(level) - 1, 2)]
            level = pairs + level[len(level) - len(level) % 2:]
        return level[0]

    @cute.jit
    def _exp_sum(x, m: Float32, fe: cute.Tensor, keep: cutlass.Constexpr[bool],
                 states: cutlass.Constexpr[bool]) -> Float32:
        """Sum of exp(x - m) over a tile's float32 values `x` whose maximum is `m`; with `keep`,
        exp(x - m) goes to `fe`. `states` (the logsumexp kernel): a +inf maximum pivots at 0 too,
        so that a row holding +inf sums to +inf (its logsumexp) instead of NaN (its softmax)."""
        pivot = m
        if m == -Float32.inf:
            pivot = Float32(0.0)  # exp(-inf - 0) = 0, where exp(-inf - -inf) would be NaN
        if const_expr(states):
            if m == Float32.inf:
                pivot = Float32(0.0)
        e = cute.math.exp2((x - pivot) * LOG2_E, fastmath=True)
        if const_expr(keep):
            fe.store(e.to(fe.element_type))
        return e.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)

    @cute.jit
    def _prologue(x, scale: Float32, cap: Float32, has_scale: cutlass.Constexpr[bool],
                  has_cap: cutlass.Constexpr[bool]):
        """The fused family's elementwise steps (`core.variant`) on float32 values: z = scale * x,
        then z = cap * tanh(z / cap) with libdevice's tanh (a few ulp: what float32 outputs need)."""
        z = x
        if const_expr(has_scale):
            z = z * scale
        if const_expr(has_cap):
            z = cute.math.tanh(z * (Float32(1.0) / cap), fastmath=False) * cap
        return z

    @cute.jit
    def _fast_tanh(a: Float32) -> Float32:
        """tanh from one exponential: sign(a) (1 - e) / (1 + e), e = exp(-2|a|), with the
        approximate reciprocal (+-inf give +-1, NaN stays NaN). Its absolute error, ~2^-22,
        becomes cap * 2^-22 in z and that relative error in the output: far below a 16-bit ulp,
        not below float32's (which `_prologue`'s libdevice tanh serves)."""
        e = cute.math.exp2(cute.math.abs(a) * (-2.0 * LOG2_E), fastmath=True)
        return cute.math.copysign((Float32(1.0) - e) * cute.math.rcp(Float32(1.0) + e, approx=True), a)

    @cute.jit
    def _prologue_in_place(fz: cute.Tensor, scale: Float32, cap: Float32, has_scale: cutlass.Constexpr[bool],
                           has_cap: cutlass.Constexpr[bool], precise: cutlass.Constexpr[bool]):
        """fz (float32, holding x) := z. `precise` (a float32 output): `_prologue`; else the
        softcap's tanh is `_fast_tanh`, element by element (the approximate reciprocal has no
        vector form). libdevice's tanh made bf16 softcap rows instruction-bound on an H100
        (0.68 of copy at 131072, float32 0.90)."""
        if const_expr(precise or not has_cap):
            fz.store(_prologue(fz.load(), scale, cap, has_scale, has_cap))
        else:
            if const_expr(has_scale):
                fz.store(fz.load() * scale)
            inv = Float32(1.0) / cap
            for i in cutlass.range_constexpr(cute.size(fz)):
                fz[i] = _fast_tanh(fz[i] * inv) * cap

    @cute.jit
    def _tile_stats_fused(frag: cute.Tensor, fz: cute.Tensor, keep_exp: cutlass.Constexpr[bool], scale: Float32,
                          cap: Float32, has_scale: cutlass.Constexpr[bool], has_cap: cutlass.Constexpr[bool],
                          first: Int32, threads: cutlass.Constexpr[int], n_vec: Int32,
                          guard: cutlass.Constexpr[bool], precise: cutlass.Constexpr[bool],
                          states: cutlass.Constexpr[bool]):
        """`_tile_stats` after the prologue: z goes to the float32 `fz` (then, with `keep_exp`,
        exp(z - m) replaces it). Vectors past the row's end are set to -inf after the prologue,
        which would map a -inf fill to +inf (scale < 0) or -cap (softcap)."""
        fz.store(frag.load().to(Float32))
        _prologue_in_place(fz, scale, cap, has_scale, has_cap, precise)
        if const_expr(guard):
            for k in cutlass.range_constexpr(cute.size(fz, mode=[1])):
                if first + k * threads >= n_vec:
                    fz[None, k].fill(-Float32.inf)
        z = fz.load()
        m = z.reduce(cute.ReductionOp.MAX, -Float32.inf, 0)
        return m, _exp_sum(z, m, fz, keep_exp, states)

    @cute.jit
    def _forward_kept(fx: cute.Tensor, fe: cute.Tensor, dst: cute.Tensor, m: Float32, big: Float32, total: Float32,
                      log: cutlass.Constexpr[bool], packed: cutlass.Constexpr[bool], zero: Int32):
        """dst = the tile's result from what `_tile_stats` kept: softmax fe * exp(m - M) / S (one
        multiply an element), log_softmax (x - M) - log(S). 16-bit kept values stay packed until
        the row's result exists (`_after`)."""
        if const_expr(log):
            if const_expr(packed):
                _opaque(fx, _after(zero, total))
            y = (fx.load().to(Float32) - big) - cute.math.log(total, fastmath=False)
        else:
            if const_expr(fe.element_type.width == 16):
                _opaque(fe, _after(zero, total))
            y = fe.load().to(Float32) * (_scale(m, big) / total)
        dst.store(y.to(dst.element_type))

    @cute.jit
    def _forward_fresh(fx: cute.Tensor, dst: cute.Tensor, big: Float32, total: Float32, log: cutlass.Constexpr[bool],
                       fz: cute.Tensor, scale: Float32, cap: Float32, has_scale: cutlass.Constexpr[bool],
                       has_cap: cutlass.Constexpr[bool]):
        """dst = softmax (log_softmax) of a reloaded tile, given the row's max and sum; with the
        fused prologue, z is formed in the float32 `fz` first."""
        x = fx.load().to(Float32)
        if const_expr(has_scale or has_cap):
            fz.store(x)
            _prologue_in_place(fz, scale, cap, has_scale, has_cap, dst.element_type.width == 32)
            x = fz.load()
        if const_expr(log):
            y = (x - big) - cute.math.log(total, fastmath=False)
        else:
            y = cute.math.exp2((x - big) * LOG2_E, fastmath=True) * (Float32(1.0) / total)
        dst.store(y.to(dst.element_type))

    @cute.jit
    def _backward_partial(fy: cute.Tensor, fg: cute.Tensor, log: cutlass.Constexpr[bool]) -> Float32:
        """softmax: sum(y * g); log_softmax: sum(g) over one thread's tile."""
        g = fg.load().to(Float32)
        if const_expr(log):
            return g.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        return (fy.load().to(Float32) * g).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)

    @cute.jit
    def _backward_tile(fy: cute.Tensor, fg: cute.Tensor, dst: cute.Tensor, total: Float32, log: cutlass.Constexpr[bool],
                       fx: cute.Tensor, ft: cute.Tensor, scale: Float32, cap: Float32,
                       has_scale: cutlass.Constexpr[bool], has_cap: cutlass.Constexpr[bool]):
        """softmax: y * (g - sum(y * g)); log_softmax: g - exp(y) * sum(g); times the fused
        prologue's derivative: scale, and 1 - tanh(scale * x / cap)^2 (x in `fx`) for a softcap."""
        y = fy.load().to(Float32)
        g = fg.load().to(Float32)
        if const_expr(log):
            dx = g - cute.math.exp2(y * LOG2_E, fastmath=True) * total
        else:
            dx = y * (g - total)
        if const_expr(has_cap):
            ft.store(fx.load().to(Float32))  # z = cap * t, t = tanh(scale * x / cap): the derivative 1 - t^2
            _prologue_in_place(ft, scale, cap, has_scale, has_cap, dst.element_type.width == 32)
            t = ft.load() * (Float32(1.0) / cap)
            dx = dx * (Float32(1.0) - t * t)
        if const_expr(has_scale):
            dx = dx * scale
        dst.store(dx.to(dst.element_type))

    @cute.jit
    def _store_lse(mL: cute.Tensor, row: Int32, rank: Int32, big: Float32, total: Float32):
        """The row's logsumexp M + log(S) into mL[row], written by the cluster's first thread
        (every thread holds M and S): -inf for a row of -inf (M = -inf, S = 0), NaN with a NaN
        (S is NaN), +inf with +inf and no NaN (M = S = +inf: `_exp_sum`'s `states`)."""
        tidx, _, _ = cute.arch.thread_idx()
        if tidx + rank == 0:
            mL[row] = big + cute.math.log(total, fastmath=False)

    def _vectors(t: cute.Tensor, row: Int32, vec: int) -> cute.Tensor:
        """Row `row` of the (rows, n) tensor `t` as (vec, n // vec) vectors."""
        return cute.zipped_divide(t[row, None], (vec,))

    def _narrow(t: cute.Tensor) -> bool:
        return t.element_type.width == 16

    # ---------------------------------------------------------------- kernels

    @cute.kernel
    def _forward_kernel(mX: cute.Tensor, mY: cute.Tensor, scale: Float32, cap: Float32, log: cutlass.Constexpr[bool],
                        cluster: cutlass.Constexpr[int], threads: cutlass.Constexpr[int], vec: cutlass.Constexpr[int],
                        vectors: cutlass.Constexpr[int], two_pass: cutlass.Constexpr[bool],
                        staged: cutlass.Constexpr[int], has_scale: cutlass.Constexpr[bool],
                        has_cap: cutlass.Constexpr[bool], states: cutlass.Constexpr[bool]):
        """softmax (log_softmax) of the rows of mX into mY; with `states` (logsumexp), the first
        pass alone: the rows' statistics closed into lse = M + log(S), one float32 a row in the
        vector mY, and nothing of the row written."""
        warps = threads // WARP
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        slots = smem.allocate_tensor(Float32, cute.make_layout((cluster * warps, 2), stride=(2, 1)), byte_alignment=16)
        mbar = smem.allocate_array(cutlass.Int64, num_elems=1)
        if const_expr(cluster > 1):
            _expect_bytes(mbar, cluster * warps * 8)  # a slot from every warp of the cluster
            cute.arch.cluster_arrive_relaxed()  # paired with the wait before the first st.async
        rank = bidx % cluster
        row = bidx // cluster
        gx = _vectors(mX, row, vec)
        n_vec = cute.size(gx, mode=[1])
        zero = _runtime_zero()
        per_cta = threads * vectors
        first = rank * per_cta + tidx  # this thread's first vector in tile 0
        frag = cute.make_layout((vec, vectors))
        fx = cute.make_rmem_tensor(frag, mX.element_type)
        fy = cute.make_rmem_tensor(frag, mY.element_type)
        fused = const_expr(has_scale or has_cap)
        out_type = mY.element_type
        if const_expr(states):
            out_type = mX.element_type  # the softmax's output dtype: logsumexp computes as that softmax does
        precise = const_expr(out_type.width == 32)  # the prologue's tanh (`_prologue_in_place`)
        # exp(x - m) kept between the reduction and the store: float16 (two a register) for a 16-bit
        # output (fp16's 2**-11 relative rounding is a quarter ulp of bf16 and half an ulp of fp16,
        # inside their tolerances, but a hundred times float32's), float32 otherwise. The fused
        # prologue's z (log_softmax) or exp(z - m) (softmax) is kept as float32 (the plan holds
        # fewer elements for it).
        packed = const_expr(_narrow(mX) and vec % 2 == 0)  # 16-bit values, two to a word
        fe_half = const_expr(out_type.width == 16 and vec % 2 == 0 and not fused)
        fe = cute.make_rmem_tensor(frag, cutlass.Float16 if fe_half else Float32)
        neg_inf = -mX.element_type.inf
        keep = const_expr(not log and not states)  # exp(x - m) kept for the output
        if const_expr(not two_pass):
            _load_tile(gx, fx, first, threads, n_vec, neg_inf, True)
            if const_expr(fused):
                m, s = _tile_stats_fused(fx, fe, keep, scale, cap, has_scale, has_cap, first, threads, n_vec, True,
                                          precise, states)
                big, total = _row_reduce(m, s, slots, mbar, True, cluster, warps)
                if const_expr(not states):
                    _forward_kept(fe, fe, fy, m, big, total, log, False, zero)  # fe: z (log) or exp(z - m)
            else:
                m, s = _tile_stats(fx, fe, keep, packed, states)
                big, total = _row_reduce(m, s, slots, mbar, True, cluster, warps)
                if const_expr(not states):
                    _forward_kept(fx, fe, fy, m, big, total, log, packed, zero)
            if const_expr(states):
                _store_lse(mY, row, rank, big, total)
            else:
                _store_tile(fy, _vectors(mY, row, vec), first, threads, n_vec, True)
        else:
            per_tile = cluster * per_cta
            n_tiles = (n_vec + per_tile - 1) // per_tile
            sx = _stage_buffer(smem, mX.element_type, vec, staged * per_cta, gx)
            m, s = -Float32.inf, Float32(0.0)
            for i in cutlass.range(n_tiles - 1, unroll=1):  # the full tiles
                _load_tile(gx, fx, first + i * per_tile, threads, n_vec, neg_inf, False)
                if const_expr(staged > 0):
                    if i < staged:
                        _store_tile(fx, sx, i * per_cta + tidx, threads, n_vec, False)
                if const_expr(fused):
                    tm, ts = _tile_stats_fused(fx, fe, False, scale, cap, has_scale, has_cap, first, threads, n_vec,
                                               False, precise, states)
                else:
                    tm, ts = _tile_stats(fx, fe, False, packed, states)
                m, s = _combine_pair(m, s, tm, ts)
            last = first + (n_tiles - 1) * per_tile
            _load_tile(gx, fx, last, threads, n_vec, neg_inf, True)
            if const_expr(fused):
                tm, ts = _tile_stats_fused(fx, fe, False, scale, cap, has_scale, has_cap, last, threads, n_vec, True,
                                           precise, states)
            else:
                tm, ts = _tile_stats(fx, fe, False, packed, states)
            m, s = _combine_pair(m, s, tm, ts)
            big, total = _row_reduce(m, s, slots, mbar, True, cluster, warps)
            if const_expr(states):
                _store_lse(mY, row, rank, big, total)
            else:
                gy = _vectors(mY, row, vec)
                if const_expr(packed):
                    _opaque(fx, _after(zero, total))  # the last tile stays packed across the reduction
                # The last tile, from the registers.
                _forward_fresh(fx, fy, big, total, log, fe, scale, cap, has_scale, has_cap)
                _store_tile(fy, gy, last, threads, n_vec, True)
                for i in cutlass.range(n_tiles - 1, unroll=1):  # newest first: the likeliest still in L2
                    t = n_tiles - 2 - i
                    _reload_tile(gx, sx, fx, first + t * per_tile, t, per_cta, tidx, threads, n_vec, staged)
                    _forward_fresh(fx, fy, big, total, log, fe, scale, cap, has_scale, has_cap)
                    _store_tile(fy, gy, first + t * per_tile, threads, n_vec, False)

    @cute.kernel
    def _backward_kernel(mY: cute.Tensor, mG: cute.Tensor, mD: cute.Tensor, mX: cute.Tensor, scale: Float32,
                         cap: Float32, log: cutlass.Constexpr[bool], cluster: cutlass.Constexpr[int],
                         threads: cutlass.Constexpr[int], vec: cutlass.Constexpr[int],
                         vectors: cutlass.Constexpr[int], two_pass: cutlass.Constexpr[bool],
                         staged: cutlass.Constexpr[int], has_scale: cutlass.Constexpr[bool],
                         has_cap: cutlass.Constexpr[bool]):
        """dx from y and dy; with a softcap, x (the forward's input, in y's dtype) is read for the
        derivative tile by tile after the reduction (it is not held across it)."""
        warps = threads // WARP
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        slots = smem.allocate_tensor(Float32, cute.make_layout((cluster * warps, 2), stride=(2, 1)), byte_alignment=16)
        mbar = smem.allocate_array(cutlass.Int64, num_elems=1)
        if const_expr(cluster > 1):
            _expect_bytes(mbar, cluster * warps * 4)  # a slot from every warp of the cluster
            cute.arch.cluster_arrive_relaxed()  # paired with the wait before the first st.async
        rank = bidx % cluster
        row = bidx // cluster
        gy, gg, gd, gx = (_vectors(mY, row, vec), _vectors(mG, row, vec), _vectors(mD, row, vec),
                          _vectors(mX, row, vec))
        n_vec = cute.size(gy, mode=[1])
        zero = _runtime_zero()
        per_cta = threads * vectors
        first = rank * per_cta + tidx
        frag = cute.make_layout((vec, vectors))
        fy = cute.make_rmem_tensor(frag, mY.element_type)
        fg = cute.make_rmem_tensor(frag, mG.element_type)
        fd = cute.make_rmem_tensor(frag, mD.element_type)
        fx = cute.make_rmem_tensor(frag, mX.element_type)
        ft = cute.make_rmem_tensor(frag, Float32)  # softcap: tanh(scale * x / cap)
        narrow = const_expr(_narrow(mY) and vec % 2 == 0)  # packed two to a word
        # Vectors past the row's end read as y = 0, g = 0: they add nothing to either sum.
        fill_zero = mY.element_type(0.0)
        x_zero = mX.element_type(0.0)
        if const_expr(not two_pass):
            _load_tile(gy, fy, first, threads, n_vec, fill_zero, True)
            _load_tile(gg, fg, first, threads, n_vec, fill_zero, True)
            _, total = _row_reduce(Float32(0.0), _backward_partial(fy, fg, log), slots, mbar, False, cluster, warps)
            if const_expr(narrow):
                _opaque(fy, _after(zero, total))
                _opaque(fg, _after(zero, total))
            if const_expr(has_cap):
                _load_tile(gx, fx, first, threads, n_vec, x_zero, True)
            _backward_tile(fy, fg, fd, total, log, fx, ft, scale, cap, has_scale, has_cap)
            _store_tile(fd, gd, first, threads, n_vec, True)
        else:
            per_tile = cluster * per_cta
            n_tiles = (n_vec + per_tile - 1) // per_tile
            sy = _stage_buffer(smem, mY.element_type, vec, staged * per_cta, gy)
            sg = _stage_buffer(smem, mG.element_type, vec, staged * per_cta, gg)
            acc = Float32(0.0)
            for i in cutlass.range(n_tiles - 1, unroll=1):
                start = first + i * per_tile
                _load_tile(gy, fy, start, threads, n_vec, fill_zero, False)
                _load_tile(gg, fg, start, threads, n_vec, fill_zero, False)
                if const_expr(staged > 0):
                    if i < staged:
                        _store_tile(fy, sy, i * per_cta + tidx, threads, n_vec, False)
                        _store_tile(fg, sg, i * per_cta + tidx, threads, n_vec, False)
                acc = acc + _backward_partial(fy, fg, log)
            last = first + (n_tiles - 1) * per_tile
            _load_tile(gy, fy, last, threads, n_vec, fill_zero, True)
            _load_tile(gg, fg, last, threads, n_vec, fill_zero, True)
            acc = acc + _backward_partial(fy, fg, log)
            _, total = _row_reduce(Float32(0.0), acc, slots, mbar, False, cluster, warps)
            if const_expr(narrow):
                _opaque(fy, _after(zero, total))
                _opaque(fg, _after(zero, total))
            if const_expr(has_cap):
                _load_tile(gx, fx, last, threads, n_vec, x_zero, True)
            _backward_tile(fy, fg, fd, total, log, fx, ft, scale, cap, has_scale, has_cap)
            _store_tile(fd, gd, last, threads, n_vec, True)
            for i in cutlass.range(n_tiles - 1, unroll=1):
                t = n_tiles - 2 - i
                start = first + t * per_tile
                _reload_tile(gy, sy, fy, start, t, per_cta, tidx, threads, n_vec, staged)
                _reload_tile(gg, sg, fg, start, t, per_cta, tidx, threads, n_vec, staged)
                if const_expr(has_cap):
                    _load_tile(gx, fx, start, threads, n_vec, x_zero, False)
                _backward_tile(fy, fg, fd, total, log, fx, ft, scale, cap, has_scale, has_cap)
                _store_tile(fd, gd, start, threads, n_vec, False)

    # ---------------------------------------------------------------- host entry points

    @cute.jit
    def forward_entry(mX: cute.Tensor, mY: cute.Tensor, stream, log: cutlass.Constexpr[bool],
                      cluster: cutlass.Constexpr[int], threads: cutlass.Constexpr[int], vec: cutlass.Constexpr[int],
                      vectors: cutlass.Constexpr[int], two_pass: cutlass.Constexpr[bool],
                      staged: cutlass.Constexpr[int]):
        """One cluster per row: grid = rows * cluster CTAs."""
        _forward_kernel(mX, mY, Float32(1.0), Float32(1.0), log, cluster, threads, vec, vectors, two_pass, staged,
                        False, False, False).launch(grid=[mX.shape[0] * cluster, 1, 1], block=[threads, 1, 1],
                                      cluster=[cluster, 1, 1] if const_expr(cluster > 1) else None, stream=stream)

    @cute.jit
    def fused_forward_entry(mX: cute.Tensor, mY: cute.Tensor, scale: Float32, cap: Float32, stream,
                            log: cutlass.Constexpr[bool], cluster: cutlass.Constexpr[int],
                            threads: cutlass.Constexpr[int], vec: cutlass.Constexpr[int],
                            vectors: cutlass.Constexpr[int], two_pass: cutlass.Constexpr[bool],
                            staged: cutlass.Constexpr[int], has_scale: cutlass.Constexpr[bool],
                            has_cap: cutlass.Constexpr[bool]):
        """`forward_entry` with the fused prologue (scale, softcap: run-time values)."""
        _forward_kernel(mX, mY, scale, cap, log, cluster, threads, vec, vectors, two_pass, staged, has_scale,
                        has_cap, False).launch(grid=[mX.shape[0] * cluster, 1, 1], block=[threads, 1, 1],
                                               cluster=[cluster, 1, 1] if const_expr(cluster > 1) else None,
                                               stream=stream)

    @cute.jit
    def states_entry(mX: cute.Tensor, mL: cute.Tensor, scale: Float32, cap: Float32, stream,
                     cluster: cutlass.Constexpr[int], threads: cutlass.Constexpr[int], vec: cutlass.Constexpr[int],
                     vectors: cutlass.Constexpr[int], two_pass: cutlass.Constexpr[bool],
                     has_scale: cutlass.Constexpr[bool], has_cap: cutlass.Constexpr[bool]):
        """logsumexp: the forward kernel's first pass, each row's lse into the float32 vector mL
        (scale and softcap: run-time values, 1.0 where the plan has no such step)."""
        _forward_kernel(mX, mL, scale, cap, False, cluster, threads, vec, vectors, two_pass, 0, has_scale, has_cap,
                        True).launch(grid=[mX.shape[0] * cluster, 1, 1], block=[threads, 1, 1],
                                     cluster=[cluster, 1, 1] if const_expr(cluster > 1) else None, stream=stream)

    @cute.jit
    def backward_entry(mY: cute.Tensor, mG: cute.Tensor, mD: cute.Tensor, stream, log: cutlass.Constexpr[bool],
                       cluster: cutlass.Constexpr[int], threads: cutlass.Constexpr[int], vec: cutlass.Constexpr[int],
                       vectors: cutlass.Constexpr[int], two_pass: cutlass.Constexpr[bool],
                       staged: cutlass.Constexpr[int]):
        _backward_kernel(mY, mG, mD, mY, Float32(1.0), Float32(1.0), log, cluster, threads, vec, vectors, two_pass,
                         staged, False, False).launch(grid=[mY.shape[0] * cluster, 1, 1], block=[threads, 1, 1],
                                              cluster=[cluster, 1, 1] if const_expr(cluster > 1) else None,
                                              stream=stream)

    @cute.jit
    def fused_backward_entry(mY: cute.Tensor, mG: cute.Tensor, mD: cute.Tensor, mX: cute.Tensor, scale: Float32,
                             cap: Float32, stream, log: cutlass.Constexpr[bool], cluster: cutlass.Constexpr[int],
                             threads: cutlass.Constexpr[int], vec: cutlass.Constexpr[int],
                             vectors: cutlass.Constexpr[int], two_pass: cutlass.Constexpr[bool],
                             staged: cutlass.Constexpr[int], has_scale: cutlass.Constexpr[bool],
                            has_cap: cutlass.Constexpr[bool]):
        """`backward_entry` times the prologue's derivative; mX (x in y's dtype) is read with a softcap only."""
        _backward_kernel(mY, mG, mD, mX, scale, cap, log, cluster, threads, vec, vectors, two_pass, staged, has_scale,
                         has_cap).launch(grid=[mY.shape[0] * cluster, 1, 1], block=[threads, 1, 1],
                                         cluster=[cluster, 1, 1] if const_expr(cluster > 1) else None, stream=stream)

    from . import column_kernels

    columns = column_kernels.define(cute, SimpleNamespace(
        opaque=_opaque, after=_after, runtime_zero=_runtime_zero, combine=_combine, lanes_reduce=_lanes_reduce,
        send=_send, wait_phase0=_wait_phase0, expect_bytes=_expect_bytes, log2_e=LOG2_E, warp=WARP))
    return SimpleNamespace(forward_entry=forward_entry, backward_entry=backward_entry,
                           fused_forward_entry=fused_forward_entry, fused_backward_entry=fused_backward_entry,
                           states_entry=states_entry,
                           columns_forward_entry=columns.forward_entry, columns_backward_entry=columns.backward_entry)
