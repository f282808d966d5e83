"""Token bytes, vocabulary comparison and text conversion windows (hf_hetspec.alignment)."""

import random
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from conftest import TOKENIZER_NAMES, specials, spells, text_strategy
from hf_hetspec.alignment import (
    TextWindowConverter,
    Vocabulary,
    complete_utf8_prefix,
    same_vocabulary,
    sanitize_utf8,
    valid_utf8_prefix,
)
from hf_hetspec.testing.toy import byte_level_bpe_tokenizer, sentencepiece_bpe_tokenizer

TEXTS = [
    "def add(a, b):\n    return a + b  \n\n\tx = [1, 2, 3]",
    "  leading spaces and trailing   ",
    "Hello, 世界! Καλημέρα. 🙂👍🏽 café naïve",
    "数学是科学的语言。 The answer is 42.",
    "\u00e9 precomposed, \u200b zero width, tabs\t\tand\r\nCRLF",
]
DECOMPOSED = "cafe\u0301 combining accent"


SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "tokenizers"


def _tokenizers():
    return {"toy-bytelevel": byte_level_bpe_tokenizer(), "toy-sentencepiece": sentencepiece_bpe_tokenizer()}


@pytest.fixture(scope="module")
def real_tokenizers():
    if not SHARED.is_dir():
        pytest.skip(f"real tokenizers not found at {SHARED} (CI and the dev machines have ../shared)")
    return {name: AutoTokenizer.from_pretrained(SHARED / name) for name in ("qwen2.5-coder", "smollm2", "gemma3")}


@pytest.fixture(scope="module", params=["toy-bytelevel", "toy-sentencepiece", "qwen2.5-coder", "smollm2", "gemma3"])
def vocab(request):
    name = request.param
    if name.startswith("toy"):
        return Vocabulary.from_tokenizer(_tokenizers()[name])
    return Vocabulary.from_tokenizer(request.getfixturevalue("real_tokenizers")[name])


def test_token_bytes_reproduce_the_encoded_text(vocab):
    for text in TEXTS:
        ids = vocab.encode(text)
        assert vocab.ids_to_bytes(ids) == text.encode("utf-8"), text


def test_normalizing_tokenizers_are_visible_in_the_bytes(vocab):
    # Qwen2's tokenizer class applies NFC: a decomposed accent comes back composed. The byte table must
    # report what the tokens really spell, so the conversion layer can see the difference.
    spelled = vocab.ids_to_bytes(vocab.encode(DECOMPOSED))
    assert spelled in (DECOMPOSED.encode(), "caf\u00e9 combining accent".encode())
    if vocab.tokenizer.name_or_path.endswith("qwen2.5-coder"):
        assert spelled == "caf\u00e9 combining accent".encode()


def test_token_bytes_table_reads_byte_fallback_and_space_markers(vocab):
    if vocab.kind == "metaspace":
        byte_id = vocab.tokenizer.convert_tokens_to_ids("<0x41>")
        assert vocab.token_bytes[byte_id] == b"A"
        ids = vocab.encode("a b")
        assert b" " in vocab.ids_to_bytes(ids)
    else:
        space_id = vocab.tokenizer.convert_tokens_to_ids("\u0120")  # byte-level 'Ġ' is the space byte
        assert vocab.token_bytes[space_id] == b" "
    assert vocab.special_ids, "special tokens must be recognized"
    eos = vocab.tokenizer.eos_token_id
    assert eos in vocab.special_ids
    assert vocab.token_bytes[eos] == vocab.tokenizer.eos_token.encode()


def test_utf8_helpers():
    emoji = "🙂".encode()
    assert complete_utf8_prefix(b"ab" + emoji[:2]) == 2
    assert complete_utf8_prefix(b"ab" + emoji) == 6
    assert complete_utf8_prefix(b"") == 0
    assert valid_utf8_prefix(b"ab\x99cd") == 2
    assert valid_utf8_prefix("é".encode()[:1]) == 0
    assert sanitize_utf8(b"a\x99b") == "a\ufffdb".encode()
    assert sanitize_utf8(b"plain") == b"plain"


def test_same_vocabulary_is_decided_by_the_token_map_not_the_size():
    a, b = byte_level_bpe_tokenizer(), sentencepiece_bpe_tokenizer()
    assert same_vocabulary(a, a)
    assert not same_vocabulary(a, b)
    # a different tokenizer of exactly the same size is still different
    c = byte_level_bpe_tokenizer(vocab_size=len(b)) if len(b) != len(a) else b
    if len(c) == len(b):
        assert not same_vocabulary(c, b)


@pytest.mark.parametrize("split_seed", range(3))
def test_window_continuation_spells_the_text_exactly(vocab, split_seed):
    rng = random.Random(split_seed)
    conv = TextWindowConverter(vocab, window=3)
    for text in TEXTS:
        cut = rng.randrange(1, len(text))
        head, tail = text[:cut], text[cut:]
        context = vocab.encode(head)
        cont = conv.continuation(context, tail)
        assert vocab.ids_to_bytes(context + cont) == text.encode("utf-8")


def test_window_continuation_matches_whole_text_tokenization_at_word_boundaries(vocab):
    conv = TextWindowConverter(vocab, window=4)
    text = "The quick brown fox jumps over the lazy dog and keeps running far away"
    words = text.split(" ")
    for i in range(2, len(words)):
        head = " ".join(words[:i])
        context = vocab.encode(head)
        cont = conv.continuation(context, " " + " ".join(words[i:]))
        assert context + cont == vocab.encode(text), i


def test_resync_keeps_matching_prefix_and_retokenizes_rest(vocab):
    conv = TextWindowConverter(vocab, window=4)
    text = "for item in items:\n    print(item)"
    ids = vocab.encode(text)
    half = len(ids) // 2
    n_keep, new = conv.resync(ids, half, vocab.ids_to_bytes(ids[half:]).decode())
    assert n_keep <= half
    assert vocab.ids_to_bytes(ids[:n_keep] + new) == text.encode()


_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(head=_TEXT, tail=_TEXT)
def test_property_continuation_never_changes_the_bytes(vocab, head, tail):
    conv = TextWindowConverter(vocab, window=3)
    context = vocab.encode(head)
    if vocab.ids_to_bytes(context) != head.encode():
        return  # the tokenizer normalizes this text (e.g. unknown characters); not a conversion question
    cont = conv.continuation(context, tail)
    joined = vocab.ids_to_bytes(context + cont)
    if vocab.ids_to_bytes(vocab.encode(tail)) == tail.encode():
        assert joined == (head + tail).encode()


# ---------------------------------------------------------------------------------------------------
# Conversion between tokenizers (toy and real byte tables)
# ---------------------------------------------------------------------------------------------------

RANDOM_TEXTS = text_strategy()


def _ordered_pairs(tables):
    names = [n for n in TOKENIZER_NAMES if n in tables]
    return [(a, b) for a in names for b in names if a != b]


@pytest.mark.parametrize("name", TOKENIZER_NAMES)
def test_special_tokens_are_never_rewritten_by_a_window(byte_tables, name):
    """Text after a control token (a chat marker, the drafter's BOS) is re-encoded without it: the window
    never turns a real special token into its characters (which would spell the same bytes)."""
    if name not in byte_tables:
        pytest.skip(f"{name}: real tokenizers not available")
    vocab = byte_tables[name]
    marker = vocab.tokenizer.eos_token_id
    context = list(vocab.bos_prefix) + [marker] + vocab.encode("a")
    converter = TextWindowConverter(vocab, window=4)
    assert converter.window_start(context) == len(context) - 1
    n_keep, new = converter.resync(context, len(context), " b<eos>")
    assert n_keep >= len(context) - 1 and marker not in new  # the marker is kept, never re-encoded
    assert vocab.ids_to_bytes(context[:n_keep] + new) == vocab.ids_to_bytes(context) + b" b<eos>"
    cont = converter.continuation(context[:-1], "a b")
    assert vocab.ids_to_bytes(cont) == b"a b" and not specials(vocab, cont)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=RANDOM_TEXTS, data=st.data())
def test_property_conversion_between_tokenizers_keeps_the_bytes(byte_tables, text, data):
    """Text generated on side A (in A's tokens, cut at random token boundaries, characters possibly split) and
    converted round by round onto side B's context decodes to exactly the same bytes, with no special token."""
    source_name, dest_name = data.draw(st.sampled_from(_ordered_pairs(byte_tables)), label="pair")
    source, dest = byte_tables[source_name], byte_tables[dest_name]
    assume(spells(source, text) and spells(dest, text))
    assume(all(spells(dest, c) for c in text) and unicodedata.normalize("NFC", text) == text)
    source_ids = source.encode(text)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(source_ids))), max_size=6), label="cuts"))
    converter = TextWindowConverter(dest, window=3)
    dest_context = list(dest.bos_prefix)
    done = 0  # bytes converted so far
    for cut in cuts + [len(source_ids)]:
        accepted = source.ids_to_bytes(source_ids[:cut])
        ready = complete_utf8_prefix(accepted)  # a character split across tokens waits for its last byte
        if ready <= done:
            continue
        dest_context += converter.continuation(dest_context, accepted[done:ready].decode("utf-8"))
        done = ready
    assert dest.ids_to_bytes(dest_context) == dest.ids_to_bytes(list(dest.bos_prefix)) + text.encode()
    assert specials(dest, dest_context) == list(dest.bos_prefix)
