"""`anysoftmax.sampling.probs`, `sample` and `logprobs`: validate, pick the implementation, run.

``"torch"`` runs the `torch` sampler (any device, no host synchronisation); another name runs that
backend's sampler (`Backend.sampler()`) or raises saying why it cannot; `backend=None` runs the
`AUTOMATIC` backend's for CUDA/ROCm logits where it is available and takes the request, else
``"torch"``. A repeated request costs one key (`spec.form_key`) and one lookup: it finds its
runner, the implementation's launches bound for its form, to which only the call's checked values go.
"""

from __future__ import annotations

import functools

import torch

from ..core import registry
from ..core.backend import as_backend
from ..core.cache import BoundedDict
from ..core.errors import BackendUnavailableError, UnsupportedRequestError
from . import torch_sampler
from .spec import SamplingSpec, SpecForm, check_top_n, form_key, form_of, ids_reader

# The backend `backend=None` tries first on CUDA/ROCm logits: the Triton sampler, which passes the
# kit's sampler section on a GPU (tests/backends/triton/test_sampling_kit_gpu.py, `-m gpu`).
AUTOMATIC: str | None = "triton"
# A request's key -> its runner (`_runner`).
_requests: BoundedDict = BoundedDict(maxsize=512)


@functools.lru_cache(maxsize=64)
def _adapted(generation: int, name: str):
    """The backend called `name` as a `Backend`, once per registry generation (`registry.generation()`)."""
    return as_backend(registry.get_backend(name))


def _implementation(op: str, backend, spec: SamplingSpec, top_n: int = 0):
    """The sampler computing `spec`: the `torch` sampler or a backend's (see the module)."""
    if backend == "torch":
        return torch_sampler
    if backend is None:
        if AUTOMATIC is None or spec.device.type != "cuda" or AUTOMATIC not in registry.registered():
            return torch_sampler
        chosen = _adapted(registry.generation(), AUTOMATIC)
        if registry.unavailable_reason(AUTOMATIC) is not None or chosen.supports_sampling(spec, top_n) is not None:
            return torch_sampler
        return chosen.sampler()
    try:
        chosen = _adapted(registry.generation(), backend)
    except ValueError as exc:
        raise ValueError(f"{op}: {exc}") from None
    if chosen.sampler_refusal is not None:
        raise UnsupportedRequestError(f"{op}: backend {backend!r} has no sampler: {chosen.sampler_refusal} "
                                      f"(backend='torch' runs any request)")
    reason = registry.unavailable_reason(backend)
    if reason is not None:
        raise BackendUnavailableError(f"{op}: backend {backend!r} is not available here: {reason}")
    reason = chosen.supports_sampling(spec, top_n)
    if reason is not None:
        raise UnsupportedRequestError(f"{op}: backend {backend!r} has no sampler for {spec.describe()}: {reason} "
                                      f"(backend='torch' runs any request)")
    return chosen.sampler()


def _runner(op: str, form: SpecForm, implementation, spec: SamplingSpec, top_n: int, read_ids, n_ids: int):
    """`call(logits, values, extra)` running every request of `form` on `implementation` (`spec`:
    the first call's request as `form_of` gives it; `extra`: `logprobs`' ids or `sample`'s
    return_logprobs): the call's checked values go to the implementation's runner for the form
    (`runner(op, spec, top_n, n_ids)`), or as a `SamplingSpec` to one without a runner."""
    read = form.read
    make = getattr(implementation, "runner", None)
    if make is None:
        if op == "sample":
            return lambda logits, values, extra: implementation.sample(form.spec(values), logits, extra)
        if op == "probs":
            return lambda logits, values, extra: implementation.probs(form.spec(values), logits)
        return lambda logits, values, extra: implementation.logprobs(form.spec(values), logits, read_ids(extra),
                                                                     top_n)
    if op == "logprobs":
        run = make(op, spec, top_n, n_ids)
        return lambda logits, values, extra: run(logits, read(values), read_ids(extra))
    run = make(op, spec)
    if op == "sample":
        return lambda logits, values, extra: run(logits, read(values), extra)
    return lambda logits, values, extra: run(logits, read(values))


def _ready(op: str, backend, logits, values: tuple, top_n=0, ids=None):
    """The runner (`_runner`) of a request whose keywords are `values` (`spec.KEYWORDS` order):
    found by the request's key where it was seen before (the runner then checks only the
    values), else the request checked whole, its implementation chosen, and remembered."""
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"{op}: backend must be a backend name (str) or None, got {type(backend).__name__}")
    key = form_key(logits, values)
    # (a top_n of another type than int, or ids that are no tensor, are checked, never keyed:
    # 1.0 == 1 as a key)
    if key is not None and type(top_n) is int and (ids is None or isinstance(ids, torch.Tensor)):
        key = (op, backend, top_n, AUTOMATIC, registry.current_generation[0], key,
               None if ids is None else (ids.dtype, ids.shape, ids.device))
        found = _requests.get(key)
        if found is not None:
            return found
    else:
        key = None
    form = SpecForm(op, logits, values)
    spec = form.spec(values)
    read_ids = None
    if ids is not None or op == "logprobs":
        read_ids = ids_reader(op, spec, ids)
        read_ids(ids)  # (its values: before the implementation is chosen, as for the keywords)
        check_top_n(op, spec, top_n)
    run = _runner(op, form, _implementation(op, backend, spec, top_n), form_of(spec), top_n, read_ids,
                  ids.shape[-1] if read_ids is not None else 0)
    if key is not None:
        _requests.put(key, run)
    return run


def probs(logits: torch.Tensor, *, temperature=None, top_k=None, top_p=None, min_p=None,
          backend: str | None = None) -> torch.Tensor:
    """float32 probabilities of the filtered, renormalised distribution of each row of
    `logits` ``[..., V]``: z = logits / temperature, then top_k, top_p (on the top-k
    renormalised distribution), min_p; 0 outside the kept set. Keywords: a number or a tensor
    with one value per row; None switches a step off. Temperature 0 is greedy (probability 1
    on the argmax, the lowest index among ties)."""
    values = (temperature, top_k, top_p, min_p)
    return _ready("probs", backend, logits, values)(logits, values, None)


def sample(logits: torch.Tensor, *, temperature=None, top_k=None, top_p=None, min_p=None, seed=None, offset=0,
           return_logprobs: bool = False, backend: str | None = None):
    """One token id per row of `logits` ``[..., V]`` (int64, shape ``logits.shape[:-1]``), drawn
    from the distribution `probs` gives; with `return_logprobs`, also each chosen token's
    float32 log-probability under that distribution.

    `seed` (an int, or an int64 tensor: 0-dim for the batch, or one per row) and `offset` (an
    int or a tensor, e.g. the decode step) make the draw a pure function of (seed, offset, the
    row's logits, the keywords): the same on every call and every backend. A per-row seed gives
    a request the same draw wherever it sits in the batch. Without a seed, torch's default
    generator for the device supplies one and advances. No host synchronisation."""
    if not isinstance(return_logprobs, bool):
        raise TypeError(f"sample: return_logprobs must be a bool, got {type(return_logprobs).__name__}")
    values = (temperature, top_k, top_p, min_p, seed, offset)
    return _ready("sample", backend, logits, values)(logits, values, return_logprobs)


def logprobs(logits: torch.Tensor, ids: torch.Tensor, *, temperature=None, top_n: int = 0,
             backend: str | None = None):
    """float32 log-probabilities of `ids` (shape ``logits.shape[:-1] + (K,)``) under
    ``log_softmax(logits / temperature)``; with ``top_n > 0`` returns ``(logprobs, top_values,
    top_ids)``, the top-n log-probabilities of each row (the lower id first among ties).
    Temperature 0 gives the limit: ``-log n`` on the n tied maxima, -inf elsewhere."""
    values = (temperature,)
    out = _ready("logprobs", backend, logits, values, top_n, ids)(logits, values, ids)
    if not top_n:
        return out.reshape(ids.shape)
    picked, values, top_ids = out
    shape = tuple(ids.shape[:-1]) + (top_n,)
    return picked.reshape(ids.shape), values.reshape(shape), top_ids.reshape(shape)
