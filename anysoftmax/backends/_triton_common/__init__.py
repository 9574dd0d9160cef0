"""The Triton layer shared by the `triton` and `triton_ascend` backends: one algorithm.

rows.py / cols.py / bwd.py   the @triton.jit kernels (imported lazily by the plans)
plan.py                      one typed plan per kernel kind, each building its launch arguments
launcher.py                  barrier counters, first-compile locks, `bind(plan) -> launch`
native_launch.py / .cc       the optional C++ launcher of compiled kernels (TVM-FFI)
request.py                   launchers bound to one request (the backends' shared `run`)
interpreter.py               compiled or interpreted: decided once, before kernels are defined

Backends plan; this package launches a plan and never calls back into a backend.
"""
