"""The matrix's `variants:` axis: schema errors, cell expansion, operands, the bytes a fused
kernel must move, and conformance of fused cells (torch backend, the Triton kernels through
the interpreter, the torch composition peer) — which must be able to fail."""

import json
import math

import pytest
import torch

from anysoftmax.core.variant import keep_mask
from anysoftmax.matrix import FAILED, PASSED, SKIPPED, Result, expand, load_config, run_matrix
from anysoftmax.matrix import chunks, fused_cells, memory, providers
from anysoftmax.matrix.cells import Cell
from anysoftmax.matrix.composition import causal_excluded
from anysoftmax.matrix.operands import make_operands
from anysoftmax.matrix.report import load_report, markdown, write_reports
from anysoftmax.matrix.runner import MatrixRun
from anysoftmax.matrix.traffic import Traffic, fused_bytes, kept_in_plane
from anysoftmax.matrix.variants import PRESETS, MaskSpec, NotApplicable, VariantSpec, resolve

from conftest import SEED
from helpers import config_errors, write_matrix

BASE = {"backends": ["torch"], "shapes": [[2, 3, 8, 12]], "devices": [{"name": "cpu", "device": "cpu"}]}
ATT = [[2, 3, 16, 24], [2, 2, 20, 12]]  # sq < sk, and sq > sk (bottom-right empties rows)
CUSTOM = [
    {"name": "everything", "scale": 0.7, "softcap": 6, "mask": {"kind": "bool", "shape": ["b", 1, "sq", "sk"]},
     "causal": "bottom_right", "sinks": {"shape": ["h", 1, 1]}, "empty_rows": "uniform"},
    {"name": "nan-rows", "mask": {"kind": "bool", "shape": ["sq", "sk"], "density": 0.5}, "empty_rows": "nan"},
]


def errors_of(tmp_path, **changes) -> list[str]:
    return config_errors(tmp_path, {**BASE, **changes})


# ---------------------------------------------------------------- schema

def test_unknown_preset_names_the_presets(tmp_path):
    (err,) = errors_of(tmp_path, variants=["plain", "megatorn"])
    assert "variants[1]" in err and "'megatorn'" in err and "megatron" in err and "mapping" in err


def test_every_bad_key_and_value_is_reported_at_once(tmp_path):
    errs = errors_of(tmp_path, variants=[
        {"scal": 0.1},
        {"scale": "big"},
        {"softcap": 0},
        {"causal": "diagonal"},
        {"mask": {"shape": ["b", 1, "sq", "sk"]}},
        {"mask": {"kind": "bool", "density": 1.5}},
        {"mask": {"kind": "additive", "shape": ["b", "q"]}},
        {"sinks": "yes"},
        {"sinks": {"shape": [0]}},
        {"scale": 2, "empty_rows": "none"},
        {"name": "a/b", "scale": 3},
    ])
    text = "\n".join(errs)
    expected = [
        ("variants[0].scal", "unknown key 'scal'"), ("variants[1].scale", "finite number"),
        ("variants[2].softcap", "> 0"), ("variants[3].causal", "bottom_right"),
        ("variants[4].mask.kind", "bool, additive"), ("variants[5].mask.density", "between 0 and 1"),
        ("variants[6].mask.shape[1]", "'q'"), ("variants[7].sinks", "{shape: [...]}"),
        ("variants[8].sinks.shape[0]", "positive integer"), ("variants[9].empty_rows", "zero, nan, uniform"),
        ("variants[10].name", "'a/b'"),
    ]
    for where, what in expected:
        assert any(f": {where}: " in e and what in e for e in errs), f"{where} ({what}) not in:\n{text}"
    assert len(errs) == len(expected), text


def test_empty_rows_without_a_mask_or_causal_and_duplicate_names(tmp_path):
    errs = errors_of(tmp_path, variants=[{"scale": 2, "empty_rows": "nan"}, "scale", {"name": "scale", "softcap": 3}])
    text = "\n".join(errs)
    assert "variants[0].empty_rows" in text and "no row can be empty" in text
    assert "variants[2]" in text and "listed twice" in text


def test_a_variant_that_applies_to_no_shape_is_an_error(tmp_path):
    (err,) = errors_of(tmp_path, shapes=[{"shape": [4, 6, 5], "dims": [0, 1]}], variants=["plain", "causal"])
    assert "variants" in err and "'causal'" in err and "applies to no shape" in err and "dim 0" in err


def test_expansion_ids_seeds_and_entry_override(tmp_path):
    cfg = load_config(write_matrix(tmp_path, {**BASE, "variants": ["plain", "megatron", {"causal": "bottom_right"}],
                                       "devices": [{"name": "a", "device": "cpu"},
                                                   {"name": "b", "device": "cpu", "variants": [{"softcap": 50}]}]}))
    a, b = cfg.devices
    assert [v.name for v in a.variants] == ["plain", "megatron", "causal-br"]
    assert [v.name for v in b.variants] == ["softcap50"] and b.variants[0].softcap == 50.0
    cells = expand(cfg)
    ids = [c.id for c in cells]
    assert ids == ["a/torch/softmax/forward/float32/2x3x8x12/dim-1",  # plain keeps its id (and seed)
                   "a/torch/softmax/forward/float32/2x3x8x12/dim-1/megatron",
                   "a/torch/softmax/forward/float32/2x3x8x12/dim-1/causal-br",
                   "b/torch/softmax/forward/float32/2x3x8x12/dim-1/softcap50"]
    assert len({c.seed for c in cells}) == 4
    assert cells[1].variant == PRESETS["megatron"]
    default = expand(load_config(write_matrix(tmp_path, BASE)))
    assert [c.variant.name for c in default] == ["plain"]


def test_rows_round_trip_with_the_variant_and_old_rows_are_plain():
    cell = Cell(0, "e", "cpu", "torch", "softmax", "forward", "float32", (2, 3, 4, 4), -1, False, 1, 1, False, 7,
                PRESETS["gpt-oss"])
    row = json.loads(json.dumps(Result(cell, PASSED).as_row()))
    assert row["variant"] == "gpt-oss" and "causal=top_left" in row["variant_desc"]
    assert Result.from_row(row).cell == cell
    for key in ("variant", "variant_desc", "variant_spec"):
        row.pop(key)
    assert Result.from_row(row).cell.variant == PRESETS["plain"]


# ---------------------------------------------------------------- one cell's variant

def test_symbols_resolve_against_each_cell():
    v = VariantSpec("v", mask=MaskSpec("bool", ("b", 1, "sq", "sk")), sinks=True, sinks_shape=("h", 1, 1))
    r = resolve(v, (2, 3, 5, 7), -1)
    assert r.mask_shape == (2, 1, 5, 7) and r.sinks_shape == (3, 1, 1)
    assert resolve(VariantSpec("d", mask=MaskSpec("additive", ("d0", 1, "d2"))), (4, 6, 5), 1).mask_shape == (4, 1, 5)
    assert resolve(VariantSpec("s", sinks=True), (4, 6, 5), 1).sinks_shape == (4, 1, 5)  # one per row
    with pytest.raises(NotApplicable, match="'b' names no dim of a 3-d input"):
        resolve(v, (3, 5, 7), -1)
    with pytest.raises(NotApplicable, match="does not broadcast"):
        resolve(VariantSpec("m", mask=MaskSpec("bool", (4, "sk"))), (2, 3, 5, 7), -1)
    with pytest.raises(NotApplicable, match=r"sinks shape .* does not broadcast"):
        resolve(VariantSpec("s", sinks=True, sinks_shape=("sk",)), (2, 3, 5, 7), -1)  # sinks need size 1 in dim
    with pytest.raises(NotApplicable, match="causal needs the softmax over the last dim"):
        resolve(PRESETS["causal"], (5, 7), 0)
    with pytest.raises(NotApplicable, match="excludes whole rows; set empty_rows"):
        resolve(VariantSpec("r", mask=MaskSpec("bool", ("sq", 1))), (5, 7), -1)


def test_cells_a_variant_cannot_run_are_skipped_with_the_reason(tmp_path):
    cfg = load_config(write_matrix(tmp_path, {**BASE, "shapes": [[2, 3, 8, 12], {"shape": [6, 5], "dims": [0, 1]}],
                                       "variants": ["sinks", "causal"], "backends": ["torch", "peer:copy"]}))
    run = run_matrix(cfg)
    by = {(r.cell.backend, r.cell.variant.name, r.cell.shape, r.cell.dim): r for r in run.results}
    assert by[("torch", "causal", (6, 5), 0)].status == SKIPPED
    assert "causal needs the softmax over the last dim" in by[("peer:copy", "causal", (6, 5), 0)].reason
    assert by[("torch", "sinks", (2, 3, 8, 12), -1)].status == PASSED  # [h, 1, 1] on a 4-d input
    assert "'h' names no dim of a 2-d input" in by[("torch", "sinks", (6, 5), 0)].reason
    assert by[("torch", "causal", (6, 5), 1)].status == PASSED


def test_operands_are_fresh_random_with_the_stated_density_and_empty_rows_only_when_asked():
    shape = (4, 3, 64, 96)
    mask_of = lambda v, seed: make_operands(v, shape, -1, torch.float32, "cpu", seed).mask  # noqa: E731
    m1, m2 = mask_of(PRESETS["mask"], SEED), mask_of(PRESETS["mask"], SEED + 1)
    assert m1.shape == (4, 1, 64, 96) and not torch.equal(m1, m2)
    assert 0.27 < m1.float().mean().item() < 0.33
    assert not m1.all(-1).any()  # empty_rows not asked: every row keeps a position
    empty = mask_of(PRESETS["megatron"], SEED).all(-1)
    assert 0 < empty.sum().item() <= 4 * 64 // 10
    add = make_operands(PRESETS["additive"], shape, -1, torch.bfloat16, "cpu", SEED).mask
    low = add == torch.finfo(torch.bfloat16).min
    assert add.dtype == torch.bfloat16 and 0.17 < low.float().mean().item() < 0.23
    assert add[~low].abs().min() > 0 and add[~low].std() > 0.5  # fresh randn, no zeros
    s1 = make_operands(PRESETS["sinks"], shape, -1, torch.float16, "cpu", SEED).sinks
    s2 = make_operands(PRESETS["sinks"], shape, -1, torch.float16, "cpu", SEED + 1).sinks
    assert s1.shape == (3, 1, 1) and s1.dtype == torch.float16 and not torch.equal(s1, s2) and s1.abs().min() > 0


def test_the_composition_causal_mask_is_the_spec_one():
    from anysoftmax.core.variant import Variant

    for sq, sk in ((5, 7), (7, 5), (6, 6)):
        for form in ("top_left", "bottom_right"):
            keep = keep_mask((sq, sk), Variant(causal=form), None)
            assert torch.equal(~causal_excluded(sq, sk, form, "cpu"), keep)
            assert kept_in_plane(sq, sk, form) == int(keep.sum())


# ---------------------------------------------------------------- bytes

def test_bytes_a_fused_kernel_must_move():
    b, h, s = 2, 3, 4
    shape, n = (b, h, s, s), b * h * s * s  # 96 elements, 2 bytes each
    fwd = lambda v, **k: fused_bytes(v, shape, 2, "forward", **k)  # noqa: E731
    bwd = lambda v, **k: fused_bytes(v, shape, 2, "backward", **k)  # noqa: E731
    assert fwd(PRESETS["plain"]) == fwd(PRESETS["scale"]) == fwd(PRESETS["softcap"]) == Traffic(2 * n, 2 * n)
    assert fwd(PRESETS["sinks"]) == Traffic(2 * n, 2 * n)  # one logit per head: not counted
    # causal keeps 1 + 2 + 3 + 4 = 10 of each 4x4 plane: x read 6 * 10 elements
    assert fwd(PRESETS["causal"]) == Traffic(2 * 60, 2 * n)
    assert bwd(PRESETS["causal"]) == Traffic(2 * 2 * 60, 2 * n)  # y, dy: kept part; dx written whole
    # a bool mask [b, 1, sq, sk] is read as stored (1 byte each, not broadcast over heads)
    assert fwd(PRESETS["mask"], mask_shape=(b, 1, s, s)) == Traffic(2 * n + b * s * s, 2 * n)
    assert bwd(PRESETS["mask"], mask_shape=(b, 1, s, s)) == Traffic(2 * 2 * n + b * s * s, 2 * n)
    # an additive mask in the input's dtype; its gradient formula does not read it
    assert fwd(PRESETS["additive"], mask_shape=(b, 1, s, s), mask_itemsize=2) == Traffic(2 * n + 2 * b * s * s, 2 * n)
    assert bwd(PRESETS["additive"], mask_shape=(b, 1, s, s), mask_itemsize=2) == Traffic(2 * 2 * n, 2 * n)
    assert bwd(PRESETS["softcap"]) == Traffic(3 * 2 * n, 2 * n)  # y, dy and x (1 - tanh^2)
    # causal and a mask over (sq, sk): the mask read where rows are kept; bottom-right, sq < sk
    v = VariantSpec("v", mask=MaskSpec("bool", ("sq", "sk")), causal="bottom_right")
    assert kept_in_plane(2, 4, "bottom_right") == 3 + 4
    assert fused_bytes(v, (3, 2, 4), 4, "forward", mask_shape=(2, 4)) == Traffic(4 * 3 * 7 + 7, 4 * 24)
    # a mask broadcast over queries is read whole
    assert fused_bytes(v, (3, 2, 4), 4, "forward", mask_shape=(1, 4)) == Traffic(4 * 3 * 7 + 4, 4 * 24)


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("name", ["causal", "mask", "softcap", "gpt-oss"])
def test_the_copy_peer_moves_exactly_those_bytes(direction, name):
    cell = Cell(0, "e", "cpu", "peer:copy", "softmax", direction, "bfloat16", (2, 3, 16, 24), -1, True, 1, 1, True,
                SEED, PRESETS[name])
    inputs, fn, moved = fused_cells.fused_bench_inputs(cell, "cpu")
    r = resolve(cell.variant, cell.shape, -1)
    want = fused_bytes(cell.variant, cell.shape, 2, direction, r.mask_shape, 1).total
    out = fn(inputs[0])
    touched = sum(t.numel() * t.element_size() for t in inputs[0]) + out.numel() * out.element_size()
    assert moved == touched and abs(moved - want) < (2 if direction == "forward" else 3) * 2
    assert all(t.abs().sum() > 0 for t in inputs[0])  # fresh data, not zeros


def test_memory_estimate_of_large_cells_counts_one_chunk_of_the_float64_check():
    shape = (8, 16, 4096, 4096)
    cell = lambda v, backend="auto": Cell(0, "e", "npu", backend, "softmax", "backward", "bfloat16", shape, -1,  # noqa: E731
                                          True, 1, 1, False, 0, v)
    # on an NPU the float64 check runs on the CPU: one [4096, 4096] chunk at a time
    assert memory.bytes_needed(cell(PRESETS["mask"]), "npu:0")["cpu"] == 4096 * 4096 * 8 * 14
    assert memory.bytes_needed(cell(PRESETS["plain"]), "npu:0")["cpu"] == 4096 * 4096 * 8 * 7
    # sinks [h, 1, 1] are shared over the batch: a chunk is [8, 1, 4096, 4096]
    assert memory.bytes_needed(cell(PRESETS["sinks"]), "npu:0")["cpu"] == 8 * 4096 * 4096 * 8 * 14
    ours = memory.bytes_needed(cell(PRESETS["mask"]), "cuda:0")["cuda:0"]
    assert 8 * 16 * 4096 * 4096 * 2 * 4 < ours < 80e9  # x, y, dy, dx at least; fits an H100
    assert memory.bytes_needed(cell(PRESETS["softcap"], "peer:torch"), "cuda:0")["cuda:0"] > ours  # float32 steps


# ---------------------------------------------------------------- conformance

def variants_config(tmp_path, **data):
    base = {"seed": SEED, "shapes": ATT, "variants": list(PRESETS) + CUSTOM,
            "devices": [{"name": "cpu", "device": "cpu"}]}
    return load_config(write_matrix(tmp_path, {**base, **data}))


def test_every_variant_passes_on_torch_triton_and_the_torch_composition(tmp_path):
    cfg = variants_config(tmp_path, backends=["torch", "triton", "peer:torch"], ops=["softmax", "log_softmax"],
                          directions=["forward", "backward"], dtypes=["float32", "bfloat16"])
    run = run_matrix(cfg)
    assert len(run.results) == 3 * 2 * 2 * 2 * len(cfg.devices[0].variants) * 2
    bad = [(r.cell.id, r.reason) for r in run.results if r.status != PASSED]
    assert not bad, bad[:5]
    assert all(r.err_ratio is not None and 0 <= r.err_ratio <= 1 for r in run.results)


def _wrong(transform):
    """providers.fused_forward with the output (or the sinks, before the call) transformed."""
    real = providers.fused_forward

    def make(name, *a):
        fn = real(name, *a)
        return lambda x, mask, sinks: transform(fn, x, mask, sinks)
    return make


@pytest.mark.parametrize("case,variant,direction,message", [
    ("output 2% off", "scale", "forward", "exceeds"),
    ("sink left out", "sinks", "forward", "exceeds"),
    ("sink gradient doubled", "gpt-oss", "backward", "dsinks error"),
    ("empty rows NaN instead of zero", "megatron", "forward", "NaN mismatch"),
    ("mask ignored in the gradient", "mask", "backward", "gradient error"),
], ids=lambda v: v if isinstance(v, str) and " " in v else "")
def test_a_wrong_fused_result_fails(tmp_path, monkeypatch, case, variant, direction, message):
    def grad_twice(t):  # identity forward, doubled gradient
        return t.detach() + 2 * (t - t.detach())

    transforms = {
        "output 2% off": lambda fn, x, m, s: fn(x, m, s) * 1.02,
        "sink left out": lambda fn, x, m, s: fn(x, m, None),
        "sink gradient doubled": lambda fn, x, m, s: fn(x, m, grad_twice(s)),
        "empty rows NaN instead of zero": lambda fn, x, m, s: fn(x, m, s).masked_fill(m.all(-1, keepdim=True), math.nan),
        "mask ignored in the gradient": lambda fn, x, m, s: fn(x, m, s).detach() + (
            torch.softmax(x.float(), -1) - torch.softmax(x.float(), -1).detach()).to(x.dtype),
    }
    monkeypatch.setattr(providers, "fused_forward", _wrong(transforms[case]))
    cfg = variants_config(tmp_path, backends=["torch"], variants=[variant], directions=[direction],
                          shapes=[[2, 3, 16, 24]])
    (r,) = run_matrix(cfg).results
    assert r.status == FAILED and message in r.reason, (case, r.reason)


@pytest.mark.parametrize("variants", [["mask", "gpt-oss"], ["plain"]], ids=["fused", "plain"])
def test_large_inputs_are_checked_chunk_by_chunk_every_row(tmp_path, monkeypatch, variants):
    monkeypatch.setattr(chunks, "CHECK_ELEMS", 16 * 24)  # a chunk per (batch, head) of [2, 3, 16, 24]
    shape = (2, 3, 16, 24)
    whole = lambda v: fused_cells.whole_dims(shape, PRESETS[v], resolve(PRESETS[v], shape, -1))  # noqa: E731
    assert len(chunks.row_chunks(shape, -1, whole("mask"))) == 6
    # sinks [h, 1, 1] are shared over the batch: it stays whole, one chunk per head
    assert len(chunks.row_chunks(shape, -1, whole("sinks"))) == 3
    cfg = variants_config(tmp_path, backends=["torch", "peer:torch"], variants=variants, shapes=[list(shape)],
                          directions=["forward", "backward"])
    assert {r.status for r in run_matrix(cfg).results} == {PASSED}

    def last_row_off(fn):  # wrong in one kept element of the last row: the last chunk only
        def run(x, *operands):
            y = fn(x, *operands)
            bump = torch.zeros_like(y)
            bump[-1, -1, -1, 0] = 0.01
            return y + bump
        return run
    for name in ("fused_forward", "forward", "backward"):
        real = getattr(providers, name)
        monkeypatch.setattr(providers, name, lambda *a, real=real: last_row_off(real(*a)))
    results = run_matrix(cfg).results
    assert all(r.status == FAILED for r in results)
    last = {"mask": "chunk 6 of 6", "gpt-oss": "chunk 3 of 3", "plain": "chunk 6 of 6"}
    assert all(last[r.cell.variant.name] in r.reason for r in results), [r.reason for r in results]


def test_row_kernels_compute_the_plain_softmax_only():
    for peer in ("peer:seed", "peer:quack", "peer:liger"):
        try:
            providers.fused_forward(peer, "softmax", -1, (2, 3, 4, 4), "cuda", PRESETS["scale"])
        except Exception as exc:
            if peer == "peer:seed" or "not importable" not in str(exc):  # a missing package says so first
                assert "plain softmax only" in str(exc) and "scale=0.125" in str(exc), exc
        else:
            pytest.fail(f"{peer} accepted a fused variant")


def test_reports_name_each_variant(tmp_path):
    cfg = variants_config(tmp_path, backends=["torch", "peer:copy"], variants=["plain", "gemma2"],
                          shapes=[[2, 3, 16, 24]], checks=["conformance", "benchmark"],
                          benchmark={"warmup_ms": 1, "rep_ms": 2, "cpu": True})
    run = run_matrix(cfg)
    paths = write_reports(run, tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Variants" in md and "| `gemma2` | scale=0.125, softcap=50, mask=additive[b, 1, sq, sk]@0.2 |" in md
    assert "| dtype | variant | cells |" in md and "| dtype | variant | shape |" in md
    csv_text = (tmp_path / "out" / "report.csv").read_text()
    header = csv_text.splitlines()[0].split(",")
    assert "variant" in header and "variant_desc" in header and "variant_spec" not in header
    back = load_report(tmp_path / "out" / "report.json")
    assert [r.cell for r in back.results] == [r.cell for r in run.results]
    assert any(p.name == "status.png" for p in paths) and any(p.name.startswith("bandwidth_") for p in paths)
    gemma = [r for r in run.results if r.cell.variant.name == "gemma2" and r.cell.backend == "torch"][0]
    assert gemma.gbps > 0 and gemma.frac_copy > 0  # timed against the bytes a fused kernel moves


def test_plain_runs_keep_their_tables(tmp_path):
    run = run_matrix(load_config(write_matrix(tmp_path, BASE)))
    assert isinstance(run, MatrixRun) and "variant" not in markdown(run, [])
