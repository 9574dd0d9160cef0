"""Drop-ins for vendor softmax entry points, each a thin mapping onto `anysoftmax.softmax`
(whose fused keywords `anysoftmax.core.variant` defines):

* `anysoftmax.compat.megatron`: apex/Megatron-LM's `scaled_softmax`, `scaled_masked_softmax`,
  `scaled_upper_triang_masked_softmax` and `FusedScaleMaskSoftmax`;
* `anysoftmax.compat.torch_npu`: `npu_scaled_masked_softmax`.

They run on every device anysoftmax serves and have no length limits. Neither Megatron nor
torch_npu is imported.
"""
