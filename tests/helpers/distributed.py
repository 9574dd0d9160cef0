"""Workers of the gloo tests that need ranks to disagree (`tests/distributed`): spawned
processes import them from here."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


def mismatched_rows(rank: int, init: str, out: str) -> None:
    """Rank r calls with r more rows than rank 0; writes the error each rank got to out.<r>."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    import anysoftmax.distributed as asd

    try:
        asd.softmax(torch.randn(3 + rank, 5), -1)
        message = "no error"
    except RuntimeError as exc:
        message = str(exc)
    with open(f"{out}.{rank}", "w") as f:
        f.write(message)
    dist.destroy_process_group()
