"""Integrations with model libraries. Each submodule imports its library (an optional extra)
only when it is imported itself:

* `anysoftmax.integrations.transformers` (`pip install anysoftmax[hf]`): importing it registers
  the attention implementation ``"anysoftmax"`` with Hugging Face transformers.
"""
