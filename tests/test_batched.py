"""Batches (hf_hetspec.batched): several left-padded prompts and ``num_return_sequences`` in one ``generate()``,
every row exactly what that row alone gives -- greedy: token-identical to the target alone on that row, with
rows that accept different numbers of tokens and stop at different times; sampled: the target's distribution
per row (chi-square against the exact distribution); deliberately broken cache handling is caught."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from transformers import pipeline

import hf_hetspec
from conftest import ForwardCounter
from hf_hetspec import batched, integration
from hf_hetspec.testing import check_lossless, compare_greedy, exact_target_distribution
from test_decoding import ScriptedProposer

ALGORITHMS = ["slem", "tli", "slrs"]
NEW_TOKENS = 16
#: Rows of different lengths: corpus openings (long accepted drafts) and short ambiguous contexts, where the
#: drafter and the target disagree (rejections), so rows accept different numbers of tokens per round.
PROMPTS = ["The lighthouse keeper climbed", "the", "Speculative decoding lets a small", "    ",
           "def fibonacci(n: int) -> int:\n    \"\"\"Return"]


def left_pad(tokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of ``texts``, left-padded with the tokenizer's pad id."""
    rows = [tokenizer(text).input_ids for text in texts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


def generate(pair, ids, mask, algorithm, **kwargs):
    hf_hetspec.enable(pair.target)
    try:
        return pair.target.generate(ids, attention_mask=mask, assistant_model=pair.drafter,
                                    tokenizer=pair.target_tokenizer, assistant_tokenizer=pair.drafter_tokenizer,
                                    hetspec_algorithm=algorithm, **kwargs)
    finally:
        hf_hetspec.disable(pair.target)


def target_alone(pair, text, **kwargs):
    """The target's own greedy continuation of ``text`` alone (new ids) and the prompt ids."""
    ids = pair.target_tokenizer(text, return_tensors="pt").input_ids
    out = type(pair.target).generate(pair.target, ids, do_sample=False, **kwargs)
    return ids, out


@pytest.fixture(scope="module")
def greedy_case(toy_pair):
    """The batch, its EOS list (the target's 5th new token of row 0 is made an EOS, so row 0 stops early), and
    each row's target-alone reference."""
    tokenizer = toy_pair.target_tokenizer
    ids, mask = left_pad(tokenizer, PROMPTS)
    _, first = target_alone(toy_pair, PROMPTS[0], max_new_tokens=NEW_TOKENS)
    n0 = len(tokenizer(PROMPTS[0]).input_ids)
    eos = [tokenizer.eos_token_id, int(first[0, n0 + 4])]
    settings = dict(max_new_tokens=NEW_TOKENS, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    references = [target_alone(toy_pair, text, **settings) for text in PROMPTS]
    return ids, mask, settings, references


def assert_rows_are_the_targets(pair, out, ids, settings, references):
    width = ids.shape[1]
    lengths = []
    for row, (prompt, reference) in enumerate(references):
        new = out[row, width:]
        alone = reference[0, prompt.shape[1]:]
        candidate = torch.cat([prompt[0], new[: len(alone)]])[None]
        verdict = compare_greedy(pair.target, prompt, reference, candidate)
        assert verdict.verdict == "identical", f"row {row}: {verdict}"
        assert (new[len(alone):] == settings["pad_token_id"]).all(), f"row {row} is not padded after it stopped"
        lengths.append(len(alone))
    return lengths


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_greedy_rows_are_the_target_alones_and_stop_at_different_times(toy_pair, greedy_case, algorithm):
    ids, mask, settings, references = greedy_case
    out = generate(toy_pair, ids, mask, algorithm, do_sample=False, **settings)
    lengths = assert_rows_are_the_targets(toy_pair, out, ids, settings, references)
    assert lengths[0] == 5 and max(lengths) == NEW_TOKENS == out.shape[1] - ids.shape[1]  # row 0 stopped at its EOS
    stats = hf_hetspec.last_stats(toy_pair.target)
    # one forward per round for all rows; rows accepted some drafts and rejected others
    assert stats.accepted_tokens > 0 and stats.rejections > 0
    assert stats.target_forwards < NEW_TOKENS
    assert stats.new_tokens == sum(lengths)
    # and the target's own batched generate() gives the very same tensor
    plain = type(toy_pair.target).generate(toy_pair.target, ids, attention_mask=mask, do_sample=False, **settings)
    assert torch.equal(plain, out)


def test_return_dict_and_one_padded_row(toy_pair, greedy_case):
    ids, mask, settings, references = greedy_case
    out = generate(toy_pair, ids[3:4], mask[3:4], "slem", do_sample=False, return_dict_in_generate=True,
                   **settings)
    assert_rows_are_the_targets(toy_pair, out.sequences, ids[3:4], settings, references[3:4])


def test_plain_batched_decoding_when_drafts_do_not_pay(toy_pair, greedy_case, monkeypatch):
    """Over the token budget every round runs without drafts: plain batched decoding, the same output."""
    ids, mask, settings, references = greedy_case
    monkeypatch.setattr(batched, "BATCH_DRAFT_TOKEN_BUDGET", 1)
    assert batched.draft_cap(2) == 0 and batched.draft_cap(1) is None
    out = generate(toy_pair, ids, mask, "tli", do_sample=False, **settings)
    assert_rows_are_the_targets(toy_pair, out, ids, settings, references)
    stats = hf_hetspec.last_stats(toy_pair.target)
    # no round drafted: several rows were left until the end, each round gave every row one token
    assert stats.drafted_tokens == 0 and stats.skipped_drafts > 0 and stats.target_forwards == NEW_TOKENS


def test_drafts_cut_to_the_token_budget_keep_every_row(toy_pair, greedy_case, monkeypatch):
    """A budget of 20 tokens per round: 5 rows keep at most 3 draft tokens each (4 once row 0 has stopped)."""
    ids, mask, settings, references = greedy_case
    monkeypatch.setattr(batched, "BATCH_DRAFT_TOKEN_BUDGET", 20)
    assert [batched.draft_cap(rows) for rows in (5, 4, 3, 1)] == [3, 4, 5, None]
    # bf16 on a CPU without bf16 instructions: a verified token costs a whole forward, the budget shrinks to 0
    from hf_hetspec.schedule import VERIFY_COSTS

    assert batched.draft_cap(4, VERIFY_COSTS["cpu-float32"]) == 4
    monkeypatch.setattr(batched, "BATCH_DRAFT_TOKEN_BUDGET", 48)
    assert batched.draft_cap(2, VERIFY_COSTS["cpu-float32"]) == 23
    assert batched.draft_cap(2, VERIFY_COSTS["cpu-emulated-half"]) == 0
    monkeypatch.setattr(batched, "BATCH_DRAFT_TOKEN_BUDGET", 20)
    fed = []
    block = batched.BatchState.block

    def recorded(self, drafts, fill):
        fed.append(sum(len(d) + 1 for d in drafts))
        return block(self, drafts, fill)

    monkeypatch.setattr(batched.BatchState, "block", recorded)
    out = generate(toy_pair, ids, mask, "tli", do_sample=False, **settings)
    assert_rows_are_the_targets(toy_pair, out, ids, settings, references)
    assert max(fed) <= 20 and hf_hetspec.last_stats(toy_pair.target).accepted_tokens > 0


def test_a_compacted_cache_gives_the_same_rows(toy_pair, greedy_case, monkeypatch):
    ids, mask, settings, references = greedy_case
    calls = []
    compact = batched.BatchState.compact

    def recorded(self, cache):
        calls.append(compact(self, cache))
        return calls[-1]

    monkeypatch.setattr(batched, "COMPACT_MIN_SLOTS", 0)
    monkeypatch.setattr(batched, "COMPACT_HOLE_SHARE", 0.05)
    monkeypatch.setattr(batched.BatchState, "compact", recorded)
    out = generate(toy_pair, ids, mask, "slrs", do_sample=False, **settings)
    assert_rows_are_the_targets(toy_pair, out, ids, settings, references)
    assert any(calls)


class ScriptedRows:
    """``build_proposer`` replaced: row ``r``'s proposer drafts ``r % 3`` tokens of the row alone's greedy
    continuation, then ``1 + r % 2`` wrong ones, so every round has rejections and rows accept different numbers
    of tokens (the holes of the batched cache)."""

    def __init__(self, pair, references):
        self.references = [reference[0].tolist() for _, reference in references]
        self.vocab_size = pair.target.config.vocab_size
        self.rows = 0

    def __call__(self, plan, drafter, input_ids, config, stats, generator):
        prompt = input_ids[0].tolist()
        row = next(i for i, ref in enumerate(self.references) if ref[: len(prompt)] == prompt)
        self.rows += 1
        return ScriptedProposer(self.references[row], row % 3, 1 + row % 2, self.vocab_size)


def test_greedy_rows_are_the_targets_whatever_each_row_drafts(toy_pair, greedy_case, monkeypatch):
    ids, mask, settings, references = greedy_case
    scripted = ScriptedRows(toy_pair, references)
    monkeypatch.setattr(integration, "build_proposer", scripted)
    out = generate(toy_pair, ids, mask, "slem", do_sample=False, **settings)
    assert scripted.rows == len(PROMPTS)
    assert_rows_are_the_targets(toy_pair, out, ids, settings, references)
    stats = hf_hetspec.last_stats(toy_pair.target)
    assert stats.rejections > 0 and stats.accepted_tokens > 0


# --------------------------------------------------------------------------------------------------------
# deliberately broken variants: the identity test above must catch them
# --------------------------------------------------------------------------------------------------------


def _broken_output_differs(pair, greedy_case, monkeypatch) -> bool:
    """Whether the identity check of the scripted-drafts test fails under the broken variant (a cache that no
    longer lines up may also fail outright, which counts as caught)."""
    ids, mask, settings, references = greedy_case
    monkeypatch.setattr(integration, "build_proposer", ScriptedRows(pair, references))
    try:
        out = generate(pair, ids, mask, "slem", do_sample=False, **settings)
        assert_rows_are_the_targets(pair, out, ids, settings, references)
    except (AssertionError, RuntimeError, IndexError):
        return True
    return False


def test_rejected_draft_tokens_left_unmasked_are_caught(toy_pair, greedy_case, monkeypatch):
    """BROKEN: a row's rejected draft tokens (and block padding) stay visible in later rounds."""
    monkeypatch.setattr(batched, "kept_slots", lambda accepted, width: torch.ones(
        accepted.shape[0], width, dtype=torch.bool, device=accepted.device))
    assert _broken_output_differs(toy_pair, greedy_case, monkeypatch)


def test_positions_counted_in_cache_slots_are_caught(toy_pair, greedy_case, monkeypatch):
    """BROKEN: position ids that count the batch's cache slots (holes included) instead of the row's tokens."""
    advance = batched.BatchState.advance

    def by_slot(self, accepted, longest, last_tokens, cache):
        advance(self, accepted, longest, last_tokens, cache)
        self.feed_positions = self.feed_positions + (longest - accepted)[:, None]

    monkeypatch.setattr(batched.BatchState, "advance", by_slot)
    assert _broken_output_differs(toy_pair, greedy_case, monkeypatch)


# --------------------------------------------------------------------------------------------------------
# sampling: the target's distribution on every row, num_return_sequences
# --------------------------------------------------------------------------------------------------------

SAMPLED_PROMPTS = ["the", "    "]
SETTING = dict(temperature=1.0, top_k=5)
#: samples per prompt: calls x num_return_sequences
CALLS, RETURN_SEQUENCES = 24, 25


def _row_outcome(tokens: list[int], eos: set[int]) -> tuple[int, ...]:
    """The first two new tokens of a row, cut after an EOS (the rest is padding)."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tuple(tokens[: i + 1])
    return tuple(tokens)


@pytest.mark.parametrize("algorithm", ["tli", "slem",
                                       pytest.param("slrs", marks=pytest.mark.slow)])
def test_sampled_rows_have_the_targets_distribution(toy_pair, algorithm, monkeypatch):
    """Each call decodes both prompts x RETURN_SEQUENCES rows; per prompt, the rows' first two tokens pass the
    exact chi-square test against the target alone (~10 s each; SLRS is slow-marked: on this toy pair it drafts
    what TLI drafts, tests/test_lossless.py). With rejected draft tokens left unmasked (the break of
    test_rejected_draft_tokens_left_unmasked_are_caught) this test fails with impossible outcomes (p = 0)."""
    monkeypatch.setattr(batched, "BATCH_DRAFT_TOKEN_BUDGET", 10_000)  # draft in every round
    tokenizer = toy_pair.target_tokenizer
    ids, mask = left_pad(tokenizer, SAMPLED_PROMPTS)
    eos = {tokenizer.eos_token_id}
    counts = [Counter() for _ in SAMPLED_PROMPTS]
    generator = torch.Generator().manual_seed(0)
    drafted = accepted = 0
    for _ in range(CALLS):
        out = generate(toy_pair, ids, mask, algorithm, do_sample=True, max_new_tokens=2, hetspec_generator=generator,
                       num_return_sequences=RETURN_SEQUENCES, pad_token_id=tokenizer.pad_token_id, **SETTING)
        assert out.shape[0] == len(SAMPLED_PROMPTS) * RETURN_SEQUENCES
        for row in range(out.shape[0]):  # rows are prompt 0 x RETURN_SEQUENCES, then prompt 1 (transformers' order)
            counts[row // RETURN_SEQUENCES][_row_outcome(out[row, ids.shape[1]:].tolist(), eos)] += 1
        stats = hf_hetspec.last_stats(toy_pair.target)
        drafted, accepted = drafted + stats.drafted_tokens, accepted + stats.accepted_tokens
    assert 0 < accepted < drafted  # both the acceptance and the rejection paths ran
    for text, observed in zip(SAMPLED_PROMPTS, counts):
        prompt = tokenizer(text, return_tensors="pt").input_ids
        expected = exact_target_distribution(toy_pair.target, prompt, 2, **SETTING)
        report = check_lossless(expected, observed, 1e-3)
        print(text, report)
        assert report.num_bins >= 3 and report.passed, str(report)


# --------------------------------------------------------------------------------------------------------
# pipelines and refusals
# --------------------------------------------------------------------------------------------------------


@pytest.fixture
def left_padding(toy_pair):
    tokenizer = toy_pair.target_tokenizer
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    yield toy_pair
    tokenizer.padding_side = side


def test_pipeline_over_a_list_with_batch_size_gives_one_prompt_at_a_times_texts(left_padding):
    pair = left_padding
    texts = PROMPTS[:4]
    greedy = dict(max_new_tokens=12, do_sample=False)
    alone = pipeline("text-generation", model=pair.target, tokenizer=pair.target_tokenizer)
    expected = [alone(text, **greedy) for text in texts]
    hf_hetspec.enable(pair.target)
    try:
        pipe = pipeline("text-generation", model=pair.target, tokenizer=pair.target_tokenizer,
                        assistant_model=pair.drafter, assistant_tokenizer=pair.drafter_tokenizer)
        batched_out = pipe(texts, batch_size=3, hetspec_algorithm="slem", **greedy)
        assert hf_hetspec.last_stats(pair.target).accepted_tokens > 0
    finally:
        hf_hetspec.disable(pair.target)
    assert batched_out == expected


def test_what_a_batch_cannot_have_is_refused_before_any_model_runs(toy_pair, greedy_case):
    from transformers import TextStreamer

    ids, mask, settings, _ = greedy_case
    tokenizer = toy_pair.target_tokenizer
    right = torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], dim=1)
    cases = [
        (dict(hetspec_loop="transformers"), ValueError, "hetspec_loop='transformers' with a batch of 5 rows"),
        (dict(attention_mask=right), NotImplementedError, "padding_side = 'left'"),
        (dict(streamer=TextStreamer(tokenizer)), ValueError, "`streamer` with a batch"),
        (dict(assistant_input_ids=torch.tensor([[1, 2]])), NotImplementedError, "assistant_input_ids"),
        (dict(return_dict_in_generate=True, output_scores=True), NotImplementedError, "output_scores"),
    ]
    counter = ForwardCounter(toy_pair.target, toy_pair.drafter)
    try:
        for override, error, words in cases:
            kwargs = dict(attention_mask=mask, do_sample=False, **settings)
            kwargs.update(override)
            with pytest.raises(error, match=words):
                generate_kwargs = {k: v for k, v in kwargs.items() if k != "attention_mask"}
                generate(toy_pair, ids, kwargs["attention_mask"], "slem", **generate_kwargs)
        # hetspec_loop='transformers' with num_return_sequences
        with pytest.raises(ValueError, match="a batch of 2 rows"):
            generate(toy_pair, ids[:1], None, "tli", do_sample=True, num_return_sequences=2, max_new_tokens=2,
                     hetspec_loop="transformers")
    finally:
        counter.close()
    assert counter.count == 0
