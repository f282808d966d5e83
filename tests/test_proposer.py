"""hf_hetspec.proposer: what every algorithm's proposer shares -- the budget, skipped drafts, the +2/-1
schedule and the statistics it fills."""

from __future__ import annotations

import torch

from hf_hetspec.alignment import vocabulary
from hf_hetspec.drafter import DrafterContextFull, DraftStop
from hf_hetspec.plan import Schedule
from hf_hetspec.proposer import MAX_LOOKAHEAD, Draft, HeterogeneousProposer
from hf_hetspec.stats import DecodingStats


class FixedProposer(HeterogeneousProposer):
    """Drafts ``draft`` (target ids) every round, or raises ``error``."""

    draft: list[int] = [5, 6, 7]
    error: Exception | None = None

    def _propose(self, budget: int) -> Draft:
        if self.error is not None:
            raise self.error
        return Draft(self.draft[:budget])


def _proposer(toy_pair, schedule, max_length=64):
    ids = toy_pair.target_tokenizer(toy_pair.prompts[0], return_tensors="pt").input_ids
    proposer = FixedProposer(vocabulary(toy_pair.target_tokenizer), toy_pair.drafter,
                             vocabulary(toy_pair.drafter_tokenizer), ids, schedule=schedule,
                             max_length=max_length, stats=DecodingStats())
    return proposer, ids


def test_adaptive_schedule_grows_by_two_and_shrinks_by_one(toy_pair):
    proposer, ids = _proposer(toy_pair, Schedule(5, True))
    lookaheads = []
    for accepted in (3, 3, 1, 0, 0, 0, 0, 0):  # FixedProposer drafts 3 tokens each round
        proposer.propose(ids)
        proposer.update_schedule(accepted)
        lookaheads.append(proposer.lookahead)
    assert lookaheads == [7, 9, 8, 7, 6, 5, 4, 3]
    proposer.lookahead = MAX_LOOKAHEAD
    proposer.propose(ids)
    proposer.update_schedule(3)
    assert proposer.lookahead == MAX_LOOKAHEAD  # capped
    for _ in range(MAX_LOOKAHEAD + 2):
        proposer.propose(ids)
        proposer.update_schedule(0)
    assert proposer.lookahead == 1  # floored


def test_the_adaptive_schedule_stops_shrinking_at_its_floor(toy_pair):
    proposer, ids = _proposer(toy_pair, Schedule(5, True, min_lookahead=3))
    lookaheads = []
    for accepted in (0, 0, 0, 0, 3, 0):  # FixedProposer drafts 3 tokens each round
        proposer.propose(ids)
        proposer.update_schedule(accepted)
        lookaheads.append(proposer.lookahead)
    assert lookaheads == [4, 3, 3, 3, 5, 4]


def test_a_fixed_schedule_never_changes(toy_pair):
    proposer, ids = _proposer(toy_pair, Schedule(4, False))
    proposer.propose(ids)
    proposer.update_schedule(0)
    assert proposer.lookahead == 4 and proposer.stats.lookaheads == [4]


def test_a_disabled_stop_is_no_stop(toy_pair):
    assert _proposer(toy_pair, Schedule(4, False, DraftStop()))[0].stop is None
    assert _proposer(toy_pair, Schedule(4, False, DraftStop(0.2)))[0].stop == DraftStop(0.2)


def test_skipped_drafts(toy_pair):
    proposer, ids = _proposer(toy_pair, Schedule(4, True), max_length=10)  # the prompt already fills it
    assert proposer.propose(ids) == Draft([]) and proposer.stats.skipped_drafts == 1
    proposer, ids = _proposer(toy_pair, Schedule(4, True))
    proposer.error = DrafterContextFull("full")
    assert proposer.propose(ids) == Draft([]) and proposer.stats.skipped_drafts == 1
    proposer.update_schedule(0)
    assert proposer.lookahead == 4  # no draft, nothing to adapt


def test_the_budget_caps_the_draft(toy_pair):
    proposer, ids = _proposer(toy_pair, Schedule(4, True))
    proposer.max_length = ids.shape[1] + 3  # room for 2 draft tokens and the target's own next token
    draft = proposer.propose(torch.cat([ids], dim=1))
    assert draft.target_ids == [5, 6] and draft.q is None
