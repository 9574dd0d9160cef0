"""Drop-ins for vendor softmax entry points, each a thin mapping onto `anysoftmax.softmax`
(whose fused keywords `anysoftmax.core.variant` defines):

* `anysoftmax.compat.megatron`: apex/Megatron-LM's `scaled_softmax`, `scaled_masked_softmax`,
  `scaled_upper_triang_masked_softmax` and `FusedScaleMaskSoftmax`;
* `anysoftmax.compat.torch_npu`: `npu_scaled_masked_softmax`;
* `anysoftmax.compat.vllm`: `merge_attn_states` (onto `anysoftmax.merge_states`) and the v1
  sampler's `apply_top_k_top_p` (onto `anysoftmax.sampling`);
* `anysoftmax.compat.flashinfer`: FlashInfer's sampling functions (onto `anysoftmax.sampling`;
  docs/sampling.md, "Drop-ins", lists the differences).

They run on every device anysoftmax serves and have no length limits. None of Megatron,
torch_npu, vLLM or FlashInfer is imported.
"""
