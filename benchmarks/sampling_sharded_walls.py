"""The sharded sampler across the ranks (one GPU each, the vocabulary cut in rank order), back to
back: `anysoftmax.distributed.sample` with the workspaces crossing through the mailbox kernel (the
default on NVIDIA GPUs) and through the all-gather (`kernel_sampling.mailbox_refusal` made to
refuse), and the local `sample` of the shard; us per call over 40 calls after 5 warm-ups, one sync
at the end. First, 3 offsets a shape: the sharded ids against `sample` on the whole logits,
interleaved with the one-read sharded softmax on the same mailbox (its result against
torch.softmax).

    python -m torch.distributed.run --nproc_per_node=2 benchmarks/sampling_sharded_walls.py OUT.json   # or 4

bf16 logits [B, 128256], B = 1, 8, 32, 128, 512; per-row temperature and seeds, top_k 50, top_p
0.9, min_p 0.05. Rank 0 writes OUT.json (with a "failures" list).
"""
import json
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.getcwd())
import anysoftmax.distributed as asd  # noqa: E402
import anysoftmax.sampling as sampling  # noqa: E402
from anysoftmax.distributed import kernel_sampling  # noqa: E402
from anysoftmax.perf import back_to_back_us  # noqa: E402

dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
dev = torch.device("cuda", rank)
torch.cuda.set_device(dev)
out = sys.argv[1]
res, bad = {}, []
refusal = kernel_sampling.mailbox_refusal
for V in (128256,):
    for B in (1, 8, 32, 128, 512):
        g = torch.Generator(device=dev).manual_seed(B + V)
        logits = (torch.randn(B, V, device=dev, generator=g) * 4).bfloat16()
        keys = dict(top_k=50, top_p=0.9, min_p=0.05, temperature=torch.rand(B, device=dev, generator=g) + 0.5,
                    seed=torch.randint(0, 2**62, (B,), device=dev, generator=g))
        lo, hi = rank * V // world, (rank + 1) * V // world
        shard = logits[:, lo:hi].contiguous()
        for k in range(3):  # correctness, interleaved with the one-read softmax on the same mailbox
            ids = asd.sample(shard, **keys, offset=k, backend="triton")
            want = sampling.sample(logits, **keys, offset=k, backend="triton")
            if not torch.equal(ids, want):
                bad.append(f"B={B} V={V} offset={k}: {int((ids != want).sum())} rows differ")
            y = asd.softmax(shard.float(), -1)
            ref = torch.softmax(logits.float(), -1)[:, lo:hi]
            if not torch.allclose(y, ref, atol=1e-6, rtol=1e-4):
                bad.append(f"B={B} V={V}: sharded softmax differs after the sampler ({float((y - ref).abs().max()):.2e})")
        calls = {"mailbox": lambda: asd.sample(shard, **keys, backend="triton"),
                 "local": lambda: sampling.sample(shard, **keys, backend="triton"),
                 # (backend=None: another request key, so a runner made while the mailbox is refused;
                 # the runner kept for backend="triton" keeps the mailbox it was made with)
                 "allgather": lambda: asd.sample(shard, **keys, backend=None)}
        for name, call in calls.items():
            if name == "allgather":
                kernel_sampling.mailbox_refusal = lambda d, w: "measuring the all-gather"
            dist.barrier()
            res[f"{name}_B{B}_V{V}_us"] = round(back_to_back_us(call, dev, calls=40, warmup=5), 1)
        kernel_sampling.mailbox_refusal = refusal
        if rank == 0:
            print(B, V, {k: v for k, v in res.items() if f"_B{B}_V{V}_" in k}, flush=True)
if rank == 0:
    res["failures"] = bad
    print(json.dumps(res, indent=1))
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
elif bad:
    print("rank1 failures", bad)
dist.destroy_process_group()
