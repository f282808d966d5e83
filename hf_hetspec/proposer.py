"""What every heterogeneous-vocabulary drafter does between two verifications.

:class:`HeterogeneousProposer` is the base of SLEM's, TLI's and SLRS's proposers: it follows the target's
accepted ids, keeps the drafter's context on the same text (:class:`~hf_hetspec.drafter.DrafterContext`),
respects the length budget, adapts the lookahead, and leaves to each algorithm only :meth:`_propose` --
how to draft, returned as a :class:`Draft` (target ids, and the distribution ``q`` they were drawn from
when :mod:`hf_hetspec.verify` needs it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import LogitsProcessorList

from .alignment import Vocabulary, complete_utf8_prefix, convert_prompt, sanitize_utf8
from .drafter import DrafterContext, DrafterContextFull
from .intersection import IntersectionLogitsProcessor, push_forward
from .schedule import MAX_LOOKAHEAD, AdaptiveLookahead, DraftStop, Schedule  # noqa: F401 -- old path of MAX_LOOKAHEAD
from .stats import DecodingStats
from .tree import RunnerUps


def drafter_prompt_ids(target_vocab: Vocabulary, drafter_vocab: Vocabulary, target_prompt: list[int]) -> list[int]:
    """The default drafter prompt: the target prompt converted by :func:`~hf_hetspec.alignment.convert_prompt`
    (text as plain text, special tokens matched by content, the drafter's own BOS once)."""
    return convert_prompt(target_vocab, drafter_vocab, target_prompt)


@dataclass
class Draft:
    """One draft, in the target's vocabulary.

    Attributes:
        target_ids: the ``k >= 0`` drafted target token ids.
        q (``torch.FloatTensor`` of shape ``(k, V_target)``, or ``None``): for speculative sampling, the
            distribution each draft token was drawn from (TLI's ``q``, SLRS's ``psi``); ``None`` for
            exact-match verification (SLEM, argmax drafts, context-lookup drafts, and every greedy call).
        branches: other target-id sequences from the same position (SLEM's sibling branches,
            :mod:`hf_hetspec.tree`), verified with ``target_ids`` as one tree where the loop can (greedy or by
            exact-match sampling); a loop that cannot verifies ``target_ids`` alone, which is exact too.
    """

    target_ids: list[int]
    q: torch.Tensor | None = None
    branches: list[list[int]] = field(default_factory=list)


class Proposer(Protocol):
    """What the decoding loop (:func:`hf_hetspec.decoding.speculative_generate`) may use of a proposer, and all
    it may use: drafts, the verification's outcome, and one count for the statistics."""

    #: drafter tokens dropped from the drafter's context to fit its maximum context (statistics).
    truncated_tokens: int

    def propose(self, input_ids: torch.LongTensor) -> Draft:
        """The next draft after the accepted target ids ``input_ids`` (``(1, n)``)."""

    def update_schedule(self, num_accepted: int) -> None:
        """The verification accepted ``num_accepted`` tokens of the last draft."""


class PrefillingProposer(Proposer, Protocol):
    """A proposer whose drafter can prefill its prompt on a second thread while the target prefills
    (:func:`hf_hetspec.decoding.overlaps_prefill`)."""

    #: where the drafter runs.
    drafter_device: torch.device
    #: drafter tokens not yet in the drafter's KV cache.
    prefill_tokens: int

    def prefill_drafter(self) -> int:
        """Feed the drafter's prompt but its last token; returns the tokens fed."""


class HeterogeneousProposer:
    """Base of the proposers of SLEM, TLI and SLRS (drafters with another vocabulary).

    Args:
        target_vocab: byte table of the target tokenizer (padded to the target's LM-head rows).
        drafter: the drafter model.
        drafter_vocab: byte table of the drafter tokenizer (padded to the drafter's LM-head rows).
        input_ids (``torch.LongTensor`` of shape ``(1, n)``): the prompt in target ids.
        schedule: lookahead (initial value when adaptive), adaptation and confidence stop
            (:class:`~hf_hetspec.schedule.Schedule`; its adaptive state: :class:`~hf_hetspec.schedule.AdaptiveLookahead`).
        max_length: the target's ``generation_config.max_length``; drafts never cross it.
        stats: statistics of the call, updated in place.
        window: tokens of context re-encoded with new text on either side.
        drafter_prompt: the prompt in drafter ids (e.g. the drafter's own chat template applied to the same
            messages, ``generate(assistant_input_ids=...)``); default: the target prompt converted by
            :func:`drafter_prompt_ids`. It only changes what the drafter proposes, never the output.
    """

    def __init__(
        self,
        target_vocab: Vocabulary,
        drafter,
        drafter_vocab: Vocabulary,
        input_ids: torch.LongTensor,
        *,
        schedule: Schedule,
        max_length: int,
        stats: DecodingStats,
        window: int = 4,
        drafter_prompt: list[int] | None = None,
    ):
        self.target_vocab = target_vocab
        self.drafter_vocab = drafter_vocab
        self.adaptive_lookahead = AdaptiveLookahead.start(schedule)
        self.stop: DraftStop | None = schedule.stop if schedule.stop.enabled else None
        self.max_length = max_length
        self.stats = stats
        self.target_ids: list[int] = input_ids[0].tolist()
        self.target_gen_bytes = b""
        with stats.timer("translation_s"):
            prompt = drafter_prompt if drafter_prompt else drafter_prompt_ids(target_vocab, drafter_vocab,
                                                                              self.target_ids)
        self.context = DrafterContext(drafter, drafter_vocab, prompt, window)
        self._last_draft_len = 0

    def propose(self, input_ids: torch.LongTensor) -> Draft:
        """Follow the accepted ids and draft what comes next.

        Args:
            input_ids (``torch.LongTensor`` of shape ``(1, n)``): accepted target ids.

        Returns:
            the next :class:`Draft` (no token when there is no room, when the drafter's context is full, or
            when the target stopped inside a character and must finish it alone).
        """
        self._last_draft_len = 0
        new = input_ids[0, len(self.target_ids) :].tolist()
        self.target_ids.extend(new)
        self.target_gen_bytes += self.target_vocab.ids_to_bytes(new)
        budget = self.max_length - len(self.target_ids) - 1
        text = self.target_gen_bytes
        if budget < 1 or complete_utf8_prefix(text) < len(text):
            # no room, or the target stopped inside a character: let it finish on its own
            self.stats.skipped_drafts += 1
            return Draft([])
        with self.stats.timer("translation_s"):
            self.context.sync(sanitize_utf8(text))
        forwards = self.context.forwards
        try:
            draft = self._propose(budget)
        except DrafterContextFull:
            # the drafter's maximum context is full even after truncation: the target goes on alone
            draft = Draft([])
            self.stats.skipped_drafts += 1
        self.stats.drafter_forwards += self.context.forwards - forwards
        if draft.target_ids:
            self._last_draft_len = len(draft.target_ids)
            self.stats.lookaheads.append(self.lookahead)
        return draft

    def prefill_drafter(self) -> int:
        """Feed the drafter's prompt but its last token now (:meth:`DrafterContext.prefill`), timed and counted
        as drafter work; returns the tokens fed. Safe on another thread while the target runs: it touches the
        drafter's context and this call's drafter statistics only."""
        forwards = self.context.forwards
        with self.stats.timer("drafter_s"):
            fed = self.context.prefill()
        self.stats.drafter_forwards += self.context.forwards - forwards
        return fed

    @property
    def truncated_tokens(self) -> int:
        """Drafter tokens dropped to fit the drafter's maximum context (:class:`PrefillingProposer`)."""
        return self.context.truncated_tokens

    @property
    def drafter_device(self) -> torch.device:
        """Where the drafter runs."""
        return self.context.device

    @property
    def prefill_tokens(self) -> int:
        """Drafter tokens not yet in the drafter's KV cache."""
        return len(self.context.ids) - self.context.cache.get_seq_length()

    def _propose(self, budget: int) -> Draft:
        """Draft up to ``budget`` target tokens."""
        raise NotImplementedError

    @property
    def lookahead(self) -> int:
        """Drafter tokens of the next draft (:class:`~hf_hetspec.schedule.AdaptiveLookahead`)."""
        return self.adaptive_lookahead.value

    @lookahead.setter
    def lookahead(self, value: int) -> None:
        self.adaptive_lookahead.value = value

    def update_schedule(self, num_accepted: int) -> None:
        """Adapt the lookahead after a verification that accepted ``num_accepted`` draft tokens
        (:meth:`hf_hetspec.schedule.AdaptiveLookahead.update`)."""
        self.adaptive_lookahead.update(self._last_draft_len, num_accepted)


@dataclass(frozen=True)
class DraftPolicy:
    """How TLI and SLRS pick each draft token and what they hand to verification; decided once per call by
    :func:`hf_hetspec.plan.choose_draft_policy` (``None`` for SLEM, which always drafts the argmax).

    Attributes:
        sample: draw each draft token from ``q`` (Timor et al. 2025, Algorithms 3 and 4); ``False``: the
            drafter's argmax (over the intersection for TLI, of ``psi`` for SLRS). Speculative sampling is
            exact for any ``q`` the draft really came from (Leviathan et al. 2023, Thm. 1): this changes speed
            only.
        warpers: the call's vocabulary-independent warpers for the drafter's logits (temperature, top-k,
            top-p; a positive ``hetspec_draft_temperature`` replaces the call's temperature), applied before
            ``q`` is formed; empty for a greedy call. The target's id-indexed processors never touch the
            drafter.
        needs_q: the draft is sampled, so it is verified by speculative sampling against the distribution it
            was drawn from; ``False``: exact match, no ``q`` (greedy calls, and argmax drafts in sampled calls:
            exact-match sampling keeps an argmax draft token with probability ``p(x)``, as speculative
            sampling against its one-hot ``q`` would, with no ``(k, V_target)`` tensor).
    """

    sample: bool = False
    warpers: LogitsProcessorList = field(default_factory=LogitsProcessorList)
    needs_q: bool = False

    def __post_init__(self):
        if self.needs_q and not self.sample:
            raise ValueError("DraftPolicy(needs_q=True) needs sample=True: an argmax draft is a point mass, verified "
                             "by exact match without a q.")


@dataclass
class DraftStep:
    """One token-level draft token.

    Attributes:
        target: the proposed target id.
        drafter: the drafter id it came from (``None``: SLRS's argmax of ``psi`` spelled by no drafter token).
        proposal (``torch.FloatTensor`` of shape ``(1, V_target)``, or ``None``): the distribution ``target`` was
            drawn from (TLI's push-forward ``q``, SLRS's ``psi``), when it was computed.
    """

    target: int
    drafter: int | None
    proposal: torch.Tensor | None = None


class TokenLevelProposer(HeterogeneousProposer):
    """Base of TLI and SLRS: each drafter token proposes one target token through a fixed map, and both draft
    through the one loop of :meth:`_propose`; each algorithm says only how a token is chosen
    (:meth:`_choose`) and how the drafter continues after it (:meth:`_continue`).

    Args:
        drafter_to_target (``torch.LongTensor`` of shape ``(V_drafter,)``): the map; drafter ids mapped to
            ``-1`` are never drafted (their logits are masked before sampling).
        target_size: ``V_target`` (rows of the target's LM head).
        policy: argmax or sample, the warpers, whether a ``q`` is handed over (:class:`DraftPolicy`).
        generator: randomness for drafting, on the drafter's device (``None`` = global RNG).
        target_eos_ids: a draft ends after the first of these (nothing is generated after an accepted EOS).
        prune_head: compute the drafter's logits only for the mapped drafter ids
            (:meth:`~hf_hetspec.drafter.DrafterContext.restrict_head`) -- exact when unmapped ids are never
            drafted anyway (TLI). ``map`` and ``mask`` are then indexed by the kept rows' columns.
        sibling_min_joint, runner_ups: sibling branches beside argmax drafts (``Schedule.sibling_min_joint`` and
            ``sibling_runner_ups``; 0: none; :meth:`_siblings`).
        other arguments: as :class:`HeterogeneousProposer`.
    """

    def __init__(
        self,
        target_vocab,
        drafter,
        drafter_vocab,
        input_ids,
        *,
        drafter_to_target: torch.Tensor,
        target_size: int,
        policy: DraftPolicy,
        generator: torch.Generator | None = None,
        target_eos_ids: list[int] | None = None,
        prune_head: bool = False,
        sibling_min_joint: float = 0.0,
        runner_ups: int = 1,
        **kwargs,
    ):
        super().__init__(target_vocab, drafter, drafter_vocab, input_ids, **kwargs)
        # siblings only beside argmax drafts: a draft handed over with its q is verified as a chain
        self.sibling_min_joint = sibling_min_joint if not policy.needs_q else 0.0
        self.runner_ups = runner_ups
        self._runner_ups: RunnerUps | None = None  # the current draft's, with sibling branches
        device = self.context.device
        mapped = drafter_to_target[: self.context.n_tokens]
        self.map_list = mapped.tolist()  # indexed by drafter id
        # columns of the drafter's logits: every drafter id, or only the mapped ones with a pruned LM head
        kept = (mapped >= 0).nonzero().squeeze(1)
        self.columns: list[int] | None = None  # drafter id per column when the head is pruned
        if prune_head and self.context.restrict_head(kept):
            self.stats.drafter_head_rows = int(kept.numel())
            self.columns = kept.tolist()
            mapped = mapped[kept]
        self.map = mapped.to(device)  # [columns] -> target id
        self.restrict = IntersectionLogitsProcessor(mapped.to(device))  # unmapped columns -> -inf
        self.target_size = target_size
        self.policy = policy
        self.generator = generator
        self.target_eos = set(target_eos_ids or [])

    def drafter_distribution(self, logits: torch.Tensor) -> torch.Tensor:
        """``q``: the distribution drafts are drawn from (``(1, columns)``), from the drafter's logits:
        unmapped ids masked, then the policy's warpers, then softmax. The call's warpers (temperature, top-k,
        top-p) give the same ``q`` whether unmapped ids are masked or pruned away."""
        scores = self.restrict(None, logits)
        if len(self.policy.warpers):
            scores = self.policy.warpers(torch.empty(1, 0, dtype=torch.long, device=scores.device), scores)
        return scores.softmax(dim=-1)

    def token_level_length(self, budget: int) -> int:
        """Drafter tokens in the next draft: one target token per drafter token, so never more than can be
        verified (``budget``) or than the drafter's context holds."""
        return min(self.lookahead, budget, self.context.room())

    def _propose(self, budget: int) -> Draft:
        """The draft loop of TLI and SLRS: choose a token, stop after the target's EOS or when the confidence
        stop says so (:class:`~hf_hetspec.schedule.DraftStop`, on the proposal probability of the drafted
        target token: TLI's ``q(t)``, SLRS's ``psi(t)``), else let the drafter continue from it."""
        n_tokens = self.token_level_length(budget)
        if n_tokens < 1:
            raise DrafterContextFull(f"the drafter holds at most {self.context.capacity} positions")
        steps: list[DraftStep] = []
        joint = 1.0
        self._runner_ups = RunnerUps(self.runner_ups) if self.sibling_min_joint > 0 else None
        for _ in range(n_tokens):
            with self.stats.timer("drafter_s"):
                logits = self.context.next_logits()  # [1, columns]
                step = self._choose(logits)
                steps.append(step)
                if self.stop is not None:
                    confidence = self._confidence(logits, step)
                    joint *= confidence
            if step.target in self.target_eos or (self.stop is not None and self.stop.ends(confidence, joint)):
                break  # the drafter's context catches up on the proposed text at the next sync
            with self.stats.timer("translation_s"):
                if not self._continue(step):
                    break
        targets = [step.target for step in steps]
        if not self.policy.needs_q or not targets:
            return Draft(targets, branches=self._siblings(targets))
        return Draft(targets, torch.cat([step.proposal for step in steps], dim=0))  # [k, V_target]

    def _choose(self, logits: torch.Tensor) -> DraftStep:
        """The next draft token from the drafter's next-token logits (``(1, columns)``)."""
        raise NotImplementedError

    def _argmax(self, probs: torch.Tensor, to_target: torch.Tensor | None = None) -> torch.Tensor:
        """The argmax column of ``probs`` (``(1, N)``, a distribution; ``(1, 1)``), keeping, when the draft carries
        siblings, the runner-ups as target ids (``to_target[column]``, or the column itself) for
        :meth:`_siblings`."""
        if self._runner_ups is None:
            return probs.argmax(dim=-1, keepdim=True)
        return self._runner_ups.top(probs, to_target)[0]

    def _siblings(self, targets: list[int]) -> list[list[int]]:
        """Sibling branches beside the argmax draft ``targets`` (target ids, :mod:`hf_hetspec.tree`): ``targets[:i] +
        [runner-up]`` for each runner-up the joint rule keeps at position ``i``
        (:meth:`~hf_hetspec.tree.RunnerUps.siblings`, SLEM's rule). One target token per drafter token: a branch
        costs no drafter step, only its tokens in the verification."""
        if self._runner_ups is None:
            return []
        return [targets[:i] + [target] for i, target in self._runner_ups.siblings(self.sibling_min_joint, len(targets))
                if target >= 0 and target != targets[i]]

    def _continue(self, step: DraftStep) -> bool:
        """Extend the drafter's context by ``step``'s token; ``False`` when it cannot continue from it."""
        raise NotImplementedError

    def _confidence(self, logits: torch.Tensor, step: DraftStep) -> float:
        """The proposal probability of ``step``'s target token (only computed when a stop is set)."""
        proposal = step.proposal
        if proposal is None:
            proposal = push_forward(self.drafter_distribution(logits), self.map, self.target_size)
        return float(proposal[0, step.target])
