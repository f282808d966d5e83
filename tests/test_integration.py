"""generate() integration: greedy identity with the target alone, generation knobs, bad input, no mutation.

Every expected value comes from the target alone (``target.generate`` without a drafter).
"""

import copy
import dataclasses
import functools
import itertools
import logging
import time
import warnings

import pytest
import torch
import transformers
from packaging.version import Version
from transformers import GenerationConfig
from transformers.generation.streamers import BaseStreamer

import hf_hetspec
from hf_hetspec.compat import cache_argument, cache_from_kwargs, output_cache, output_cache_kwargs
from hf_hetspec.schedule import choose_schedule
from hf_hetspec.tools.runner import count_forwards
from hf_hetspec.testing.toy import tiny_causal_lm
from conftest import ForwardCounter

EDGE_PROMPTS = [
    "def f(x):\n    if x:\n        return x  \n",
    "trailing spaces   ",
    "混合 text: 数学 🙂👍🏽 café",
    "a",
]


def _reference(pair, ids, **kwargs):
    hf_hetspec.disable(pair.target)
    return pair.target.generate(ids, **kwargs)


def _hetspec(pair, ids, **kwargs):
    hf_hetspec.enable(pair.target)
    try:
        return pair.target.generate(
            ids,
            assistant_model=pair.drafter,
            tokenizer=pair.target_tokenizer,
            assistant_tokenizer=pair.drafter_tokenizer,
            **kwargs,
        )
    finally:
        hf_hetspec.disable(pair.target)


def _ids(pair, text):
    return pair.target_tokenizer(text, return_tensors="pt").input_ids


def _check_greedy(pair, prompts, max_new_tokens=40, algorithm="slem", **kwargs):
    stats = []
    for text in prompts:
        ids = _ids(pair, text)
        ref = _reference(pair, ids, max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
        out = _hetspec(pair, ids, max_new_tokens=max_new_tokens, do_sample=False, hetspec_algorithm=algorithm,
                       **kwargs)
        assert out.tolist() == ref.tolist(), text
        assert hf_hetspec.last_stats(pair.target).algorithm == algorithm
        stats.append(hf_hetspec.last_stats(pair.target))
    return stats


@pytest.mark.parametrize("algorithm", ["slem", "tli", "slrs"])
@pytest.mark.parametrize("pair_name", ["toy_pair", "toy_pair_reversed"])
def test_greedy_identical_to_target_alone_on_toy_pairs(request, pair_name, algorithm):
    pair = request.getfixturevalue(pair_name)
    stats = _check_greedy(pair, pair.prompts, algorithm=algorithm)
    # the drafts really are accepted: the test exercises multi-token acceptance and rollback
    # TLI drafts only shared tokens and greedy SLRS the argmax of psi, which favours short prefix tokens:
    # a target that prefers longer tokens accepts less of both
    floor = 0.5 if algorithm == "slem" else 0.3
    assert sum(s.accepted_tokens for s in stats) > floor * sum(s.drafted_tokens for s in stats)
    assert all(s.mean_accepted_per_forward > 1.5 for s in stats)
    # SLEM's default verifies the drafter's runner-ups as sibling branches (hf_hetspec.tree): exercised here
    assert (sum(s.tree_rounds for s in stats) > 0) == (algorithm == "slem")
    _check_greedy(pair, EDGE_PROMPTS, algorithm=algorithm)


@pytest.mark.parametrize("algorithm", ["tli", "slrs"])
@pytest.mark.parametrize("pair_name", ["toy_pair", "toy_pair_reversed"])
def test_greedy_token_level_drafts_with_sibling_branches_are_the_target_alones(request, pair_name, algorithm):
    """TLI's and SLRS's argmax drafts with the drafter's runner-ups as sibling branches, verified as one tree:
    the target's own greedy output, with trees verified and siblings taken."""
    pair = request.getfixturevalue(pair_name)
    schedule = dataclasses.replace(choose_schedule(algorithm), sibling_min_joint=0.001, sibling_runner_ups=2)
    trees = siblings = 0
    for text in pair.prompts:
        ids = _ids(pair, text)
        ref = _reference(pair, ids, max_new_tokens=40, do_sample=False)
        out = _hetspec(pair, ids, max_new_tokens=40, do_sample=False, hetspec_algorithm=algorithm,
                       hetspec_schedule=schedule)
        assert out.tolist() == ref.tolist(), text
        trees += hf_hetspec.last_stats(pair.target).tree_rounds
        siblings += hf_hetspec.last_stats(pair.target).sibling_rounds
    assert trees > 0 and siblings > 0, (trees, siblings)


REAL = ["qwen2.5-coder", "smollm2", "gemma3"]


def _real_greedy_cells():
    """Every ordered pair of real vocabularies x every algorithm; by default a Latin square of them (each pair
    once, each algorithm on two pairs: 6 of 18 cells, ~2.5 minutes less of CI), the rest ``slow``."""
    cells = []
    for i, names in enumerate(itertools.permutations(REAL, 2)):
        for a, algorithm in enumerate(["slem", "tli", "slrs"]):
            marks = () if (i + a) % 3 == 0 else (pytest.mark.slow,)
            cells.append(pytest.param(names, algorithm, marks=marks, id=f"{'-'.join(names)}-{algorithm}"))
    return cells


@pytest.mark.parametrize("names, algorithm", _real_greedy_cells())
def test_greedy_identical_on_real_vocabularies(real_pair, names, algorithm):
    pair = real_pair(*names)
    stats = _check_greedy(pair, pair.prompts[:3] + EDGE_PROMPTS, max_new_tokens=32, algorithm=algorithm)
    corpus_stats = stats[:3]
    assert sum(s.accepted_tokens for s in corpus_stats) > 0, "no draft was ever accepted"


def test_chat_template_prompt_keeps_special_tokens(real_pair):
    pair = real_pair("qwen2.5-coder", "smollm2")
    tok = pair.target_tokenizer
    ids = tok.apply_chat_template(
        [{"role": "user", "content": pair.prompts[0]}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
    ref = _reference(pair, ids, max_new_tokens=24, do_sample=False)
    out = _hetspec(pair, ids, max_new_tokens=24, do_sample=False)
    assert out.tolist() == ref.tolist()


def test_stats_follow_the_documented_conventions(toy_pair):
    ids = _ids(toy_pair, toy_pair.prompts[0])
    began = time.perf_counter()
    out = _hetspec(toy_pair, ids, max_new_tokens=30, do_sample=False)
    wall = time.perf_counter() - began
    s = hf_hetspec.last_stats(toy_pair.target)
    assert s.new_tokens == out.shape[1] - ids.shape[1] == 30
    assert s.algorithm == "slem"
    assert 0 < s.accepted_tokens <= s.drafted_tokens
    assert s.acceptance_rate == pytest.approx(s.accepted_tokens / s.drafted_tokens)
    assert s.mean_accepted_per_forward == pytest.approx(s.new_tokens / s.target_forwards)
    assert s.target_forwards < s.new_tokens
    assert s.drafter_s > 0 and s.target_s > 0 and s.translation_s > 0
    # the three parts are disjoint timers inside the decoding loop, which runs within the call
    assert s.drafter_s + s.target_s + s.translation_s <= s.total_s <= wall
    assert s.tokens_per_second == pytest.approx(30 / s.total_s)
    assert set(s.as_dict()) >= {"target_forwards", "drafted_tokens", "accepted_tokens", "acceptance_rate",
                                "mean_accepted_per_forward", "drafter_s", "target_s", "translation_s"}


def test_translation_time_is_counted_once(toy_pair, monkeypatch):
    """Issue #25: the drafter's prompt conversion ran under two nested ``translation_s`` timers (the call's and
    the proposer's), so its time was added twice."""
    convert = hf_hetspec.proposer.drafter_prompt_ids

    def slow_convert(*args):
        time.sleep(0.3)
        return convert(*args)

    monkeypatch.setattr(hf_hetspec.proposer, "drafter_prompt_ids", slow_convert)
    _hetspec(toy_pair, _ids(toy_pair, toy_pair.prompts[0]), max_new_tokens=3, do_sample=False)
    s = hf_hetspec.last_stats(toy_pair.target)
    assert 0.3 <= s.translation_s < 0.55  # twice would be >= 0.6


@pytest.mark.parametrize("text", ["trailing spaces   ", "混合 text: 数学 🙂👍🏽 café"])
def test_rejections_and_alpha(toy_pair, text):
    """Off-corpus prompts, where the toy models disagree: a round's verification rejects at most once; alpha
    counts only the drafted tokens it reached. The bench's target hook reads the same rejections from the
    target's cache, except the last round's."""
    ids = _ids(toy_pair, text)
    with count_forwards(toy_pair.target) as hooked:
        _hetspec(toy_pair, ids, max_new_tokens=30, do_sample=False, num_assistant_tokens=6,
                 num_assistant_tokens_schedule="constant")
    s = hf_hetspec.last_stats(toy_pair.target)
    assert hooked["forwards"] == s.target_forwards
    assert 0 < s.rejections <= s.target_forwards
    assert s.rejections - 1 <= hooked["rejections"] <= s.rejections
    assert s.alpha == pytest.approx(s.accepted_tokens / (s.accepted_tokens + s.rejections))
    assert s.alpha > s.acceptance_rate  # the drafted tokens after a round's first rejection are never examined
    assert s.as_dict()["alpha"] == s.alpha

@pytest.mark.parametrize("algorithm", ["tli", "slrs"])
def test_block_verification_is_chosen_by_keyword_and_reported(toy_pair, algorithm):
    """``hetspec_verification`` reaches the loop: explicit ``"token"`` is the default (same seeded output),
    ``"block"`` is reproducible from a seed and named in the statistics (its distribution:
    tests/test_lossless.py)."""
    ids = _ids(toy_pair, toy_pair.prompts[0])

    def run(**kwargs):
        out = _hetspec(toy_pair, ids, hetspec_algorithm=algorithm, do_sample=True, max_new_tokens=24,
                       hetspec_generator=torch.Generator().manual_seed(3), **kwargs)
        return out.tolist(), hf_hetspec.last_stats(toy_pair.target)

    default, default_stats = run()
    assert run(hetspec_verification="token")[0] == default and default_stats.verification == "token"
    block, stats = run(hetspec_verification="block")
    assert run(hetspec_verification="block")[0] == block
    assert stats.verification == "block" and stats.as_dict()["verification"] == "block"
    assert f"{algorithm} (block verification): " in stats.summary() and stats.accepted_tokens > 0
    hf_hetspec.enable(toy_pair.target)
    try:
        with pytest.raises(ValueError, match="hetspec_verification.*without `assistant_model`"):
            toy_pair.target.generate(ids, hetspec_verification="block", max_new_tokens=2)
    finally:
        hf_hetspec.disable(toy_pair.target)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3])
def test_short_generations(toy_pair, max_new_tokens):
    _check_greedy(toy_pair, toy_pair.prompts[:2], max_new_tokens=max_new_tokens)


def test_one_token_prompt(toy_pair):
    tok = toy_pair.target_tokenizer
    ids = torch.tensor([[tok.convert_tokens_to_ids(tok.tokenize("The")[0])]])
    ref = _reference(toy_pair, ids, max_new_tokens=20, do_sample=False)
    assert _hetspec(toy_pair, ids, max_new_tokens=20, do_sample=False).tolist() == ref.tolist()


def test_eos_inside_an_accepted_block_stops_exactly_there(toy_pair):
    ids = _ids(toy_pair, toy_pair.prompts[0])
    free = _reference(toy_pair, ids, max_new_tokens=30, do_sample=False)[0, ids.shape[1]:].tolist()
    for position in (3, 6):
        eos = free[position]
        eos_list = [eos, toy_pair.target_tokenizer.eos_token_id]
        ref = _reference(toy_pair, ids, max_new_tokens=30, do_sample=False, eos_token_id=eos_list)
        out = _hetspec(toy_pair, ids, max_new_tokens=30, do_sample=False, eos_token_id=eos_list)
        assert out.tolist() == ref.tolist()
        assert out[0, -1].item() == eos and out.shape[1] <= ids.shape[1] + position + 1


def test_stop_strings_and_custom_stopping_criteria(toy_pair):
    from transformers import StoppingCriteria, StoppingCriteriaList

    ids = _ids(toy_pair, toy_pair.prompts[1])
    tok = toy_pair.target_tokenizer
    free = tok.decode(_reference(toy_pair, ids, max_new_tokens=30, do_sample=False)[0, ids.shape[1]:])
    stop = free.strip().split(" ")[2]
    kwargs = dict(max_new_tokens=30, do_sample=False, stop_strings=[stop])
    ref = _reference(toy_pair, ids, tokenizer=tok, **kwargs)
    out = _hetspec(toy_pair, ids, **kwargs)
    assert out.tolist() == ref.tolist() and ref.shape[1] < ids.shape[1] + 30

    class StopAtLength(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= ids.shape[1] + 7, dtype=torch.bool)

    crit = dict(max_new_tokens=30, do_sample=False, stopping_criteria=StoppingCriteriaList([StopAtLength()]))
    ref = _reference(toy_pair, ids, **crit)
    out = _hetspec(toy_pair, ids, **crit)
    assert out.tolist() == ref.tolist() and out.shape[1] == ids.shape[1] + 7


class _Recorder(BaseStreamer):
    def __init__(self):
        self.chunks = []
        self.ended = False

    def put(self, value):
        self.chunks.append(value.flatten().tolist())

    def end(self):
        self.ended = True


def test_streamer_receives_only_accepted_tokens_as_they_come(toy_pair):
    ids = _ids(toy_pair, toy_pair.prompts[0])
    rec = _Recorder()
    out = _hetspec(toy_pair, ids, max_new_tokens=30, do_sample=False, streamer=rec)
    assert rec.ended
    assert rec.chunks[0] == ids[0].tolist()
    assert sum(rec.chunks[1:], []) == out[0, ids.shape[1]:].tolist()
    stats = hf_hetspec.last_stats(toy_pair.target)
    assert len(rec.chunks) - 1 == stats.target_forwards  # one block per verification, not one at the end


def test_return_dict_with_scores(toy_pair):
    ids = _ids(toy_pair, toy_pair.prompts[0])
    kwargs = dict(max_new_tokens=12, do_sample=False, return_dict_in_generate=True, output_scores=True)
    ref = _reference(toy_pair, ids, **kwargs)
    out = _hetspec(toy_pair, ids, **kwargs)
    assert out.sequences.tolist() == ref.sequences.tolist()
    assert len(out.scores) == len(ref.scores) == 12
    for a, b in zip(out.scores, ref.scores):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_fixed_lookahead_is_honored(toy_pair):
    ids = _ids(toy_pair, toy_pair.prompts[0])
    ref = _reference(toy_pair, ids, max_new_tokens=24, do_sample=False)
    out = _hetspec(toy_pair, ids, max_new_tokens=24, do_sample=False, num_assistant_tokens=3,
                   num_assistant_tokens_schedule="constant")
    assert out.tolist() == ref.tolist()
    assert set(hf_hetspec.last_stats(toy_pair.target).lookaheads) == {3}


def test_default_schedules(toy_pair):
    """SLEM by default (a tiny drafter runs eager): drafts of at most SLEM_DEFAULTS["eager"].max_lookahead drafter tokens (ended earlier by the
    drafter's joint confidence, see test_draft_stop); TLI by default: transformers' +2/-1 rule starting at
    DEFAULT_LOOKAHEAD."""
    from hf_hetspec import plan

    ids = _ids(toy_pair, toy_pair.prompts[0])
    ref = _reference(toy_pair, ids, max_new_tokens=40, do_sample=False)
    out = _hetspec(toy_pair, ids, max_new_tokens=40, do_sample=False, hetspec_algorithm="slem")
    assert out.tolist() == ref.tolist()
    stats = hf_hetspec.last_stats(toy_pair.target)
    cap = plan.SLEM_DEFAULTS["eager"].max_lookahead
    assert set(stats.lookaheads) == {cap}
    assert stats.drafter_forwards <= stats.target_forwards * cap
    out = _hetspec(toy_pair, ids, max_new_tokens=40, do_sample=False, hetspec_algorithm="tli")
    assert out.tolist() == ref.tolist()
    lookaheads = hf_hetspec.last_stats(toy_pair.target).lookaheads
    assert lookaheads[0] == plan.DEFAULT_LOOKAHEAD and len(set(lookaheads)) > 1
    assert all(abs(b - a) in (1, 2) or b == a for a, b in zip(lookaheads, lookaheads[1:]))


def test_drafter_in_another_dtype(toy_pair):
    pair = copy.copy(toy_pair)
    pair.drafter = copy.deepcopy(toy_pair.drafter).to(torch.bfloat16)
    _check_greedy(pair, pair.prompts[:2], max_new_tokens=24)


def _fingerprint(model):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        model.config.to_dict(),
        model.generation_config.to_dict(),
    )


def test_models_are_not_mutated_and_a_second_call_is_identical(toy_pair):
    before_t, before_d = _fingerprint(toy_pair.target), _fingerprint(toy_pair.drafter)
    ids = _ids(toy_pair, toy_pair.prompts[2])
    first = _hetspec(toy_pair, ids, max_new_tokens=20, do_sample=False)
    torch.manual_seed(1)
    _hetspec(toy_pair, ids, max_new_tokens=20, do_sample=True, temperature=0.8)
    second = _hetspec(toy_pair, ids, max_new_tokens=20, do_sample=False)
    assert first.tolist() == second.tolist()
    for before, model in ((before_t, toy_pair.target), (before_d, toy_pair.drafter)):
        weights, config, gen = _fingerprint(model)
        assert config == before[1] and gen == before[2]
        assert all(torch.equal(weights[k], before[0][k]) for k in weights)


def test_enable_is_idempotent_and_disable_restores_exactly(toy_pair):
    model = toy_pair.target
    assert "generate" not in model.__dict__
    hf_hetspec.enable(model)
    hf_hetspec.enable(model)
    assert hf_hetspec.is_enabled(model)
    hf_hetspec.disable(model)
    assert "generate" not in model.__dict__ and not hf_hetspec.is_enabled(model)
    assert model.generate.__func__ is type(model).generate
    # after disable, hetspec arguments are transformers' business again
    with pytest.raises(ValueError, match="hetspec_algorithm"):
        model.generate(_ids(toy_pair, "The"), max_new_tokens=2, hetspec_algorithm="slem")


def test_plain_generate_is_unchanged_when_enabled(toy_pair):
    ids = _ids(toy_pair, toy_pair.prompts[0])
    ref = _reference(toy_pair, ids, max_new_tokens=10, do_sample=False)
    hf_hetspec.enable(toy_pair.target)
    try:
        assert toy_pair.target.generate(ids, max_new_tokens=10, do_sample=False).tolist() == ref.tolist()
    finally:
        hf_hetspec.disable(toy_pair.target)


def test_same_tokenizer_with_padded_embeddings_is_standard_speculative_decoding(toy_bpe_tokenizer):
    target = tiny_causal_lm(toy_bpe_tokenizer, seed=3, pad_vocab_to=64)
    drafter = tiny_causal_lm(toy_bpe_tokenizer, seed=4, pad_vocab_to=300)
    assert target.config.vocab_size != drafter.config.vocab_size
    ids = toy_bpe_tokenizer("def f", return_tensors="pt").input_ids
    ref = target.generate(ids, max_new_tokens=16, do_sample=False)
    hf_hetspec.enable(target)
    out = target.generate(ids, assistant_model=drafter, tokenizer=toy_bpe_tokenizer,
                          assistant_tokenizer=toy_bpe_tokenizer, max_new_tokens=16, do_sample=False)
    hf_hetspec.disable(target)
    assert out.tolist() == ref.tolist()
    assert "identical vocabularies" in hf_hetspec.last_stats(target).note


# ---------------------------------------------------------------------------------------------------
# Bad input: a clear error before any model forward
# ---------------------------------------------------------------------------------------------------


BAD_INPUTS = [
    (dict(tokenizer=None), ValueError, "tokenizer"),
    (dict(assistant_tokenizer=None), ValueError, "assistant_tokenizer"),
    (dict(hetspec_algorithm="bogus"), ValueError, "hetspec_algorithm"),
    (dict(num_beams=2), ValueError, "num_beams"),
    (dict(num_return_sequences=2, do_sample=True, hetspec_loop="transformers"), ValueError,
     "hetspec_loop='transformers' with a batch of 2 rows"),
    (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
    (dict(input_ids=torch.ones(2, 3, dtype=torch.long), assistant_input_ids=torch.tensor([[1, 2]])),
     NotImplementedError, "assistant_input_ids` with a batch of 2 prompts"),
    (dict(input_ids=torch.ones(1, 0, dtype=torch.long)), ValueError, "empty"),
    (dict(attention_mask=torch.tensor([[1, 1, 0]])), NotImplementedError, "attention_mask` ends in padding"),
    (dict(use_cache=False), ValueError, "use_cache"),
    (dict(hetspec_generator="seed"), TypeError, "hetspec_generator"),
    (dict(hetspec_draft_temperature=-0.5, hetspec_algorithm="tli", do_sample=True), ValueError,
     "hetspec_draft_temperature=-0.5.*>= 0"),
    (dict(hetspec_draft_temperature="hot", hetspec_algorithm="slrs", do_sample=True), ValueError,
     "hetspec_draft_temperature='hot'"),
    (dict(hetspec_draft_temperature=0.7, hetspec_algorithm="slem", do_sample=True), ValueError,
     "hetspec_draft_temperature=0.7 has no effect.*SLEM"),
    (dict(hetspec_draft_temperature=0.7, hetspec_algorithm="tli"), ValueError,
     "hetspec_draft_temperature=0.7 has no effect.*greedy call"),
    (dict(hetspec_verification="blocks", hetspec_algorithm="tli", do_sample=True), ValueError,
     "hetspec_verification='blocks' is not known; use one of token, block"),
    (dict(hetspec_verification="block", hetspec_algorithm="slem", do_sample=True), ValueError,
     "hetspec_verification='block' has no effect.*SLEM"),
    (dict(hetspec_verification="block", hetspec_algorithm="tli"), ValueError,
     "hetspec_verification='block' has no effect.*greedy call"),
]


@pytest.mark.parametrize("override,error,words", BAD_INPUTS, ids=[b[2].split(".*")[0] for b in BAD_INPUTS])
def test_bad_input_raises_before_any_work(toy_pair, override, error, words):
    kwargs = dict(
        input_ids=torch.tensor([[5, 6, 7]]),
        assistant_model=toy_pair.drafter,
        tokenizer=toy_pair.target_tokenizer,
        assistant_tokenizer=toy_pair.drafter_tokenizer,
        max_new_tokens=5,
    )
    kwargs.update(override)
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    counter = ForwardCounter(toy_pair.target, toy_pair.drafter)
    hf_hetspec.enable(toy_pair.target)
    try:
        with pytest.raises(error, match=words):
            toy_pair.target.generate(**kwargs)
    finally:
        hf_hetspec.disable(toy_pair.target)
        counter.close()
    assert counter.count == 0


def test_wrong_tokenizer_for_the_model_is_reported(toy_pair, real_tokenizer):
    big = real_tokenizer("gemma3")
    hf_hetspec.enable(toy_pair.target)
    try:
        with pytest.raises(ValueError, match="assistant_tokenizer.*embedding"):
            toy_pair.target.generate(torch.tensor([[5, 6]]), assistant_model=toy_pair.drafter,
                                     tokenizer=toy_pair.target_tokenizer, assistant_tokenizer=big,
                                     max_new_tokens=3)
    finally:
        hf_hetspec.disable(toy_pair.target)


def test_generation_config_object_is_honored(toy_pair):
    ids = _ids(toy_pair, toy_pair.prompts[3])
    cfg = GenerationConfig(max_new_tokens=15, do_sample=False, eos_token_id=toy_pair.target.generation_config.eos_token_id)
    ref = _reference(toy_pair, ids, generation_config=cfg)
    out = _hetspec(toy_pair, ids, generation_config=cfg)
    assert out.tolist() == ref.tolist()


@pytest.mark.parametrize("do_sample, expected", [(False, "slem"), (True, "slem")])
def test_auto_picks_slem_for_different_vocabularies(toy_pair, do_sample, expected):
    """The documented ``auto`` rule for two different vocabularies (identical ones: see the next test)."""
    ids = _ids(toy_pair, toy_pair.prompts[0])
    kwargs = dict(do_sample=True, temperature=1.0, top_k=5) if do_sample else dict(do_sample=False)
    _hetspec(toy_pair, ids, max_new_tokens=6, hetspec_algorithm="auto", **kwargs)
    assert hf_hetspec.last_stats(toy_pair.target).algorithm == expected


def test_auto_samples_with_tli_for_identical_vocabularies(toy_pair):
    target, tok = toy_pair.target, toy_pair.target_tokenizer
    ids = _ids(toy_pair, toy_pair.prompts[0])
    hf_hetspec.enable(target)
    try:
        target.generate(ids, assistant_model=target, tokenizer=tok, assistant_tokenizer=tok, do_sample=True,
                        top_k=5, max_new_tokens=6)
    finally:
        hf_hetspec.disable(target)
    stats = hf_hetspec.last_stats(target)
    assert stats.algorithm == "tli" and "identical vocabularies" in stats.note


def test_tli_prunes_the_drafter_head_to_the_intersection_without_changing_drafts(real_pair, monkeypatch):
    """A Gemma-3-vocabulary drafter shares about a third of its 262,144 rows with Qwen2.5-Coder: TLI computes
    only those rows. Greedy drafts (argmax over the intersection) are the same as with the full head, so the
    draft statistics are equal, and the output is the target's."""
    pair = real_pair("qwen2.5-coder", "gemma3")
    shared = hf_hetspec.vocabulary_intersection(pair.target_tokenizer, pair.drafter_tokenizer).drafter_shared
    stats = {}
    for mode, share in (("pruned", hf_hetspec.drafter.PRUNE_MAX_SHARE), ("full", 0.0)):
        monkeypatch.setattr(hf_hetspec.drafter, "PRUNE_MAX_SHARE", share)
        stats[mode] = _check_greedy(pair, pair.prompts[:2], max_new_tokens=24, algorithm="tli")
    assert [s.drafter_head_rows for s in stats["pruned"]] == [shared, shared]
    assert 0 < shared < 0.5 * len(pair.drafter_tokenizer)
    assert [s.drafter_head_rows for s in stats["full"]] == [0, 0]
    for pruned, full in zip(stats["pruned"], stats["full"]):
        assert (pruned.drafted_tokens, pruned.accepted_tokens) == (full.drafted_tokens, full.accepted_tokens)
    assert sum(s.accepted_tokens for s in stats["pruned"]) > 0


def test_pruned_head_logits_are_the_full_heads_rows(real_pair):
    pair = real_pair("qwen2.5-coder", "gemma3")
    vocab = hf_hetspec.alignment.Vocabulary.from_tokenizer(pair.drafter_tokenizer)
    prompt = pair.drafter_tokenizer(pair.prompts[0]).input_ids
    rows = torch.arange(0, len(pair.drafter_tokenizer), 3)
    full = hf_hetspec.drafter.DrafterContext(pair.drafter, vocab, prompt)
    pruned = hf_hetspec.drafter.DrafterContext(pair.drafter, vocab, prompt)
    assert pruned.restrict_head(rows)
    expected = full.next_logits()[:, rows]
    got = pruned.next_logits()
    assert got.shape == (1, rows.numel())
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_head_with_logit_softcapping_is_not_pruned():
    """Gemma-2 caps its final logits (tanh): a plain linear head over the decoder's output would be wrong, so
    the full head is kept; a Llama head is pruned."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM

    small = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16)
    torch.manual_seed(0)
    capped = Gemma2ForCausalLM(Gemma2Config(final_logit_softcapping=0.5, **small)).eval()
    plain = LlamaForCausalLM(LlamaConfig(**small)).eval()
    rows = torch.arange(0, 256, 4)
    assert hf_hetspec.drafter.PrunedHead.build(capped, rows, 256) is None
    assert hf_hetspec.drafter.PrunedHead.build(plain, rows, 256) is not None
    assert hf_hetspec.drafter.PrunedHead.build(plain, torch.arange(250), 256) is None  # too little to gain


def test_pruned_head_follows_changes_to_the_drafter_weights(real_pair):
    """The cached copy of the kept rows is refreshed after the head changes in place (e.g. a training step in
    a notebook), so drafts always come from the drafter as it is now."""
    pair = real_pair("qwen2.5-coder", "gemma3")
    head = pair.drafter.get_output_embeddings()
    rows = torch.arange(0, len(pair.drafter_tokenizer), 3)
    before = hf_hetspec.drafter.PrunedHead(pair.drafter, rows).linear.weight.clone()
    saved = head.weight.detach().clone()
    try:
        with torch.no_grad():
            head.weight.mul_(2.0)
        after = hf_hetspec.drafter.PrunedHead(pair.drafter, rows).linear.weight
        torch.testing.assert_close(after, 2.0 * before)
    finally:
        with torch.no_grad():
            head.weight.copy_(saved)
    torch.testing.assert_close(hf_hetspec.drafter.PrunedHead(pair.drafter, rows).linear.weight, before)


def test_cache_argument_follows_the_forward_signature(toy_sp_tokenizer):
    """transformers 5.24 renamed the KV cache argument ``past_key_values`` -> ``cache`` (the old name warns and
    goes in 5.40): hf_hetspec passes the name each forward takes, reads outputs and generate()'s kwargs under
    either name."""
    class Old(torch.nn.Module):
        def forward(self, input_ids, past_key_values=None, use_cache=True):
            pass

    class New(torch.nn.Module):
        def forward(self, input_ids, cache=None, use_cache=True):
            pass

    def renamed(forward):  # how transformers' deprecate_kwarg wraps a forward
        @functools.wraps(forward)
        def wrapper(*args, **kwargs):
            return forward(*args, **kwargs)
        return wrapper

    class Wrapped(torch.nn.Module):
        forward = renamed(New.forward)

    assert [cache_argument(m) for m in (Old(), New(), Wrapped())] == ["past_key_values", "cache", "cache"]

    @dataclasses.dataclass
    class OldOutput:
        past_key_values: object = None

    @dataclasses.dataclass
    class NewOutput:
        cache: object = None

    assert output_cache(OldOutput("a")) == output_cache(NewOutput("a")) == "a"
    assert output_cache_kwargs(OldOutput, "c") == {"past_key_values": "c"}
    assert output_cache_kwargs(NewOutput, "c") == {"cache": "c"}
    assert cache_from_kwargs({"cache": "x"}) == cache_from_kwargs({"past_key_values": "x"}) == "x"
    assert cache_from_kwargs({}) is None

    # and the installed release: Llama's forward takes `cache` from 5.24 on
    model = tiny_causal_lm(toy_sp_tokenizer, seed=0, hidden=16, layers=1)
    renamed_release = Version(transformers.__version__).release >= (5, 24)
    assert cache_argument(model) == ("cache" if renamed_release else "past_key_values")


def _cache_warnings(pair, algorithm) -> list[str]:
    """Messages mentioning ``past_key_values`` (warnings and transformers' log) during a greedy and a sampled
    call with ``pair``."""
    logging.Logger.warning_once.cache_clear()  # transformers logs each message once per process
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = transformers.utils.logging.get_logger("transformers")
    logger.addHandler(handler)
    ids = _ids(pair, pair.prompts[0])
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for do_sample in (False, True):
                _hetspec(pair, ids, max_new_tokens=8, do_sample=do_sample, hetspec_algorithm=algorithm,
                         return_dict_in_generate=True)
    finally:
        logger.removeHandler(handler)
    messages = [str(w.message) for w in caught] + [r.getMessage() for r in records]
    return [m for m in messages if "past_key_values" in m]


@pytest.mark.parametrize("algorithm", ["slem", "tli", "slrs"])
def test_no_cache_deprecation_warning(toy_pair, algorithm):
    """No "`past_key_values` is deprecated" warning from any forward hf_hetspec runs (transformers >= 5.24;
    on older releases there is nothing to warn about)."""
    assert _cache_warnings(toy_pair, algorithm) == []


def test_no_cache_deprecation_warning_with_a_pruned_head(real_pair):
    """The same for TLI's pruned drafter head, which runs the drafter's decoder itself (Gemma-3 vocabulary)."""
    pair = real_pair("qwen2.5-coder", "gemma3")
    assert _cache_warnings(pair, "tli") == []
    assert hf_hetspec.last_stats(pair.target).drafter_head_rows > 0
