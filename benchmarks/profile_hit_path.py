"""Where a repeated request's host time goes (run on a CUDA host): us per call of anysoftmax's
forward and backward hit paths beside torch's call and a bare allocation, then cProfile."""

import cProfile
import pstats
import time

import torch

import anysoftmax


def per_call_us(f, n=5000):
    for _ in range(200):
        f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


x = torch.randn(8, 1024, device="cuda")
y = anysoftmax.softmax(x, -1)
g = torch.randn_like(y)
for name, f in (("anysoftmax forward", lambda: anysoftmax.softmax(x, -1)),
                ("anysoftmax backward", lambda: anysoftmax.softmax_backward(y, g, -1)),
                ("torch.softmax", lambda: torch.softmax(x, -1)),
                ("torch._softmax_backward_data", lambda: torch._softmax_backward_data(g, y, -1, y.dtype)),
                ("torch.empty", lambda: torch.empty((8, 1024), dtype=torch.float32, device=x.device))):
    print(f"{name:32s} {per_call_us(f):7.2f} us/call")
prof = cProfile.Profile()
prof.enable()
for _ in range(5000):
    anysoftmax.softmax(x, -1)
    anysoftmax.softmax_backward(y, g, -1)
prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(18)
