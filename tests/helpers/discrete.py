"""A watch on the Triton interpreter's loads and stores: every lane of a discrete access (one
whose addresses are not an affine block: a scatter or gather), masked or not, must address
memory of one tensor the launch was given. triton-ascend lowers such an access to one that
touches every lane's address; a structured access (affine addresses) is copied under its mask."""

from __future__ import annotations

import contextlib

import numpy as np


def _affine(addresses: np.ndarray) -> bool:
    """Whether the addresses are base + sum_i stride_i * index_i (a strided block)."""
    a = addresses.astype(np.int64)
    for axis in range(a.ndim):
        if a.shape[axis] > 1:
            steps = np.diff(a, axis=axis)
            if (steps != steps.flat[0]).any():
                return False
    return True


@contextlib.contextmanager
def watch_discrete_accesses(monkeypatch):
    """Yields a list that collects one line per discrete access with a lane outside every
    launch tensor's storage (the launches inside the block, through the interpreter)."""
    import triton.runtime.interpreter as ti

    storages: list[tuple[int, int]] = []
    bad: list[str] = []
    real_args, builder = ti.GridExecutor._init_args_hst, ti.interpreter_builder
    real_load, real_store = builder.create_masked_load, builder.create_masked_store

    def init_args(executor, args_dev, kwargs):
        storages.clear()
        for arg in (*args_dev, *kwargs.values()):
            if hasattr(arg, "untyped_storage"):
                storage = arg.untyped_storage()
                storages.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
        return real_args(executor, args_dev, kwargs)

    def check(kind, ptrs, mask):
        addresses = np.asarray(ptrs.data)
        if addresses.size < 2 or _affine(addresses):
            return
        item = ptrs.get_element_ty().primitive_bitwidth // 8
        lo, hi = int(addresses.min()), int(addresses.max()) + item
        if not any(start <= lo and hi <= end for start, end in storages):
            masked = int((~np.asarray(mask.data, dtype=bool)).sum())
            bad.append(f"{kind} of {addresses.size} lanes ({masked} masked) spans [{lo:#x}, {hi:#x}), "
                       f"outside every launch tensor")

    def load(ptrs, mask, other, cache_policy, is_volatile):
        check("load", ptrs, mask)
        return real_load(ptrs, mask, other, cache_policy, is_volatile)

    def store(ptrs, value, mask, cache_policy):
        check("store", ptrs, mask)
        return real_store(ptrs, value, mask, cache_policy)

    monkeypatch.setattr(ti.GridExecutor, "_init_args_hst", init_args)
    monkeypatch.setattr(builder, "create_masked_load", load)
    monkeypatch.setattr(builder, "create_masked_store", store)
    yield bad
