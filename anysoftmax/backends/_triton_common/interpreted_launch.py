"""Triton's interpreter: which kernels it runs (`interpreted`), and `patch_each_launch_once`
(called by `fused.py`): as shipped, it patches `triton.language` again on every `@triton.jit`
helper call inside a launch, half of an interpreted launch's time."""

from __future__ import annotations

import functools
import inspect
import threading
import weakref


def interpreted(kernel) -> bool:
    """Whether `kernel` was defined for the interpreter."""
    return type(kernel).__name__ == "InterpretedFunction"


class OncePerLaunch:
    """`patch_lang(fn)` stands for the interpreter's `_patch_lang` (`real`), `call` for
    `GridExecutor.__call__` (`real_call`): inside this thread's launch, a device function's patch
    is skipped where the launch patched its modules (`langs_of`) already; all undone at its end."""

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
        # The launch's own patch, restored when the grid is done: the device calls' patches first,
        # last one first (Triton drops them, leaving those modules patched).
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
    """Make Triton's interpreter patch `triton.language` once per launch (a test: 65 s, 30 s with
    it): the installed `OncePerLaunch`, or None where the interpreter lacks those internals."""
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
