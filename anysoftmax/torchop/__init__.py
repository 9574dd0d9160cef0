"""anysoftmax as a torch operator: the public functions (`api`, `lse_merge`), the `torch.library`
operators (`ops`, `traced_ops`) with their autograd, vmap rules and registration, and the
override of torch's own softmax (`override`). Everything here sits above `anysoftmax.dispatch`.
"""
