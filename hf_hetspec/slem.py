"""SLEM: string-level exact match (Timor et al. 2025, Algorithm 2).

The drafter drafts ``lookahead`` tokens greedily from its own context; their text is re-tokenized for the
target through a window of the target's accepted tokens (:class:`~hf_hetspec.alignment.TextWindowConverter`);
the target verifies all of them in one forward pass by exact match
(:func:`~hf_hetspec.verify.verify_greedy`, or :func:`~hf_hetspec.verify.verify_exact_match_sampling` when
sampling). Exact matching makes SLEM lossless whatever the drafter proposes: the draft only decides how
many target tokens one forward can confirm.
"""

from __future__ import annotations

import torch

from .alignment import TextWindowConverter, valid_utf8_prefix
from .intersection import special_token_pairs
from .proposer import Draft, HeterogeneousProposer


def greedy_select(logits: torch.Tensor) -> tuple[torch.Tensor, None]:
    """``argmax`` of ``logits`` (``(1, V)``) as a ``(1, 1)`` token tensor; a deterministic choice (no ``q``)."""
    return logits.argmax(dim=-1, keepdim=True), None


class SLEMProposer(HeterogeneousProposer):
    """Drafts target-token candidates for SLEM (Timor et al. 2025, Algorithm 2); exact-match verification.

    Arguments as :class:`~hf_hetspec.proposer.HeterogeneousProposer`.
    """

    def __init__(self, target_vocab, drafter, drafter_vocab, input_ids, *, window: int = 4, **kwargs):
        super().__init__(target_vocab, drafter, drafter_vocab, input_ids, window=window, **kwargs)
        self.converter = TextWindowConverter(target_vocab, window)
        # a special drafter token ends the draft; its target counterpart (by role or content) is proposed
        self.special_to_target = dict(special_token_pairs(target_vocab, drafter_vocab))

    def _propose(self, budget: int) -> Draft:
        with self.stats.timer("drafter_s"):
            # not capped by the budget: a target token can take several drafter tokens to spell
            steps = self.context.draft(min(self.lookahead, self.context.room()), greedy_select, self.stop)
        with self.stats.timer("translation_s"):
            return Draft(self._to_target(steps.ids)[:budget])

    def _to_target(self, drafted: list[int]) -> list[int]:
        """Target ids spelling the drafted text (cut at the first special drafter token)."""
        tail: list[int] = []
        for j, tok in enumerate(drafted):
            if tok in self.drafter_vocab.special_ids:
                if tok in self.special_to_target:
                    tail = [self.special_to_target[tok]]
                self.context.discard_draft_after(j)
                drafted = drafted[:j]
                break
        data = self.drafter_vocab.ids_to_bytes(drafted)
        valid = valid_utf8_prefix(data)
        if valid < len(data):  # the draft ends inside a character, or holds bytes that are not text
            data, tail = data[:valid], []
        if not data:
            return tail if not drafted else []
        return self.converter.continuation(self.target_ids, data.decode("utf-8")) + tail
