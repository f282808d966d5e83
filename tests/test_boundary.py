"""Text conversion equals whole-text encoding for every tokenizer family (issue #16).

For toy tokenizers of each family (:mod:`hf_hetspec.testing.families`) and the real tokenizers the machine
has offline (``../shared/tokenizers``; Mistral's SentencePiece models v1 and v3, loaded with ``legacy=True``
and ``False``, where the ``mistral_common`` wheel and ``sentencepiece`` are present), converting random text
after random context -- on the target's side with the context fixed (``continuation``), on the drafter's
side allowed to replace window tokens (``resync``) -- gives exactly the tokens the tokenizer gives the whole
text. The probe that makes this work is shown to matter: without it the same checks fail.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hf_hetspec.agreement import conversion_agreement
from hf_hetspec.alignment import TextWindowConverter, Vocabulary, convert_prompt
from hf_hetspec.testing import toy
from hf_hetspec.testing.families import FAMILIES, family_tokenizer

#: Pieces random texts are made of: words with and without a leading space, white-space runs, digit runs
#: (3-digit groups), punctuation, text normalizers change (combining accent for NFC, a ligature for NFKC,
#: upper case, the ``Replace`` pattern), CJK, emoji, a non-special added token.
FRAGMENTS = (
    "the", " the", " lighthouse", " keeper", "climbed", " stairs", "s", " St", "ST", "\n", "\n\n", "    ",
    "\t", " ", "  ", "1", "23", "456", "7,890", ".", ",", "!", "(", ")", ":", '"', "é", "e\u0301", "\ufb01",
    "``", "你好", "🎉", "<think>", "'s", "-", " $", "123.45",
)
texts = st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=10).map("".join)

#: Mistral's SentencePiece models (Llama-2 layout, dummy prefix ▁) inside the mistral_common wheel.
MISTRAL_MODELS = {"mistral-v1": "tokenizer.model.v1",
                  "mistral-v3": "mistral_instruct_tokenizer_240323.model.v3"}
REAL_NAMES = ("qwen2.5-coder", "smollm2", "gemma3")


def _mistral_data(member: str) -> bytes | None:
    """A data file of mistral_common: from the installed package, else from a wheel on disk."""
    spec = importlib.util.find_spec("mistral_common")
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / "data" / member
        if path.is_file():
            return path.read_bytes()
    for wheel in sorted(glob.glob("/opt/pypi-more/files/mistral_common-*.whl")):
        with zipfile.ZipFile(wheel) as zf:
            if f"mistral_common/data/{member}" in zf.namelist():
                return zf.read(f"mistral_common/data/{member}")
    return None


@pytest.fixture(scope="module")
def mistral_tokenizer(tmp_path_factory):
    """Factory ``(name, legacy) -> tokenizer`` converted from Mistral's SentencePiece model (skips when absent)."""
    from transformers import AutoTokenizer

    cache = {}

    def load(name: str, legacy: bool):
        if (name, legacy) not in cache:
            pytest.importorskip("sentencepiece")
            data = _mistral_data(MISTRAL_MODELS[name])
            if data is None:
                pytest.skip(f"{name}: no mistral_common package or wheel on this machine")
            folder = tmp_path_factory.mktemp(f"{name}-{legacy}")
            (folder / "tokenizer.model").write_bytes(data)
            config = {"tokenizer_class": "LlamaTokenizer", "legacy": legacy, "bos_token": "<s>",
                      "eos_token": "</s>", "unk_token": "<unk>"}
            (folder / "tokenizer_config.json").write_text(json.dumps(config))
            cache[name, legacy] = AutoTokenizer.from_pretrained(str(folder), legacy=legacy)
        return cache[name, legacy]

    return load


@pytest.fixture(scope="module")
def any_tokenizer(real_tokenizer, mistral_tokenizer):
    """Factory over every tokenizer of this module: a family name, a real one, or ``mistral-vN:legacy``."""

    def load(name: str):
        if name in FAMILIES:
            return family_tokenizer(name)
        if name in REAL_NAMES:
            return real_tokenizer(name)
        base, legacy = name.split(":")
        return mistral_tokenizer(base, legacy == "legacy")

    return load


ALL_NAMES = FAMILIES + REAL_NAMES + tuple(f"{model}:{kind}" for model in MISTRAL_MODELS
                                          for kind in ("legacy", "nonlegacy"))


def _check_conversion(vocab: Vocabulary, context: str, new: str, before: str) -> None:
    """Converting ``new`` after the encoding of ``before + context`` equals encoding the whole text.

    ``before``: ``"bos"`` (the tokenizer's BOS prefix first, as a prompt has), ``"special"`` (``context``
    ends with the EOS token, as after a chat turn) or ``""`` (plain text).
    """
    tok = vocab.tokenizer
    if before == "special":
        context += tok.eos_token
    prefix = list(vocab.bos_prefix) if before == "bos" else []
    parse = before == "special"
    context_ids = prefix + vocab.encode(context, parse_special=parse)
    whole = prefix + vocab.encode(context + new, parse_special=parse)
    assume(whole[: len(context_ids)] == context_ids)  # else no context could stay fixed
    converter = TextWindowConverter(vocab, window=4)
    got = converter.continuation(context_ids, new)
    assert got == whole[len(context_ids):], (tok.convert_ids_to_tokens(got),
                                              tok.convert_ids_to_tokens(whole[len(context_ids):]))
    n_keep, fresh = converter.resync(context_ids, len(context_ids), new)
    assert context_ids[:n_keep] + fresh == whole


def _check_conversion_property(vocab: Vocabulary, max_examples: int = 60):
    """:func:`_check_conversion` on random contexts and new texts (hypothesis, reproducible)."""

    @settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
    @given(context=texts, new=texts, before=st.sampled_from(["", "bos", "special"]))
    def check(context, new, before):
        _check_conversion(vocab, context, new, before)

    return check


@pytest.mark.parametrize("name", ALL_NAMES)
def test_conversion_equals_whole_text_encoding(any_tokenizer, name):
    _check_conversion_property(Vocabulary.from_tokenizer(any_tokenizer(name)))()


@pytest.mark.parametrize("name", ALL_NAMES)
def test_conversion_agreement_is_complete_on_the_toy_corpus(any_tokenizer, name):
    agreement = conversion_agreement(Vocabulary.from_tokenizer(any_tokenizer(name)), list(toy.TOY_CORPUS[:8]),
                                     max_boundaries=64)
    assert agreement.boundaries > 200
    assert agreement.rate == 1.0, agreement.examples


@pytest.mark.parametrize("name", ["llama2", "llama2-nonlegacy", "gpt2-prefix-space", "sp-normalized"])
def test_without_the_probe_conversion_fails_these_checks(monkeypatch, name):
    """The checks above have power: the former conversion (a window encoded as a text start) fails them."""
    vocab = Vocabulary.from_tokenizer(family_tokenizer(name))
    monkeypatch.setattr("hf_hetspec.alignment.encode_after", lambda *args, **kwargs: None)
    with pytest.raises(AssertionError):
        _check_conversion_property(vocab)()
    if name in ("llama2", "sp-normalized"):  # a lead before every window: no boundary agrees
        assert conversion_agreement(vocab, list(toy.TOY_CORPUS[:2]), max_boundaries=32).rate < 0.1


@pytest.mark.parametrize("name, lead, special_lead", [
    ("llama2", " ", " "), ("llama2-nonlegacy", " ", ""), ("metaspace-always", " ", " "),
    ("gpt2-prefix-space", " ", " "), ("gpt2", "", ""), ("tiktoken", "", ""), ("gemma", "", ""),
])
def test_probe_reads_the_text_start_from_the_tokenizer(name, lead, special_lead):
    probe = Vocabulary.from_tokenizer(family_tokenizer(name)).text_boundaries
    assert (probe.start_lead, probe.special_lead) == (lead, special_lead)
    assert probe.anchors and probe.anchors[0][0] == "\n"


def test_the_issues_examples_convert_without_an_extra_space():
    """``' climbed'`` after context and ``'$7,890,'`` + ``'123.45'`` (issue #16) on a dummy-prefix vocabulary."""
    vocab = Vocabulary.from_tokenizer(family_tokenizer("llama2"))
    converter = TextWindowConverter(vocab, window=4)
    for context, new in [("The lighthouse keeper", " climbed"), ("It costs $7,890,", "123.45"),
                         ("The l", "ighthouse keeper")]:
        context_ids = list(vocab.bos_prefix) + vocab.encode(context)
        got = converter.continuation(context_ids, new)
        assert vocab.ids_to_bytes(got) == new.encode()
        n_keep, fresh = converter.resync(context_ids, len(context_ids), new)
        assert vocab.ids_to_bytes(context_ids[:n_keep] + fresh) == vocab.ids_to_bytes(context_ids) + new.encode()


@pytest.mark.parametrize("source, dest", [("llama2", "qwen"), ("qwen", "llama2"), ("llama2", "llama2-nonlegacy"),
                                          ("gpt2-prefix-space", "gpt2")])
def test_prompt_conversion_drops_the_dummy_prefix_and_adds_the_destinations(source, dest):
    source_tok, dest_tok = family_tokenizer(source), family_tokenizer(dest)
    text = "The lighthouse keeper climbed"
    converted = convert_prompt(Vocabulary.from_tokenizer(source_tok), Vocabulary.from_tokenizer(dest_tok),
                               source_tok(text).input_ids)
    assert converted == dest_tok(text).input_ids
