"""The fused-family cases the `wave` backend is compiled for (tests/backends/wave/test_wave.py) and
checked against on a GPU (test_wave_gpu.py): data, one generator per case (test_wave_variants.py
checks that the list covers every step of `core.variant` and that each case is a kernel of its
own).

A case makes the fused keywords for an input shape from a torch.Generator: fresh random
operands (masks with excluded and kept positions, planted empty rows where the policy is
under test, additive masks with -inf entries, random sinks), never zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from anysoftmax.core.spec import SoftmaxSpec
from anysoftmax.core.variant import BOTTOM_RIGHT, TOP_LEFT


def _rand(gen, shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def _bool(gen, shape, p=0.3, empty_rows=0):
    """A bool mask (True = excluded) with about `p` excluded, and `empty_rows` whole rows
    (the first ones of the last-but-one dim) excluded entirely."""
    m = torch.rand(shape, generator=gen) < p
    if empty_rows and len(shape) >= 2:
        m[..., :empty_rows, :] = True
    return m


def _rows(shape):
    """The sink/mask shape with one value per row: the input's with 1 in the last dim."""
    return (*shape[:-1], 1)


def _heads(shape):
    """Broadcast over all but the head dim for attention-shaped inputs, per row otherwise."""
    return (shape[1], 1, 1) if len(shape) == 4 else _rows(shape)


def _batch_keys(shape):
    """A mask per (batch, query, key), broadcast over heads; per key for 2-D inputs."""
    return (shape[0], 1, *shape[2:]) if len(shape) == 4 else (shape[-1],)


def _additive(gen, shape, dtype):
    """A floating mask: random values, ~10% -inf, and (2-D and up) one row of only -inf: torch
    gives that row NaN, and so must every backend."""
    m = _rand(gen, shape, torch.float64, 2.0)
    m[torch.rand(shape, generator=gen) < 0.1] = -math.inf
    if len(shape) >= 2 and shape[-2] > 1:
        m[..., 1, :] = -math.inf
    return m.to(dtype)


def _transposed_bool(gen, shape):
    """A bool mask with its last two dims laid out transposed: read through a column stride
    of the row count, not 1."""
    return _bool(gen, (*shape[:-2], shape[-1], shape[-2])).transpose(-1, -2)


@dataclass(frozen=True)
class WaveCase:
    """One member of the fused family: `make(gen, shape, device)` -> fused keywords."""

    name: str
    make: Callable[[torch.Generator, tuple, str], dict]
    dtypes: tuple = (torch.float32,)

    def kwargs(self, gen, shape, device="cpu") -> dict:
        return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.make(gen, shape).items()}


ALL16 = (torch.float32, torch.float16, torch.bfloat16)

CASES = [
    WaveCase("scale", lambda g, s: dict(scale=0.37)),
    WaveCase("scale_negative", lambda g, s: dict(scale=-1.7)),
    WaveCase("softcap", lambda g, s: dict(softcap=4.0), ALL16),
    WaveCase("scale_softcap", lambda g, s: dict(scale=1.9, softcap=2.5)),
    WaveCase("mask_bool", lambda g, s: dict(mask=_bool(g, s, empty_rows=2)), ALL16),  # empty rows: 0
    WaveCase("mask_bool_broadcast", lambda g, s: dict(mask=_bool(g, _batch_keys(s)))),
    WaveCase("mask_bool_transposed", lambda g, s: dict(mask=_transposed_bool(g, s))),
    WaveCase("mask_additive_float32_rows", lambda g, s: dict(mask=_rand(g, _rows(s), scale=2.0))),
    WaveCase("mask_additive_float16", lambda g, s: dict(mask=_additive(g, s, torch.float16)), ALL16),
    WaveCase("mask_additive_bfloat16_broadcast", lambda g, s: dict(mask=_additive(g, _batch_keys(s), torch.bfloat16))),
    WaveCase("causal_top_left", lambda g, s: dict(causal=TOP_LEFT), ALL16),
    WaveCase("causal_bottom_right", lambda g, s: dict(causal=BOTTOM_RIGHT)),
    WaveCase("causal_bottom_right_empty_uniform", lambda g, s: dict(causal=BOTTOM_RIGHT, empty_rows="uniform")),
    WaveCase("sink_rows", lambda g, s: dict(sinks=_rand(g, _heads(s), scale=2.0)), ALL16),
    WaveCase("sink_one", lambda g, s: dict(sinks=_rand(g, (1,), scale=2.0))),
    WaveCase("mask_bool_empty_nan", lambda g, s: dict(mask=_bool(g, s, empty_rows=2), empty_rows="nan")),
    WaveCase("mask_bool_empty_uniform_sink", lambda g, s: dict(mask=_bool(g, s, empty_rows=2), empty_rows="uniform",
                                                              sinks=_rand(g, _rows(s), scale=2.0))),
    WaveCase("all_scale_softcap_mask_causal_sink", lambda g, s: dict(
        scale=0.8, softcap=6.0, mask=_bool(g, _batch_keys(s), empty_rows=0), causal=BOTTOM_RIGHT,
        sinks=_rand(g, _heads(s), scale=2.0), empty_rows="nan"), ALL16),
]
BY_NAME = {c.name: c for c in CASES}


def spec_of(case: WaveCase, shape, dtype=torch.float32, log=False, gen=None, device="meta") -> SoftmaxSpec:
    """The spec of `case` on an input of `shape` (operands as meta tensors unless `device`)."""
    gen = gen or torch.Generator().manual_seed(0)
    x = torch.empty(shape, dtype=dtype, device=device)
    kwargs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in case.make(gen, shape).items()}
    spec, _ = SoftmaxSpec.from_request(x, -1, log=log, fused=kwargs)
    return spec

