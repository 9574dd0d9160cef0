"""anysoftmax as a torch operator: the public functions (`api`, `lse_merge`), the `torch.library`
operators (`ops`, `traced_ops`) with their autograd (`autodiff`), vmap rules (`batching`) and
registration (`registration`), the test of which path a call takes (`grad_mode`), and the
override of torch's own softmax (`override`).

Everything here sits above `anysoftmax.dispatch`: these modules turn a call into a request;
dispatch turns a request into a launch.
"""
