"""Hugging Face models with attn_implementation "eager", "sdpa" and "anysoftmax", on a CUDA GPU.

    python -m anysoftmax.bench.models --out DIR [--families gemma2 gpt_oss llama gpt2]
        [--seqs 1024 2048 4096] [--batch 4] [--layers 2] [--steps 20] [--budget-s 600]
    python -m anysoftmax.bench.models --from-json DIR/models.json --out DIR   # tables and plot again

Per family (per-layer shapes of a released model, `--layers` decoder layers, a 32000-token
vocabulary; `FAMILIES`), per sequence length, bf16, batch `--batch`:
* ``model``: a whole step: ``fwd`` (no_grad forward, logits) and ``fwd+bwd`` (forward with a
  cross-entropy loss on the inputs as labels, then backward; no optimizer). Medians of
  `--steps` steps per implementation, interleaved (eager, sdpa, anysoftmax, eager, ...: a small
  model's step time is host-noisy, and slow drifts of the GPU clock then hit every
  implementation alike), each step between two synchronizations, timed with CUDA events.
* ``attention``: the attention module of layer 0 alone (projections, rotary, the attention
  function), on the inputs the model gives it under that implementation (its own mask);
  `triton.testing.do_bench` medians (L2 flushed between repeats), ``fwd`` under no_grad and
  ``fwd+bwd`` (gradients of the hidden states and the module's weights).
`sdpa` runs where the model declares it (not gpt-oss: it has sinks); Gemma2 declares it but its
sdpa path drops the logit softcap: the table marks that it is not the same function. A
configuration that runs out of GPU memory is recorded as "OOM".

Accuracy (at the first sequence length): the logits of the bf16 model with each implementation
against the same weights in float32 with eager attention; ``ok`` when anysoftmax's relative
error (2-norm) is at most twice eager's plus bf16 eps / 8 (the rule of tests/integrations/hf).

Writes DIR/models.json, DIR/models.md (tables) and DIR/models.png (speed-up over eager).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import platform
import sys
import time
from pathlib import Path

import torch

FAMILIES = {  # per-layer shapes of: Gemma-2-2B, gpt-oss-20b, Llama-3.2-1B, GPT-2 medium
    "gemma2": dict(cls="Gemma2Config", hidden_size=2304, intermediate_size=9216, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0, sliding_window=4096),
    "gpt_oss": dict(cls="GptOssConfig", hidden_size=2880, intermediate_size=2880, num_attention_heads=64,
                    num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
                    sliding_window=128),
    "llama": dict(cls="LlamaConfig", hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=64, rope_theta=500000.0),
    "gpt2": dict(cls="GPT2Config", n_embd=1024, n_head=16, n_positions=8192, attn_pdrop=0.0, resid_pdrop=0.0,
                 embd_pdrop=0.0),
}
NOT_THE_SAME_FUNCTION = {("gemma2", "sdpa"): "sdpa drops Gemma2's logit softcap"}
IMPLEMENTATIONS = ("eager", "sdpa", "anysoftmax")
VOCAB = 32000
WARMUP = 2  # untimed rounds of whole-model steps (Triton compiles anysoftmax's kernels in the first)
DEVICE = "cuda"


def build(family: str, layers: int, dtype=torch.bfloat16):
    """The bf16 causal LM of `family` (see FAMILIES) with `layers` layers, random weights, in
    train mode (every dropout probability is 0)."""
    import transformers

    spec = dict(FAMILIES[family])
    cfg_cls = getattr(transformers, spec.pop("cls"))
    if family == "gpt2":
        cfg = cfg_cls(vocab_size=VOCAB, n_layer=layers, **spec)
    else:
        cfg = cfg_cls(vocab_size=VOCAB, num_hidden_layers=layers, max_position_embeddings=8192, attention_dropout=0.0,
                      **spec)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    return model.to(DEVICE, dtype).train()


def implementations(model) -> list[str]:
    """The implementations the model can run: sdpa only where it declares support."""
    return [i for i in IMPLEMENTATIONS if i != "sdpa" or getattr(model, "_supports_sdpa", False)]


def attention_layer(model) -> torch.nn.Module:
    """Layer 0's attention module."""
    base = model.base_model
    layers = base.layers if hasattr(base, "layers") else base.h
    return layers[0].self_attn if hasattr(layers[0], "self_attn") else layers[0].attn


def capture_attention_inputs(model, ids) -> tuple[tuple, dict]:
    """(args, kwargs) that layer 0's attention module receives in a forward of `ids` under the
    model's current implementation."""
    seen = {}

    def hook(module, args, kwargs):
        seen["call"] = (args, kwargs)
        raise _Captured

    handle = attention_layer(model).register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(ids, use_cache=False)
    except _Captured:
        pass
    finally:
        handle.remove()
    return seen["call"]


class _Captured(Exception):
    """Stops the forward once layer 0's attention inputs are seen."""


def _hidden_first(args, kwargs, hidden):
    # The hidden states are the first positional argument, or the `hidden_states` keyword.
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


def _hidden(args, kwargs) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def interleaved_ms(steps: dict, n: int, warmup: int = WARMUP) -> dict:
    """{name: sorted step times in ms} of `steps` {name: (prepare, run)}, run round-robin:
    `warmup` rounds untimed, then `n` timed rounds; each timed step between synchronizations
    (prepare() outside the timed window). A name whose step raises OOM maps to "OOM"."""
    out, live = {}, dict(steps)
    for _ in range(warmup):
        for name, (prepare, run) in list(live.items()):
            try:
                prepare()
                run()
            except torch.cuda.OutOfMemoryError:
                out[name] = "OOM"
                del live[name]
                _free()
    times = {name: [] for name in live}
    for _ in range(n):
        for name, (prepare, run) in live.items():
            prepare()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    out.update({name: sorted(t) for name, t in times.items()})
    return out


def _free():
    gc.collect()
    torch.cuda.empty_cache()


def model_steps(model, ids, impls, direction: str) -> dict:
    """{impl: (prepare, run)} of whole-model steps."""
    def prepare(impl):
        return lambda: (model.set_attn_implementation(impl), model.zero_grad(set_to_none=True))

    if direction == "fwd":
        def run():
            with torch.no_grad():
                model(ids, use_cache=False)
    else:
        def run():
            model(ids, labels=ids, use_cache=False).loss.backward()
    return {impl: (prepare(impl), run) for impl in impls}


def attention_ms(model, ids, impl: str, direction: str) -> float:
    """do_bench median (ms) of layer 0's attention module under `impl`."""
    import triton

    model.set_attn_implementation(impl)
    args, kwargs = capture_attention_inputs(model, ids)
    attn = attention_layer(model)
    if direction == "fwd":
        def step():
            with torch.no_grad():
                attn(*args, **kwargs)
    else:
        hidden = _hidden(args, kwargs).detach().requires_grad_()
        a, kw = _hidden_first(args, kwargs, hidden)
        grad = torch.randn_like(hidden)

        def step():
            out = attn(*a, **kw)[0]
            out.backward(grad)
    try:
        return triton.testing.do_bench(step, warmup=25, rep=150, return_mode="median")
    finally:
        model.zero_grad(set_to_none=True)


def accuracy(model, ids, impls) -> dict:
    """Relative 2-norm error of the bf16 logits per implementation against a float32 copy with
    eager attention, and whether anysoftmax's is within twice eager's plus bf16 eps / 8."""
    ref = copy.deepcopy(model).float()
    ref.set_attn_implementation("eager")
    with torch.no_grad():
        expected = ref(ids, use_cache=False).logits.double()
        del ref
        _free()
        errs = {}
        for impl in impls:
            model.set_attn_implementation(impl)
            got = model(ids, use_cache=False).logits.double()
            errs[impl] = ((got - expected).norm() / expected.norm()).item()
    bound = 2 * errs["eager"] + torch.finfo(torch.bfloat16).eps / 8
    return {"rel_err": errs, "bound": bound, "ok": errs["anysoftmax"] <= bound}


def run(args) -> dict:
    import transformers
    import triton

    import anysoftmax.integrations.transformers as hf

    t0 = time.monotonic()
    result = {"device": torch.cuda.get_device_name(), "dtype": "bf16", "batch": args.batch, "layers": args.layers,
              "vocab": VOCAB, "steps": args.steps, "torch": torch.__version__, "triton": triton.__version__,
              "transformers": transformers.__version__, "python": platform.python_version(),
              "families": {f: FAMILIES[f] for f in args.families}, "rows": [], "accuracy": {}, "skipped": []}
    for family in args.families:
        model = build(family, args.layers)
        impls = implementations(model)
        for i, seq in enumerate(args.seqs):
            if time.monotonic() - t0 > args.budget_s:
                result["skipped"].append(f"{family} S={seq}: time budget ({args.budget_s} s) spent")
                continue
            ids = torch.randint(0, VOCAB, (args.batch, seq), device=DEVICE)
            if i == 0:
                try:
                    result["accuracy"][f"{family} S={seq}"] = accuracy(model, ids, impls)
                except torch.cuda.OutOfMemoryError:
                    result["accuracy"][f"{family} S={seq}"] = "OOM"
                _free()
            for direction in ("fwd", "fwd+bwd"):
                before = hf.calls["forward"]
                times = interleaved_ms(model_steps(model, ids, impls, direction), args.steps)
                for impl in impls:
                    row = _row(family, seq, impl, "model", direction, times.get(impl, "OOM"))
                    if impl == "anysoftmax" and row["status"] == "ok":  # proof that every layer was served
                        row["calls_per_step"] = (hf.calls["forward"] - before) / (WARMUP + args.steps)
                    result["rows"].append(row)
                _free()
                for impl in impls:
                    try:
                        ms = attention_ms(model, ids, impl, direction)
                    except torch.cuda.OutOfMemoryError:
                        ms = "OOM"
                    result["rows"].append(_row(family, seq, impl, "attention", direction, ms))
                    _free()
            print(f"[{time.monotonic() - t0:6.1f} s] {family} S={seq} done", flush=True)
        del model
        _free()
    result["wall_s"] = round(time.monotonic() - t0, 1)
    return result


def _row(family, seq, impl, scope, direction, t) -> dict:
    row = {"family": family, "seq": seq, "impl": impl, "scope": scope, "direction": direction}
    if t == "OOM" or (isinstance(t, list) and not t):
        return {**row, "status": "OOM", "ms": None}
    if isinstance(t, list):
        return {**row, "status": "ok", "ms": t[len(t) // 2], "p10": t[len(t) // 10], "p90": t[(9 * len(t)) // 10],
                "n": len(t)}
    return {**row, "status": "ok", "ms": t}


def _cells(result: dict) -> dict:
    return {(r["family"], r["seq"], r["scope"], r["direction"], r["impl"]): r for r in result["rows"]}


def table(result: dict) -> str:
    """Markdown: ms per implementation and anysoftmax's speed-up over eager, per family,
    sequence, scope and direction; the accuracy check after."""
    cells = _cells(result)
    lines = [f"{result['device']}, bf16, batch {result['batch']}, {result['layers']} layers, vocab {result['vocab']}, "
             f"torch {result['torch']}, Triton {result['triton']}, transformers {result['transformers']}",
             "", "| family | S | scope | direction | eager ms | sdpa ms | anysoftmax ms | anysoftmax vs eager |",
             "|---|---|---|---|---|---|---|---|"]
    keys = sorted({k[:4] for k in cells}, key=lambda k: (list(result["families"]).index(k[0]), k[1], k[2], k[3]))
    for family, seq, scope, direction in keys:
        def ms(impl):
            r = cells.get((family, seq, scope, direction, impl))
            if r is None:
                return "–"
            if r["status"] != "ok":
                return r["status"]
            note = " (not the same function)" if (family, impl) in NOT_THE_SAME_FUNCTION else ""
            return f"{r['ms']:.2f}{note}"
        e, a = cells.get((family, seq, scope, direction, "eager")), cells.get((family, seq, scope, direction, "anysoftmax"))
        speed = f"{e['ms'] / a['ms']:.2f}x" if e and a and e["status"] == a["status"] == "ok" else "–"
        lines.append(f"| {family} | {seq} | {scope} | {direction} | {ms('eager')} | {ms('sdpa')} | {ms('anysoftmax')} "
                     f"| {speed} |")
    lines += ["", "Accuracy (logits, relative 2-norm error against float32 eager of the same weights):", ""]
    for key, acc in result.get("accuracy", {}).items():
        if acc == "OOM":
            lines.append(f"- {key}: OOM")
            continue
        errs = ", ".join(f"{k} {v:.2e}" for k, v in acc["rel_err"].items())
        lines.append(f"- {key}: {errs}; bound {acc['bound']:.2e}: {'ok' if acc['ok'] else 'FAILED'}")
    lines += [f"- skipped: {s}" for s in result.get("skipped", [])]
    notes = [f"- {f} sdpa: {why}" for (f, i), why in NOT_THE_SAME_FUNCTION.items() if f in result["families"]]
    return "\n".join(lines + notes) + "\n"


def plot(result: dict, path: Path) -> None:
    """Speed-up over eager (anysoftmax and sdpa) per sequence length, one panel per family,
    lines per scope and direction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = _cells(result)
    families = list(result["families"])
    fig, axes = plt.subplots(1, len(families), figsize=(4.5 * len(families), 4), squeeze=False)
    for ax, family in zip(axes[0], families):
        for c, (scope, direction) in enumerate([(s, d) for s in ("attention", "model") for d in ("fwd", "fwd+bwd")]):
            for impl, style in (("anysoftmax", "-"), ("sdpa", ":")):
                pts = []
                for seq in sorted({k[1] for k in cells if k[0] == family}):
                    e, o = cells.get((family, seq, scope, direction, "eager")), cells.get((family, seq, scope, direction, impl))
                    if e and o and e["status"] == o["status"] == "ok":
                        pts.append((seq, e["ms"] / o["ms"]))
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", color=f"C{c}", label=f"{impl} {scope} {direction}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{family} ({result['device']}, bf16)", fontsize=9)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("speed-up over eager")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(result: dict, out: Path) -> None:
    """models.json, models.md and (with matplotlib) models.png in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "models.json").write_text(json.dumps(result, indent=1))
    (out / "models.md").write_text(table(result))
    try:
        plot(result, out / "models.png")
    except ImportError:
        print("no plot: matplotlib is not installed (pip install 'anysoftmax[plot]')")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m anysoftmax.bench.models", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument("--seqs", nargs="+", type=int, default=[1024, 2048, 4096])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="timed steps per implementation (model scope)")
    p.add_argument("--budget-s", type=float, default=600.0, help="start no new sequence length after this")
    p.add_argument("--from-json", type=Path, help="re-write the tables and plot of an earlier run")
    args = p.parse_args(argv)
    if args.from_json:
        result = json.loads(args.from_json.read_text())
    else:
        if not torch.cuda.is_available():
            print("python -m anysoftmax.bench.models needs a CUDA GPU", file=sys.stderr)
            return 2
        result = run(args)
    write(result, args.out)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
