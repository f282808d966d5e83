"""Tests of the toy tokenizers, tiny models and correlated pairs of :mod:`hf_hetspec.testing.toy`."""

from __future__ import annotations

import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hf_hetspec.testing import toy

ROUND_TRIP_TEXTS = [
    "The lighthouse keeper climbed the spiral stairs.",
    " leading space and  double  spaces",
    "def f(x):\n    if x:\n        return x  \n    return None   \n",
    "for i in range(3):\n\tprint(i)\r\n",
    "今天天气很好，我们去公园散步。東京の駅",
    "emoji 🎉 and unseen ones 🦜🫨 👩‍👩‍👧 ❤️",
    "numbers 3.14159, 2,048 and 1e-9",
    "trailing spaces   ",
    "\n\n  \n",
    "",
]


@pytest.fixture(params=["bpe", "sp"])
def any_toy_tokenizer(request, toy_bpe_tokenizer, toy_sp_tokenizer):
    return toy_bpe_tokenizer if request.param == "bpe" else toy_sp_tokenizer


# --------------------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build", [toy._byte_level_bpe_tokenizer.__wrapped__, toy._sentencepiece_bpe_tokenizer.__wrapped__]
)
def test_tokenizer_builds_in_under_a_second(build):
    vocab_size = 480 if build is toy._byte_level_bpe_tokenizer.__wrapped__ else 600
    start = time.perf_counter()
    tok = build(vocab_size, toy.TOY_CORPUS)  # uncached
    assert time.perf_counter() - start < 1.0
    assert len(tok) > 300


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_round_trip(any_toy_tokenizer, text):
    tok = any_toy_tokenizer
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\u2581")))
def test_round_trip_property(any_toy_tokenizer, text):
    # U+2581 is excluded: the sentencepiece normalizer maps " " to it, so a literal one decodes as a space
    # (exactly as with the real Gemma-3 tokenizer).
    tok = any_toy_tokenizer
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_literal_metaspace_char_decodes_as_space(toy_sp_tokenizer):
    assert toy_sp_tokenizer.decode(toy_sp_tokenizer.encode("a\u2581b", add_special_tokens=False)) == "a b"


def test_byte_level_layout(toy_bpe_tokenizer):
    tok = toy_bpe_tokenizer
    assert tok.vocab_size == 480 and len(tok) == 483
    # specials after the regular vocabulary, as in Qwen2
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [480, 481, 482]
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 482)
    assert tok.pad_token_id == tok.bos_token_id == 480
    assert tok.unk_token is None
    assert tok.encode("Hello world") == tok.encode("Hello world", add_special_tokens=False)  # no BOS
    assert tok.convert_ids_to_tokens(tok.encode(" world")) == ["Ġw", "or", "l", "d"]
    # every byte is a token, so nothing is unknown
    vocab = tok.get_vocab()
    assert all(ch in vocab for ch in "ĠĊĉčðŁ¦ľ")
    # special tokens inside text are parsed as special tokens
    assert tok.encode("a<|im_end|>b")[1] == 482


def test_sentencepiece_layout(toy_sp_tokenizer):
    tok = toy_sp_tokenizer
    assert len(tok) == tok.vocab_size == 600
    assert tok.convert_ids_to_tokens(list(range(6))) == [
        "<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>",
    ]
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert [tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in range(256)] == list(range(6, 262))
    ids = tok.encode(" hello world")
    assert ids[0] == tok.bos_token_id and ids[1:] == tok.encode(" hello world", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids)[1].startswith("▁")  # the leading space is kept, as ▁
    assert tok.decode(ids[1:]) == " hello world"


def test_sentencepiece_byte_fallback_for_unseen_character(toy_sp_tokenizer):
    tok = toy_sp_tokenizer
    assert not any("🦜" in doc for doc in toy.TOY_CORPUS)
    pieces = tok.convert_ids_to_tokens(tok.encode("🦜", add_special_tokens=False))
    assert pieces == ["<0xF0>", "<0x9F>", "<0xA6>", "<0x9C>"]
    # a character of the corpus is a single piece
    assert tok.convert_ids_to_tokens(tok.encode("好", add_special_tokens=False)) == ["好"]
    # the byte tokens are regular tokens: skip_special_tokens keeps them
    assert tok.decode(tok.encode("x🦜y"), skip_special_tokens=True) == "x🦜y"
    # decoding a lone byte token yields U+FFFD
    assert tok.decode([tok.convert_tokens_to_ids("<0xF0>")]) == "\ufffd"


def test_toy_tokenizers_differ(toy_bpe_tokenizer, toy_sp_tokenizer):
    assert len(toy_bpe_tokenizer) != len(toy_sp_tokenizer)
    text = "class Stack:\n    def push(self, item):"
    bpe = toy_bpe_tokenizer.convert_ids_to_tokens(toy_bpe_tokenizer.encode(text))
    sp = toy_sp_tokenizer.convert_ids_to_tokens(toy_sp_tokenizer.encode(text, add_special_tokens=False))
    assert bpe != sp
    assert [t.replace("Ġ", " ").replace("Ċ", "\n") for t in bpe] != [t.replace("▁", " ") for t in sp]


def test_chat_templates(toy_bpe_tokenizer, toy_sp_tokenizer):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    assert toy_bpe_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>assistant\n"
    )
    assert toy_sp_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    ids = toy_sp_tokenizer.encode("<start_of_turn>user\n", add_special_tokens=False)
    assert ids[0] == toy_sp_tokenizer.convert_tokens_to_ids("<start_of_turn>") == 4


def test_tokenizer_factories_return_fresh_objects():
    a, b = toy.byte_level_bpe_tokenizer(), toy.byte_level_bpe_tokenizer()
    assert a is not b and a.get_vocab() == b.get_vocab()
    with pytest.raises(ValueError):
        toy.byte_level_bpe_tokenizer(vocab_size=100)
    with pytest.raises(ValueError):
        toy.sentencepiece_bpe_tokenizer(vocab_size=300)
    with pytest.raises(TypeError):
        toy.byte_level_bpe_tokenizer(corpus="one string")


# --------------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------------


def test_tiny_causal_lm(toy_bpe_tokenizer, toy_sp_tokenizer):
    state = torch.random.get_rng_state()
    model = toy.tiny_causal_lm(toy_bpe_tokenizer, seed=3, arch="qwen2", pad_vocab_to=64)
    assert torch.equal(state, torch.random.get_rng_state())  # global RNG untouched
    assert type(model).__name__ == "Qwen2ForCausalLM" and not model.training
    assert model.config.vocab_size == 512 and model.dtype == torch.float32
    gc = model.generation_config
    assert (gc.eos_token_id, gc.pad_token_id, gc.bos_token_id) == (482, 480, 480)
    ids = torch.tensor([toy_bpe_tokenizer.encode("Hello world")])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 512)
    again = toy.tiny_causal_lm(toy_bpe_tokenizer, seed=3, arch="qwen2", pad_vocab_to=64)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters()))

    llama = toy.tiny_causal_lm(toy_sp_tokenizer, seed=0, hidden=32, layers=1, heads=2, kv_heads=1)
    assert type(llama).__name__ == "LlamaForCausalLM" and llama.config.vocab_size == 600
    assert (llama.generation_config.eos_token_id, llama.generation_config.pad_token_id) == (1, 0)
    assert toy.tiny_causal_lm(toy_sp_tokenizer, vocab_size=1000).config.vocab_size == 1000
    with pytest.raises(ValueError):
        toy.tiny_causal_lm(toy_sp_tokenizer, vocab_size=10)
    with pytest.raises(ValueError):
        toy.tiny_causal_lm(toy_sp_tokenizer, arch="gpt2")


# --------------------------------------------------------------------------------------------------------
# Correlated pairs
# --------------------------------------------------------------------------------------------------------


def _assert_agrees(pair: toy.CorrelatedPair, min_chars: int = 20) -> toy.AgreementReport:
    report = toy.measure_agreement(pair)
    assert len(report.prompts) == len(pair.prompts) >= 8
    assert report.mean_fraction >= 0.9, str(report)
    long_enough = sum(c >= min_chars for c in report.common_prefix)
    assert long_enough >= 0.8 * len(report.prompts), str(report)
    # and the continuations really are the corpus
    joined = "\n".join(pair.corpus)
    pieces = zip(report.prompts, report.target_texts, report.common_prefix)
    hits = sum((prompt + text[:common]) in joined for prompt, text, common in pieces)
    assert hits >= 0.8 * len(report.prompts), str(report)
    return report


def _assert_unused_ids_improbable(pair: toy.CorrelatedPair) -> None:
    """Ids past ``len(tokenizer)`` (vocabulary padding) get almost no probability."""
    for model, tok in [(pair.target, pair.target_tokenizer), (pair.drafter, pair.drafter_tokenizer)]:
        ids = torch.tensor([tok.encode(pair.prompts[0])])
        with torch.no_grad():
            probs = model(ids).logits[0].softmax(-1)
        assert probs[:, len(tok):].sum(-1).max() < 0.05


def test_toy_pair_agrees(toy_pair):
    assert toy_pair.target.config.vocab_size == 512 and toy_pair.drafter.config.vocab_size == 600
    assert toy_pair.final_loss["target"] < 0.6 and toy_pair.final_loss["drafter"] < 0.6
    assert not any(p.requires_grad for p in toy_pair.target.parameters())
    _assert_agrees(toy_pair)
    _assert_unused_ids_improbable(toy_pair)


def test_toy_pair_reversed_agrees(toy_pair_reversed):
    pair = toy_pair_reversed
    assert pair.target_tokenizer.bos_token == "<bos>" and pair.drafter_tokenizer.eos_token == "<|im_end|>"
    assert pair.target.config.vocab_size == 640 and pair.drafter.config.vocab_size == 512
    _assert_agrees(pair)
    _assert_unused_ids_improbable(pair)


def test_random_models_do_not_agree(toy_bpe_tokenizer, toy_sp_tokenizer):
    """Sanity check of the measure: untrained models share (almost) no continuation text."""
    pair = toy.CorrelatedPair(
        target=toy.tiny_causal_lm(toy_bpe_tokenizer, seed=0),
        drafter=toy.tiny_causal_lm(toy_sp_tokenizer, seed=1),
        target_tokenizer=toy_bpe_tokenizer,
        drafter_tokenizer=toy_sp_tokenizer,
        prompts=list(toy.TOY_PROMPTS[:4]),
    )
    assert toy.measure_agreement(pair, max_new_tokens=8).mean_common_prefix < 3


def test_real_pair_agrees(real_pair, real_tokenizer):
    pair = real_pair("qwen2.5-coder", "gemma3")
    assert pair.target.config.vocab_size == 151936 == len(real_tokenizer("qwen2.5-coder"))
    assert pair.drafter.config.vocab_size == 262144
    assert pair.train_seconds["drafter"] < 30  # the 262,144-row vocabulary is never trained
    _assert_agrees(pair)
