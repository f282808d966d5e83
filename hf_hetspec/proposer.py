"""What every heterogeneous-vocabulary drafter does between two verifications.

:class:`HeterogeneousProposer` is the base of SLEM's, TLI's and SLRS's proposers: it follows the target's
accepted ids, keeps the drafter's context on the same text (:class:`~hf_hetspec.drafter.DrafterContext`),
respects the length budget, adapts the lookahead, and leaves to each algorithm only :meth:`_propose` --
how to draft, returned as a :class:`Draft` (target ids, and the distribution ``q`` they were drawn from
when :mod:`hf_hetspec.verify` needs it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList

from .alignment import Vocabulary, complete_utf8_prefix, convert_prompt, sanitize_utf8
from .drafter import DrafterContext, DrafterContextFull
from .schedule import MAX_LOOKAHEAD, AdaptiveLookahead, DraftStop, Schedule  # noqa: F401 -- old path of MAX_LOOKAHEAD
from .stats import DecodingStats


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
            distribution each draft token was drawn from (TLI's ``q``, SLRS's ``psi``; one-hot for a greedy
            draft); ``None`` for exact-match verification (SLEM, and every greedy call).
    """

    target_ids: list[int]
    q: torch.Tensor | None = None


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


class TokenLevelProposer(HeterogeneousProposer):
    """Base of TLI and SLRS: each drafter token proposes one target token through a fixed map.

    Args:
        drafter_to_target (``torch.LongTensor`` of shape ``(V_drafter,)``): the map; drafter ids mapped to
            ``-1`` are never drafted (their logits are masked before sampling).
        target_size: ``V_target`` (rows of the target's LM head).
        sampling: verify by speculative sampling (``do_sample=True``), else by exact match.
        greedy_draft: with ``sampling``, draft the drafter's argmax instead of a sample of ``q``; the draft is
            then deterministic given the context, ``q`` is one-hot at the drafted token and a draft token ``x``
            is accepted with probability ``p(x)`` -- the same acceptance as exact-match sampling (SLEM).
            Speculative sampling is exact for any ``q`` the draft really came from (Leviathan et al. 2023,
            Thm. 1), so this only changes speed. Ignored without ``sampling`` (drafts are greedy then).
        drafter_processors: vocabulary-independent warpers for the drafter's logits (temperature, top-k,
            top-p of the call); the target's id-indexed processors never touch the drafter.
        generator: randomness for drafting, on the drafter's device (``None`` = global RNG).
        target_eos_ids: a draft ends after the first of these.
        prune_head: compute the drafter's logits only for the mapped drafter ids
            (:meth:`~hf_hetspec.drafter.DrafterContext.restrict_head`) -- exact when unmapped ids are never
            drafted anyway (TLI). ``map`` and ``mask`` are then indexed by the kept rows' columns, and
            :meth:`~hf_hetspec.drafter.DrafterContext.draft` turns a chosen column into its drafter id.
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
        sampling: bool,
        greedy_draft: bool = False,
        drafter_processors: LogitsProcessorList | None = None,
        generator: torch.Generator | None = None,
        target_eos_ids: list[int] | None = None,
        prune_head: bool = False,
        **kwargs,
    ):
        super().__init__(target_vocab, drafter, drafter_vocab, input_ids, **kwargs)
        device = self.context.device
        mapped = drafter_to_target[: self.context.n_tokens]
        self.map_list = mapped.tolist()  # indexed by drafter id
        # columns of the drafter's logits: every drafter id, or only the mapped ones with a pruned LM head
        kept = (mapped >= 0).nonzero().squeeze(1)
        if prune_head and self.context.restrict_head(kept):
            self.stats.drafter_head_rows = int(kept.numel())
            mapped = mapped[kept]
        self.map = mapped.to(device)  # [columns] -> target id
        self.mask = torch.where(mapped >= 0, 0.0, float("-inf")).to(device)  # [columns]
        self.target_size = target_size
        self.sampling = sampling
        self.greedy_draft = greedy_draft or not sampling
        self.processors = drafter_processors or LogitsProcessorList()
        self.generator = generator
        self.target_eos = set(target_eos_ids or [])

    def drafter_distribution(self, logits: torch.Tensor) -> torch.Tensor:
        """``q``: the distribution drafts are drawn from (``(1, columns)``), from the drafter's logits:
        unmapped ids masked, then (when sampling) the call's warpers, then softmax. The call's warpers
        (temperature, top-k, top-p) give the same ``q`` whether unmapped ids are masked or pruned away."""
        scores = logits.float() + self.mask
        if self.sampling and len(self.processors):
            scores = self.processors(torch.empty(1, 0, dtype=torch.long, device=scores.device), scores)
        return scores.softmax(dim=-1)

    def one_hot_q(self, targets: list[int]) -> torch.Tensor:
        """``q`` of greedy drafts, ``(k, V_target)`` on the drafter's device: 1 at each drafted target id, 0
        elsewhere (the draft was certain to be that token)."""
        q = torch.zeros(len(targets), self.target_size, device=self.context.device)
        q[torch.arange(len(targets), device=q.device), torch.tensor(targets, device=q.device)] = 1.0
        return q

    def token_level_length(self, budget: int) -> int:
        """Drafter tokens in the next draft: one target token per drafter token, so never more than can be
        verified (``budget``) or than the drafter's context holds."""
        return min(self.lookahead, budget, self.context.room())
