"""On a GPU: the Triton sampler's general path (`sampling_kernels._general_cut`, the compiled
multi-way search over the whole row) at a real vocabulary: rows the candidates cannot decide
(top-p / min-p without a top-k on randn * 3 logits, a top-k of 1000, both, a flat row, a
half -inf row) keep the float64 reference's set and draw the torch sampler's ids."""

from __future__ import annotations

import math

import pytest
import torch

import anysoftmax.sampling as sampling
from anysoftmax.backends._triton_common import sampling as triton_sampling
from anysoftmax.sampling.reference import reference_distribution
from anysoftmax.sampling.spec import SamplingSpec
from anysoftmax.testing.sampling import PROB_ATOL, PROB_RTOL

pytestmark = pytest.mark.gpu

VOCAB = 128256
FILTERS = {"top_p": dict(top_p=0.9), "min_p": dict(min_p=1e-6), "top_k": dict(top_k=1000),
           "top_k+top_p+min_p": dict(top_k=1000, top_p=0.8, min_p=0.01)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(FILTERS))
def test_undecided_rows_on_the_gpu(name, dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none visible: torch.cuda.is_available() is False)")
    gen = torch.Generator().manual_seed(53)
    x = torch.randn(6, VOCAB, generator=gen) * 3
    x[4] = 0.0  # flat: every token tied
    x[5, ::2] = -math.inf
    x = x.to(dtype).cuda()
    kw = dict(temperature=(torch.rand(6, generator=gen) + 0.5).cuda(), **FILTERS[name])
    spec = SamplingSpec.from_request("probs", x, **kw)
    cpu_spec = SamplingSpec.from_request("probs", x.cpu(), **{k: v.cpu() if torch.is_tensor(v) else v
                                                              for k, v in kw.items()})
    ref = reference_distribution(x.cpu(), cpu_spec).probs.reshape(x.shape)
    plan = triton_sampling.plan_for(6, VOCAB, x.device)
    # (a row at a low temperature may have its top-p cut among the candidates)
    assert triton_sampling.row_paths(spec, x, plan=plan).count("general") >= 5
    got = triton_sampling.probs(spec, x, plan=plan).cpu()
    assert torch.equal(got > 0, ref > 0), "kept sets differ"
    err = (got.double() - ref).abs()
    assert bool((err <= PROB_ATOL + PROB_RTOL * ref).all()), float(err.max())
    for seed in range(3):
        sspec = SamplingSpec.from_request("sample", x, **kw, seed=seed)
        assert torch.equal(triton_sampling.sample(sspec, x, plan=plan).cpu(),
                           sampling.sample(x, **kw, seed=seed, backend="torch").cpu())
