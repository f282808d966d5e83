"""hf_hetspec.decoding: the draft -> verify -> accept -> roll back loop, driven by scripted proposers, against
the target alone (greedy identity whatever the drafts, counts of drafted/accepted tokens and rejections)."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.stopping_criteria import MaxLengthCriteria

from hf_hetspec import decoding
from hf_hetspec.proposer import Draft
from hf_hetspec.stats import DecodingStats

NEW_TOKENS = 24


class _Context:
    truncated_tokens = 0


class ScriptedProposer:
    """Drafts from a fixed sequence: the reference continuation (``right`` tokens of it per draft) followed by
    ``wrong`` tokens that are not the reference's next ones."""

    def __init__(self, reference: list[int], right: int, wrong: int, vocab_size: int):
        self.reference, self.right, self.wrong, self.vocab_size = reference, right, wrong, vocab_size
        self.context = _Context()
        self.accepted_per_round = []

    def propose(self, input_ids: torch.LongTensor) -> Draft:
        n = input_ids.shape[1]
        good = self.reference[n : n + self.right]
        bad = [(t + 1) % self.vocab_size for t in self.reference[n + len(good) : n + len(good) + self.wrong]]
        return Draft(good + bad)

    def update_schedule(self, num_accepted: int) -> None:
        self.accepted_per_round.append(num_accepted)


def _run(target, ids, proposer, stats):
    config = GenerationConfig(do_sample=False, max_length=ids.shape[1] + NEW_TOKENS)
    criteria = StoppingCriteriaList([MaxLengthCriteria(max_length=config.max_length)])
    with torch.no_grad():
        return decoding.speculative_generate(target, ids, LogitsProcessorList(), criteria, config, proposer, stats)


@pytest.fixture(scope="module")
def reference(toy_pair):
    ids = toy_pair.target_tokenizer(toy_pair.prompts[0], return_tensors="pt").input_ids
    with torch.no_grad():
        out = toy_pair.target.generate(ids, do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=None)
    return ids, out[0].tolist()


@pytest.mark.parametrize("right,wrong", [(4, 0), (0, 3), (2, 2), (7, 1)])
def test_greedy_output_is_the_targets_whatever_the_drafts(toy_pair, reference, right, wrong):
    ids, expected = reference
    stats = DecodingStats()
    proposer = ScriptedProposer(expected, right, wrong, toy_pair.target.config.vocab_size)
    out = _run(toy_pair.target, ids, proposer, stats)
    assert out[0].tolist() == expected
    assert stats.new_tokens == NEW_TOKENS and stats.prompt_tokens == ids.shape[1]
    assert stats.accepted_tokens == sum(proposer.accepted_per_round)
    # every round's right tokens are accepted, and a wrong token is a rejection
    assert all(a <= right for a in proposer.accepted_per_round)
    if wrong and not right:
        assert stats.accepted_tokens == 0 and stats.rejections == stats.target_forwards
    if right and not wrong:
        assert stats.rejections == 0 and stats.target_forwards < NEW_TOKENS
    assert stats.drafted_tokens >= stats.accepted_tokens + stats.rejections


def test_a_loop_that_does_not_roll_back_its_cache_is_caught(toy_pair, reference, monkeypatch):
    """BROKEN loop: rejected draft tokens stay in the target's KV cache (one stale position per round). The
    identity test above fails on it: wrong tokens, or the next verification no longer lines up."""
    ids, expected = reference
    original = decoding.rollback_cache
    monkeypatch.setattr(decoding, "rollback_cache", lambda cache, length: original(cache, length + 1))
    proposer = ScriptedProposer(expected, 2, 2, toy_pair.target.config.vocab_size)
    try:
        out = _run(toy_pair.target, ids, proposer, DecodingStats())
    except RuntimeError:
        return
    assert out[0].tolist() != expected
