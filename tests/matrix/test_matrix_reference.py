"""The YAML reference (docs/matrix.md, generated from `anysoftmax.matrix.keys`) states the
validator's real limits: for each limit it states, a value at the limit is accepted and one past
it is refused. (It once said sizes are positive and `mul` an integer >= 2 while the validator
accepted 0 and 1.5.)"""

from __future__ import annotations

import pytest

from anysoftmax.matrix import ConfigError
from anysoftmax.matrix.keys import KEYS
from anysoftmax.matrix.schema import validate

BASE = {"backends": ["torch"], "shapes": [[2, 8]], "devices": [{"name": "cpu", "device": "cpu"}]}


def sweep(n):
    return {**BASE, "shapes": [{"M": 2, "N": n}]}


def bench(**values):
    return {**BASE, "checks": ["conformance", "benchmark"], "benchmark": values}


def variant(**keys):
    return {**BASE, "shapes": [[2, 3, 4, 6]], "variants": [keys]}


# key -> (words its "allowed values" must contain, configs that must pass, configs that must fail)
LIMITS = {
    "shapes": ("non-negative sizes", [{**BASE, "shapes": [[0, 8]]}, {**BASE, "shapes": [[3, 0]]}],
               [{**BASE, "shapes": [[-1, 8]]}, {**BASE, "shapes": [[2.5, 8]]}]),
    "shapes[].M / N.start": ("a non-negative integer (>= 1 with `mul`)",
                             [sweep({"start": 0, "stop": 4, "step": 2}), sweep({"start": 1, "stop": 4, "mul": 2})],
                             [sweep({"start": -1, "stop": 4, "step": 2}), sweep({"start": 0, "stop": 4, "mul": 2})]),
    "shapes[].M / N.stop": ("an integer >= start", [sweep({"start": 4, "stop": 4, "step": 1})],
                            [sweep({"start": 4, "stop": 3, "step": 1})]),
    "shapes[].M / N.step": ("a positive integer", [sweep({"start": 1, "stop": 4, "step": 1})],
                            [sweep({"start": 1, "stop": 4, "step": 0}), sweep({"start": 1, "stop": 4, "step": 1.5})]),
    "shapes[].M / N.mul": ("a number > 1", [sweep({"start": 1, "stop": 64, "mul": 1.5}),
                                           sweep({"start": 1, "stop": 64, "mul": 2})],
                           [sweep({"start": 1, "stop": 64, "mul": 1}), sweep({"start": 1, "stop": 64, "mul": 0.5})]),
    "benchmark.warmup_ms": ("a positive number", [bench(warmup_ms=0.5)], [bench(warmup_ms=0), bench(warmup_ms=-1)]),
    "benchmark.rep_ms": ("a positive number", [bench(rep_ms=0.5)], [bench(rep_ms=0)]),
    "benchmark.cpu": ("true or false", [bench(cpu=True)], [bench(cpu="yes"), bench(cpu=1)]),
    "seed": ("an integer", [{**BASE, "seed": 7}], [{**BASE, "seed": 1.5}, {**BASE, "seed": True}]),
    "dims": ("integers within each shape's rank", [{**BASE, "dims": [-2, 1]}], [{**BASE, "dims": [2]}]),
    "devices[].device": ("cpu, cuda, npu, optionally with `:index`",
                         [{**BASE, "devices": [{"name": "g", "device": "cuda:1"}]}],
                         [{**BASE, "devices": [{"name": "g", "device": "tpu"}]},
                          {**BASE, "devices": [{"name": "c", "device": "cpu:0"}]}]),
    "variants[].scale": ("a finite number", [variant(scale=0.5), variant(scale=-3)],
                         [variant(scale=float("inf")), variant(scale="big")]),
    "variants[].softcap": ("a number > 0", [variant(softcap=0.5)], [variant(softcap=0), variant(softcap=-1)]),
    "variants[].mask.density": ("a number strictly between 0 and 1",
                                [variant(mask={"kind": "bool", "density": 0.01}),
                                 variant(mask={"kind": "additive", "density": 0.99})],
                                [variant(mask={"kind": "bool", "density": 0}), variant(mask={"kind": "bool",
                                                                                              "density": 1})]),
    "variants[].mask.shape": ("sizes and symbols", [variant(mask={"kind": "bool", "shape": ["b", 1, "sq", "sk"]})],
                              [variant(mask={"kind": "bool", "shape": ["b", -1, "sq", "sk"]})]),
    "devices[].resources": ("a positive number", [{**BASE, "devices": [{"name": "c", "device": "cpu",
                                                                        "resources": {"host_a": 0.5}}]}],
                            [{**BASE, "devices": [{"name": "c", "device": "cpu", "resources": {"host_a": 0}}]}]),
}


@pytest.mark.parametrize("key", list(LIMITS))
def test_stated_limit_is_the_validators(key):
    words, good, bad = LIMITS[key]
    assert words in KEYS[key][2], f"the reference no longer says {words!r} for {key}: update this test's probes"
    for data in good:
        validate(data, backend_names=("torch",))
    for data in bad:
        with pytest.raises(ConfigError):
            validate(data, backend_names=("torch",))


def test_every_numeric_limit_is_probed():
    """A key whose allowed values state a number or a range must have probes here."""
    numeric = {k for k, (_, _, allowed) in KEYS.items()
               if any(w in allowed for w in ("integer", "number", "positive", ">", "size"))}
    assert numeric <= set(LIMITS), f"limits stated but not probed: {sorted(numeric - set(LIMITS))}"
