"""The Triton layer shared by `triton` and `triton_ascend`: kernels, plans, the launch engine, the
launchers of one request, the traced path and the interpreter choice; it never calls a backend."""
