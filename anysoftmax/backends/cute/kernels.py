"""The CuTe DSL row kernels (softmax / log_softmax forward and backward, logsumexp) over a
thread-block cluster (docs/cute.md), defined on first use (`entries()`); a plan's numbers
(`plan.KernelKey`) are compile-time constants. Numerics: exp2((x - m) * log2(e)), x - m formed
first, float32 accumulation.
"""
import math
from functools import lru_cache
from types import SimpleNamespace

LOG2_E = math.log2(math.e)
WARP = 32
# Shuffle distances of a full-warp butterfly reduction.
BUTTERFLY = (16, 8, 4, 2, 1)


@lru_cache(maxsize=None)
def entries() -> SimpleNamespace:
    """The `cute.compile` entry points of the row kernels (`forward_entry`, `backward_entry`, their
    `fused_*` forms, `states_entry`) and of the column kernels (`columns_*`), defined once."""
    # The DSL, imported for the architecture chosen by `env` (sm_90a without a GPU).
    from .env import import_dsl

    cute = import_dsl()
    import cutlass
    from cutlass import Float32, Int32, const_expr

    CInt, CBool = cutlass.Constexpr[int], cutlass.Constexpr[bool]  # compile-time arguments

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
    def _combine(a: Float32, b: Float32, is_max: CBool) -> Float32:
        """max(a, b) or a + b."""
        r = a + b
        if const_expr(is_max):
            r = cute.arch.fmax(a, b)
        return r

    @cute.jit
    def _lanes_reduce(v: Float32, is_max: CBool, lanes: CInt) -> Float32:
        """Combine `v` over the lanes of the warp that share lane % lanes (every lane: lanes=1)."""
        for i in cutlass.range_constexpr(len(BUTTERFLY)):
            if const_expr(BUTTERFLY[i] >= lanes):
                v = _combine(v, cute.arch.shuffle_sync_bfly(v, BUTTERFLY[i]), is_max)
        return v

    def _send(addr: Int32, mbar: Int32, peer: Int32, *values: Float32):
        """Store `values` (one float32, or two as one 8-byte store) at shared address `addr` of
        cluster CTA `peer` with `st.async`, counted on the peer's mbarrier at `mbar` (no fence)."""
        regs = ", ".join(f"{{$r{3 + i}}}" for i in range(len(values)))
        vec, data = (".v2", f"{{{regs}}}") if len(values) == 2 else ("", regs)
        cute.arch.inline_ptx(
            "{ .reg .b32 ra, rb; mapa.shared::cluster.u32 ra, {$r0}, {$r2}; "
            "mapa.shared::cluster.u32 rb, {$r1}, {$r2}; "
            f"st.async.shared::cluster.mbarrier::complete_tx::bytes{vec}.f32 [ra], {data}, [rb]; }}",
            read_only_args=[addr, mbar, peer, *values])

    @cute.jit
    def _wait_phase0(mbar: Int32) -> Int32:
        """Wait for the first phase of the mbarrier at `mbar`; returns 0 for the caller to add to the
        addresses it reads next (no compiler moves them above the wait). The loop is in the PTX:
        the DSL's wait, a loop in the kernel, cost registers (fused log_softmax bf16: 155, not 113)."""
        return cute.arch.inline_ptx(
            "{ .reg .pred p; WAIT: mbarrier.try_wait.parity.shared::cta.b64 p, [{$r0}], 0; @!p bra WAIT; "
            "mov.u32 {$w0}, 0; }",
            write_only_types=[Int32], read_only_args=[mbar])

    @cute.jit
    def _expect_bytes(mbar, nbytes: CInt):
        """Thread 0 sets up the mbarrier at `mbar` for one phase of `nbytes` arriving by `st.async`;
        the init fence orders it before the kernel's relaxed cluster arrive, which peers wait for."""
        if cute.arch.thread_idx()[0] == 0:
            cute.arch.mbarrier_init(mbar, 1)
            cute.arch.mbarrier_init_fence()
            cute.arch.mbarrier_arrive_and_expect_tx(mbar, nbytes)

    @cute.jit
    def _row_reduce(a: Float32, b: Float32, slots: cute.Tensor, mbar, pair: CBool, cluster: CInt, warps: CInt):
        """The row's reduction of every thread's partial, in every thread of the cluster. `pair`:
        (a, b) = (max, sum), else `b` is a sum. `slots`: this CTA's (cluster * warps, 2) float32
        buffer, filled by every warp of the cluster through `st.async` on `mbar` (no release fence)."""
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
    def _load_tile(gv: cute.Tensor, frag: cute.Tensor, first: Int32, threads: CInt, n_vec: Int32, fill, guard: CBool):
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
    def _store_tile(frag: cute.Tensor, gv: cute.Tensor, first: Int32, threads: CInt, n_vec: Int32, guard: CBool):
        for k in cutlass.range_constexpr(cute.size(frag, mode=[1])):
            j = first + k * threads
            if const_expr(guard):
                if j < n_vec:
                    cute.autovec_copy(frag[None, k], gv[None, j])
            else:
                cute.autovec_copy(frag[None, k], gv[None, j])

    def _stage_buffer(smem, dtype, vec: int, n: int, none: cute.Tensor) -> cute.Tensor:
        """Shared memory for `n` vectors of `vec` elements (vector j at j * vec: a warp's accesses
        conflict-free), or `none` (never read) for n = 0."""
        if n == 0:
            return none
        return smem.allocate_tensor(dtype, cute.make_layout((vec, n)), byte_alignment=16)

    @cute.jit
    def _reload_tile(gv: cute.Tensor, sv: cute.Tensor, frag: cute.Tensor, start: Int32, tile: Int32, per_cta: CInt,
                     tidx: Int32, threads: CInt, n_vec: Int32, staged: CInt):
        """Full tile `tile` for the second pass: from shared memory for tiles below `staged` (this
        thread's own stores: no barrier), else from global memory at `start`."""
        if const_expr(staged > 0):
            if tile < staged:
                _load_tile(sv, frag, tile * per_cta + tidx, threads, n_vec, Float32(0.0), False)
            else:
                _load_tile(gv, frag, start, threads, n_vec, Float32(0.0), False)
        else:
            _load_tile(gv, frag, start, threads, n_vec, Float32(0.0), False)

    @cute.jit
    def _runtime_zero() -> Int32:
        """0, as the dynamic shared memory size shifted right by 31: a value no compiler can fold."""
        return Int32(cute.arch.dynamic_smem_size()) >> 31

    @cute.jit
    def _after(zero: Int32, value: Float32) -> Int32:
        """`zero` computed from `value`: an `_opaque` with it waits for the row's reduction, so no
        conversion of kept values is hoisted above it (float32 copies live across it)."""
        return zero & Int32(value == value)

    @cute.jit
    def _opaque(frag: cute.Tensor, zero: Int32):
        """XOR each 32-bit word of `frag` (16-bit values) with the run-time 0 `zero`: float32
        conversions made before cannot be reused after, so the packed words (two values a register)
        stay live across the row reduction instead of float32 copies (twice the registers)."""
        words = cute.recast_tensor(frag, Int32)
        words.store(words.load() ^ zero)

    @cute.jit
    def _tile_stats(frag: cute.Tensor, fe: cute.Tensor, keep: CBool, packed: CBool, states: CBool):
        """(max m, sum of exp(x - m)) of one thread's tile, exp(x - m) kept in `fe` with `keep`;
        `packed`: 16-bit values, their maximum taken packed (`_packed_max`)."""
        if const_expr(packed):
            m = _packed_max(frag)
        else:
            m = frag.load().to(Float32).reduce(cute.ReductionOp.MAX, -Float32.inf, 0)
        return m, _exp_sum(frag.load().to(Float32), m, fe, keep, states)

    @cute.jit
    def _packed_max(frag: cute.Tensor) -> Float32:
        """The maximum of 16-bit values `frag` by the packed NaN-propagating max: half the
        instructions of converting first, and no float32 copies kept until the exponentials."""
        words = cute.recast_tensor(frag, Int32)
        op = "max.NaN.bf16x2" if const_expr(frag.element_type == cutlass.BFloat16) else "max.NaN.f16x2"
        pair = cute.make_rmem_tensor(cute.make_layout(2), frag.element_type)
        cute.recast_tensor(pair, Int32)[0] = _max_tree(op, [words[i] for i in range(cute.size(words))])
        return pair.load().to(Float32).reduce(cute.ReductionOp.MAX, -Float32.inf, 0)

    def _max_tree(op: str, level: list):
        """Packed words combined pairwise by `op` in a tree (log2 dependent steps, not a chain)."""
        while len(level) > 1:
            pairs = [cute.arch.inline_ptx(f"{op} {{$w0}}, {{$r0}}, {{$r1}};", write_only_types=[Int32],
                                          read_only_args=[level[i], level[i + 1]])
                     for i in range(0, len(level) - 1, 2)]
            level = pairs + level[len(level) - len(level) % 2:]
        return level[0]

    @cute.jit
    def _exp_sum(x, m: Float32, fe: cute.Tensor, keep: CBool, states: CBool) -> Float32:
        """Sum of exp(x - m) over float32 values `x` of maximum `m` (kept in `fe` with `keep`);
        `states` (logsumexp): a +inf maximum pivots at 0 too, so the row sums to +inf, not NaN."""
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
    def _prologue(x, scale: Float32, cap: Float32, has_scale: CBool, has_cap: CBool):
        """The fused prologue (`core.variant`) on float32 values: z = scale * x, then
        cap * tanh(z / cap) with libdevice's tanh (a few ulp: what float32 outputs need)."""
        z = x
        if const_expr(has_scale):
            z = z * scale
        if const_expr(has_cap):
            z = cute.math.tanh(z * (Float32(1.0) / cap), fastmath=False) * cap
        return z

    @cute.jit
    def _fast_tanh(a: Float32) -> Float32:
        """sign(a) (1 - e) / (1 + e), e = exp(-2|a|), by the approximate reciprocal: absolute error
        ~2^-22, far below a 16-bit ulp, not below float32's (`_prologue` serves those)."""
        e = cute.math.exp2(cute.math.abs(a) * (-2.0 * LOG2_E), fastmath=True)
        return cute.math.copysign((Float32(1.0) - e) * cute.math.rcp(Float32(1.0) + e, approx=True), a)

    @cute.jit
    def _prologue_in_place(fz: cute.Tensor, scale: Float32, cap: Float32, has_scale: CBool, has_cap: CBool,
                           precise: CBool):
        """fz (float32, holding x) := z: `_prologue` for a float32 output (`precise`), else the
        softcap by `_fast_tanh` element by element (libdevice's made 16-bit rows instruction-bound)."""
        if const_expr(precise or not has_cap):
            fz.store(_prologue(fz.load(), scale, cap, has_scale, has_cap))
        else:
            if const_expr(has_scale):
                fz.store(fz.load() * scale)
            inv = Float32(1.0) / cap
            for i in cutlass.range_constexpr(cute.size(fz)):
                fz[i] = _fast_tanh(fz[i] * inv) * cap

    @cute.jit
    def _tile_stats_fused(frag: cute.Tensor, fz: cute.Tensor, keep_exp: CBool, scale: Float32, cap: Float32,
                          has_scale: CBool, has_cap: CBool, first: Int32, threads: CInt, n_vec: Int32, guard: CBool,
                          precise: CBool, states: CBool):
        """`_tile_stats` after the prologue, z (or exp(z - m) with `keep_exp`) in the float32 `fz`.
        Vectors past the row's end become -inf after the prologue (which maps -inf to +inf or -cap)."""
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
                      log: CBool, packed: CBool, zero: Int32):
        """dst from what `_tile_stats` kept: softmax fe * exp(m - M) / S, log_softmax (x - M) - log(S)."""
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
    def _forward_fresh(fx: cute.Tensor, dst: cute.Tensor, big: Float32, total: Float32, log: CBool, fz: cute.Tensor,
                       scale: Float32, cap: Float32, has_scale: CBool, has_cap: CBool):
        """dst = softmax (log_softmax) of a reloaded tile given the row's max and sum (z formed in `fz`)."""
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
    def _backward_partial(fy: cute.Tensor, fg: cute.Tensor, log: CBool) -> Float32:
        """softmax: sum(y * g); log_softmax: sum(g) over one thread's tile."""
        g = fg.load().to(Float32)
        if const_expr(log):
            return g.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        return (fy.load().to(Float32) * g).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)

    @cute.jit
    def _backward_tile(fy: cute.Tensor, fg: cute.Tensor, dst: cute.Tensor, total: Float32, log: CBool, fx: cute.Tensor,
                       ft: cute.Tensor, scale: Float32, cap: Float32, has_scale: CBool, has_cap: CBool):
        """softmax y * (g - sum(y * g)), log_softmax g - exp(y) * sum(g), times the prologue's
        derivative: scale, and 1 - tanh(scale * x / cap)^2 (x in `fx`) for a softcap."""
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
        """The row's M + log(S) into mL[row], written by the cluster's first thread."""
        tidx, _, _ = cute.arch.thread_idx()
        if tidx + rank == 0:
            mL[row] = big + cute.math.log(total, fastmath=False)

    def _row_slots(cluster: int, warps: int, slot_bytes: int):
        """(allocator, slots, mbarrier) of a row kernel: a (cluster * warps, 2) float32 slot a warp
        of the cluster; with a cluster, the mbarrier expects `slot_bytes` from each, set up before
        the relaxed cluster arrive that the first `st.async` waits for."""
        smem = cutlass.memory.SmemAllocator()
        slots = smem.allocate_tensor(Float32, cute.make_layout((cluster * warps, 2), stride=(2, 1)), byte_alignment=16)
        mbar = smem.allocate_array(cutlass.Int64, num_elems=1)
        if cluster > 1:
            _expect_bytes(mbar, cluster * warps * slot_bytes)
            cute.arch.cluster_arrive_relaxed()
        return smem, slots, mbar

    def _vectors(t: cute.Tensor, row: Int32, vec: int) -> cute.Tensor:
        """Row `row` of the (rows, n) tensor `t` as (vec, n // vec) vectors."""
        return cute.zipped_divide(t[row, None], (vec,))

    def _narrow(t: cute.Tensor) -> bool:
        return t.element_type.width == 16

    # ---------------------------------------------------------------- kernels

    @cute.kernel
    def _forward_kernel(mX: cute.Tensor, mY: cute.Tensor, scale: Float32, cap: Float32, log: CBool, cluster: CInt,
                        threads: CInt, vec: CInt, vectors: CInt, two_pass: CBool, staged: CInt, has_scale: CBool,
                        has_cap: CBool, states: CBool):
        """softmax (log_softmax) of the rows of mX into mY; with `states`, each row's lse into the
        float32 vector mY."""
        warps = threads // WARP
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        smem, slots, mbar = _row_slots(cluster, warps, 8)  # (max, sum) from every warp of the cluster
        rank = bidx % cluster
        row = bidx // cluster
        gx = _vectors(mX, row, vec)
        n_vec = cute.size(gx, mode=[1])
        zero = _runtime_zero()
        per_cta = threads * vectors
        # Thread t of CTA r holds vector k of tile i at i * (cluster * per_cta) + r * per_cta + k * threads
        # + t: a warp touches 32 consecutive vectors.
        first = rank * per_cta + tidx  # this thread's first vector in tile 0
        frag = cute.make_layout((vec, vectors))
        fx = cute.make_rmem_tensor(frag, mX.element_type)
        fy = cute.make_rmem_tensor(frag, mY.element_type)
        fused = const_expr(has_scale or has_cap)
        out_type = mY.element_type
        if const_expr(states):
            out_type = mX.element_type  # the softmax's output dtype: logsumexp computes as that softmax does
        precise = const_expr(out_type.width == 32)  # the prologue's tanh (`_prologue_in_place`)
        # exp(x - m) kept until the store: float16 for a 16-bit output (its 2**-11 rounding is within
        # a 16-bit ulp, not float32's), else float32, as is the fused prologue's z or exp(z - m).
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
                         cap: Float32, log: CBool, cluster: CInt, threads: CInt, vec: CInt, vectors: CInt,
                         two_pass: CBool, staged: CInt, has_scale: CBool, has_cap: CBool):
        """dx from y and dy; with a softcap, x (in y's dtype) is read after the reduction."""
        warps = threads // WARP
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        smem, slots, mbar = _row_slots(cluster, warps, 4)  # a sum from every warp of the cluster
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

    # ---------------------------------------------------------------- host entry points: one cluster a row

    def _launch(kernel, ctas, cluster: int, threads: int, stream):
        """Launch `kernel` on `ctas` CTAs of `threads` threads, in clusters of `cluster` (traced inline)."""
        kernel.launch(grid=[ctas, 1, 1], block=[threads, 1, 1], cluster=[cluster, 1, 1] if cluster > 1 else None,
                      stream=stream)

    @cute.jit
    def forward_entry(mX: cute.Tensor, mY: cute.Tensor, stream, log: CBool, cluster: CInt, threads: CInt, vec: CInt,
                      vectors: CInt, two_pass: CBool, staged: CInt):
        _launch(_forward_kernel(mX, mY, Float32(1.0), Float32(1.0), log, cluster, threads, vec, vectors, two_pass,
                                staged, False, False, False), mX.shape[0] * cluster, cluster, threads, stream)

    @cute.jit
    def fused_forward_entry(mX: cute.Tensor, mY: cute.Tensor, scale: Float32, cap: Float32, stream, log: CBool,
                            cluster: CInt, threads: CInt, vec: CInt, vectors: CInt, two_pass: CBool, staged: CInt,
                            has_scale: CBool, has_cap: CBool):
        """`forward_entry` with the fused prologue (scale, softcap: run-time values)."""
        _launch(_forward_kernel(mX, mY, scale, cap, log, cluster, threads, vec, vectors, two_pass, staged, has_scale,
                                has_cap, False), mX.shape[0] * cluster, cluster, threads, stream)

    @cute.jit
    def states_entry(mX: cute.Tensor, mL: cute.Tensor, scale: Float32, cap: Float32, stream, cluster: CInt,
                     threads: CInt, vec: CInt, vectors: CInt, two_pass: CBool, has_scale: CBool, has_cap: CBool):
        """logsumexp: each row's lse into the float32 vector mL (scale and softcap 1.0 where absent)."""
        _launch(_forward_kernel(mX, mL, scale, cap, False, cluster, threads, vec, vectors, two_pass, 0, has_scale,
                                has_cap, True), mX.shape[0] * cluster, cluster, threads, stream)

    @cute.jit
    def backward_entry(mY: cute.Tensor, mG: cute.Tensor, mD: cute.Tensor, stream, log: CBool, cluster: CInt,
                       threads: CInt, vec: CInt, vectors: CInt, two_pass: CBool, staged: CInt):
        _launch(_backward_kernel(mY, mG, mD, mY, Float32(1.0), Float32(1.0), log, cluster, threads, vec, vectors,
                                 two_pass, staged, False, False), mY.shape[0] * cluster, cluster, threads, stream)

    @cute.jit
    def fused_backward_entry(mY: cute.Tensor, mG: cute.Tensor, mD: cute.Tensor, mX: cute.Tensor, scale: Float32,
                             cap: Float32, stream, log: CBool, cluster: CInt, threads: CInt, vec: CInt, vectors: CInt,
                             two_pass: CBool, staged: CInt, has_scale: CBool, has_cap: CBool):
        """`backward_entry` times the prologue's derivative; mX (x in y's dtype) is read with a softcap only."""
        _launch(_backward_kernel(mY, mG, mD, mX, scale, cap, log, cluster, threads, vec, vectors, two_pass, staged,
                                 has_scale, has_cap), mY.shape[0] * cluster, cluster, threads, stream)

    from . import column_kernels

    columns = column_kernels.define(cute, SimpleNamespace(
        opaque=_opaque, after=_after, runtime_zero=_runtime_zero, combine=_combine, lanes_reduce=_lanes_reduce,
        send=_send, wait_phase0=_wait_phase0, expect_bytes=_expect_bytes, launch=_launch, log2_e=LOG2_E, warp=WARP))
    return SimpleNamespace(forward_entry=forward_entry, backward_entry=backward_entry,
                           fused_forward_entry=fused_forward_entry, fused_backward_entry=fused_backward_entry,
                           states_entry=states_entry,
                           columns_forward_entry=columns.forward_entry, columns_backward_entry=columns.backward_entry)
