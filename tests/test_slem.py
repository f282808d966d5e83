"""hf_hetspec.slem: how SLEM turns the drafter's tokens into target ids (Timor et al. 2025, Algorithm 2).

Expectations come from the tokenizers themselves (the target's own encoding of the same text), never from an
earlier run of the proposer. SLEM's exactness is tested in test_lossless and test_integration."""

from __future__ import annotations

import torch

from hf_hetspec.alignment import vocabulary
from hf_hetspec.plan import Schedule
from hf_hetspec.slem import SLEMProposer, greedy_select
from hf_hetspec.stats import DecodingStats

PROMPT = "The lighthouse keeper"


def _slem(pair, lookahead: int = 8) -> SLEMProposer:
    ids = pair.target_tokenizer(PROMPT, return_tensors="pt").input_ids
    return SLEMProposer(vocabulary(pair.target_tokenizer), pair.drafter, vocabulary(pair.drafter_tokenizer), ids,
                        schedule=Schedule(lookahead, False), max_length=64, stats=DecodingStats())


def _drafter_ids(pair, text: str) -> list[int]:
    return pair.drafter_tokenizer(text, add_special_tokens=False).input_ids


def _target_continuation(pair, text: str) -> list[int]:
    """The target tokenizer's own ids for ``text`` after the prompt."""
    n = len(pair.target_tokenizer(PROMPT).input_ids)
    return pair.target_tokenizer(PROMPT + text).input_ids[n:]


def test_greedy_select_is_the_argmax_without_a_distribution():
    column, q = greedy_select(torch.tensor([[0.1, 2.0, -1.0, 1.9]]))
    assert column.tolist() == [[1]] and q is None


def test_drafted_text_is_retokenized_as_the_target_writes_it(toy_pair):
    proposer = _slem(toy_pair)
    drafted = _drafter_ids(toy_pair, " the cat sat")
    assert toy_pair.drafter_tokenizer.convert_ids_to_tokens(drafted) == ["▁the", "▁c", "at", "▁s", "at"]
    assert proposer._to_target(drafted) == _target_continuation(toy_pair, " the cat sat")
    assert toy_pair.target_tokenizer.convert_ids_to_tokens(proposer._to_target(drafted)) == [
        "Ġthe", "Ġc", "at", "Ġs", "at"]


def test_a_special_drafter_token_ends_the_draft_with_its_target_counterpart(toy_pair):
    proposer = _slem(toy_pair)
    eos = toy_pair.drafter_tokenizer.eos_token_id
    drafted = _drafter_ids(toy_pair, " the") + [eos] + _drafter_ids(toy_pair, " cat")
    proposer.context.ids.extend(drafted)
    assert proposer._to_target(drafted) == _target_continuation(toy_pair, " the") + [
        toy_pair.target_tokenizer.eos_token_id]
    assert proposer.context.draft_ids == _drafter_ids(toy_pair, " the")  # the rest is discarded


def test_a_draft_ending_inside_a_character_proposes_only_whole_characters(toy_pair):
    proposer = _slem(toy_pair)
    first_byte_of_e_acute = toy_pair.drafter_tokenizer.convert_tokens_to_ids("<0xC3>")
    assert proposer._to_target(_drafter_ids(toy_pair, " the") + [first_byte_of_e_acute]) == \
        _target_continuation(toy_pair, " the")
    assert proposer._to_target([first_byte_of_e_acute]) == []


def test_propose_drafts_the_drafters_argmax_within_the_budget(toy_pair, monkeypatch):
    """A drafter sure of " the cat sat" drafts exactly those five tokens; the target gets the ids it would
    write itself, cut to the length budget."""
    proposer = _slem(toy_pair, lookahead=5)
    script = iter(_drafter_ids(toy_pair, " the cat sat"))

    def forward(feed):
        logits = torch.zeros(1, proposer.context.n_tokens)
        logits[0, next(script)] = 5.0
        return logits

    monkeypatch.setattr(proposer.context, "_forward", forward)
    prompt = toy_pair.target_tokenizer(PROMPT, return_tensors="pt").input_ids
    proposer.max_length = prompt.shape[1] + 4  # room for 3 draft tokens (one is left for the bonus token)
    assert proposer.propose(prompt).target_ids == _target_continuation(toy_pair, " the cat sat")[:3]
    assert proposer.context.draft_ids == _drafter_ids(toy_pair, " the cat sat")


def test_siblings_are_the_drafters_runner_ups_retokenized_for_the_target(toy_pair, monkeypatch):
    """The drafter writes " the cat" and is unsure between " c" and " d" at the second word: the sibling is
    " the" + " d", in the target's own ids; a runner-up whose estimated chance is below the cut-off (the first
    word's) is not proposed."""
    proposer = _slem(toy_pair, lookahead=3)
    proposer.sibling_min_joint = 0.2
    chosen = _drafter_ids(toy_pair, " the cat")
    runner = {1: _drafter_ids(toy_pair, " d")[0], 0: _drafter_ids(toy_pair, " a")[0]}
    script = iter(range(len(chosen)))

    def forward(feed):
        i = next(script)
        logits = torch.full((1, proposer.context.n_tokens), -20.0)
        logits[0, chosen[i]] = 2.0
        if i in runner:  # second word: 0.5 / 0.4; first word: the runner-up far behind
            logits[0, runner[i]] = 2.0 - (0.223 if i == 1 else 3.0)
        return logits

    monkeypatch.setattr(proposer.context, "_forward", forward)
    prompt = toy_pair.target_tokenizer(PROMPT, return_tensors="pt").input_ids
    draft = proposer.propose(prompt)
    assert draft.target_ids == _target_continuation(toy_pair, " the cat")
    assert draft.branches == [_target_continuation(toy_pair, " the d")]
    # the context holds the chain only: siblings are never fed to the drafter
    assert proposer.context.draft_ids == chosen


def test_runner_ups_report_the_confidence_the_stop_would_compute(toy_pair):
    """RunnerUps hands the draft's confidence stop the chosen token's probability it computed anyway: the
    drafts end where they end with the argmax selector, whose confidence the context computes itself."""
    from hf_hetspec.drafter import DraftStop
    from hf_hetspec.slem import RunnerUps, greedy_select

    prompt = toy_pair.target_tokenizer(PROMPT, return_tensors="pt").input_ids
    lengths = {}
    for name in ("argmax", "runner-ups"):
        for min_joint in (0.999, 0.99, 0.97):  # the toy drafter is sure of each token: 0.98-0.998
            proposer = _slem(toy_pair)
            proposer.propose(prompt)  # the context follows the prompt
            select = greedy_select if name == "argmax" else RunnerUps(2).select
            steps = proposer.context.draft(8, select, DraftStop(min_joint=min_joint))
            lengths.setdefault(name, []).append(steps.ids)
    assert lengths["argmax"] == lengths["runner-ups"]
    assert len({len(ids) for ids in lengths["argmax"]}) > 1  # the cut-offs end the drafts at different lengths


def test_each_runner_up_likely_enough_becomes_a_sibling(toy_pair, monkeypatch):
    """With two runner-ups per position, the 2nd and 3rd choices at the second word both become siblings when
    their estimates reach the cut-off; the 3rd is dropped when it does not."""
    chosen = _drafter_ids(toy_pair, " the cat")
    second, third = _drafter_ids(toy_pair, " d")[0], _drafter_ids(toy_pair, " b")[0]
    for cut_off, expected in ((0.1, [" the d", " the b"]), (0.3, [" the d"])):
        proposer = _slem(toy_pair, lookahead=3)
        proposer.sibling_min_joint, proposer.runner_ups = cut_off, 2
        script = iter(range(len(chosen)))

        def forward(feed):
            i = next(script)
            logits = torch.full((1, proposer.context.n_tokens), -20.0)
            logits[0, chosen[i]] = 2.0
            if i == 1:  # about 0.45 / 0.37 / 0.18
                logits[0, second], logits[0, third] = 1.8, 1.1
            return logits

        monkeypatch.setattr(proposer.context, "_forward", forward)
        prompt = toy_pair.target_tokenizer(PROMPT, return_tensors="pt").input_ids
        assert proposer.propose(prompt).branches == [_target_continuation(toy_pair, t) for t in expected]


def test_no_siblings_without_a_cut_off(toy_pair):
    proposer = _slem(toy_pair, lookahead=3)
    prompt = toy_pair.target_tokenizer(PROMPT, return_tensors="pt").input_ids
    assert proposer.sibling_min_joint == 0 and proposer.propose(prompt).branches == []
