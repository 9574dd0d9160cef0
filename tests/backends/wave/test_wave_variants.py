"""The `wave` backend's fused-family cases (`helpers.wave.CASES`): they cover every step of
`core.variant`, and each is a kernel of its own."""

from __future__ import annotations

import pytest
import torch

from anysoftmax.core.variant import BOTTOM_RIGHT, EMPTY_ROWS, MASK_ADDITIVE, MASK_BOOL, TOP_LEFT
from helpers.wave import CASES, spec_of


ATTENTION = (2, 8, 256, 256)


def test_cases_cover_every_step():
    specs = [spec_of(c, ATTENTION) for c in CASES]
    v = [s.variant for s in specs]
    assert any(x.scale is not None and x.scale < 0 for x in v) and any(x.softcap is not None for x in v)
    assert {MASK_BOOL, MASK_ADDITIVE} <= {x.mask_kind for x in v}
    assert {TOP_LEFT, BOTTOM_RIGHT} <= {x.causal for x in v}
    assert any(x.sinks is not None for x in v)
    assert set(EMPTY_ROWS) <= {x.empty_rows for x in v if x.has_empty_rows}
    assert {torch.float16, torch.bfloat16, torch.float32} <= {x.mask.dtype for x in v if x.mask_kind == MASK_ADDITIVE}
    for keyword in ("scale", "softcap", "mask", "causal", "sink"):
        assert any(keyword in c.name for c in CASES), keyword


@pytest.mark.parametrize("shape", [(256, 1024), ATTENTION])
def test_each_case_is_a_kernel_of_its_own(shape):
    from anysoftmax.backends.wave.backend import kernel_key
    from anysoftmax.backends.wave.target import parse_target

    keys = {c.name: kernel_key(spec_of(c, shape), parse_target("sm_80")) for c in CASES}
    same = {frozenset((a, b)) for a in keys for b in keys if a < b and keys[a] == keys[b]}
    # Cases differ in steps, operand layouts or policies, except that a scale's value is a
    # runtime argument (a new temperature never recompiles).
    assert same == {frozenset(("scale", "scale_negative"))}
