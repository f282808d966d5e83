"""SLEM, TLI and SLRS as transformers ``CandidateGenerator`` classes, for transformers' own assisted-generation
loop (``GenerationMixin._assisted_decoding``).

transformers' loop asks a candidate generator for a draft, ``get_candidates(input_ids) -> (candidate_ids,
candidate_logits)``, verifies it in one target forward and reports back, ``update_candidate_strategy(input_ids,
scores, num_matches)``. Verification is chosen by ``candidate_logits``:

* ``None``: exact match -- greedy against the target's argmax, sampling by sampling every position from the
  target (``p``) and keeping the prefix that equals the draft. That is SLEM (Timor et al. 2025, Algorithm 2),
  every greedy call, every argmax draft of a sampled call (exact-match sampling keeps a point-mass draft token
  with probability ``p(x)``, as speculative sampling against its one-hot ``q`` would) and every context-lookup
  draft (:mod:`hf_hetspec.sources`);
* logits of shape ``(1, k, V_target)``: speculative sampling (Leviathan et al. 2023, Algorithm 1) against
  ``softmax(candidate_logits)``. It is exact when that softmax is the distribution each draft token was drawn
  from, over target ids: TLI's sampled ``q`` pushed onto target ids (Algorithm 4) or SLRS's ``psi``
  (Algorithm 3). The generators hand over ``log q`` (``-inf`` outside the support), whose softmax is ``q``
  again.

The drafting is the proposers' (:mod:`hf_hetspec.slem`, :mod:`hf_hetspec.tli`, :mod:`hf_hetspec.slrs`, built
by :func:`hf_hetspec.plan.build_proposer`), so both loops draft identically. A proposer follows the accepted
ids by itself: each ``get_candidates`` hands it transformers' whole ``input_ids`` and it takes the ids past
those it has seen (the accepted draft tokens and the target's correction or bonus token), exactly as
:func:`hf_hetspec.decoding.speculative_generate` calls it after each verification.

What transformers' loop cannot do exactly is refused by :func:`hf_hetspec.checks.check_loop` (docs/api.md
"transformers' loop"). ``generate(..., hetspec_loop="transformers")`` on an enabled model runs these classes
(:mod:`hf_hetspec.integration`); :func:`hf_hetspec.integration.assisted_decoding_with` is the hook for
callers of ``_assisted_decoding``. ``tests/test_candidates.py`` pins the transformers interfaces used.
"""

from __future__ import annotations

import copy
import time

import torch
from transformers import GenerationConfig
from transformers.generation.candidate_generator import CandidateGenerator

from .plan import DecodingPlan, HetspecArguments, build_proposer, make_plan
from .proposer import Draft, HeterogeneousProposer
from .slem import SLEMProposer
from .sources import SourcedProposer
from .slrs import SLRSProposer
from .stats import DecodingStats
from .tli import TLIProposer

class HetspecCandidateGenerator(CandidateGenerator):
    """Base of :class:`SLEMCandidateGenerator`, :class:`TLICandidateGenerator` and
    :class:`SLRSCandidateGenerator`: one hf_hetspec proposer behind transformers' candidate interface.

    Args:
        proposer: the algorithm's proposer for this call's prompt (:func:`hf_hetspec.plan.build_proposer`):
            an instance of the class's ``proposer_type``, or a :class:`~hf_hetspec.sources.SourcedProposer`
            around one (context lookup and back-off).
        stats: the call's statistics, updated in place (drafted / accepted tokens, target forwards, the
            target's time between a draft and its verification's report); default: the proposer's.

    Raises:
        TypeError: ``proposer`` is another algorithm's.
    """

    #: The algorithm's name (``hetspec_algorithm``) and the proposer class it wraps.
    algorithm: str = ""
    proposer_type: type = HeterogeneousProposer

    def __init__(self, proposer: HeterogeneousProposer, stats: DecodingStats | None = None):
        algorithm_proposer = proposer.inner if isinstance(proposer, SourcedProposer) else proposer
        if not isinstance(algorithm_proposer, self.proposer_type):
            raise TypeError(f"{type(self).__name__} needs a {self.proposer_type.__name__}, got "
                            f"{type(algorithm_proposer).__name__}: use the generator class of the proposer's "
                            "algorithm.")
        self.proposer = proposer
        self.stats = stats if stats is not None else proposer.stats
        self._drafted = 0
        self._handed_over_at: float | None = None

    @property
    def num_drafting_tokens(self) -> int:
        """The most tokens a round drafts, as transformers >= 5.25's ``_assisted_decoding`` asks of every
        candidate generator (it keeps that many steps of a hybrid cache's recurrent states for the rollback).
        hf_hetspec refuses targets with such states (:func:`hf_hetspec.checks.check_model_supported`), so only
        attention caches reach here, which ignore the figure: the cap of the proposer's lookahead in drafter
        tokens (:attr:`hf_hetspec.schedule.AdaptiveLookahead.cap`)."""
        inner = self.proposer.inner if isinstance(self.proposer, SourcedProposer) else self.proposer
        return inner.adaptive_lookahead.cap

    @classmethod
    def from_plan(cls, plan: DecodingPlan, drafter, input_ids: torch.LongTensor,
                  generation_config: GenerationConfig, stats: DecodingStats) -> "HetspecCandidateGenerator":
        """The generator for one call decided by ``plan`` (its algorithm must be the class's).

        Args:
            plan: the call's plan.
            drafter: the drafter model (in its runtime, :func:`hf_hetspec.runtime.prepare_drafter`).
            input_ids (``torch.LongTensor`` of shape ``(1, n)``): the prompt in target ids.
            generation_config: the config transformers decodes with (its ``max_length`` is final).
            stats: the call's statistics.

        Raises:
            ValueError: the plan is for another algorithm.
        """
        if plan.algorithm != cls.algorithm:
            raise ValueError(f"{cls.__name__} runs {cls.algorithm!r}, but the plan is for {plan.algorithm!r}: use "
                             f"{GENERATORS[plan.algorithm].__name__}.")
        with stats.timer("translation_s"):  # converts the drafter's prompt
            proposer = build_proposer(plan, drafter, input_ids, generation_config, stats, None)
        return cls(proposer, stats)

    @classmethod
    def for_call(cls, target, drafter, input_ids: torch.LongTensor, generation_config: GenerationConfig, *,
                 tokenizer, assistant_tokenizer, hetspec_drafter: str = "auto",
                 hetspec_draft_temperature: float | None = None,
                 assistant_input_ids: torch.LongTensor | None = None) -> "HetspecCandidateGenerator":
        """The generator for a call of ``_assisted_decoding`` made by the caller (docs/api.md "transformers'
        loop"), checked as ``generate(..., hetspec_loop="transformers")`` checks a call.

        Args:
            target, drafter: the models (``drafter`` is never modified; ``hetspec_drafter`` picks its runtime).
            input_ids (``torch.LongTensor`` of shape ``(1, n)``): the prompt in target ids.
            generation_config: the call's config (``max_new_tokens`` or ``max_length``: drafts never cross it).
            tokenizer, assistant_tokenizer: the target's and the drafter's tokenizers.
            hetspec_drafter, hetspec_draft_temperature, assistant_input_ids: as in ``generate()``.

        Raises:
            ValueError / TypeError / NotImplementedError: as ``generate()``, before any work.
        """
        args = HetspecArguments(algorithm=cls.algorithm, draft_temperature=hetspec_draft_temperature,
                                drafter_prompt=assistant_input_ids, drafter_runtime=hetspec_drafter,
                                loop="transformers", target_runtime="eager")  # the caller runs the target
        call = {"inputs": input_ids, "generation_config": generation_config, "assistant_model": drafter}
        plan = make_plan(target, call, {"tokenizer": tokenizer, "assistant_tokenizer": assistant_tokenizer}, args)
        prepared = plan.drafter  # the drafter in its runtime, prepared once by the plan
        stats = DecodingStats(algorithm=plan.algorithm, note="; ".join(filter(None, (plan.note, prepared.note))),
                              drafter_runtime=prepared.runtime,
                              drafter_prepare_s=prepared.prepare_s, drafter_memory_bytes=prepared.memory_bytes)
        decoding_config = copy.deepcopy(generation_config)
        if decoding_config.max_new_tokens is not None:  # as transformers' generate() resolves the length
            decoding_config.max_length = decoding_config.max_new_tokens + input_ids.shape[1]
        return cls.from_plan(plan, prepared.model, input_ids, decoding_config, stats)

    def get_candidates(self, input_ids: torch.LongTensor, **kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """The next draft after the accepted ``input_ids``.

        Args:
            input_ids (``torch.LongTensor`` of shape ``(1, n)``): every accepted target id (prompt included).

        Returns:
            ``candidate_ids`` (``torch.LongTensor`` of shape ``(1, n + k)``): ``input_ids`` then the ``k >= 0``
            drafted target ids; ``candidate_logits``: ``None`` (exact match) or ``torch.FloatTensor`` of shape
            ``(1, k, V_target)`` whose softmax is the distribution the draft was drawn from
            (:meth:`candidate_logits`).

        Raises:
            ValueError: ``input_ids`` is not a continuation of the ids the generator has seen (a generator
                serves one call).
        """
        seen = len(self.proposer.target_ids)
        if input_ids.shape[1] < seen or input_ids[0, :seen].tolist() != self.proposer.target_ids:
            raise ValueError(f"{type(self).__name__}.get_candidates: input_ids do not continue the sequence this "
                             "generator drafted for; make one generator per generate() call.")
        draft = self.proposer.propose(input_ids)
        self._drafted = len(draft.target_ids)
        self.stats.drafted_tokens += self._drafted
        drafted = torch.tensor([draft.target_ids], dtype=input_ids.dtype, device=input_ids.device)  # [1, k]
        self._handed_over_at = time.perf_counter()
        return torch.cat([input_ids, drafted], dim=1), self.candidate_logits(draft)

    def candidate_logits(self, draft: Draft) -> torch.Tensor | None:
        """What verification compares the draft with: ``log q`` of shape ``(1, k, V_target)`` (``-inf``
        outside the support, so ``softmax`` gives back ``q``), or ``None`` for exact match (no ``q``, or an
        empty draft, which transformers then verifies by the target's own choice)."""
        if draft.q is None or not draft.target_ids:
            return None
        return draft.q.float().log()[None]

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int):
        """Count the verification and adapt the draft length (:meth:`HeterogeneousProposer.update_schedule`).

        Args:
            input_ids (``torch.LongTensor`` of shape ``(1, n')``): the ids after this verification.
            scores (``torch.FloatTensor`` of shape ``(1, k + 1, V_target)``): the target's processed logits.
            num_matches: draft tokens kept (transformers' count, after its cut at EOS or ``max_length``).
        """
        if self._handed_over_at is not None:
            self.stats.target_s += time.perf_counter() - self._handed_over_at
            self._handed_over_at = None
        accepted = int(num_matches)
        self.stats.target_forwards += 1
        self.stats.accepted_tokens += min(accepted, self._drafted)
        self.stats.rejections += int(accepted < self._drafted)
        self.proposer.update_schedule(accepted)


class SLEMCandidateGenerator(HetspecCandidateGenerator):
    """SLEM (Timor et al. 2025, Algorithm 2) for transformers' loop: the drafter's greedy text re-tokenized
    for the target (:class:`~hf_hetspec.slem.SLEMProposer`), verified by exact match (``candidate_logits``
    ``None``; sampling: the target samples every position)."""

    algorithm = "slem"
    proposer_type = SLEMProposer

    def candidate_logits(self, draft: Draft) -> None:
        return None


class TLICandidateGenerator(HetspecCandidateGenerator):
    """TLI (Timor et al. 2025, Algorithm 4) for transformers' loop: drafts from the vocabulary intersection
    (:class:`~hf_hetspec.tli.TLIProposer`, the drafter's logits restricted by
    :class:`~hf_hetspec.intersection.IntersectionLogitsProcessor`); sampled calls are verified by speculative
    sampling against ``q`` pushed onto target ids (exact match for argmax drafts), greedy calls by exact match.

    Unlike transformers' ``UniversalSpeculativeDecodingGenerator`` it keeps the target's distribution exactly.
    """

    algorithm = "tli"
    proposer_type = TLIProposer


class SLRSCandidateGenerator(HetspecCandidateGenerator):
    """SLRS (Timor et al. 2025, Algorithm 3, one-token indicator) for transformers' loop
    (:class:`~hf_hetspec.slrs.SLRSProposer`); sampled calls are verified by speculative sampling against
    ``psi``, the push-forward of the drafter's ``q`` through the longest-prefix map (exact match for argmax
    drafts), greedy calls by exact match."""

    algorithm = "slrs"
    proposer_type = SLRSProposer


#: The generator class of each algorithm.
GENERATORS: dict[str, type[HetspecCandidateGenerator]] = {
    "slem": SLEMCandidateGenerator,
    "tli": TLICandidateGenerator,
    "slrs": SLRSCandidateGenerator,
}
