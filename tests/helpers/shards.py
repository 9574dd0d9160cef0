"""The Triton sampler over a vocabulary cut into equal shards, in one process: what
`anysoftmax.distributed.sample` does across ranks, without the collectives."""

from __future__ import annotations

import torch

from anysoftmax.backends._triton_common import sampling as triton_sampling
from anysoftmax.sampling.spec import SamplingSpec


def sharded_sample(x: torch.Tensor, keywords: dict, plan, shards: int = 2) -> torch.Tensor:
    """Ids of `x`'s rows ([rows, V], V a multiple of `shards`) drawn with `keywords`: each shard's
    `scan_shard`, the workspaces' shared prefixes stacked in rank order, then `select_shards`."""
    vocab = x.shape[-1]
    size = vocab // shards
    parts = []
    for lo in range(0, vocab, size):
        shard = x[:, lo:lo + size].contiguous()
        ws, space, _ = triton_sampling.scan_shard(SamplingSpec.from_request("sample", shard, **keywords), shard, lo,
                                                  vocab, plan=plan)
        parts.append(ws[:space.shard_words])
    spec = SamplingSpec.from_request("sample", x[:, :size], **keywords)
    return triton_sampling.select_shards(spec, torch.stack(parts), shards, vocab, plan)
