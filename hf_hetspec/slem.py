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
from .tree import RunnerUps  # also its old import path


def greedy_select(logits: torch.Tensor) -> tuple[torch.Tensor, None]:
    """``argmax`` of ``logits`` (``(1, V)``) as a ``(1, 1)`` token tensor; a deterministic choice (no ``q``)."""
    return logits.argmax(dim=-1, keepdim=True), None


class SLEMProposer(HeterogeneousProposer):
    """Drafts target-token candidates for SLEM (Timor et al. 2025, Algorithm 2); exact-match verification.

    Args:
        sibling_min_joint: when positive, drafts also carry sibling branches (the drafter's runner-up at a
            draft position, :meth:`_siblings`) whose drafter-estimated chance reaches it; the loop verifies
            them as a tree when it can (:mod:`hf_hetspec.tree`). ``Schedule.sibling_min_joint``.
        runner_ups: the drafter's runner-ups per position that may become siblings (``Schedule.sibling_runner_ups``).
        other arguments: as :class:`~hf_hetspec.proposer.HeterogeneousProposer`.
    """

    def __init__(self, target_vocab, drafter, drafter_vocab, input_ids, *, window: int = 4,
                 sibling_min_joint: float = 0.0, runner_ups: int = 1, **kwargs):
        super().__init__(target_vocab, drafter, drafter_vocab, input_ids, window=window, **kwargs)
        self.sibling_min_joint = sibling_min_joint
        self.runner_ups = runner_ups
        self.converter = TextWindowConverter(target_vocab, window)
        # a special drafter token ends the draft; its target counterpart (by role or content) is proposed
        self.special_to_target = dict(special_token_pairs(target_vocab, drafter_vocab))

    def _propose(self, budget: int) -> Draft:
        runner_ups = RunnerUps(self.runner_ups) if self.sibling_min_joint > 0 else None
        select = greedy_select if runner_ups is None else runner_ups.select
        with self.stats.timer("drafter_s"):
            # not capped by the budget: a target token can take several drafter tokens to spell
            steps = self.context.draft(min(self.lookahead, self.context.room()), select, self.stop)
        with self.stats.timer("translation_s"):
            chain = self._to_target(steps.ids)[:budget]
            if runner_ups is None or not chain:
                return Draft(chain)
            return Draft(chain, branches=self._siblings(steps.ids, runner_ups, budget))

    def _siblings(self, drafted: list[int], runner_ups: RunnerUps, budget: int) -> list[list[int]]:
        """Target ids of the sibling branches (:mod:`hf_hetspec.tree`): for each runner-up the joint rule keeps
        (:meth:`~hf_hetspec.tree.RunnerUps.siblings`) at draft position ``i``, up to the first special drafter
        token, the text of ``drafted[:i]`` plus the runner-up, re-tokenized like the chain."""
        special = next((i for i, tok in enumerate(drafted) if tok in self.drafter_vocab.special_ids), len(drafted))
        branches = []
        for i, runner_id in runner_ups.siblings(self.sibling_min_joint, special + 1):
            branch = self._to_target(drafted[:i] + [runner_id], discard=False)[:budget]
            if branch:
                branches.append(branch)
        return branches

    def _to_target(self, drafted: list[int], discard: bool = True) -> list[int]:
        """Target ids spelling the drafted text (cut at the first special drafter token, which is also dropped
        from the drafter's context when ``discard``)."""
        tail: list[int] = []
        for j, tok in enumerate(drafted):
            if tok in self.drafter_vocab.special_ids:
                if tok in self.special_to_target:
                    tail = [self.special_to_target[tok]]
                if discard:
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
