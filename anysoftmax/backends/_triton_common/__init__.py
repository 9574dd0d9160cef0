"""The Triton layer shared by the `triton` and `triton_ascend` backends: one algorithm.

rows.py / cols.py / bwd.py / sharded.py   the softmax's @triton.jit kernels (imported lazily)
logsumexp.py / merge_states.py   logsumexp's and merge_states' kernels and their launchers
plan.py                      one typed plan per softmax kernel kind, each building its launch arguments
launcher.py                  the one launch engine: a kernel bound to one request (`Binding`)
native_launch.py / .cc       the optional C++ launcher of compiled kernels (TVM-FFI)
softmax_launchers.py         the softmax's launchers bound to one request (the backends' shared `run`)
lse_rows.py                  logsumexp from the softmax's row kernels
interpreter.py               compiled or interpreted: decided once, before kernels are defined

Backends plan; this package launches a plan and never calls back into a backend.
"""
