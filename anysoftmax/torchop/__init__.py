"""anysoftmax as a torch operator: the public functions, the `torch.library` operators with their
autograd and vmap rules, and the override of torch's own softmax; all above `anysoftmax.dispatch`."""
