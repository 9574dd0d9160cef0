"""`anysoftmax.distributed.sample` and `logprobs` over gloo on the CPU: 1 and 3 ranks with
uneven shards draw the ids `anysoftmax.sampling.sample` draws from the whole logits (exactly on
distinct probabilities, >= 99.9 % of rows on random ones), the same on every rank; the
collectives each call makes; errors."""

from __future__ import annotations

import pytest
import torch

from helpers.distributed import one_rank  # noqa: F401  (a fixture)


@pytest.mark.parametrize("world", [1, 3])
def test_sharded_draws_equal_the_unsharded_sampler(world, tmp_path, seed):
    from helpers.distributed import sampler_checks

    if world == 1:  # (in this process: one rank needs no spawn)
        sampler_checks(0, 1, f"file://{tmp_path}/rendezvous", str(tmp_path / "out"), seed)
        failures = (tmp_path / "out.0").read_text().splitlines()
    else:
        from anysoftmax.testing.distributed import run_ranks

        run_ranks(sampler_checks, world, (world, f"file://{tmp_path}/rendezvous", str(tmp_path / "out"), seed), 180)
        failures = [line for r in range(world) for line in (tmp_path / f"out.{r}").read_text().splitlines()]
    assert failures == [], f"seed {seed}:\n" + "\n".join(failures)


def test_two_collectives_never_the_logits(one_rank, gen, monkeypatch):
    """The row states, then the draws (or the top-n): small tensors, independent of V."""
    import anysoftmax.distributed as asd
    from anysoftmax.distributed import sampling as sharded

    sizes = []
    gather = sharded.gather_states

    def counted(state, world, group):
        sizes.append(state.numel())
        return gather(state, world, group)

    monkeypatch.setattr(sharded, "gather_states", counted)
    for vocab in (64, 4096):
        x = torch.randn(8, vocab, generator=gen)
        sizes.clear()
        asd.sample(x, top_k=5, top_p=0.9, min_p=0.05, seed=1)
        assert sizes == [8 * (4 + 5 + 1) + 3, 8 * 4]
        sizes.clear()
        asd.logprobs(x, torch.zeros(8, 2, dtype=torch.int64), top_n=3)
        assert sizes == [8 * (4 + 2) + 1, 8 * 2 * 3]


def test_errors_name_the_argument(one_rank, gen):
    import anysoftmax.distributed as asd

    x = torch.randn(3, 8, generator=gen)
    with pytest.raises(ValueError, match="top_p"):
        asd.sample(x, top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        asd.sample(x, temperature=torch.tensor([1.0, -1.0, 1.0]))
    with pytest.raises(TypeError, match="return_logprobs"):
        asd.sample(x, return_logprobs=1)
    with pytest.raises(ValueError, match="ids"):
        asd.logprobs(x, torch.tensor([[8]] * 3))
    with pytest.raises(ValueError, match="top_n"):
        asd.logprobs(x, torch.zeros(3, 1, dtype=torch.int64), top_n=9)
    with pytest.raises(ValueError, match="logits_shard"):
        asd.sample(torch.tensor(1.0))
    with pytest.raises((ValueError, TypeError, RuntimeError), match="group"):
        asd.sample(x, group="tp")


def test_a_repeated_request_reads_and_checks_each_call_values(one_rank, gen, monkeypatch):
    """The shard kernels' runner kept for a request's form: a later call of that form draws with
    its own values (another seed, temperature tensor, offset) and still raises on bad ones."""
    import anysoftmax.distributed as asd
    import anysoftmax.sampling as sampling
    from anysoftmax.distributed import kernel_sampling

    x = torch.randn(4, 64, generator=gen) * 3
    made = []
    kernel_runner = kernel_sampling.runner
    monkeypatch.setattr(kernel_sampling, "runner", lambda *a, **k: made.append(1) or kernel_runner(*a, **k))
    for seed, offset in ((3, 0), (4, 2), (5, 7)):
        t = torch.rand(4, generator=gen) + 0.5
        got = asd.sample(x, temperature=t, top_k=9, top_p=0.8, seed=seed, offset=offset, backend="triton")
        want = sampling.sample(x, temperature=t, top_k=9, top_p=0.8, seed=seed, offset=offset)
        assert torch.equal(got, want), (seed, offset)
    assert len(made) == 1, f"{len(made)} runners made for one form"
    with pytest.raises(ValueError, match="top_p"):
        asd.sample(x, temperature=t, top_k=9, top_p=0.0, seed=3, offset=0, backend="triton")
    with pytest.raises(ValueError, match="temperature"):
        asd.sample(x, temperature=-t, top_k=9, top_p=0.8, seed=3, offset=0, backend="triton")


def test_uninitialised_group_is_refused():
    import torch.distributed as dist

    import anysoftmax.distributed as asd

    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        asd.sample(torch.randn(2, 3))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_batch_dims_and_half_precision(one_rank, gen, dtype):
    import anysoftmax.distributed as asd
    import anysoftmax.sampling as sampling

    x = (torch.randn(2, 5, 30, generator=gen) * 3).to(dtype)
    t = torch.rand(2, 5, generator=gen) + 0.3
    ids, lp = asd.sample(x, temperature=t, top_k=6, top_p=0.85, seed=3, offset=1, return_logprobs=True)
    want, want_lp = sampling.sample(x, temperature=t, top_k=6, top_p=0.85, seed=3, offset=1, return_logprobs=True)
    assert ids.shape == (2, 5) and ids.dtype == torch.int64 and torch.equal(ids, want)
    torch.testing.assert_close(lp, want_lp, rtol=1e-5, atol=2e-5)
    pick = torch.randint(0, 30, (2, 5, 2), generator=gen)
    for got, ref in zip(asd.logprobs(x, pick, top_n=3), sampling.logprobs(x, pick, top_n=3)):
        assert got.shape == ref.shape
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=2e-5)


def test_triton_shard_kernels_draw_the_unsharded_ids(tmp_path, seed):
    """backend="triton" on 2 ranks (the Triton interpreter on the CPU): the gathered sample's ids
    and the torch-ops path's, the kernels drawing every call they can (see the worker)."""
    from anysoftmax.testing.distributed import run_ranks
    from helpers.distributed import kernel_sampler_checks

    run_ranks(kernel_sampler_checks, 2, (2, f"file://{tmp_path}/rendezvous", str(tmp_path / "out"), seed), 240)
    failures = [line for r in range(2) for line in (tmp_path / f"out.{r}").read_text().splitlines()]
    assert failures == [], f"seed {seed}:\n" + "\n".join(failures)


def test_triton_shard_kernels_through_the_mailbox(tmp_path, seed):
    """The same checks with the workspaces crossing through the mailbox exchange kernel (shared
    memory standing in for NVLink) instead of the all-gather."""
    from anysoftmax.testing.distributed import run_ranks
    from helpers.distributed import kernel_sampler_checks

    words_all = torch.zeros(2, 2 * 16384 * 2, dtype=torch.int64).share_memory_()
    run_ranks(kernel_sampler_checks, 2, (2, f"file://{tmp_path}/rendezvous", str(tmp_path / "out"), seed, words_all),
              240)
    failures = [line for r in range(2) for line in (tmp_path / f"out.{r}").read_text().splitlines()]
    assert failures == [], f"seed {seed}:\n" + "\n".join(failures)


def test_unknown_backend_is_refused(one_rank, gen):
    import anysoftmax.distributed as asd

    x = torch.randn(2, 8, generator=gen)
    for bad in ("tirton", "cute", 3):
        with pytest.raises(ValueError, match=f"backend must be one of .*{bad!r}"):
            asd.sample(x, backend=bad)


def test_the_default_tries_the_shard_kernels_on_cuda_logits_only():
    """`backend=None`: the Triton shard kernels for CUDA/ROCm logits, the torch-ops path elsewhere;
    a named backend is taken as named (the kernels still fall back where they refuse)."""
    from anysoftmax.distributed.sampling import uses_kernels

    assert uses_kernels(None, torch.device("cuda", 0)) and uses_kernels("triton", torch.device("cpu"))
    assert not uses_kernels(None, torch.device("cpu")) and not uses_kernels(None, torch.device("meta"))
    assert not uses_kernels("torch", torch.device("cuda", 0))
