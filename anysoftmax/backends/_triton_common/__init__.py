"""The Triton layer shared by the `triton` and `triton_ascend` backends: the kernels (rows, cols,
bwd, sharded, logsumexp, merge_states; fused: the fused family's steps), their typed plans (plan),
the one launch engine (launcher, native_launch), the softmax's and logsumexp's launchers of one
request (softmax_launchers, lse_rows), the traced path (traced) and the interpreter choice
(interpreter). Backends plan; this package launches a plan and never calls back into a backend.
"""
