"""Statistical proof of losslessness: exact target distributions, samplers and a chi-square check.

"Lossless" means: with ``do_sample=True``, speculative decoding produces token sequences with exactly the
distribution that sampling from the target alone produces (same temperature, top-k, top-p, ... and same
stopping criteria). This module tests that claim on the *first few tokens* of a generation, where the target's
distribution can be computed exactly, so the test compares samples against the truth instead of against a
second noisy sample::

    from hf_hetspec.testing import verify_lossless

    report = verify_lossless(target, drafter, target_tokenizer, drafter_tokenizer, prompt_ids, "slem",
                             n=2000, seed=0, temperature=0.7, top_k=5)
    print(report)            # "PASS: chi2=..., dof=..., p=..., TV=..., n=2000, alpha=0.001, ..."
    assert report.passed

The pieces, usable separately:

* :func:`exact_target_distribution` -- the exact distribution of the first ``num_tokens`` new tokens of
  ``target.generate(input_ids, do_sample=True, **generation_kwargs)``, by enumerating every sequence with
  nonzero probability (one target forward per prefix), with the logits processors and stopping criteria
  that transformers' own ``generate()`` builds for the call.
* Samplers -- callables ``sampler(generator) -> tuple[int, ...]`` (the first ``num_tokens`` new ids of one
  generation): :func:`hetspec_sampler` (hf_hetspec, any algorithm name), :func:`target_sampler` (the target
  alone, plain ``generate``) and :func:`transformers_sampler` (transformers' built-in universal assisted
  generation); :func:`sample_outcomes` draws ``n`` of them reproducibly from a seed.
* :func:`check_lossless` -- chi-square goodness of fit of the sample counts against the exact
  distribution -> :class:`LosslessnessReport`; :func:`chi_square_power` -- what power a given ``n`` has;
  :func:`required_samples` -- the smallest ``n`` with a given power on a given distribution.

Why this is a valid exact test
------------------------------
With a support-limiting warper (``top_k <= 8`` or ``top_p < 1``) the first ``k`` generated tokens take only
finitely many values (at most ``top_k ** k`` sequences), and their probabilities are products of the target's
processed next-token probabilities, which :func:`exact_target_distribution` computes in float64 from the same
float32 scores ``generate()`` samples from. Each sample of the sampler under test is an independent draw
(fresh ``generate()`` call; the random stream only advances), so the ``n`` outcomes are i.i.d. from *some*
distribution ``Q``, and the counts are multinomial ``(n, Q)``. Losslessness is the simple null hypothesis
``Q = P`` with ``P`` fully known -- no parameters estimated -- which is exactly the setting of Pearson's
chi-square goodness-of-fit test: under ``H0`` the statistic is asymptotically chi-square with
``bins - 1`` degrees of freedom. The approximation is good when every expected count is at least 5
(Cochran's rule), so outcomes with smaller expected counts are merged into one bin (merging is a fixed
function of ``P`` and ``n``, chosen before looking at the data, so the test stays valid; it can only lose
power). An observed outcome that has probability 0 under ``P`` is a proof of a difference by itself
(p-value 0). Testing only the first ``k`` tokens is a necessary condition for losslessness, and with
``k >= 2`` it already covers the interesting paths: an accepted draft token followed by a bonus or
correction token, a rejection at the first position, and an EOS inside a draft.

Power. For an alternative ``Q`` the statistic is approximately noncentral chi-square with noncentrality
``lambda = n * sum((Q_i - P_i)**2 / P_i)`` (over the bins). By Cauchy-Schwarz,
``(sum |Q_i - P_i|)**2 <= sum((Q_i - P_i)**2 / P_i) * sum(P_i)``, so ``lambda >= 4 * n * TV(P, Q)**2``: every
alternative at total-variation distance ``TV`` from the target (measured on the bins) is detected with at
least the power of a noncentral chi-square with that ``lambda``. :func:`chi_square_power` evaluates it: at
``alpha = 1e-3`` and 10 degrees of freedom, ``TV = 0.1`` is detected with probability > 0.999 for
``n = 2000``, ~0.95 for ``n = 1000``, ~0.48 for ``n = 500`` and ~0.11 for ``n = 250``; ``TV = 0.2``
(``lambda`` four times larger) already with probability ~0.95 for ``n = 250``. Fewer bins give more power at
the same ``lambda`` (5 degrees of freedom: ~0.98 for ``n = 1000``, ~0.65 for ``n = 500``). The reported
``total_variation`` is the empirical TV between the observed frequencies and ``P``; it is biased upwards
(for a correct sampler it is of order ``sqrt(bins / n)``: 0.03-0.06 in this package's tests) and is
descriptive only: decide with the p-value.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch
from transformers import StoppingCriteriaList, StopStringCriteria

from ..drafter import model_device
from ..plan import HetspecArguments

__all__ = [
    "LosslessnessReport",
    "check_lossless",
    "chi_square_power",
    "exact_target_distribution",
    "hetspec_sampler",
    "required_samples",
    "sample_outcomes",
    "target_sampler",
    "transformers_sampler",
    "verify_lossless",
]

#: Outcome of one generation: the first ``num_tokens`` new token ids (fewer if generation stopped earlier).
Outcome = tuple[int, ...]

_FORBIDDEN = {
    "assistant_model": "the exact distribution is the target's alone; give the drafter to the sampler",
    "custom_generate": "exact_target_distribution builds its own decoding method",
    "streamer": "nothing is streamed during enumeration",
    "num_beams": "beam search is not sampling",
    "num_return_sequences": "each outcome is one sequence",
    "do_sample": "sampling is always on (do_sample=True)",
}


# --------------------------------------------------------------------------------------------------------
# Exact distribution of the target alone
# --------------------------------------------------------------------------------------------------------


def _plain_generate(model):
    """The class's ``generate`` (bypasses an instance wrapper such as :func:`hf_hetspec.enable`'s)."""
    return type(model).generate.__get__(model)


def _prepared_processing(target, input_ids, tokenizer, generation_kwargs):
    """Run transformers' ``generate()`` up to its decoding method and capture what it prepared.

    Returns ``(logits_processor, stopping_criteria, generation_config)``: exactly the objects transformers'
    sampling loop would receive for ``target.generate(input_ids, do_sample=True, **generation_kwargs)``.
    """
    captured: dict = {}

    def capture(model, input_ids, logits_processor=None, stopping_criteria=None, generation_config=None,
                synced_gpus=False, streamer=None, **model_kwargs):
        captured.update(processors=logits_processor, criteria=stopping_criteria, config=generation_config)
        return input_ids

    kwargs = dict(generation_kwargs)
    if kwargs.get("stop_strings"):
        # transformers does not hand `tokenizer` on when `custom_generate` is a callable, so it could not
        # build the stop-string criterion itself: build the very same public criterion here.
        if tokenizer is None:
            raise ValueError("stop_strings needs `tokenizer=` (the target's tokenizer) to be enumerated.")
        criteria = StoppingCriteriaList(kwargs.get("stopping_criteria") or [])
        criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=kwargs.pop("stop_strings")))
        kwargs["stopping_criteria"] = criteria
    _plain_generate(target)(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True,
                            custom_generate=capture, **kwargs)
    return captured["processors"], captured["criteria"], captured["config"]


def _support_limited(config, max_top_k: int) -> bool:
    top_k = config.top_k
    top_p = config.top_p
    return bool((top_k is not None and 0 < top_k <= max_top_k) or (top_p is not None and top_p < 1.0))


@torch.no_grad()
def exact_target_distribution(
    target,
    input_ids: torch.Tensor,
    num_tokens: int = 2,
    *,
    tokenizer=None,
    max_top_k: int = 8,
    max_outcomes: int = 4096,
    **generation_kwargs,
) -> dict[Outcome, float]:
    """The exact distribution of the first ``num_tokens`` tokens that sampling from ``target`` produces.

    It is the distribution of ``tuple(out[0, n:n + num_tokens])`` for
    ``out = target.generate(input_ids, do_sample=True, **generation_kwargs)`` (the class's ``generate``; an
    hf_hetspec wrapper on the instance is bypassed), computed by enumeration: every prefix with nonzero
    probability gets one target forward (no KV cache) over ``input_ids + prefix``; its last-position logits
    are cast to float32 and processed by the ``LogitsProcessorList`` that transformers' own ``generate()``
    prepares for this call (it is captured by running ``generate()`` with a ``custom_generate`` callable that
    returns at once, so temperature, top-k, top-p, min-p, repetition penalty, ``min_new_tokens``, suppressed
    tokens, the model's ``generation_config`` defaults and ``min_tokens_to_keep`` are exactly transformers');
    the probabilities are ``softmax`` of the processed scores in float32, as in transformers' sampling loop,
    renormalized and multiplied in float64. After each token the captured ``StoppingCriteriaList`` (EOS ids,
    ``max_new_tokens`` / ``max_length``, stop strings, custom criteria) decides whether generation stops
    there; if it does, the outcome is the shorter tuple (e.g. a sequence ending in an EOS id).

    Args:
        target: a decoder-only transformers model (``PreTrainedModel`` with ``generate``), in eval mode.
        input_ids (``torch.LongTensor`` of shape ``(1, n)``, ``n >= 1``): the prompt, without padding.
        num_tokens: length of the outcome tuples (``>= 1``). ``max_new_tokens`` defaults to it.
        tokenizer: the target's tokenizer; needed only with ``stop_strings``.
        max_top_k: largest ``top_k`` accepted as support-limiting on its own.
        max_outcomes: refuse (``ValueError``) to enumerate more sequences than this.
        **generation_kwargs: anything ``generate()`` accepts for sampling (``temperature``, ``top_k``,
            ``top_p``, ``repetition_penalty``, ``eos_token_id``, ``stopping_criteria``, ``logits_processor``,
            ``generation_config``, ...). ``do_sample`` is always ``True``.

    Returns:
        ``{outcome: probability}`` over every outcome with nonzero probability, most likely first. Outcomes
        are tuples of ``num_tokens`` target ids, or shorter when a stopping criterion fired earlier; the
        probabilities sum to 1 (up to float64 rounding).

    Raises:
        ValueError: ``input_ids`` not of shape ``(1, n)``; ``num_tokens < 1``; an argument that makes no
            sense here (``assistant_model``, ``num_beams``, ...); no support-limiting setting in the merged
            generation config (``top_k`` in ``1..max_top_k`` or ``top_p < 1``) -- transformers' default
            ``top_k=50`` does not count, it allows up to ``50 ** num_tokens`` sequences; more than
            ``max_outcomes`` sequences.
    """
    shape_ok = torch.is_tensor(input_ids) and input_ids.dim() == 2 and input_ids.shape[0] == 1
    if not shape_ok or input_ids.shape[1] < 1:
        raise ValueError("input_ids must be a tensor of shape (1, n) with n >= 1 (one unpadded prompt).")
    if num_tokens < 1:
        raise ValueError(f"num_tokens={num_tokens}: enumerate at least one token.")
    for name in HetspecArguments.KEYWORDS:
        if name in generation_kwargs:
            raise ValueError(f"exact_target_distribution: `{name}` is an hf_hetspec keyword; the target alone "
                             "does not take it (give it to the hf_hetspec sampler only, as verify_lossless does).")
    for name, why in _FORBIDDEN.items():
        if name in generation_kwargs and not (name == "do_sample" and generation_kwargs[name] is True):
            if name in ("num_beams", "num_return_sequences") and generation_kwargs[name] in (None, 1):
                continue
            raise ValueError(f"exact_target_distribution: `{name}` is not supported here ({why}).")
    generation_kwargs.pop("do_sample", None)
    mask = generation_kwargs.pop("attention_mask", None)
    if mask is not None and not bool((mask == 1).all()):
        raise ValueError("attention_mask contains padding: pass one unpadded prompt.")
    if generation_kwargs.get("max_length") is None:
        generation_kwargs.setdefault("max_new_tokens", num_tokens)

    processors, criteria, config = _prepared_processing(target, input_ids, tokenizer, generation_kwargs)
    if not _support_limited(config, max_top_k):
        raise ValueError(
            "exact_target_distribution enumerates every sequence with nonzero probability, so it needs a "
            f"support-limiting sampling setting: top_k between 1 and {max_top_k}, or top_p < 1 "
            f"(the merged generation config has top_k={config.top_k}, top_p={config.top_p}). "
            "Pass e.g. top_k=5."
        )

    device = model_device(target)
    prompt = input_ids.to(device)
    forward_kwargs = {"use_cache": False}
    if "logits_to_keep" in inspect.signature(target.forward).parameters:
        forward_kwargs["logits_to_keep"] = 1

    result: dict[Outcome, float] = {}
    frontier: list[tuple[Outcome, float]] = [((), 1.0)]
    enumerated = 0
    while frontier:
        prefix, mass = frontier.pop()
        ids = torch.cat([prompt, torch.tensor([prefix], dtype=prompt.dtype, device=device)], dim=1)
        logits = target(input_ids=ids, attention_mask=torch.ones_like(ids), **forward_kwargs).logits
        logits = logits[:, -1].to(dtype=torch.float32)  # [1, V], as transformers' _sample casts it
        scores = processors(ids, logits)
        probs = torch.nn.functional.softmax(scores, dim=-1)[0].to(torch.float64)  # what multinomial sees
        probs = probs / probs.sum()
        support = torch.nonzero(probs > 0).flatten()
        enumerated += support.numel()
        if enumerated > max_outcomes:
            raise ValueError(
                f"more than max_outcomes={max_outcomes} sequences have nonzero probability "
                f"(top_k={config.top_k}, top_p={config.top_p}, num_tokens={num_tokens}): use a smaller "
                "top_k / top_p or fewer tokens."
            )
        for token, p in zip(support.tolist(), probs[support].tolist()):
            outcome = prefix + (token,)
            extended = torch.cat([ids, torch.tensor([[token]], dtype=ids.dtype, device=device)], dim=1)
            stopped = bool(criteria(extended, scores).any()) if len(criteria) else False
            if stopped or len(outcome) == num_tokens:
                result[outcome] = result.get(outcome, 0.0) + mass * p
            else:
                frontier.append((outcome, mass * p))
    return dict(sorted(result.items(), key=lambda item: (-item[1], item[0])))


# --------------------------------------------------------------------------------------------------------
# Samplers
# --------------------------------------------------------------------------------------------------------


def _sequences(out) -> torch.Tensor:
    return out.sequences if hasattr(out, "sequences") else out


class _Sampler:
    """Base of the samplers: ``sampler(generator) -> outcome``; its generator must live on ``device``."""

    device: torch.device

    def __init__(self, target, input_ids: torch.Tensor, num_tokens: int, generation_kwargs: dict):
        if not torch.is_tensor(input_ids) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError("input_ids must be a tensor of shape (1, n): one unpadded prompt.")
        if num_tokens < 1:
            raise ValueError(f"num_tokens={num_tokens}: sample at least one token.")
        if "do_sample" in generation_kwargs and generation_kwargs["do_sample"] is not True:
            raise ValueError("samplers always sample: drop do_sample=False.")
        self.target = target
        self.device = model_device(target)
        self.input_ids = input_ids.to(self.device)
        self.num_tokens = num_tokens
        kwargs = {k: v for k, v in generation_kwargs.items() if k != "do_sample"}
        if kwargs.get("max_length") is None:
            kwargs.setdefault("max_new_tokens", num_tokens)
        self.generation_kwargs = kwargs
        self.calls = 0

    def _outcome(self, out) -> Outcome:
        self.calls += 1
        n = self.input_ids.shape[1]
        return tuple(_sequences(out)[0, n : n + self.num_tokens].tolist())

    def __call__(self, generator: torch.Generator | None) -> Outcome:  # pragma: no cover - abstract
        raise NotImplementedError


class HetSpecSampler(_Sampler):
    """One hf_hetspec generation per call; randomness from the ``torch.Generator`` passed in.

    Attributes (accumulated over calls, from :func:`hf_hetspec.last_stats`): ``calls``, ``drafted_tokens``,
    ``accepted_tokens``, ``target_forwards``; ``acceptance_rate`` = accepted / drafted.
    """

    def __init__(self, target, drafter, target_tokenizer, drafter_tokenizer, input_ids, algorithm, num_tokens,
                 generation_kwargs):
        super().__init__(target, input_ids, num_tokens, generation_kwargs)
        self.drafter = drafter
        self.target_tokenizer = target_tokenizer
        self.drafter_tokenizer = drafter_tokenizer
        self.algorithm = algorithm
        self.drafted_tokens = 0
        self.accepted_tokens = 0
        self.target_forwards = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    def __call__(self, generator: torch.Generator | None) -> Outcome:
        from ..integration import disable, enable, is_enabled, last_stats

        was_enabled = is_enabled(self.target)
        enable(self.target)
        # transformers' loop samples with torch's global RNG (seeded by sample_outcomes) and refuses a generator
        randomness = {} if self.generation_kwargs.get("hetspec_loop") == "transformers" else {
            "hetspec_generator": generator}
        try:
            out = self.target.generate(
                self.input_ids,
                assistant_model=self.drafter,
                tokenizer=self.target_tokenizer,
                assistant_tokenizer=self.drafter_tokenizer,
                hetspec_algorithm=self.algorithm,
                do_sample=True,
                **randomness,
                **self.generation_kwargs,
            )
        finally:
            if not was_enabled:
                disable(self.target)
        stats = last_stats(self.target)
        if stats is not None:
            self.drafted_tokens += stats.drafted_tokens
            self.accepted_tokens += stats.accepted_tokens
            self.target_forwards += stats.target_forwards
        return self._outcome(out)

    def __repr__(self) -> str:
        return (f"hetspec_sampler(algorithm={self.algorithm!r}, num_tokens={self.num_tokens}, "
                f"{self.generation_kwargs})")


class TargetSampler(_Sampler):
    """Plain ``target.generate(do_sample=True)`` (the class's method); uses torch's *global* RNG."""

    def __call__(self, generator: torch.Generator | None) -> Outcome:
        out = _plain_generate(self.target)(self.input_ids, do_sample=True, **self.generation_kwargs)
        return self._outcome(out)

    def __repr__(self) -> str:
        return f"target_sampler(num_tokens={self.num_tokens}, {self.generation_kwargs})"


class TransformersSampler(_Sampler):
    """transformers' built-in universal assisted generation; uses torch's *global* RNG.

    The drafter is deep-copied once, here: with ``do_sample=True`` transformers prunes the assistant's LM head
    and wraps its input embeddings in place, and changes its ``generation_config``. The tokenizers are
    shallow-copied because transformers caches its vocabulary translator (which owns the pruning) per
    *tokenizer pair*: a translator cached for the caller's tokenizers would belong to another model object
    (the caller's drafter, possibly already pruned) and would not prune this copy.
    """

    def __init__(self, target, drafter, target_tokenizer, drafter_tokenizer, input_ids, num_tokens,
                 generation_kwargs):
        super().__init__(target, input_ids, num_tokens, generation_kwargs)
        self.drafter = copy.deepcopy(drafter)
        self.target_tokenizer = copy.copy(target_tokenizer)
        self.drafter_tokenizer = copy.copy(drafter_tokenizer)

    def __call__(self, generator: torch.Generator | None) -> Outcome:
        out = _plain_generate(self.target)(
            self.input_ids,
            assistant_model=self.drafter,
            tokenizer=self.target_tokenizer,
            assistant_tokenizer=self.drafter_tokenizer,
            do_sample=True,
            **self.generation_kwargs,
        )
        return self._outcome(out)

    def __repr__(self) -> str:
        return f"transformers_sampler(num_tokens={self.num_tokens}, {self.generation_kwargs})"


def hetspec_sampler(
    target, drafter, target_tokenizer, drafter_tokenizer, input_ids: torch.Tensor, algorithm: str,
    num_tokens: int = 2, **generation_kwargs,
) -> HetSpecSampler:
    """A sampler running hf_hetspec speculative decoding with ``algorithm`` (any name ``generate`` accepts).

    Each call runs ``target.generate(input_ids, assistant_model=drafter, tokenizer=target_tokenizer,
    assistant_tokenizer=drafter_tokenizer, hetspec_algorithm=algorithm, hetspec_generator=generator,
    do_sample=True, max_new_tokens=num_tokens, **generation_kwargs)`` (hf_hetspec is enabled on ``target`` for
    the call and disabled again if it was not enabled before) and returns the first ``num_tokens`` new ids.
    With ``hetspec_loop="transformers"`` in ``generation_kwargs`` the call runs in transformers' loop, which
    samples with torch's global RNG: no ``hetspec_generator`` is passed then (:func:`sample_outcomes` seeds
    the global RNG).

    Args:
        target, drafter: the models; target_tokenizer, drafter_tokenizer: their tokenizers.
        input_ids (``torch.LongTensor`` of shape ``(1, n)``): the prompt in target ids.
        algorithm: ``hetspec_algorithm`` (``"slem"``, ``"tli"``, ...).
        num_tokens: outcome length; ``max_new_tokens`` defaults to it.
        **generation_kwargs: passed to ``generate()`` (``temperature``, ``top_k``, ``top_p``, ...).

    Returns:
        A callable ``sampler(generator) -> tuple[int, ...]``; ``generator`` is a ``torch.Generator`` on
        ``sampler.device`` (the target's). It also counts drafted / accepted tokens (``acceptance_rate``).
        Errors of ``generate()`` (e.g. ``NotImplementedError`` for an algorithm not available) surface on the
        first call.
    """
    return HetSpecSampler(target, drafter, target_tokenizer, drafter_tokenizer, input_ids, algorithm,
                          num_tokens, generation_kwargs)


def target_sampler(
    target, input_ids: torch.Tensor, num_tokens: int = 2, **generation_kwargs
) -> TargetSampler:
    """A sampler for the target alone: ``target.generate(input_ids, do_sample=True, **generation_kwargs)``.

    The class's ``generate`` is called (an hf_hetspec wrapper on the instance is bypassed). transformers
    samples with torch's global RNG: the ``generator`` argument is ignored, and :func:`sample_outcomes` seeds
    the global RNG instead. ``max_new_tokens`` defaults to ``num_tokens``.
    """
    return TargetSampler(target, input_ids, num_tokens, generation_kwargs)


def transformers_sampler(
    target, drafter, target_tokenizer, drafter_tokenizer, input_ids: torch.Tensor, num_tokens: int = 2,
    **generation_kwargs,
) -> TransformersSampler:
    """A sampler for transformers' own universal assisted generation (different tokenizers).

    Each call runs the class's ``target.generate(input_ids, assistant_model=<copy of drafter>,
    tokenizer=..., assistant_tokenizer=..., do_sample=True, **generation_kwargs)``, i.e. transformers' path
    even if hf_hetspec is enabled on ``target``. The drafter is deep-copied once when the sampler is made
    (transformers mutates it: pruned LM head, wrapped input embeddings, changed ``generation_config``); the
    caller's drafter is never touched. Randomness comes from torch's global RNG (seeded by
    :func:`sample_outcomes`).
    """
    return TransformersSampler(target, drafter, target_tokenizer, drafter_tokenizer, input_ids, num_tokens,
                               generation_kwargs)


def sample_outcomes(
    sampler: Callable[[torch.Generator], Outcome], n: int, seed: int, *, device=None
) -> Counter:
    """Draw ``n`` outcomes from ``sampler`` reproducibly.

    A ``torch.Generator`` on ``device`` (default ``sampler.device`` if it has one, else CPU) seeded with
    ``seed`` is passed to every call; torch's global RNG is also seeded with ``seed`` for the duration (for
    samplers that use it, such as transformers' own ``generate``) and restored afterwards, so the caller's
    random state is unchanged. Calls are sequential and independent: each returns a fresh generation.

    Returns:
        ``collections.Counter`` ``{outcome: count}`` with ``sum(counts.values()) == n``.
    """
    if n < 1:
        raise ValueError(f"n={n}: draw at least one sample.")
    device = torch.device(device if device is not None else getattr(sampler, "device", "cpu"))
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if cuda else []):
        torch.manual_seed(seed)
        return Counter(sampler(generator) for _ in range(n))


# --------------------------------------------------------------------------------------------------------
# The test
# --------------------------------------------------------------------------------------------------------


@dataclass
class LosslessnessReport:
    """Result of :func:`check_lossless`.

    Attributes:
        statistic: Pearson's chi-square statistic over the bins (``inf`` with impossible outcomes).
        dof: degrees of freedom, ``bins - 1`` (0: a single bin, the test has no power; ``p_value`` is 1).
        p_value: probability, under "lossless", of a statistic at least this large.
        total_variation: ``0.5 * sum |observed frequency - expected probability|`` over all outcomes
            (unmerged); descriptive, biased upwards by sampling noise.
        n: number of samples.
        passed: ``p_value >= alpha``.
        alpha: significance level used.
        num_outcomes: outcomes with nonzero expected probability; num_bins: bins after merging.
        impossible: observed outcomes whose expected probability is 0 (each one proves a difference).
        worst: up to 5 ``(outcome, observed count, expected count)`` with the largest ``|obs - exp|``.
        acceptance_rate: accepted / drafted tokens of the sampler, when known (``verify_lossless``).
    """

    statistic: float
    dof: int
    p_value: float
    total_variation: float
    n: int
    passed: bool
    alpha: float
    num_outcomes: int = 0
    num_bins: int = 0
    impossible: tuple[Outcome, ...] = ()
    worst: list[tuple[Outcome, int, float]] = field(default_factory=list)
    acceptance_rate: float | None = None

    def __str__(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        text = (
            f"{verdict}: chi2={self.statistic:.4g}, dof={self.dof}, p={self.p_value:.3g}, "
            f"TV={self.total_variation:.3f}, n={self.n}, alpha={self.alpha:g}, "
            f"{self.num_outcomes} outcomes in {self.num_bins} bins"
        )
        if self.acceptance_rate is not None:
            text += f", acceptance={self.acceptance_rate:.2f}"
        if self.impossible:
            shown = ", ".join(map(str, self.impossible[:5]))
            text += f"; {len(self.impossible)} impossible outcome(s) observed: {shown}"
        if self.worst and not self.passed:
            text += "; largest deviations (outcome, observed, expected): " + ", ".join(
                f"({o}, {c}, {e:.1f})" for o, c, e in self.worst
            )
        return text


def _bin_groups(probs: Mapping[Outcome, float], n: int, min_expected: float) -> list[list[Outcome]]:
    """The bins of :func:`check_lossless` for ``n`` samples: lists of outcomes, a fixed function of ``probs``.

    Every outcome with ``n * P >= min_expected`` is its own bin (most likely first); the others form one
    bin, merged into the smallest regular bin when its own expected count is below ``min_expected``.
    """
    ordered = sorted(((o, p) for o, p in probs.items() if p > 0), key=lambda item: -item[1])
    bins = [[o] for o, p in ordered if n * p >= min_expected]
    rest = [o for o, p in ordered if n * p < min_expected]
    if rest:
        if n * sum(probs[o] for o in rest) >= min_expected or not bins:
            bins.append(rest)
        else:
            smallest = min(bins, key=lambda group: sum(probs[o] for o in group))
            smallest.extend(rest)
    return bins


def check_lossless(
    expected: Mapping[Outcome, float], counts: Mapping[Outcome, int], alpha: float = 1e-3, *,
    min_expected: float = 5.0,
) -> LosslessnessReport:
    """Chi-square goodness-of-fit test of sample ``counts`` against the exact distribution ``expected``.

    Bins: every outcome with expected count ``n * P >= min_expected`` is its own bin; all others are merged
    into one bin, which is in turn merged into the smallest regular bin if its own expected count is below
    ``min_expected``. The statistic is ``scipy.stats.chisquare`` with ``dof = bins - 1`` (nothing is estimated
    from the data). Observed outcomes with expected probability 0 make the test fail at once (``p_value = 0``,
    ``statistic = inf``). See the module docstring for why this is valid and how much power it has.

    Args:
        expected: ``{outcome: probability}`` summing to 1 (e.g. from :func:`exact_target_distribution`).
        counts: ``{outcome: count}`` (e.g. from :func:`sample_outcomes`).
        alpha: significance level; ``passed = p_value >= alpha``.
        min_expected: smallest expected count of a bin (Cochran's rule: 5).

    Returns:
        :class:`LosslessnessReport`.

    Raises:
        ValueError: no samples, negative counts, or ``expected`` with negative values or not summing to 1.
    """
    from scipy.stats import chisquare

    n = int(sum(counts.values()))
    if n < 1 or any(c < 0 for c in counts.values()):
        raise ValueError("counts must be non-negative and contain at least one sample.")
    if any(p < 0 for p in expected.values()) or not math.isclose(sum(expected.values()), 1.0, abs_tol=1e-6):
        raise ValueError(f"expected probabilities must be >= 0 and sum to 1, sum={sum(expected.values())!r}.")
    probs = {o: float(p) for o, p in expected.items() if p > 0}
    total = sum(probs.values())
    probs = {o: p / total for o, p in probs.items()}

    outcomes = set(probs) | {o for o, c in counts.items() if c > 0}
    tv = 0.5 * sum(abs(counts.get(o, 0) / n - probs.get(o, 0.0)) for o in outcomes)
    deviations = sorted(
        ((o, int(counts.get(o, 0)), n * probs.get(o, 0.0)) for o in outcomes), key=lambda t: -abs(t[1] - t[2])
    )
    worst = deviations[:5]
    impossible = tuple(sorted(o for o, c in counts.items() if c > 0 and o not in probs))
    if impossible:
        return LosslessnessReport(math.inf, max(len(probs) - 1, 0), 0.0, tv, n, False, alpha, len(probs), 0,
                                  impossible, worst)

    bins = _bin_groups(probs, n, min_expected)
    bins_obs = [sum(counts.get(o, 0) for o in group) for group in bins]
    bins_exp = [n * sum(probs[o] for o in group) for group in bins]
    dof = len(bins_exp) - 1
    if dof < 1:
        return LosslessnessReport(0.0, 0, 1.0, tv, n, True, alpha, len(probs), len(bins_exp), (), worst)
    scale = n / sum(bins_exp)  # exact agreement of the sums, as scipy requires
    result = chisquare(bins_obs, [e * scale for e in bins_exp])
    p_value = float(result.pvalue)
    return LosslessnessReport(float(result.statistic), dof, p_value, tv, n, p_value >= alpha, alpha,
                              len(probs), len(bins_exp), (), worst)


def chi_square_power(n: int, dof: int, tv: float = 0.1, alpha: float = 1e-3) -> float:
    """Lower bound on the power of :func:`check_lossless` against any alternative at total variation ``tv``.

    Uses the noncentral chi-square approximation with the smallest noncentrality compatible with ``tv``,
    ``lambda = 4 * n * tv**2`` (module docstring). ``tv`` is the distance on the merged bins.

    Returns:
        ``P(noncentral chi2(dof, lambda) > chi2.ppf(1 - alpha, dof))``.
    """
    from scipy.stats import chi2, ncx2

    if dof < 1:
        return 0.0
    return float(ncx2.sf(chi2.isf(alpha, dof), dof, 4.0 * n * tv * tv))


def required_samples(
    expected: Mapping[Outcome, float], tv: float = 0.2, power: float = 0.9, alpha: float = 1e-3, *,
    min_expected: float = 5.0, n_min: int = 100, n_max: int = 2000, step: int = 25,
) -> int:
    """The smallest sample size that detects every alternative at total variation ``tv`` with ``power``.

    Tries ``n = n_min, n_min + step, ...`` up to ``n_max`` and returns the first ``n`` for which
    :func:`chi_square_power` with the degrees of freedom :func:`check_lossless` will use for ``expected`` and
    ``n`` (its bins depend on ``n``: more samples, more bins) reaches ``power``. The bound is a worst case
    over all alternatives at that distance (module docstring), so a concrete broken sampler is usually
    caught with fewer samples. Choosing ``n`` this way depends only on ``expected``, never on samples, so
    the test stays valid.

    Args:
        expected: ``{outcome: probability}`` (e.g. from :func:`exact_target_distribution`).
        tv: total-variation distance (on the bins) to detect.
        power: wanted probability of detecting it at level ``alpha``.
        min_expected, n_min, n_max, step: binning rule of :func:`check_lossless` and the grid of sizes.

    Returns:
        ``n`` (``n_max`` if no smaller size reaches ``power``).

    Raises:
        ValueError: ``tv`` not in ``(0, 1]``, ``power`` not in ``(0, 1)``, or an empty grid.
    """
    if not (0.0 < tv <= 1.0 and 0.0 < power < 1.0):
        raise ValueError(f"tv={tv}, power={power}: need 0 < tv <= 1 and 0 < power < 1.")
    if not (1 <= n_min <= n_max and step >= 1):
        raise ValueError(f"n_min={n_min}, n_max={n_max}, step={step}: need 1 <= n_min <= n_max, step >= 1.")
    probs = {o: float(p) for o, p in expected.items() if p > 0}
    for n in range(n_min, n_max + 1, step):
        dof = len(_bin_groups(probs, n, min_expected)) - 1
        if chi_square_power(n, dof, tv, alpha) >= power:
            return n
    return n_max


def verify_lossless(
    target, drafter, target_tokenizer, drafter_tokenizer, prompt_ids: torch.Tensor, algorithm: str, *,
    n: int = 2000, seed: int = 0, num_tokens: int = 2, alpha: float = 1e-3, **generation_kwargs,
) -> LosslessnessReport:
    """Test hf_hetspec sampling with ``algorithm`` for losslessness on one prompt and one sampling setting.

    :func:`exact_target_distribution` of the first ``num_tokens`` tokens, ``n`` samples from
    :func:`hetspec_sampler` (seeded with ``seed``), then :func:`check_lossless` at level ``alpha``. With the
    defaults (``n = 2000``, ``alpha = 1e-3``) any sampler at total variation >= 0.1 from the target is caught
    with probability > 0.999 for up to ~20 bins (:func:`chi_square_power`), while a correct sampler fails one
    time in a thousand.

    Args:
        target, drafter, target_tokenizer, drafter_tokenizer: as for ``generate()``.
        prompt_ids (``torch.LongTensor`` of shape ``(1, n)``): the prompt in target ids.
        algorithm: ``hetspec_algorithm``.
        n, seed, num_tokens, alpha: sample size, seed, outcome length, significance level.
        **generation_kwargs: the sampling setting; must limit the support (``top_k <= 8`` or ``top_p < 1``).
            hf_hetspec's own keywords (``hetspec_draft_temperature``, ``assistant_input_ids``) go to the
            sampler only, never to the target's exact distribution.

    Returns:
        :class:`LosslessnessReport` with ``acceptance_rate`` of the drafts (0 means no draft was ever
        accepted: the acceptance paths were not exercised -- choose a prompt the drafter predicts well).

    Raises:
        ValueError: ``hetspec_algorithm`` or ``hetspec_generator`` in ``generation_kwargs`` (pass
            ``algorithm=`` and ``seed=``); see also :func:`exact_target_distribution`.
    """
    for name, fix in (("hetspec_algorithm", "algorithm="), ("hetspec_generator", "seed=")):
        if name in generation_kwargs:
            raise ValueError(f"verify_lossless: pass {fix} instead of {name}= (the sampler sets {name} itself).")
    reference_kwargs = {k: v for k, v in generation_kwargs.items() if k not in HetspecArguments.KEYWORDS}
    expected = exact_target_distribution(target, prompt_ids, num_tokens, tokenizer=target_tokenizer,
                                         **reference_kwargs)
    sampler = hetspec_sampler(target, drafter, target_tokenizer, drafter_tokenizer, prompt_ids, algorithm,
                              num_tokens, **generation_kwargs)
    counts = sample_outcomes(sampler, n, seed)
    report = check_lossless(expected, counts, alpha)
    report.acceptance_rate = sampler.acceptance_rate
    return report
