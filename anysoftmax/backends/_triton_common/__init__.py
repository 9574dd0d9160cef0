"""The Triton layer shared by `triton` and `triton_ascend`: the kernels, their plans (plan), the launch
engine (launcher, native_launch), the launchers of one request (softmax_launchers, lse_rows), the traced
path (traced) and the interpreter choice (interpreter). It launches plans, never calling a backend.
"""
