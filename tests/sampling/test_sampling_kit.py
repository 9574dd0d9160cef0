"""The kit's sampler section (`anysoftmax.testing.sampling`): the `torch` sampler passes it, a
second, independent sampler passes it, and each planted bug fails it, naming its case."""

from __future__ import annotations

import math
import os

import pytest
import torch

import anysoftmax.sampling as sampling
from anysoftmax.testing.sampling import (CHI2_SEED, FILTER_CASES, SIGNIFICANCE, SamplerReport, check_sampler, chi_square,
                                         sampler_checks)
from wrong_samplers import BUGS, Sampler

SEED = int(os.environ.get("ANYSOFTMAX_TEST_SEED", "0"))


def test_the_torch_sampler_passes():
    report = check_sampler(sampling.sample, sampling.probs, sampling.logprobs, seed=SEED, name="torch")
    assert isinstance(report, SamplerReport) and report.ok and not report.failed and not report.skipped
    names = set(report.passed)
    for case in FILTER_CASES:
        assert f"probs {case.name} float32" in names and f"sample {case.name} float32" in names
    assert {"chi-square int-seed", "definition per-row-seeds", "advancing without a seed",
            "logprobs top-n-ties-greedy-invalid"} <= names
    assert report.computed > 40


def test_an_independent_sampler_passes_without_probs_or_logprobs():
    """The planted bugs' base, with no bug: a second implementation that agrees with the
    package's; the checks of the functions not given are not built."""
    right = Sampler()
    report = check_sampler(right.sample, seed=SEED)
    assert report.ok and not any(n.startswith(("probs ", "logprobs ")) for n in report.passed)
    assert check_sampler(right.sample, right.probs, seed=SEED).ok


# Each bug with a case that must name it (more may fail).
PLANTED = {
    "topp-le": "probs topp-boundary-exact float32",
    "topk-drops-ties": "probs topk-ties-at-kth float32",
    "temperature-after-softmax": "probs temperature-v100 float32",
    "no-renorm-after-topk": "probs topp-after-topk-renormalised float32",
    "random-reused-across-rows": "chi-square int-seed",
    "offset-ignored": "determinism another offset changes the draw",
    "stale-bound-operands": "determinism a keyword as a tensor, then as the same number, same ids",
    "stale-workspace": "determinism one form on new logits, each call its own draw",
}


@pytest.mark.parametrize("bug", BUGS)
def test_each_planted_bug_fails_naming_its_case(bug):
    wrong = Sampler(bug)
    with pytest.raises(AssertionError) as err:
        check_sampler(wrong.sample, wrong.probs, seed=SEED, name=f"wrong-{bug}")
    text = str(err.value)
    assert f"anysoftmax conformance of 'wrong-{bug}'" in text
    failed = [line.strip().split(":")[0] for line in text.splitlines() if line.startswith("  ") and ":" in line]
    assert PLANTED[bug] in failed, text[:3000]
    assert f"replay: check_sampler(..., seed={SEED})" in text


def test_the_sample_checks_alone_catch_the_filter_bugs():
    """Without a probs function the draws must still expose the filter bugs (kept sets)."""
    for bug, case in (("topp-le", "sample topp-boundary-exact float32"),
                      ("topk-drops-ties", "sample topk-ties-at-kth float32"),
                      ("no-renorm-after-topk", "sample topp-after-topk-renormalised float32")):
        check = next(c for c in sampler_checks(Sampler(bug).sample) if c.name == case)
        with pytest.raises(AssertionError):
            check.run(SEED)


def _chi_square_calls(kit_seed: int) -> list:
    """What the chi-square checks pass to the sampler (logits, keywords, the torch seed of the
    no-seed mode) when the kit runs with `kit_seed`."""
    seen = []

    def recording(logits, **kwargs):
        words = {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        seen.append((logits.tolist(), sorted(words.items()), torch.initial_seed()))
        return sampling.sample(logits, **kwargs)

    for check in sampler_checks(recording):
        if check.kind == "chi-square":
            check.run(kit_seed)
    return seen


def test_the_chi_square_checks_draw_with_a_fixed_seed():
    """The chi-square checks draw the same data and seeds whatever the kit's seed: a sampler's
    verdict is then the same on every run (a run's random seed would fail a correct sampler
    about once in 2000 runs)."""
    assert _chi_square_calls(1) == _chi_square_calls(2)


def test_chi_square_p_values():
    """The statistic and p-value against the closed form of 2 degrees of freedom (p = exp(-x/2)),
    pooling of small bins, and a count on a zero-probability token failing outright."""
    probs = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    counts = torch.tensor([520, 290, 190])
    stat, df, p = chi_square(counts, probs)
    want = (20**2 / 500 + 10**2 / 300 + 10**2 / 200)
    assert df == 2 and math.isclose(stat, want) and math.isclose(p, math.exp(-want / 2), rel_tol=1e-9)
    small = torch.tensor([0.9, 0.098, 0.001, 0.001], dtype=torch.float64)
    assert chi_square(torch.tensor([900, 98, 1, 1]), small)[1] == 2  # the two tiny bins pooled into one
    with pytest.raises(AssertionError, match="probability 0"):
        chi_square(torch.tensor([5, 0, 1]), torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))
    assert SIGNIFICANCE == 1e-4


def test_chi_square_false_alarm_rate_is_the_significance():
    """Multinomial counts drawn by torch: p-values below the significance no more often than
    it says (and uniform-ish: about 10 % below 0.1)."""
    g = torch.Generator().manual_seed(CHI2_SEED)  # (fixed: the bounds below hold for it, not for every seed)
    probs = torch.softmax(torch.randn(12, generator=g, dtype=torch.float64), -1)
    ps = torch.tensor([chi_square(torch.bincount(torch.multinomial(probs, 2000, True, generator=g), minlength=12),
                                  probs)[2] for _ in range(400)])
    assert float((ps < 0.1).double().mean()) < 0.2 and float((ps < 0.1).double().mean()) > 0.03
    assert int((ps < SIGNIFICANCE).sum()) <= 1


def test_checks_are_named_once_and_cheap_shapes():
    checks = sampler_checks(sampling.sample, sampling.probs, sampling.logprobs)
    names = [c.name for c in checks]
    assert len(names) == len(set(names))
    assert sum(n.startswith("bad-input") for n in names) >= 20


def test_a_logsumexp_of_a_rows_first_chunk_fails_the_long_rows_check():
    """A `logprobs` whose logsumexp covers only each row's first 4096 logits (a split kernel that
    never joins its chunks) passes the short-row checks and fails the long rows'."""
    chunk = 4096

    def first_chunk(x, ids, *, temperature=None, top_n=0):
        got = sampling.logprobs(x, ids, temperature=temperature, top_n=top_n)
        if top_n or x.shape[-1] <= chunk:
            return got
        t = temperature if isinstance(temperature, torch.Tensor) else torch.tensor(temperature or 1.0)
        scale = torch.where(t > 0, 1.0 / t, 1.0).to(x.device, torch.float32)[..., None]
        z = x.float() * scale
        return got + (torch.logsumexp(z, -1, keepdim=True) - torch.logsumexp(z[..., :chunk], -1, keepdim=True))

    checks = {c.name: c for c in sampler_checks(sampling.sample, logprobs_fn=first_chunk)}
    assert checks["logprobs top-n-ties-greedy-invalid"].run(SEED) is None
    assert checks["logprobs batch-dims-top-n-0"].run(SEED) is None
    with pytest.raises(AssertionError, match="log-probability of id"):
        checks["logprobs long-rows-top-n-0"].run(SEED)
    assert {c.name: c for c in sampler_checks(sampling.sample, logprobs_fn=sampling.logprobs)}[
        "logprobs long-rows-top-n-0"].run(SEED) is None


@pytest.mark.gpu
def test_a_seed_frozen_into_a_cuda_graph_fails_the_kit():
    """A sampler that draws its seed on the host when none is given (right in eager calls:
    torch.manual_seed replays them, and they advance) passes that number to the kernel, so a
    captured graph draws the same ids at every replay: the kit's CUDA graph check names it; the
    package's sampler passes."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none visible: torch.cuda.is_available() is False)")

    def frozen(x, *, seed=None, **kw):
        if seed is None:  # (the CPU generator: readable during a capture, unlike the device's)
            seed = int(torch.randint(0, 2**62, (1,)))
        return sampling.sample(x, seed=seed, **kw)

    name = "advancing without a seed, replayed in a CUDA graph"
    for fn, fails in ((frozen, True), (sampling.sample, False)):
        checks = {c.name: c for c in sampler_checks(fn, device="cuda")}
        assert checks["advancing without a seed"].run(SEED) is None
        if fails:
            with pytest.raises(AssertionError, match="does not advance per replay"):
                checks[name].run(SEED)
        else:
            assert checks[name].run(SEED) is None
