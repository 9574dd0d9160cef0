"""`_triton_common.interpreted_launch.patch_each_launch_once`: Triton's interpreter patches the language
once per launch, not once per device-function call, and nothing else changes: a launch still
patches and restores `triton.language` as before, a helper that sees a language module the
launch did not patch still patches it, and the kernels compute what the reference does."""

from __future__ import annotations

import inspect

import pytest
import torch

from helpers import runnable_backends

pytestmark = pytest.mark.skipif("triton" not in runnable_backends("cpu"),
                                reason="triton does not run on CPU here: TRITON_INTERPRET is not set")


def _members(module) -> dict:
    """A module's or class's attributes (a class's `__dict__` view is compared through them)."""
    return {name: value for name, value in inspect.getmembers(module) if name != "__dict__"}


def _installed():
    from anysoftmax.backends._triton_common import fused  # noqa: F401  (defining the kernels installs it)
    from anysoftmax.backends._triton_common.interpreted_launch import patch_each_launch_once

    return patch_each_launch_once()


def test_installed_with_the_kernels():
    from triton.runtime import interpreter as ti

    once = _installed()
    assert once is not None, "this Triton's interpreter lacks _patch_lang / GridExecutor / _LangPatchScope"
    assert ti._patch_lang == once.patch_lang


def test_a_launch_patches_once_and_restores_the_language(monkeypatch, gen):
    import triton.language as tl

    import anysoftmax

    once = _installed()
    real, patched = once.real, []
    monkeypatch.setattr(once, "real", lambda fn: patched.append((fn.__module__, fn.__name__)) or real(fn))
    before = {m: _members(m) for m in (tl, tl.core, tl.math, tl.tensor)}
    for shape in ((6, 300), (3, 5, 7)):  # (a row kernel, then one launched with its helpers inlined)
        x = torch.randn(shape, generator=gen)
        y = anysoftmax.softmax(x, -1, backend="triton")
        torch.testing.assert_close(y.double(), torch.softmax(x.double(), -1), rtol=1e-5, atol=1e-6)
    # Per launch: its kernel's patch, and once each a Triton library helper's (`tl.cdiv` sees
    # `triton.language.core`, which the kernel's globals do not hold); none for our helpers,
    # called per program.
    ours = [name for module, name in patched if module.startswith("anysoftmax.")]
    assert ours and all(name.endswith("_kernel") for name in ours), patched
    library = [name for module, name in patched if not module.startswith("anysoftmax.")]
    assert len(library) <= 2 * len(ours), patched
    after = {m: _members(m) for m in (tl, tl.core, tl.math, tl.tensor)}
    for module, members in before.items():
        changed = sorted(n for n in members if after[module].get(n) != members[n])
        assert not changed, f"{module.__name__}: left patched after the launch: {changed[:10]}"


def test_only_modules_the_launch_patched_are_skipped():
    """Outside a launch every patch is Triton's; inside, the launch's own patch is, and a device
    call's is skipped only when its modules are among those already patched; the patches taken
    inside a launch are undone with the launch's, last first."""
    from anysoftmax.backends._triton_common.interpreted_launch import OncePerLaunch

    class Fn:  # a device function as the patch sees it: its globals' language modules
        def __init__(self, *langs):
            self.langs = frozenset(langs)

    undone = []

    class Scope:
        def __init__(self, fn=None):
            self.fn = fn

        def restore(self):
            undone.append(self.fn)

    real = []
    launch_fn, helper, other = Fn("tl"), Fn("tl"), Fn("core")

    def grid(executor):
        scopes = [once.patch_lang(fn) for fn in (launch_fn, helper, helper, other, other, helper)]
        scopes[0].restore()  # (as the executor does when its grid is done)
        return scopes

    once = OncePerLaunch(lambda fn: real.append(fn) or Scope(fn), grid, Scope, lambda fn: fn.langs)
    assert once.patch_lang(helper).fn is helper and real == [helper]  # (no launch)
    real.clear()
    got = once.call(None)
    assert [s.fn for s in got] == [launch_fn, None, None, other, None, None], got
    assert real == [launch_fn, other]
    assert undone == [other, launch_fn]
    assert once.patch_lang(helper).fn is helper  # the launch ended: Triton's own again
