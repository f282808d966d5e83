"""Hardening: the fault classes other heterogeneous-vocabulary implementations shipped (issue 6), each a test.

Every expected value comes from the target alone: greedy output is compared with ``target.generate()``
without a drafter (float32), sampled output with the exact target distribution (:mod:`hf_hetspec.testing`).
The matrix runs every algorithm (SLEM, TLI, SLRS) on the two toy pairs (fresh clone) and on three tiny pairs
built on the real tokenizers (``../shared``; skipped with a reason when absent), chosen so that each real
vocabulary is once the target and once the drafter: Qwen2.5-Coder -> Gemma-3, Gemma-3 -> SmolLM2,
SmolLM2 -> Qwen2.5-Coder. Cases already in other test files are not repeated; they are listed here.

| class | tests |
|---|---|
| 1 BOS / specials re-inserted when re-encoding | ``test_drafter_context_is_prompt_plus_accepted_text`` (matrix); ``test_alignment::test_special_tokens_are_never_rewritten_by_a_window``, ``test_drafter::test_property_drafter_context_never_drifts`` |
| 2 look-behind window longer than the prompt | ``test_one_and_two_token_prompts`` (matrix); ``test_integration::test_one_token_prompt`` |
| 3 target's mask / positions handed to the drafter | ``test_position_ids_and_attention_mask_are_the_targets`` (matrix), ``test_cache_position_is_treated_as_by_the_target_alone``; ``test_plan::test_bad_position_ids_are_refused`` |
| 4 EOS inside a draft, EOS lists, stop strings, criteria | ``test_eos_list_inside_an_accepted_block`` and ``test_stop_strings_and_custom_criteria_inside_a_block`` (matrix), ``test_eos_list_sampling_is_lossless``; ``test_integration::test_eos_inside_an_accepted_block_stops_exactly_there``, ``test_lossless::test_exact_distribution_stops_at_eos_and_hetspec_stops_there_too`` |
| 5 q not the distribution drafts were drawn from | ``test_lossless`` (every algorithm on both toy pairs; SLEM, TLI and SLRS on all six real-vocabulary pairs at T=1, 0.7 and top-p, 18 cells by default and 36 ``slow``; broken variants rejected); ``test_token_level_sampling_is_lossless_on_real_vocabularies`` (TLI/SLRS on the three real pairs, ``slow``) |
| 6 target's id-indexed processors on the drafter | ``test_target_processors_with_id_state`` (matrix), ``test_target_processors_sampling_is_lossless`` |
| 7 models mutated; second call / other target differs | ``test_nothing_is_mutated_and_calls_repeat``, ``test_one_drafter_with_two_targets``; ``test_integration::test_models_are_not_mutated_and_a_second_call_is_identical`` |
| 8 vocabularies judged by ``vocab_size`` | ``test_equal_size_different_tokenizers_are_heterogeneous``, ``test_same_tokenizer_padded_differently_is_identical``; ``test_integration::test_same_tokenizer_with_padded_embeddings_is_standard_speculative_decoding`` |
| 9 chat templates | ``test_each_side_gets_its_own_chat_template``, ``test_chat_markers_map_by_content_without_assistant_input_ids``; ``test_chat::test_chat_inputs_falls_back_to_the_target_text``, ``test_plan::test_bad_assistant_input_ids_are_refused``, ``test_plan::test_assistant_input_ids_without_a_drafter_is_refused``, ``test_integration::test_chat_template_prompt_keeps_special_tokens`` |
| 10 streamers get rejected tokens / nothing until the end | ``test_drafter_context_is_prompt_plus_accepted_text`` (matrix, also records the stream); ``test_integration::test_streamer_receives_only_accepted_tokens_as_they_come`` |
| 11 Unicode, byte fallback, literal special-token strings | ``test_literal_special_strings_in_the_prompt_stay_text``, ``test_target_generating_literal_special_strings`` (matrix), ``test_slem_drafts_of_literal_special_text_stay_plain_target_tokens``; ``test_alignment::test_property_conversion_between_tokenizers_keeps_the_bytes``, ``test_integration::test_greedy_identical_*`` (emoji, CJK, combining marks, trailing spaces), ``test_alignment`` |
| 12 lengths | ``test_one_and_two_new_tokens``, ``test_drafts_never_cross_max_length`` (matrix), ``test_prompt_longer_than_the_drafter_context``; ``test_drafter::test_sliding_window_drafter_rolls_back_past_its_window``, ``test_integration::test_short_generations`` |
| 13 dtypes and devices | ``test_mixed_dtypes`` (bf16 target + fp32 drafter and the reverse), ``test_inputs_on_another_device_than_the_target`` (CUDA only: CPU prompt and drafter, GPU target; a CPU ``hetspec_generator`` is refused); ``test_integration::test_drafter_in_another_dtype`` |
"""

from __future__ import annotations

import copy
import weakref

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.generation.streamers import BaseStreamer

import hf_hetspec
import hf_hetspec.proposer as proposer_module
from conftest import ForwardCounter, specials
from conftest import hetspec_generate as _hetspec
from hf_hetspec.alignment import sanitize_utf8, vocabulary
from hf_hetspec.compat import cache_from_kwargs
from hf_hetspec.drafter import DrafterContext
from hf_hetspec.plan import Schedule
from hf_hetspec.slem import SLEMProposer
from hf_hetspec.stats import DecodingStats
from hf_hetspec.testing import verify_lossless
from hf_hetspec.testing.toy import sentencepiece_bpe_tokenizer, tiny_causal_lm
from hf_hetspec.testing import compare_greedy

ALGORITHMS = ["slem", "tli", "slrs"]
REAL_PAIRS = {
    "qwen-gemma3": ("qwen2.5-coder", "gemma3"),
    "gemma3-smollm2": ("gemma3", "smollm2"),
    "smollm2-qwen": ("smollm2", "qwen2.5-coder"),
}
PAIRS = ["toy", "toy_reversed", *REAL_PAIRS]
ALPHA = 1e-3
T1 = dict(temperature=1.0, top_k=5)


@pytest.fixture(params=PAIRS)
def pair(request):
    """Each pair of the matrix (real ones skip without ``../shared``)."""
    name = request.param
    if name == "toy":
        return request.getfixturevalue("toy_pair")
    if name == "toy_reversed":
        return request.getfixturevalue("toy_pair_reversed")
    return request.getfixturevalue("real_pair")(*REAL_PAIRS[name])


# ---------------------------------------------------------------------------------------------------
# Helpers: the target alone, hf_hetspec, and a spy on the drafter's context
# ---------------------------------------------------------------------------------------------------

_REFERENCES: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def _reference(pair, ids, cache=True, **kwargs):
    """``target.generate`` without a drafter (memoized per live target model, prompt and arguments)."""
    key = (tuple(ids[0].tolist()), repr(sorted(kwargs.items())))
    memo = _REFERENCES.setdefault(pair.target, {}) if cache else {}
    if key not in memo:
        hf_hetspec.disable(pair.target)
        memo[key] = pair.target.generate(ids, **kwargs)
    return memo[key]


def _ids(pair, text):
    return pair.target_tokenizer(text, return_tensors="pt").input_ids


def _greedy_identical(pair, ids, algorithm, **kwargs):
    """Greedy hf_hetspec output equals the target alone's; returns ``(output, stats)``."""
    ref = _reference(pair, ids, do_sample=False, **kwargs)
    out = _hetspec(pair, ids, algorithm, do_sample=False, **kwargs)
    assert out.tolist() == ref.tolist()
    stats = hf_hetspec.last_stats(pair.target)
    assert stats.algorithm == algorithm
    return out, stats


@pytest.fixture
def contexts(monkeypatch):
    """Every :class:`DrafterContext` a ``generate()`` call makes, with the prompt it was given."""
    made = []

    class Recording(DrafterContext):
        def __init__(self, model, vocab, prompt_ids, *args, **kwargs):
            super().__init__(model, vocab, prompt_ids, *args, **kwargs)
            self.given_prompt = list(prompt_ids)
            made.append(self)

    monkeypatch.setattr(proposer_module, "DrafterContext", Recording)
    return made


class _Recorder(BaseStreamer):
    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, value):
        self.chunks.append(value.flatten().tolist())

    def end(self):
        self.ended = True


def _assert_context_spells(ctx: DrafterContext, generated_bytes: bytes) -> None:
    """The drafter's synced ids spell its prompt followed by the accepted text, with no special token added."""
    vocab = ctx.vocab
    synced = ctx.ids[: ctx.n_synced]
    accepted = sanitize_utf8(generated_bytes)[: ctx.synced_len]
    assert vocab.ids_to_bytes(synced) == vocab.ids_to_bytes(ctx.given_prompt) + accepted
    assert specials(vocab, synced) == specials(vocab, ctx.given_prompt)


# ---------------------------------------------------------------------------------------------------
# Classes 1 and 10: the drafter's context follows the accepted text; the streamer gets accepted tokens
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_drafter_context_is_prompt_plus_accepted_text(pair, algorithm, contexts):
    ids = _ids(pair, pair.prompts[0])
    rec = _Recorder()
    ref = _reference(pair, ids, do_sample=False, max_new_tokens=16)
    # a short fixed lookahead: several rounds, so the drafter syncs on accepted text more than once
    out = _hetspec(pair, ids, algorithm, do_sample=False, max_new_tokens=16, streamer=rec,
                   num_assistant_tokens=4, num_assistant_tokens_schedule="constant")
    assert out.tolist() == ref.tolist()
    stats = hf_hetspec.last_stats(pair.target)
    assert stats.accepted_tokens > 0, "no draft accepted: the sync after an accepted draft was not exercised"
    ctx = contexts[-1]
    n = ids.shape[1]
    generated = vocabulary(pair.target_tokenizer).ids_to_bytes(out[0, n:].tolist())
    _assert_context_spells(ctx, generated)
    assert ctx.synced_len > 0
    # the BOS (or any special token) of the drafter appears exactly as often as in its prompt: once at most
    bos = pair.drafter_tokenizer.bos_token_id
    assert ctx.ids[: ctx.n_synced].count(bos) == ctx.given_prompt.count(bos) <= 1
    # class 10: the prompt first, then exactly the accepted tokens, one block per target forward
    assert rec.ended and rec.chunks[0] == ids[0].tolist()
    assert sum(rec.chunks[1:], []) == out[0, n:].tolist()
    assert len(rec.chunks) - 1 == stats.target_forwards


# ---------------------------------------------------------------------------------------------------
# Class 2: prompts shorter than the look-behind window
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [1, 2])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_one_and_two_token_prompts(pair, algorithm, length):
    ids = _ids(pair, pair.prompts[0])[:, :length]  # for Gemma-style targets the 1-token prompt is <bos> alone
    out, stats = _greedy_identical(pair, ids, algorithm, max_new_tokens=12)  # asserts identity with the target
    assert out[0, :length].tolist() == ids[0].tolist() and out.shape[1] > length
    assert stats.target_forwards >= 1 and stats.new_tokens == out.shape[1] - length


# ---------------------------------------------------------------------------------------------------
# Class 3: the target's attention mask / position ids / cache position are the target's alone
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_position_ids_and_attention_mask_are_the_targets(pair, algorithm):
    ids = _ids(pair, pair.prompts[0])
    n = ids.shape[1]
    kwargs = dict(max_new_tokens=8, return_dict_in_generate=True, output_scores=True,
                  attention_mask=torch.ones_like(ids), position_ids=2 * torch.arange(n)[None] + 3)
    ref = _reference(pair, ids, do_sample=False, **kwargs)
    plain = _reference(pair, ids, do_sample=False, max_new_tokens=8, return_dict_in_generate=True,
                       output_scores=True)
    # the positions matter to the target (the test has power): its scores differ from default positions
    assert not torch.allclose(ref.scores[0], plain.scores[0], atol=1e-4)
    out = _hetspec(pair, ids, algorithm, do_sample=False, **kwargs)
    assert out.sequences.tolist() == ref.sequences.tolist()
    for ours, theirs in zip(out.scores, ref.scores, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_cache_position_is_treated_as_by_the_target_alone(toy_pair):
    ids = _ids(toy_pair, toy_pair.prompts[0])
    kwargs = dict(max_new_tokens=4, do_sample=False, cache_position=torch.arange(ids.shape[1]))
    try:
        ref = _reference(toy_pair, ids, cache=False, **kwargs)
    except (ValueError, TypeError) as err:  # transformers 5.23 refuses it: so must we, before any drafting
        counter = ForwardCounter(toy_pair.drafter)
        try:
            with pytest.raises(type(err), match="cache_position"):
                _hetspec(toy_pair, ids, "slem", **kwargs)
        finally:
            counter.close()
        assert counter.count == 0
    else:
        assert _hetspec(toy_pair, ids, "slem", **kwargs).tolist() == ref.tolist()


# ---------------------------------------------------------------------------------------------------
# Class 4: EOS, EOS lists, stop strings and custom criteria inside an accepted block
# ---------------------------------------------------------------------------------------------------


def _free(pair, ids, m=16):
    return _reference(pair, ids, do_sample=False, max_new_tokens=m)[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_eos_list_inside_an_accepted_block(pair, algorithm):
    ids = _ids(pair, pair.prompts[0])
    free = _free(pair, ids)
    eos = free[4]
    out, stats = _greedy_identical(pair, ids, algorithm, max_new_tokens=16,
                                   eos_token_id=[pair.target_tokenizer.eos_token_id, eos])
    assert out[0, -1].item() == eos and out.shape[1] <= ids.shape[1] + 5
    assert stats.accepted_tokens > 0


class _StopAtLength(StoppingCriteria):
    def __init__(self, length):
        self.length = length

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_stop_strings_and_custom_criteria_inside_a_block(pair, algorithm):
    ids = _ids(pair, pair.prompts[0])
    n = ids.shape[1]
    free = _free(pair, ids)
    tok = pair.target_tokenizer
    stop = next(s for s in (tok.decode(free[i : i + 1]).strip() for i in range(3, 12)) if s)
    kwargs = dict(max_new_tokens=16, do_sample=False, stop_strings=[stop])
    ref = _reference(pair, ids, tokenizer=tok, **kwargs)
    assert ref.shape[1] < n + 16
    assert _hetspec(pair, ids, algorithm, **kwargs).tolist() == ref.tolist()
    criteria = StoppingCriteriaList([_StopAtLength(n + 6)])
    ref = _reference(pair, ids, cache=False, max_new_tokens=16, do_sample=False, stopping_criteria=criteria)
    out = _hetspec(pair, ids, algorithm, max_new_tokens=16, do_sample=False, stopping_criteria=criteria)
    assert out.tolist() == ref.tolist() and out.shape[1] == n + 6


@pytest.mark.parametrize("algorithm", ["tli", "slrs"])
def test_eos_list_sampling_is_lossless(toy_pair, algorithm):
    """An EOS id given as a list, hit inside a sampled block: the exact distribution stops there too."""
    ids = _ids(toy_pair, "the")
    likely = _reference(toy_pair, ids, do_sample=False, max_new_tokens=1)[0, -1].item()
    setting = dict(T1, eos_token_id=[likely, toy_pair.target_tokenizer.eos_token_id])
    report = verify_lossless(toy_pair.target, toy_pair.drafter, toy_pair.target_tokenizer,
                             toy_pair.drafter_tokenizer, ids, algorithm, n=300, seed=0, alpha=ALPHA, **setting)
    print(report)
    assert report.passed and report.num_bins >= 3, str(report)
    assert report.acceptance_rate > 0


# ---------------------------------------------------------------------------------------------------
# Class 5: q is the distribution the drafts were drawn from (TLI/SLRS on the real vocabularies)
# ---------------------------------------------------------------------------------------------------


@pytest.mark.slow  # 10-70 s each: every drafter step pushes a 49k-262k distribution onto the other vocabulary
@pytest.mark.parametrize("algorithm", ["tli", "slrs"])
@pytest.mark.parametrize("names", list(REAL_PAIRS))
def test_token_level_sampling_is_lossless_on_real_vocabularies(real_pair, names, algorithm):
    pair = real_pair(*REAL_PAIRS[names])
    ids = _ids(pair, "def" if names != "gemma3-smollm2" else "Our")
    report = verify_lossless(pair.target, pair.drafter, pair.target_tokenizer, pair.drafter_tokenizer, ids,
                             algorithm, n=200, seed=0, alpha=ALPHA, **T1)
    print(report)
    assert report.passed and report.num_bins >= 3, str(report)


# ---------------------------------------------------------------------------------------------------
# Class 6: the target's processors with id-indexed state stay on the target
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_target_processors_with_id_state(pair, algorithm):
    ids = _ids(pair, pair.prompts[0])
    n = ids.shape[1]
    free = _free(pair, ids)
    penalized = dict(max_new_tokens=12, repetition_penalty=1.3, bad_words_ids=[[free[2]]],
                     suppress_tokens=[free[5]])
    out, _ = _greedy_identical(pair, ids, algorithm, **penalized)
    assert out[0, n:].tolist() != free[:12]  # the processors changed the target's output: the test has power
    eos = pair.target_tokenizer.eos_token_id
    forced = dict(max_new_tokens=10, begin_suppress_tokens=[free[0]], forced_eos_token_id=eos)
    out, _ = _greedy_identical(pair, ids, algorithm, **forced)
    assert out[0, n].item() != free[0] and out[0, -1].item() == eos


@pytest.mark.parametrize("algorithm,setting", [
    ("tli", dict(repetition_penalty=3.0)),
    ("slrs", dict(suppress_tokens="first")),
], ids=["tli-repetition_penalty", "slrs-suppress_tokens"])
def test_target_processors_sampling_is_lossless(toy_pair, algorithm, setting):
    ids = _ids(toy_pair, "the")
    if setting.get("suppress_tokens") == "first":
        setting = dict(suppress_tokens=[_reference(toy_pair, ids, do_sample=False, max_new_tokens=1)[0, -1].item()])
    report = verify_lossless(toy_pair.target, toy_pair.drafter, toy_pair.target_tokenizer,
                             toy_pair.drafter_tokenizer, ids, algorithm, n=300, seed=0, alpha=ALPHA, **T1,
                             **setting)
    print(report)
    assert report.passed and report.num_bins >= 3, str(report)


# ---------------------------------------------------------------------------------------------------
# Class 7: nothing is mutated; a second call and another target behave as the first
# ---------------------------------------------------------------------------------------------------


def _model_fingerprint(model):
    return ({k: v.clone() for k, v in model.state_dict().items()}, model.config.to_dict(),
            model.generation_config.to_dict())


def _tokenizer_fingerprint(tok):
    backend = tok.backend_tokenizer
    return (len(tok), backend.encode_special_tokens, tok.split_special_tokens,
            tok.encode("<|im_end|><eos> x", add_special_tokens=False))


@pytest.mark.parametrize("pair_name", ["toy_pair", "toy_pair_reversed"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_nothing_is_mutated_and_calls_repeat(request, pair_name, algorithm):
    pair = request.getfixturevalue(pair_name)
    models = [_model_fingerprint(m) for m in (pair.target, pair.drafter)]
    tokenizers = [_tokenizer_fingerprint(t) for t in (pair.target_tokenizer, pair.drafter_tokenizer)]
    ids = _ids(pair, pair.prompts[1])
    first = _hetspec(pair, ids, algorithm, max_new_tokens=12, do_sample=False)
    _hetspec(pair, ids, algorithm, max_new_tokens=12, do_sample=True, temperature=0.8,
             hetspec_generator=torch.Generator().manual_seed(1))
    second = _hetspec(pair, ids, algorithm, max_new_tokens=12, do_sample=False)
    assert first.tolist() == second.tolist() == _reference(pair, ids, do_sample=False, max_new_tokens=12).tolist()
    for before, model in zip(models, (pair.target, pair.drafter)):
        weights, config, generation = _model_fingerprint(model)
        assert config == before[1] and generation == before[2]
        assert all(torch.equal(weights[k], before[0][k]) for k in weights)
    assert [_tokenizer_fingerprint(t) for t in (pair.target_tokenizer, pair.drafter_tokenizer)] == tokenizers


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_one_drafter_with_two_targets(toy_pair, toy_bpe_tokenizer, algorithm):
    """The SentencePiece drafter serves the trained byte-level target, then a random one of another size
    (another LM-head width, another model type), then the first again: each call is its target's output."""
    other = copy.copy(toy_pair)
    other.target = tiny_causal_lm(toy_bpe_tokenizer, seed=7, hidden=32, arch="llama", pad_vocab_to=128)
    ids = _ids(toy_pair, toy_pair.prompts[0])
    first, _ = _greedy_identical(toy_pair, ids, algorithm, max_new_tokens=12)
    ref = _reference(other, ids, cache=False, do_sample=False, max_new_tokens=12)
    assert _hetspec(other, ids, algorithm, do_sample=False, max_new_tokens=12).tolist() == ref.tolist()
    again, _ = _greedy_identical(toy_pair, ids, algorithm, max_new_tokens=12)
    assert again.tolist() == first.tolist()


# ---------------------------------------------------------------------------------------------------
# Class 8: vocabularies are compared by their tokens, never by vocab_size
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def equal_size_pair(toy_bpe_tokenizer):
    """The byte-level toy tokenizer and a SentencePiece tokenizer trained to exactly its size, with random
    models of equal embedding size (transformers would take them for one tokenizer)."""
    sp = sentencepiece_bpe_tokenizer(vocab_size=len(toy_bpe_tokenizer))
    assert len(sp) == len(toy_bpe_tokenizer)
    target = tiny_causal_lm(toy_bpe_tokenizer, seed=11, arch="qwen2")
    drafter = tiny_causal_lm(sp, seed=12)
    assert target.config.vocab_size == drafter.config.vocab_size
    return _Pair(target, drafter, toy_bpe_tokenizer, sp)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_equal_size_different_tokenizers_are_heterogeneous(equal_size_pair, algorithm):
    pair = equal_size_pair
    ids = pair.target_tokenizer("def fibonacci(n", return_tensors="pt").input_ids
    _, stats = _greedy_identical(pair, ids, algorithm, max_new_tokens=10)
    assert "identical" not in stats.note and stats.drafted_tokens > 0


class _Pair:
    def __init__(self, target, drafter, target_tokenizer, drafter_tokenizer):
        self.target, self.drafter = target, drafter
        self.target_tokenizer, self.drafter_tokenizer = target_tokenizer, drafter_tokenizer


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_same_tokenizer_padded_differently_is_identical(toy_bpe_tokenizer, algorithm):
    target = tiny_causal_lm(toy_bpe_tokenizer, seed=3, pad_vocab_to=64)
    drafter = tiny_causal_lm(toy_bpe_tokenizer, seed=4, pad_vocab_to=300)
    pair = _Pair(target, drafter, toy_bpe_tokenizer, copy.deepcopy(toy_bpe_tokenizer))  # equal, not the same
    ids = toy_bpe_tokenizer("def f", return_tensors="pt").input_ids
    _, stats = _greedy_identical(pair, ids, algorithm, max_new_tokens=10)
    assert "identical vocabularies" in stats.note


# ---------------------------------------------------------------------------------------------------
# Class 9: chat templates applied on each side
# ---------------------------------------------------------------------------------------------------

CHAT_PAIRS = ["toy", "toy_reversed", "qwen-gemma3", "smollm2-qwen"]  # targets with a chat template


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("pair_name", CHAT_PAIRS)
def test_each_side_gets_its_own_chat_template(request, pair_name, algorithm, contexts):
    pair = _pair_by_name(request, pair_name)
    messages = [{"role": "user", "content": pair.prompts[0]}]
    inputs = hf_hetspec.chat_inputs(messages, pair.target_tokenizer, pair.drafter_tokenizer)
    target_ids = pair.target_tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                           return_dict=True, return_tensors="pt")["input_ids"]
    assert inputs["input_ids"].tolist() == target_ids.tolist()
    ref = _reference(pair, target_ids, do_sample=False, max_new_tokens=12)
    out = _hetspec(pair, inputs["input_ids"], algorithm, do_sample=False, max_new_tokens=12,
                   attention_mask=inputs["attention_mask"], assistant_input_ids=inputs["assistant_input_ids"])
    assert out.tolist() == ref.tolist()
    ctx = contexts[-1]
    assert ctx.given_prompt == inputs["assistant_input_ids"][0].tolist()
    # after decoding, the drafter's context still holds every control token of its prompt (class 1 too)
    _assert_context_spells(ctx, vocabulary(pair.target_tokenizer).ids_to_bytes(out[0, target_ids.shape[1]:].tolist()))
    if pair.drafter_tokenizer.chat_template:
        drafter_ids = pair.drafter_tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                                 return_dict=True, return_tensors="pt")["input_ids"]
        assert inputs["assistant_input_ids"].tolist() == drafter_ids.tolist()
        # the drafter's own turn markers are real special tokens of its vocabulary
        assert len(specials(vocabulary(pair.drafter_tokenizer), drafter_ids[0].tolist())) >= 2


def _pair_by_name(request, name):
    if name == "toy":
        return request.getfixturevalue("toy_pair")
    if name == "toy_reversed":
        return request.getfixturevalue("toy_pair_reversed")
    return request.getfixturevalue("real_pair")(*REAL_PAIRS.get(name, name.split("+")))


def test_chat_markers_map_by_content_without_assistant_input_ids(real_pair, contexts):
    """Without ``assistant_input_ids`` a ChatML drafter still gets ChatML markers as its special tokens."""
    pair = real_pair("smollm2", "qwen2.5-coder")
    ids = pair.target_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                                    add_generation_prompt=True, return_dict=True,
                                                    return_tensors="pt")["input_ids"]
    _greedy_identical(pair, ids, "slem", max_new_tokens=4)
    dt = pair.drafter_tokenizer
    markers = [dt.convert_tokens_to_ids("<|im_start|>"), dt.convert_tokens_to_ids("<|im_end|>")]
    prompt = contexts[-1].given_prompt
    assert prompt.count(markers[0]) == 3 and prompt.count(markers[1]) == 2  # system, user, assistant turns
    assert dt.decode(prompt) == pair.target_tokenizer.decode(ids[0])





# ---------------------------------------------------------------------------------------------------
# Class 11: literal special-token strings stay text on the other side
# ---------------------------------------------------------------------------------------------------

LITERAL_TEXT = " say <|endoftext|> or <eos>, then <start_of_turn>user and <|im_end|> now"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_literal_special_strings_in_the_prompt_stay_text(pair, algorithm, contexts):
    """A user typed control-token strings; the target's tokenizer kept them as text (``split_special_tokens``):
    the drafter must see them as text too."""
    tok = pair.target_tokenizer
    ids = tok(pair.prompts[0] + LITERAL_TEXT, return_tensors="pt", split_special_tokens=True).input_ids
    assert not specials(vocabulary(tok), ids[0, 1:].tolist())
    _greedy_identical(pair, ids, algorithm, max_new_tokens=10)
    prompt = contexts[-1].given_prompt
    drafter_vocab = vocabulary(pair.drafter_tokenizer)
    assert specials(drafter_vocab, prompt) == list(drafter_vocab.bos_prefix)


class _ForceText(LogitsProcessor):
    """Makes the target emit a fixed token sequence after the prompt (then EOS), as a target processor."""

    def __init__(self, script, prompt_length, eos):
        self.script, self.n, self.eos = script, prompt_length, eos

    def __call__(self, input_ids, scores):
        i = input_ids.shape[1] - self.n
        forced = torch.full_like(scores, -1e4)
        forced[:, self.script[i] if i < len(self.script) else self.eos] = 0.0
        return scores + forced


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_target_generating_literal_special_strings(pair, algorithm, contexts):
    """The target spells control-token strings with ordinary tokens: the drafter's context must spell the same
    characters with ordinary tokens, never switch to its special tokens (before the fix a SentencePiece
    drafter's context held a real ``<eos>`` after the target wrote ``<eos>`` as text)."""
    tok = pair.target_tokenizer
    ids = _ids(pair, pair.prompts[0])
    script = tok.encode(LITERAL_TEXT, add_special_tokens=False, split_special_tokens=True)
    force = LogitsProcessorList([_ForceText(script, ids.shape[1], tok.eos_token_id)])
    out, _ = _greedy_identical(pair, ids, algorithm, max_new_tokens=len(script), logits_processor=force)
    assert out[0, ids.shape[1]:].tolist() == script
    ctx = contexts[-1]
    _assert_context_spells(ctx, vocabulary(tok).ids_to_bytes(script))
    assert ctx.synced_len > len(LITERAL_TEXT) // 2  # most of the literal text was synced


@pytest.mark.parametrize("pair_name", PAIRS)
def test_slem_drafts_of_literal_special_text_stay_plain_target_tokens(request, pair_name):
    pair = _pair_by_name(request, pair_name)
    target_vocab, drafter_vocab = vocabulary(pair.target_tokenizer), vocabulary(pair.drafter_tokenizer)
    prompt = _ids(pair, pair.prompts[0])
    proposer = SLEMProposer(target_vocab, pair.drafter, drafter_vocab, prompt, schedule=Schedule(4, False),
                            max_length=100, stats=DecodingStats())
    drafted = drafter_vocab.encode(LITERAL_TEXT)
    assert not specials(drafter_vocab, drafted)
    proposer.context.ids.extend(drafted)
    target_ids = proposer._to_target(drafted)
    assert target_vocab.ids_to_bytes(target_ids) == LITERAL_TEXT.encode()
    assert not specials(target_vocab, target_ids)


# ---------------------------------------------------------------------------------------------------
# Class 12: lengths
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_one_and_two_new_tokens(pair, algorithm):
    ids = _ids(pair, pair.prompts[0])
    for m in (1, 2):
        out, _ = _greedy_identical(pair, ids, algorithm, max_new_tokens=m)
        assert out.shape[1] == ids.shape[1] + m


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_drafts_never_cross_max_length(pair, algorithm):
    """A lookahead of 12 with room for 7 tokens: every target forward stays within ``max_length - 1``
    positions (its last logits give the token at ``max_length``)."""
    ids = _ids(pair, pair.prompts[0])
    length = ids.shape[1] + 7
    seen = []

    def record(module, args, kwargs):
        seen.append(cache_from_kwargs(kwargs).get_seq_length() + kwargs["input_ids"].shape[1])

    handle = pair.target.register_forward_pre_hook(record, with_kwargs=True)
    try:
        out = _hetspec(pair, ids, algorithm, do_sample=False, max_length=length, num_assistant_tokens=12,
                       num_assistant_tokens_schedule="constant")
    finally:
        handle.remove()
    assert out.tolist() == _reference(pair, ids, do_sample=False, max_length=length).tolist()
    assert out.shape[1] == length and max(seen) <= length - 1
    stats = hf_hetspec.last_stats(pair.target)
    assert stats.accepted_tokens > 0 and stats.target_forwards < 7


@pytest.fixture(scope="module")
def short_context_drafters(toy_pair, toy_sp_tokenizer):
    """The toy pair's trained drafter believing it holds 48 positions (RoPE: it would not fail beyond), and a
    random GPT-2 drafter with 40 learned positions (fails with an IndexError beyond them)."""
    rope = copy.deepcopy(toy_pair.drafter)
    rope.config.max_position_embeddings = 48
    config = GPT2Config(vocab_size=len(toy_sp_tokenizer), n_positions=40, n_embd=32, n_layer=1, n_head=2,
                        bos_token_id=toy_sp_tokenizer.bos_token_id, eos_token_id=toy_sp_tokenizer.eos_token_id)
    torch.manual_seed(5)
    learned = GPT2LMHeadModel(config).eval()
    return {"rope48": rope, "gpt2-40": learned}


@pytest.mark.parametrize("drafter_name", ["rope48", "gpt2-40"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_prompt_longer_than_the_drafter_context(toy_pair, short_context_drafters, drafter_name, algorithm):
    """The drafter keeps its BOS and the last tokens it can hold; the target sees everything (lossless)."""
    drafter = short_context_drafters[drafter_name]
    capacity = drafter.config.max_position_embeddings if drafter_name == "rope48" else drafter.config.n_positions
    seen = []

    def within_capacity(module, args, kwargs):
        cache = cache_from_kwargs(kwargs)  # the cache under its name in this transformers release
        seen.append(cache.get_seq_length() + kwargs["input_ids"].shape[1])

    handle = drafter.register_forward_pre_hook(within_capacity, with_kwargs=True)
    try:
        pair = copy.copy(toy_pair)
        pair.drafter = drafter
        doc = toy_pair.corpus[0]
        ids = _ids(pair, doc[: len(doc) // 2])
        assert ids.shape[1] > capacity
        _, stats = _greedy_identical(pair, ids, algorithm, max_new_tokens=24)
    finally:
        handle.remove()
    assert seen and max(seen) <= capacity
    assert stats.drafter_truncated_tokens > 0
    if drafter_name == "rope48":
        assert stats.accepted_tokens > 0  # the truncated drafter still drafts usefully


# ---------------------------------------------------------------------------------------------------
# Class 13: dtypes and devices
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)],
                         ids=["bf16-target", "bf16-drafter"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("pair_name", ["toy", "toy_reversed", "qwen-gemma3"])
def test_mixed_dtypes(request, pair_name, algorithm, dtypes):
    base = _pair_by_name(request, pair_name)
    pair = copy.copy(base)
    pair.target = copy.deepcopy(base.target).to(dtypes[0])
    pair.drafter = copy.deepcopy(base.drafter).to(dtypes[1])
    ids = _ids(pair, pair.prompts[0])
    ref = _reference(pair, ids, cache=False, do_sample=False, max_new_tokens=12)
    out = _hetspec(pair, ids, algorithm, do_sample=False, max_new_tokens=12)
    verdict = compare_greedy(pair.target, ids, ref, out)
    assert verdict.verdict in ("identical", "tie"), str(verdict)  # bf16: a rounding tie may swap two tokens
    if dtypes[0] == torch.float32:
        assert verdict.verdict == "identical"
    sampled = _hetspec(pair, ids, algorithm, do_sample=True, max_new_tokens=6,
                       hetspec_generator=torch.Generator().manual_seed(0))
    assert sampled.shape[1] == ids.shape[1] + 6 and sampled.dtype == ids.dtype


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the target on the GPU, "
                    "the prompt and the drafter on the CPU")
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_inputs_on_another_device_than_the_target(toy_pair, algorithm):
    pair = copy.copy(toy_pair)
    pair.target = copy.deepcopy(toy_pair.target).to("cuda")
    ids = _ids(pair, pair.prompts[0])  # on the CPU, like the drafter
    ref = _reference(pair, ids.to("cuda"), cache=False, do_sample=False, max_new_tokens=12)
    out = _hetspec(pair, ids, algorithm, do_sample=False, max_new_tokens=12)
    assert out.cpu().tolist() == ref.cpu().tolist()
    with pytest.raises(ValueError, match="hetspec_generator.*device"):  # the target samples on the GPU
        _hetspec(pair, ids, algorithm, do_sample=True, max_new_tokens=4, hetspec_generator=torch.Generator())


