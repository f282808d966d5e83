"""What every heterogeneous-vocabulary drafter does between two verifications.

:class:`HeterogeneousProposer` is the ``CandidateGenerator`` base of SLEM, TLI and SLRS: it follows the
target's accepted ids, keeps the drafter's context on the same text (:class:`~hf_hetspec.drafter.DrafterContext`),
respects the length budget, adapts the lookahead, and leaves to each algorithm only :meth:`_propose` --
how to draft and what to hand to :mod:`hf_hetspec.verify`.
"""

from __future__ import annotations

import torch
from transformers.generation import CandidateGenerator

from transformers import LogitsProcessorList

from .alignment import Vocabulary, complete_utf8_prefix, convert_prompt, sanitize_utf8
from .drafter import DrafterContext, DraftStop
from .stats import DecodingStats


def drafter_prompt_ids(target_vocab: Vocabulary, drafter_vocab: Vocabulary, target_prompt: list[int]) -> list[int]:
    """The default drafter prompt: the target prompt converted by :func:`~hf_hetspec.alignment.convert_prompt`
    (text as plain text, special tokens matched by content, the drafter's own BOS once)."""
    return convert_prompt(target_vocab, drafter_vocab, target_prompt)


class HeterogeneousProposer(CandidateGenerator):
    """Base ``CandidateGenerator`` for drafters with another vocabulary.

    Args:
        target_vocab: byte table of the target tokenizer (padded to the target's LM-head rows).
        drafter: the drafter model.
        drafter_vocab: byte table of the drafter tokenizer (padded to the drafter's LM-head rows).
        input_ids (``torch.LongTensor`` of shape ``(1, n)``): the prompt in target ids.
        lookahead: drafter tokens per draft (initial value when ``adaptive``), >= 1.
        adaptive: grow the lookahead by 2 after a fully accepted draft, shrink it by 1 otherwise
            (transformers' "heuristic" schedule), within ``[1, max_lookahead]``.
        max_length: the target's ``generation_config.max_length``; drafts never cross it.
        stats: statistics of the call, updated in place.
        stop: ends drafts early from the drafter's confidence (:class:`~hf_hetspec.drafter.DraftStop`);
            ``None`` or a disabled one: every draft has ``lookahead`` drafter tokens.
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
        lookahead: int,
        adaptive: bool,
        max_length: int,
        stats: DecodingStats,
        max_lookahead: int = 16,
        window: int = 4,
        stop: DraftStop | None = None,
        drafter_prompt: list[int] | None = None,
    ):
        self.target_vocab = target_vocab
        self.drafter_vocab = drafter_vocab
        self.lookahead = lookahead
        self.adaptive = adaptive
        self.max_lookahead = max(max_lookahead, lookahead)
        self.max_length = max_length
        self.stats = stats
        self.stop = stop if stop else None
        self.target_ids: list[int] = input_ids[0].tolist()
        self.target_gen_bytes = b""
        with stats.timer("translation_s"):
            prompt = drafter_prompt if drafter_prompt else drafter_prompt_ids(target_vocab, drafter_vocab,
                                                                              self.target_ids)
        self.drafter = DrafterContext(drafter, drafter_vocab, prompt, window)
        self._last_draft_len = 0

    def get_candidates(self, input_ids: torch.LongTensor, **kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """Return ``(candidate_input_ids, candidate_logits)``.

        Args:
            input_ids (``torch.LongTensor`` of shape ``(1, n)``): accepted target ids.

        Returns:
            ``candidate_input_ids`` (``torch.LongTensor`` of shape ``(1, n + k)``): ``input_ids`` followed by
            ``k >= 0`` draft tokens in the target vocabulary; ``candidate_logits``
            (``torch.FloatTensor`` of shape ``(1, k, V_target)``) whose softmax is the distribution each draft
            token was sampled from, or ``None`` for exact-match verification.
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
            return input_ids, None
        with self.stats.timer("translation_s"):
            self.drafter.sync(sanitize_utf8(text))
        # token-level algorithms draft one target token per drafter token: never more than can be verified
        self.draft_len = min(self.lookahead, budget, self.drafter.room())
        forwards = self.drafter.forwards
        candidates, logits = self._propose(budget)
        self.stats.drafter_forwards += self.drafter.forwards - forwards
        if not candidates:
            return input_ids, None
        self._last_draft_len = len(candidates)
        self.stats.lookaheads.append(self.lookahead)
        extra = torch.tensor([candidates], dtype=input_ids.dtype, device=input_ids.device)
        return torch.cat([input_ids, extra], dim=1), logits

    def _propose(self, budget: int) -> tuple[list[int], torch.Tensor | None]:
        """Draft up to ``budget`` target tokens: ``(target ids, candidate_logits (1, k, V_target) or None)``."""
        raise NotImplementedError

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int):
        """Adapt the lookahead: +2 after a fully accepted draft, -1 otherwise (when ``adaptive``)."""
        if not self.adaptive or self._last_draft_len == 0:
            return
        if num_matches >= self._last_draft_len:
            self.lookahead = min(self.lookahead + 2, self.max_lookahead)
        else:
            self.lookahead = max(1, self.lookahead - 1)


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
        device = self.drafter.device
        mapped = drafter_to_target[: self.drafter.n_tokens]
        self.map_list = mapped.tolist()  # indexed by drafter id
        # columns of the drafter's logits: every drafter id, or only the mapped ones with a pruned LM head
        kept = (mapped >= 0).nonzero().squeeze(1)
        if prune_head and self.drafter.restrict_head(kept):
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

    def one_hot_log_q(self, targets: list[int]) -> torch.Tensor:
        """``log q`` of greedy drafts, ``(1, k, V_target)`` on the drafter's device: 0 at each drafted target
        id, ``-inf`` elsewhere (``q`` is one-hot: the draft was certain to be that token)."""
        log_q = torch.full((1, len(targets), self.target_size), float("-inf"), device=self.drafter.device)
        log_q[0, torch.arange(len(targets), device=log_q.device), torch.tensor(targets, device=log_q.device)] = 0.0
        return log_q
