"""Every key of a device-matrix YAML file, with its meaning and allowed values: the reference in
docs/matrix.md is generated from this table (`python -m anysoftmax.matrix.keys`), and tests check
that the page holds exactly that text, that every key the schema accepts is described, and that
each limit stated here is the validator's (values at the limit pass, values past it fail)."""

from __future__ import annotations

from ..core.spec import DTYPE_NAMES
from .providers import PEER_NAMES
from .schema import BENCH_KEYS, CHECKS, DEVICE_TYPES, DIRECTIONS, ENTRY_KEYS, OPS, RANGE_KEYS, TOP_KEYS
from .variants import MASK_KEYS, PRESETS, SINKS_KEYS, VARIANT_KEYS

_AXIS = "top level (default of every entry) or inside an entry"
# key path -> (where, meaning, allowed values)
KEYS: dict[str, tuple[str, str, str]] = {
    "name": ("top level", "name of the matrix (report folder and title)", "a string"),
    "description": ("top level", "free text shown in the report", "a string"),
    "seed": ("top level", "base of every cell's random seed (the same config gives the same data)", "an integer"),
    "plugins": ("top level", "modules imported before the run; they may `anysoftmax.register()` backends",
                "a list of importable module names"),
    "ray": ("top level", "where the cells run (same as `--ray`; omit for local workers)",
            "`auto`, `local`, `off` or a Ray address `host:port`"),
    "devices": ("top level", "the device entries", "a non-empty list of entries"),
    "devices[].name": ("entry", "the entry's name (reports, `--device`)", "a unique string"),
    "devices[].device": ("entry", "the torch device", f"{', '.join(DEVICE_TYPES)}, optionally with `:index`"),
    "devices[].match": ("entry", "run only on devices whose name contains one of these", "a list of strings"),
    "devices[].properties": ("entry", "free key/values copied to reports and `--list-devices`", "a mapping"),
    "devices[].resources": ("entry", "Ray only: extra Ray resources the entry's worker needs (pins hosts)",
                            "a mapping of resource name to a positive number"),
    "devices[].labels": ("entry", "Ray only: node labels the entry's worker needs", "a mapping of strings"),
    "backends": (_AXIS, "backends (and peers) to run",
                 "names from `anysoftmax backends` (and plugins), `auto` (the automatic choice), or peers: "
                 + ", ".join(f"`{p}`" for p in PEER_NAMES)),
    "shapes": (_AXIS, "shapes: `[M, N, ...]`, `{shape: [...], dims: [...]}` or an `{M, N}` sweep",
               "non-negative sizes (0: an empty tensor); sweep values a size, a list or a range"),
    "dtypes": (_AXIS, "input dtypes (default float32)", ", ".join(sorted(DTYPE_NAMES))),
    "dims": (_AXIS, "reduced dims (default -1)", "integers within each shape's rank"),
    "ops": (_AXIS, "operations (default softmax)", ", ".join(OPS)),
    "directions": (_AXIS, "forward and/or backward (default forward)", ", ".join(DIRECTIONS)),
    "variants": (_AXIS, "members of the fused family each cell runs (default `plain`); a variant that cannot "
                 "apply to a shape skips that cell with the reason",
                 "presets (" + ", ".join(f"`{p}`" for p in PRESETS) + ") or mappings with the keys below"),
    "variants[].name": ("variant", "its name in cell ids and reports (default: made from its keys)",
                        "letters, digits and `_ . + = -`"),
    "variants[].scale": ("variant", "z = scale · x", "a finite number"),
    "variants[].softcap": ("variant", "z = softcap · tanh(z / softcap)", "a number > 0"),
    "variants[].causal": ("variant", "causal mask over the last two dims (queries, keys); the softmax dim must be "
                          "the last", "`true` / `top_left` (keep j ≤ i), `bottom_right` (keep j ≤ i + sk − sq), "
                          "`false`"),
    "variants[].mask": ("variant", "a mask drawn per cell from its seed", "a mapping with the keys below"),
    "variants[].mask.kind": ("mask", "`bool`: True = excluded; `additive`: added to z (excluded entries at "
                             "finfo.min)", "bool, additive"),
    "variants[].mask.shape": ("mask; also `sinks: {shape}`", "the operand's shape, aligned right with the cell's "
                                            "(default: the cell's shape; sinks: one per row)",
                                            "sizes and symbols `b`, `h`, `sq`, `sk` (4th-last to last dim), "
                                            "`d0`, `d1`, ... (by position)"),
    "variants[].mask.density": ("mask", "bool: fraction excluded; additive: fraction at finfo.min "
                                "(default 0.3 / 0.2)", "a number strictly between 0 and 1"),
    "variants[].sinks": ("variant", "one more logit per row, in the denominator only (gpt-oss)",
                         "`true` (one per row) or `{shape: [...]}`"),
    "variants[].empty_rows": ("variant", "what rows the bool mask or causal leave empty give; when set, one bool-mask "
                              "row in ten is excluded entirely", "zero, nan, uniform"),
    "checks": (_AXIS, "what each cell does (default conformance)", ", ".join(CHECKS)),
    "benchmark": (_AXIS, "timing settings of `benchmark` checks", "a mapping with the keys below"),
    "benchmark.warmup_ms": ("benchmark", "warm-up time before timing", "a positive number (ms)"),
    "benchmark.rep_ms": ("benchmark", "timed repetitions' total time", "a positive number (ms)"),
    "benchmark.cpu": ("benchmark", "also time CPU cells (wall clock)", "true or false"),
    "shapes[].M / N.start": ("sweep range", "first value", "a non-negative integer (>= 1 with `mul`)"),
    "shapes[].M / N.stop": ("sweep range", "last value (inclusive)", "an integer >= start"),
    "shapes[].M / N.step": ("sweep range", "arithmetic step (or `mul`)", "a positive integer"),
    "shapes[].M / N.mul": ("sweep range", "geometric factor (or `step`)",
                           "a number > 1 (each value is the previous times `mul`, rounded down, at least +1)"),
}


def described() -> set[str]:
    """The schema's key names that this table describes (by last path component)."""
    return {k.split(".")[-1].split("[].")[-1].removeprefix("devices[].") for k in KEYS}


def accepted() -> set[str]:
    """Every key name the schema accepts."""
    return set(TOP_KEYS) | set(ENTRY_KEYS) | set(BENCH_KEYS) | set(RANGE_KEYS) | set(VARIANT_KEYS) | set(MASK_KEYS) \
        | set(SINKS_KEYS)


def reference_markdown() -> str:
    """The YAML reference table of docs/matrix.md."""
    lines = ["| key | where | meaning | allowed values |", "|---|---|---|---|"]
    lines += [f"| `{k}` | {where} | {meaning} | {allowed} |" for k, (where, meaning, allowed) in KEYS.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
