"""Whether Triton kernels run compiled or through Triton's CPU interpreter.

Triton decides when a kernel is *defined* (decorated): with TRITON_INTERPRET=1 in the
environment, `@triton.jit` makes an interpreted function. The decision is process-wide, so it
is taken once, here, before anything imports the kernel modules (`rows.py`, `cols.py`,
`bwd.py`, imported lazily by the plans): the CLI, the matrix workers and the tests call
`use_interpreter_if_no_device()` instead of each deciding for themselves.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import sys
import threading
import weakref

ENV = "TRITON_INTERPRET"
KERNEL_MODULES = ("rows", "cols", "bwd", "sharded")
# Triton is an extra: CUDA and ROCm builds of torch bring it, the CPU build does not.
TRITON_EXTRA = "pip install 'anysoftmax[triton]'"


def triton_missing(extra: str = TRITON_EXTRA) -> str | None:
    """Why the `triton` package cannot be imported here, naming what to install (`extra`), or
    None. Located without importing it: importing `triton` fixes the interpreter choice."""
    try:
        found = importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError) as exc:  # a finder refused it, or a broken partial install
        found, why = False, f" ({type(exc).__name__}: {exc})"
    else:
        why = ""
    if found:
        return None
    return f"the `triton` package is not installed{why}: {extra}"


def kernels_imported() -> bool:
    """True once Triton or any kernel module was imported: the interpreter choice is then fixed
    (Triton's own library functions, such as `tl.cdiv`, are defined when `triton` is imported)."""
    return "triton" in sys.modules or any(f"{__package__}.{m}" in sys.modules for m in KERNEL_MODULES)


def has_triton_device() -> bool:
    """A device the Triton kernels compile for is visible: a CUDA/ROCm GPU, or an Ascend NPU
    stack (detected by `torch_npu` being installed, never by importing it: without CANN that
    import breaks)."""
    import torch

    return torch.cuda.is_available() or importlib.util.find_spec("torch_npu") is not None


def needs_interpreter() -> bool:
    """True when the Triton kernels can run here only through the interpreter."""
    return not has_triton_device()


def use_interpreter_if_no_device() -> str | None:
    """Set TRITON_INTERPRET=1 when no Triton device is visible and neither the user (the
    variable is set) nor an earlier import (kernels already defined) decided; return a line
    saying so, or None when nothing changed."""
    if ENV in os.environ or kernels_imported() or not needs_interpreter():
        return None
    os.environ[ENV] = "1"
    return ("no GPU or NPU visible: Triton kernels run on the CPU through the Triton interpreter "
            f"({ENV}=1; set {ENV}=0 to keep it off)")


def interpreting() -> bool:
    """True when Triton runs the kernels through its CPU interpreter."""
    from .rows import softmax_tile_kernel

    return type(softmax_tile_kernel).__name__ == "InterpretedFunction"


def status_note() -> str:
    """A Triton backend's status line when the interpreter is what makes it usable here."""
    if interpreting():
        return "via the interpreter on CPU (TRITON_INTERPRET=1; slow, for testing)"
    return ""


@functools.lru_cache(maxsize=None)
def interpreter_problem() -> str | None:
    """Why this machine's Triton interpreter cannot run the kernels, or None when it can.

    Probed once by running the tile kernel on a tiny CPU tensor: some Triton/numpy pairs break
    the interpreter's loops over program ids (Triton 3.6 with numpy >= 2.4: "only 0-dimensional
    arrays can be converted to Python scalars"), and that must read as "unavailable, because",
    not as a wrong or crashing backend.
    """
    import torch
    import triton

    from ...core.layout import RowLayout
    from .launcher import bind
    from .plan import TilePlan

    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    y = torch.empty_like(x)
    layout = RowLayout.from_strides((2, 3), (3, 1), (3, 1), 1)
    try:
        bind(TilePlan(1, 4, 1), layout, False, torch.float32)((x, y, None, None, None))
    except Exception as exc:  # the interpreter's own failure, reported as the reason
        import numpy
        return (f"the Triton {triton.__version__} interpreter fails here with numpy {numpy.__version__} "
                f"({type(exc).__name__}: {exc}); upgrade triton")
    if not torch.allclose(y, torch.softmax(x, 1)):
        return f"the Triton {triton.__version__} interpreter computes wrong results on this machine"
    return None



class OncePerLaunch:
    """Triton's interpreter patching `triton.language` once per launch (`patch_each_launch_once`):
    `patch_lang(fn)` stands for the interpreter's `_patch_lang` (`real`), `call` for
    `GridExecutor.__call__` (`real_call`). Inside a launch (this thread's), a device function's
    patch is skipped when the launch already patched every language module its globals hold
    (`langs_of`); the launch's own patch, and any other, go to `real`, and all of them are
    undone when the launch ends."""

    def __init__(self, real, real_call, scope_type, langs_of):
        self.real, self.real_call, self.scope_type, self.langs_of = real, real_call, scope_type, langs_of
        self.launch = threading.local()  # .langs: modules this thread's launch patched (None: no launch)

    def patch_lang(self, fn):
        launch = self.launch
        langs = getattr(launch, "langs", None)
        if langs is None:
            return self.real(fn)
        if not launch.first and self.langs_of(fn) <= langs:
            return self.scope_type()  # (nothing to patch, nothing to restore)
        launch.langs = langs | self.langs_of(fn)
        scope = self.real(fn)
        if not launch.first:  # a device call's patch of another module: undone with the launch's
            launch.inner.append(scope)
            return scope
        # The launch's own patch, which the executor restores when the grid is done: the device
        # calls' patches first, last one first (Triton drops them, leaving those modules patched).
        launch.first, inner, restore = False, [], scope.restore
        launch.inner = inner

        def restore_all():
            while inner:
                inner.pop().restore()
            restore()

        scope.restore = restore_all
        return scope

    def call(self, executor, *args, **kwargs):
        launch = self.launch
        outer = getattr(launch, "langs", None), getattr(launch, "first", False), getattr(launch, "inner", None)
        launch.langs, launch.first, launch.inner = frozenset(), True, []
        try:
            return self.real_call(executor, *args, **kwargs)
        finally:
            launch.langs, launch.first, launch.inner = outer


@functools.lru_cache(maxsize=None)
def patch_each_launch_once() -> OncePerLaunch | None:
    """Make Triton's interpreter patch `triton.language` once per launch instead of once per
    call of a `@triton.jit` helper; the installed `OncePerLaunch`, or None where the interpreter
    lacks the internals it replaces (then it is left as it is).

    The interpreter replaces the language's builtins with its numpy versions when a launch
    starts (and restores them when it ends), and again on *every* call of a device function
    inside it: a scan of `triton.language`, `tl.tensor` and `tl.math` that finds them already
    replaced and changes nothing. With the kernels' small helpers called per program, that scan
    was half of an interpreted launch's time (a logsumexp test: 65 s, 30 s without it).
    """
    try:
        from triton.runtime import interpreter as ti

        once = OncePerLaunch(ti._patch_lang, ti.GridExecutor.__call__, ti._LangPatchScope, None)
    except (ImportError, AttributeError):
        return None
    seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def langs_of(fn) -> frozenset:
        found = seen.get(fn)
        if found is None:
            found = seen[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                         if inspect.ismodule(v) and v in (ti.tl, ti.tl.core))
        return found

    once.langs_of = langs_of
    ti._patch_lang = once.patch_lang
    ti.GridExecutor.__call__ = lambda executor, *args, **kwargs: once.call(executor, *args, **kwargs)
    return once
