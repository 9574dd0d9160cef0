"""Per-call cost of the `wave` runtime, before and after, in one process and interleaved, so
that the machine's drift (thread wake-up latency varies from run to run on a VM) hits both:

* `sync`: the previous runtime's call: torch's stream synchronised, x and y imported through
  DLPack, Wave's synchronous entry point (`isolated_benchmark`, compiled by the previous code:
  `--before-vmfb`), the result exported back through DLPack and compared with y;
* `async, blocking wait` and `async, polled wait`: `runtime.launch` with the asynchronous entry
  point, its fence waited on at once (`SPIN_S = 0`) or polled first (the default);
* `chained`: 4096x4096 through IREE's queue, calls chained by fences, one wait at the end.

    ANYSOFTMAX_WAVE_ON_CUDA=1 python benchmarks/wave_ab.py --before-vmfb F --out DIR

Writes DIR/latency_wave_ab.json: per round and the median, us per call back to back.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from anysoftmax.backends.wave import runtime
from anysoftmax.backends.wave.backend import WaveBackend
from anysoftmax.core import SoftmaxSpec
from anysoftmax.testing.compare import compare
from anysoftmax.perf import back_to_back_us


def sync_call(dev, vmfb: bytes):
    """The previous runtime's call on Wave's synchronous entry point, on device `dev`."""
    import iree.runtime as rt

    module = rt.VmModule.copy_buffer(dev.instance, vmfb)
    context = rt.VmContext(dev.instance, [rt.create_hal_module(dev.instance, dev.hal), module])
    function = module.lookup_function("isolated_benchmark")

    def call(x, y):
        torch.cuda.current_stream().synchronize()
        args = rt.VmVariantList(2)
        args.push_ref(runtime._import(dev, x))
        args.push_ref(runtime._import(dev, y))
        rets = rt.VmVariantList(1)
        context.invoke(function, args, rets)
        result = runtime._export(dev, rets.get_variant(0).deref(rt.HalBufferView), y)
        assert result.data_ptr() == y.data_ptr()
    return call


def run(before_vmfb: Path, out: Path, rounds: int, calls: int) -> dict:
    x = torch.randn(8, 1024, device="cuda") * 3
    y = torch.empty_like(x)
    spec = SoftmaxSpec.from_tensor(x, -1)
    loaded, _ = WaveBackend()._kernel(spec, x.device)
    old = sync_call(loaded.device, before_vmfb.read_bytes())
    old(x, y)
    assert compare(y, x, spec, "cuda").ok
    y.zero_()
    runtime.launch(loaded, x, y)
    assert compare(y, x, spec, "cuda").ok
    spin = runtime.SPIN_S

    def polled():
        runtime.SPIN_S = spin
        runtime.launch(loaded, x, y)

    def blocking():
        runtime.SPIN_S = 0.0
        runtime.launch(loaded, x, y)

    cases = {"sync entry point (before)": lambda: old(x, y), "async, blocking wait": blocking,
             "async, polled wait (default)": polled}
    rows = {name: [] for name in cases}
    for _ in range(rounds):
        for name, call in cases.items():
            rows[name].append(back_to_back_us(call, "cuda", calls, warmup=20))
    runtime.SPIN_S = spin
    big = torch.randn(4096, 4096, device="cuda") * 3
    bspec = SoftmaxSpec.from_tensor(big, -1)
    bloaded, _ = WaveBackend()._kernel(bspec, big.device)
    by = torch.empty_like(big)
    views = (runtime._import(bloaded.device, big), runtime._import(bloaded.device, by))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from wave_latency import _chained_us

    chained = [_chained_us(bloaded, views, 200) for _ in range(rounds)]
    assert compare(by, big, bspec, "cuda").ok
    nbytes = 2 * big.numel() * 4
    doc = dict(device=torch.cuda.get_device_name(), shape=[8, 1024], dtype="float32", calls_per_round=calls,
               per_call_us={k: dict(rounds=v, median=statistics.median(v)) for k, v in rows.items()},
               chained_4096x4096=dict(us_rounds=chained, gbps_rounds=[nbytes / us / 1e3 for us in chained],
                                      gbps_median=nbytes / statistics.median(chained) / 1e3))
    out.mkdir(parents=True, exist_ok=True)
    (out / "latency_wave_ab.json").write_text(json.dumps(doc, indent=1))
    return doc


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before-vmfb", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=1000)
    a = p.parse_args()
    print(json.dumps(run(Path(a.before_vmfb), Path(a.out), a.rounds, a.calls), indent=1))
