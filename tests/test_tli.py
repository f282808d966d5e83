"""hf_hetspec.tli: what TLI drafts from given drafter logits and the ``q`` it hands to verification (Timor et
al. 2025, Algorithm 4). Expected ids come from the tokenizers' own token strings, expected distributions are
computed by hand. TLI's exactness is tested in test_lossless."""

from __future__ import annotations

import math

import pytest
import torch

from hf_hetspec.alignment import vocabulary
from hf_hetspec.intersection import intersection_for
from hf_hetspec.plan import Schedule
from hf_hetspec.proposer import DraftPolicy
from hf_hetspec.schedule import DraftStop
from hf_hetspec.stats import DecodingStats
from hf_hetspec.tli import TLIProposer

PROMPT = "The lighthouse keeper"


def _tli(pair, lookahead: int, stop: DraftStop = DraftStop(), **kwargs) -> TLIProposer:
    target_vocab, drafter_vocab = vocabulary(pair.target_tokenizer), vocabulary(pair.drafter_tokenizer)
    return TLIProposer(target_vocab, pair.drafter, drafter_vocab, _prompt(pair),
                       intersection=intersection_for(target_vocab, drafter_vocab),
                       target_eos_ids=[pair.target_tokenizer.eos_token_id], schedule=Schedule(lookahead, False, stop),
                       max_length=64, stats=DecodingStats(), **kwargs)


def _prompt(pair) -> torch.LongTensor:
    return pair.target_tokenizer(PROMPT, return_tensors="pt").input_ids


def _drafter_logits(proposer, monkeypatch, scores: dict[int, float]) -> None:
    """Every drafter forward returns these logits (drafter id -> logit; the rest far below)."""
    logits = torch.full((1, proposer.context.n_tokens), -30.0)
    for drafter_id, value in scores.items():
        logits[0, drafter_id] = value
    monkeypatch.setattr(proposer.context, "_forward", lambda feed: logits.clone())


def test_greedy_tli_drafts_the_argmax_over_the_intersection(toy_pair, monkeypatch):
    """The drafter's favourite, ``<start_of_turn>``, has no target counterpart: TLI drafts its best shared
    token, ``▁the``, as the target's ``Ġthe``."""
    d, t = toy_pair.drafter_tokenizer, toy_pair.target_tokenizer
    proposer = _tli(toy_pair, 2, policy=DraftPolicy())
    _drafter_logits(proposer, monkeypatch, {d.convert_tokens_to_ids("<start_of_turn>"): 9.0,
                                            d.convert_tokens_to_ids("▁the"): 5.0})
    draft = proposer.propose(_prompt(toy_pair))
    assert draft.target_ids == [t.convert_tokens_to_ids("Ġthe")] * 2 and draft.q is None


def test_sampled_tli_hands_over_the_push_forward_of_q(toy_pair, monkeypatch):
    """``T`` and its byte fallback ``<0x54>`` both spell the target's ``T``: their drafter probabilities add up
    (0.5 + 0.25), ``▁the`` keeps its 0.25; every other target id gets 0."""
    d, t = toy_pair.drafter_tokenizer, toy_pair.target_tokenizer
    generator = torch.Generator().manual_seed(0)
    proposer = _tli(toy_pair, 1, policy=DraftPolicy(sample=True, needs_q=True), generator=generator)
    _drafter_logits(proposer, monkeypatch, {d.convert_tokens_to_ids("T"): math.log(0.5),
                                            d.convert_tokens_to_ids("<0x54>"): math.log(0.25),
                                            d.convert_tokens_to_ids("▁the"): math.log(0.25)})
    expected = torch.zeros(1, proposer.target_size)
    expected[0, t.convert_tokens_to_ids("T")] = 0.75
    expected[0, t.convert_tokens_to_ids("Ġthe")] = 0.25
    draft = proposer.propose(_prompt(toy_pair))
    assert draft.target_ids[0] in (t.convert_tokens_to_ids("T"), t.convert_tokens_to_ids("Ġthe"))
    torch.testing.assert_close(draft.q, expected, atol=1e-5, rtol=0)


def test_a_greedy_draft_in_a_sampled_call_comes_without_a_dense_q(toy_pair, monkeypatch):
    """The default sampled TLI call drafts the argmax (``hetspec_draft_temperature`` 0) and hands no
    ``(k, V_target)`` one-hot tensor to verification: exact-match sampling verifies it (issue #26, item 4)."""
    from transformers import GenerationConfig

    from hf_hetspec.plan import choose_draft_policy

    d, t = toy_pair.drafter_tokenizer, toy_pair.target_tokenizer
    policy = choose_draft_policy("tli", GenerationConfig(do_sample=True, temperature=0.7), 0.0)
    assert not policy.sample and not policy.needs_q
    proposer = _tli(toy_pair, 1, policy=policy)
    _drafter_logits(proposer, monkeypatch, {d.convert_tokens_to_ids("▁the"): 2.0, d.convert_tokens_to_ids("T"): 1.9})
    draft = proposer.propose(_prompt(toy_pair))
    assert draft.target_ids == [t.convert_tokens_to_ids("Ġthe")] and draft.q is None


@pytest.mark.parametrize("min_joint,length", [(0.3, 3), (0.2, 4), (0.5, 2), (0.0, 4)])
def test_the_joint_cut_off_ends_a_tli_draft_by_q_over_the_intersection(toy_pair, monkeypatch, min_joint, length):
    """TLI's default schedule ends a draft once the product of the drafted tokens' ``q`` -- the drafter's
    distribution over the intersection -- falls below the joint cut-off (:class:`DraftStop`): ``q(Ġthe)`` = 2/3
    after ``<start_of_turn>`` (no target counterpart) is masked, so the products run 0.67, 0.44, 0.30, 0.20
    within a lookahead of 4. Over the whole drafter vocabulary the first token would already end the draft
    (``<start_of_turn>`` holds nearly all of it)."""
    d, t = toy_pair.drafter_tokenizer, toy_pair.target_tokenizer
    proposer = _tli(toy_pair, 4, DraftStop(min_joint=min_joint), policy=DraftPolicy())
    _drafter_logits(proposer, monkeypatch, {d.convert_tokens_to_ids("<start_of_turn>"): 9.0,
                                            d.convert_tokens_to_ids("▁the"): math.log(2.0),
                                            d.convert_tokens_to_ids("T"): math.log(1.0)})
    draft = proposer.propose(_prompt(toy_pair))
    assert draft.target_ids == [t.convert_tokens_to_ids("Ġthe")] * length


@pytest.mark.parametrize("cut_off,expected", [
    (0.05, [["T"], ["Ġthe", "T"]]),  # position 1: 2/3 (the first token) x 1/3 (the runner-up) = 0.22
    (0.25, [["T"]]),                 # 0.22 < 0.25: only position 0's runner-up (1/3)
    (0.0, []),                       # no siblings
])
def test_greedy_tli_drafts_its_runner_ups_over_the_intersection_as_sibling_branches(toy_pair, monkeypatch, cut_off,
                                                                                     expected):
    """Beside its argmax draft ``Ġthe Ġthe``, TLI drafts the drafter's runner-up over the intersection (``T``,
    1/3 after ``<start_of_turn>``, which has no target counterpart, is masked) at each position whose estimate
    (the draft's tokens before it times the runner-up's probability) reaches the cut-off; the 3rd choice (every
    other token, e^-30) never does."""
    d, t = toy_pair.drafter_tokenizer, toy_pair.target_tokenizer
    proposer = _tli(toy_pair, 2, policy=DraftPolicy(), sibling_min_joint=cut_off, runner_ups=2)
    _drafter_logits(proposer, monkeypatch, {d.convert_tokens_to_ids("<start_of_turn>"): 9.0,
                                            d.convert_tokens_to_ids("▁the"): math.log(2.0),
                                            d.convert_tokens_to_ids("T"): math.log(1.0)})
    draft = proposer.propose(_prompt(toy_pair))
    assert draft.target_ids == [t.convert_tokens_to_ids("Ġthe")] * 2 and draft.q is None
    assert draft.branches == [t.convert_tokens_to_ids(branch) for branch in expected]


def test_tli_drafts_no_siblings_beside_a_draft_handed_over_with_its_q(toy_pair):
    """A sampled draft with its ``q`` is verified by speculative sampling as a chain: no sibling branches."""
    proposer = _tli(toy_pair, 2, policy=DraftPolicy(sample=True, needs_q=True), sibling_min_joint=0.05)
    assert proposer.sibling_min_joint == 0.0


def test_a_draft_policy_that_hands_over_q_must_sample():
    with pytest.raises(ValueError, match="needs_q"):
        DraftPolicy(needs_q=True)


@pytest.mark.parametrize("sample", [False, True])
def test_a_draft_ends_after_the_targets_eos(toy_pair, monkeypatch, sample):
    """The drafter's EOS maps to the target's: nothing is generated after an accepted EOS, so the draft of
    lookahead 4 stops there; the drafter catches up on the text at the next sync."""
    d, t = toy_pair.drafter_tokenizer, toy_pair.target_tokenizer
    proposer = _tli(toy_pair, 4, policy=DraftPolicy(sample=sample, needs_q=sample))
    _drafter_logits(proposer, monkeypatch, {d.eos_token_id: 9.0})
    draft = proposer.propose(_prompt(toy_pair))
    assert draft.target_ids == [t.eos_token_id]
    assert proposer.context.draft_ids == []
