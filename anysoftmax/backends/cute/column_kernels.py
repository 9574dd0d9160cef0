"""The CuTe DSL column kernels (docs/cute.md): softmax / log_softmax over a strided dim followed by contiguous
positions, seen as (outer, n, inner) (`core.layout.ColumnView`). Numerics as the row kernels; padding reads as
-inf and adds nothing."""

from types import SimpleNamespace


def define(cute, shared: SimpleNamespace) -> SimpleNamespace:
    """The column kernels' entry points, built on the row kernels' helpers (`shared`, from `kernels.py`)."""
    import cutlass
    from cutlass import Float32, Int32, const_expr

    CInt, CBool = cutlass.Constexpr[int], cutlass.Constexpr[bool]  # compile-time arguments

    _opaque, _after, _runtime_zero = shared.opaque, shared.after, shared.runtime_zero
    _combine, _lanes_reduce = shared.combine, shared.lanes_reduce
    _send, _wait_phase0, _expect_bytes, _launch = shared.send, shared.wait_phase0, shared.expect_bytes, shared.launch
    LOG2_E, WARP = shared.log2_e, shared.warp

    def _identity(is_max: bool) -> Float32:
        return -Float32.inf if is_max else Float32(0.0)

    @cute.jit
    def _rows_reduce(vals: cute.Tensor, buf: cute.Tensor, col: Int32, is_max: CBool, lanes: CInt):
        """vals[e] = column col + e of `buf` combined over its rows, split over the lanes holding the
        column (each reads every `WARP // lanes`-th row, then shuffles: not every row in registers)."""
        sharing = WARP // lanes
        rows = cute.size(buf, mode=[0])
        g = cute.arch.lane_idx() // lanes
        for e in cutlass.range_constexpr(cute.size(vals)):
            acc = _identity(is_max)
            for i in cutlass.range_constexpr((rows + sharing - 1) // sharing):
                idx = g + i * sharing
                if idx < rows:
                    acc = _combine(acc, buf[idx, col + e], is_max)
            vals[e] = _lanes_reduce(acc, is_max, lanes)

    @cute.jit
    def _columns_reduce(vals: cute.Tensor, slots: SimpleNamespace, is_max: CBool, first: CBool, cluster: CInt,
                        warps: CInt, lanes: CInt):
        """Each of this thread's `vec` column values (`vals`) := its column's max (sum) over the
        cluster. `slots`: buffers used once (no barrier before peers write the next reduction's);
        `first`: the kernel's first cluster reduction, which waits for the peers to have started."""
        vec = cute.size(vals)
        width = lanes * vec
        lane, warp = cute.arch.lane_idx(), cute.arch.warp_idx()
        tidx, _, _ = cute.arch.thread_idx()
        col = (lane % lanes) * vec
        for e in cutlass.range_constexpr(vec):
            vals[e] = _lanes_reduce(vals[e], is_max, lanes)
        if lane < lanes:
            for e in cutlass.range_constexpr(vec):
                slots.warps[warp, col + e] = vals[e]
        cute.arch.barrier()
        if const_expr(cluster == 1):
            _rows_reduce(vals, slots.warps, col, is_max, lanes)
        else:
            # The CTA's partial of column tidx % width goes to peers tidx // width, + groups, ...:
            # one word a peer and column (a slot per warp rivalled the kernel's own traffic).
            groups = warps * WARP // width
            column = tidx % width
            acc = _identity(is_max)
            for w in cutlass.range_constexpr(warps):
                acc = _combine(acc, slots.warps[w, column], is_max)
            rank = cute.arch.block_idx_in_cluster()
            addr = (slots.ctas.iterator + cute.crd2idx((rank, column), slots.ctas.layout)).toint()
            if const_expr(first):
                cute.arch.cluster_wait()
            for i in cutlass.range_constexpr((cluster + groups - 1) // groups):
                peer = tidx // width + i * groups
                if peer < cluster:
                    _send(addr, slots.mbar.toint(), peer, acc)
            after = _wait_phase0(slots.mbar.toint())
            _rows_reduce(vals, slots.ctas, col + after, is_max, lanes)

    def _vectors(t: cute.Tensor, outer: Int32, n: Int32, vec: int) -> cute.Tensor:
        """t[outer, n] of the (outer, n, inner) tensor `t` as (vec, inner // vec) vectors."""
        return cute.zipped_divide(t[outer, n, None], (vec,))

    def _slots(smem, cluster: int, warps: int, width: int) -> SimpleNamespace:
        """One reduction's shared buffers: a row of partials per warp, one per CTA of the cluster
        (written by the peers) and the mbarrier counting their bytes."""
        return SimpleNamespace(
            warps=smem.allocate_tensor(Float32, cute.make_layout((warps, width), stride=(width, 1)), byte_alignment=16),
            ctas=smem.allocate_tensor(Float32, cute.make_layout((cluster, width), stride=(width, 1)), byte_alignment=16),
            mbar=smem.allocate_array(cutlass.Int64, num_elems=1), bytes=cluster * width * 4)

    @cute.jit
    def _load(t: cute.Tensor, frag: cute.Tensor, outer: Int32, n0: Int32, step: Int32, jv: Int32, ok: cutlass.Boolean,
              fill):
        """Vectors (n0 + k * step, jv) of `t[outer]` into frag[:, k]; `fill` where out of range."""
        frag.fill(fill)
        n_red = cute.size(t, mode=[1])
        for k in cutlass.range_constexpr(cute.size(frag, mode=[1])):
            n = n0 + k * step
            if ok and n < n_red:
                cute.autovec_copy(_vectors(t, outer, n, cute.size(frag, mode=[0]))[None, jv], frag[None, k])

    @cute.jit
    def _store(frag: cute.Tensor, t: cute.Tensor, outer: Int32, n0: Int32, step: Int32, jv: Int32, ok: cutlass.Boolean):
        n_red = cute.size(t, mode=[1])
        for k in cutlass.range_constexpr(cute.size(frag, mode=[1])):
            n = n0 + k * step
            if ok and n < n_red:
                cute.autovec_copy(frag[None, k], _vectors(t, outer, n, cute.size(frag, mode=[0]))[None, jv])

    @cute.jit
    def _place(t: cute.Tensor, cluster: CInt, threads: CInt, vec: CInt, vectors: CInt, lanes: CInt):
        """(outer, first reduced index, step, column vector, in range) of this thread."""
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        inner_vec = cute.size(t, mode=[2]) // vec
        strips = (inner_vec + lanes - 1) // lanes
        strip = bidx // cluster
        jv = (strip % strips) * lanes + tidx % lanes
        step = threads // lanes
        n0 = (bidx % cluster) * step * vectors + tidx // lanes
        return strip // strips, n0, step, jv, jv < inner_vec

    @cute.kernel
    def _forward_kernel(mX: cute.Tensor, mY: cute.Tensor, log: CBool, cluster: CInt, threads: CInt, vec: CInt,
                        vectors: CInt, lanes: CInt):
        warps = threads // WARP
        smem = cutlass.memory.SmemAllocator()
        slots_max = _slots(smem, cluster, warps, lanes * vec)
        slots_sum = _slots(smem, cluster, warps, lanes * vec)
        if const_expr(cluster > 1):
            _expect_bytes(slots_max.mbar, slots_max.bytes)
            _expect_bytes(slots_sum.mbar, slots_sum.bytes)
            cute.arch.cluster_arrive_relaxed()  # paired with the wait before the first st.async
        outer, n0, step, jv, ok = _place(mX, cluster, threads, vec, vectors, lanes)
        zero = _runtime_zero()
        frag = cute.make_layout((vec, vectors))
        fx = cute.make_rmem_tensor(frag, mX.element_type)
        packed = const_expr(mX.element_type.width == 16 and vec % 2 == 0)
        # exp(x - M) kept for the stores: float16 for a 16-bit output (see kernels.py), else float32.
        fe = cute.make_rmem_tensor(frag, cutlass.Float16 if const_expr(mY.element_type.width == 16 and vec % 2 == 0)
                                   else Float32)
        _load(mX, fx, outer, n0, step, jv, ok, -mX.element_type.inf)
        big = cute.make_rmem_tensor(cute.make_layout(vec), Float32)
        for e in cutlass.range_constexpr(vec):
            m = -Float32.inf
            for k in cutlass.range_constexpr(vectors):
                m = cute.arch.fmax(m, Float32(fx[e, k]))
            big[e] = m
        _columns_reduce(big, slots_max, True, True, cluster, warps, lanes)
        if const_expr(packed):  # x stays packed across the reduction, not as float32 copies
            _opaque(fx, _after(zero, big[0]))
        total = cute.make_rmem_tensor(cute.make_layout(vec), Float32)
        for e in cutlass.range_constexpr(vec):
            s = Float32(0.0)
            for k in cutlass.range_constexpr(vectors):
                ex = cute.math.exp2((Float32(fx[e, k]) - big[e]) * LOG2_E, fastmath=True)
                if const_expr(not log):
                    fe[e, k] = fe.element_type(ex)
                s = s + ex
            total[e] = s
        _columns_reduce(total, slots_sum, False, False, cluster, warps, lanes)
        fy = cute.make_rmem_tensor(frag, mY.element_type)
        if const_expr(log):
            if const_expr(packed):
                _opaque(fx, _after(zero, total[0]))
            for e in cutlass.range_constexpr(vec):
                log_total = cute.math.log(total[e], fastmath=False)
                for k in cutlass.range_constexpr(vectors):
                    # x - M first: exact near the maximum; M + log(S) first rounds at M's
                    # magnitude (4.8e-4 at M = -1e4, over fp32's tolerance).
                    fy[e, k] = mY.element_type((Float32(fx[e, k]) - big[e]) - log_total)
        else:
            if const_expr(fe.element_type.width == 16):
                _opaque(fe, _after(zero, total[0]))
            for e in cutlass.range_constexpr(vec):
                inv = Float32(1.0) / total[e]
                for k in cutlass.range_constexpr(vectors):
                    fy[e, k] = mY.element_type(Float32(fe[e, k]) * inv)
        _store(fy, mY, outer, n0, step, jv, ok)

    @cute.kernel
    def _backward_kernel(mY: cute.Tensor, mG: cute.Tensor, mD: cute.Tensor, log: CBool, cluster: CInt, threads: CInt,
                         vec: CInt, vectors: CInt, lanes: CInt):
        """softmax: dx = y * (g - sum(y * g)); log_softmax: dx = g - exp(y) * sum(g), per column."""
        warps = threads // WARP
        smem = cutlass.memory.SmemAllocator()
        slots = _slots(smem, cluster, warps, lanes * vec)
        if const_expr(cluster > 1):
            _expect_bytes(slots.mbar, slots.bytes)
            cute.arch.cluster_arrive_relaxed()
        outer, n0, step, jv, ok = _place(mY, cluster, threads, vec, vectors, lanes)
        zero = _runtime_zero()
        frag = cute.make_layout((vec, vectors))
        fy = cute.make_rmem_tensor(frag, mY.element_type)
        fg = cute.make_rmem_tensor(frag, mG.element_type)
        fd = cute.make_rmem_tensor(frag, mD.element_type)
        # Padding reads as y = 0, g = 0: it adds nothing to either sum.
        _load(mY, fy, outer, n0, step, jv, ok, mY.element_type(0.0))
        _load(mG, fg, outer, n0, step, jv, ok, mG.element_type(0.0))
        total = cute.make_rmem_tensor(cute.make_layout(vec), Float32)
        for e in cutlass.range_constexpr(vec):
            s = Float32(0.0)
            for k in cutlass.range_constexpr(vectors):
                if const_expr(log):
                    s = s + Float32(fg[e, k])
                else:
                    s = s + Float32(fy[e, k]) * Float32(fg[e, k])
            total[e] = s
        _columns_reduce(total, slots, False, True, cluster, warps, lanes)
        if const_expr(mY.element_type.width == 16 and vec % 2 == 0):
            _opaque(fy, _after(zero, total[0]))
            _opaque(fg, _after(zero, total[0]))
        for e in cutlass.range_constexpr(vec):
            for k in cutlass.range_constexpr(vectors):
                y, g = Float32(fy[e, k]), Float32(fg[e, k])
                if const_expr(log):
                    fd[e, k] = mD.element_type(g - cute.math.exp2(y * LOG2_E, fastmath=True) * total[e])
                else:
                    fd[e, k] = mD.element_type(y * (g - total[e]))
        _store(fd, mD, outer, n0, step, jv, ok)

    def _ctas(t: cute.Tensor, cluster: int, vec: int, lanes: int):
        """One cluster per (outer, strip): outer * strips * cluster CTAs."""
        return t.shape[0] * ((t.shape[2] // vec + lanes - 1) // lanes) * cluster

    @cute.jit
    def forward_entry(mX: cute.Tensor, mY: cute.Tensor, stream, log: CBool, cluster: CInt, threads: CInt, vec: CInt,
                      vectors: CInt, lanes: CInt):
        _launch(_forward_kernel(mX, mY, log, cluster, threads, vec, vectors, lanes), _ctas(mX, cluster, vec, lanes),
                cluster, threads, stream)

    @cute.jit
    def backward_entry(mY: cute.Tensor, mG: cute.Tensor, mD: cute.Tensor, stream, log: CBool, cluster: CInt,
                       threads: CInt, vec: CInt, vectors: CInt, lanes: CInt):
        _launch(_backward_kernel(mY, mG, mD, log, cluster, threads, vec, vectors, lanes),
                _ctas(mY, cluster, vec, lanes), cluster, threads, stream)

    return SimpleNamespace(forward_entry=forward_entry, backward_entry=backward_entry)
