"""Toy tokenizers of the real tokenizer families, each trained on :data:`~hf_hetspec.testing.toy.TOY_CORPUS`.

Each family reproduces what a real ``tokenizer.json`` does at a text boundary (where a text starts, and
what a pre-tokenizer or normalizer does to it), at a toy vocabulary size, so that converting text between
two vocabularies can be tested on every kind without downloading anything (each builds in well under a
second):

* ``gpt2`` -- GPT-2 / GPT-NeoX / StarCoder2: ``ByteLevel`` with its own regex (digit runs, punctuation runs).
* ``gpt2-prefix-space`` -- the same with ``add_prefix_space=True`` (a space is put before every text).
* ``tiktoken`` -- Llama-3 / Command-R / Mistral tekken: a ``Split`` regex with 3-digit groups, then
  ``ByteLevel``.
* ``punct-digits`` -- Falcon / DeepSeek style: ``Punctuation`` and single ``Digits`` splits before
  ``ByteLevel``.
* ``nfkc-bytelevel`` -- an ``NFKC`` normalizer before the GPT-2 pipeline.
* ``added-tokens`` -- ``gpt2`` plus added tokens that are *not* special (``<think>``, an indentation run).
* ``llama2`` -- Llama-2 / Mistral v0.1-v0.3 / Phi-3 / TinyLlama (``legacy=True``): a dummy prefix ``▁`` put
  before every text by a ``Prepend`` normalizer, byte fallback, a decoder that strips the first space.
* ``llama2-nonlegacy`` -- Llama-2 loaded with ``legacy=False``: ``Metaspace(prepend_scheme="first")``.
* ``metaspace-always`` -- older conversions: ``Metaspace(prepend_scheme="always", split=True)``.
* ``sp-normalized`` -- the ``llama2`` pipeline after ``NFC``, ``Lowercase`` and a ``Replace`` normalizer.
* ``gemma`` -- :func:`~hf_hetspec.testing.toy.sentencepiece_bpe_tokenizer` (no dummy prefix).
* ``qwen`` -- :func:`~hf_hetspec.testing.toy.byte_level_bpe_tokenizer` (single digits).

The ``transformers`` converters build the real families the same way (``LlamaConverter`` gives the
``Prepend`` normalizer with ``legacy=True`` and ``Metaspace(prepend_scheme="first")`` without).
"""

from __future__ import annotations

import json
from functools import lru_cache

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers.trainers import BpeTrainer
from transformers import PreTrainedTokenizerFast

from . import toy

__all__ = ["FAMILIES", "family_tokenizer"]

_SP_SPACE = "\u2581"  # ▁
_LLAMA_SPECIALS = ("<unk>", "<s>", "</s>")
# Llama-3's pre-tokenization regex: letters with one leading non-letter, digits in groups of up to three
_TIKTOKEN_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_NON_SPECIAL_ADDED = ("<think>", "</think>", "        ")


def _byte_level(family: str) -> PreTrainedTokenizerFast:
    """A byte-level BPE of a byte-level family, ``<|endoftext|>`` (special) after the vocabulary."""
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=family == "gpt2-prefix-space", use_regex=True)
    if family == "tiktoken":
        split = pre_tokenizers.Split(Regex(_TIKTOKEN_REGEX), behavior="isolated")
        bytes_only = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        byte_level = pre_tokenizers.Sequence([split, bytes_only])
    elif family == "punct-digits":
        byte_level = pre_tokenizers.Sequence(
            [pre_tokenizers.Punctuation(), pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    if family == "nfkc-bytelevel":
        tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=520, min_frequency=2, show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(toy.TOY_CORPUS, trainer=trainer)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    if family == "added-tokens":
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in _NON_SPECIAL_ADDED])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token=None,
        chat_template=toy.CHATML_TEMPLATE, clean_up_tokenization_spaces=False, name_or_path=f"toy-{family}",
    )


def _sentencepiece_normalizer(family: str):
    """The normalizer of a SentencePiece family (``None`` where ``Metaspace`` pre-tokenizes)."""
    if family in ("llama2-nonlegacy", "metaspace-always"):
        return None
    steps = [normalizers.Prepend(_SP_SPACE), normalizers.Replace(" ", _SP_SPACE)]
    if family == "sp-normalized":
        steps = [normalizers.NFC(), normalizers.Lowercase(), normalizers.Replace("``", '"')] + steps
    return normalizers.Sequence(steps)


def _sentencepiece(family: str) -> PreTrainedTokenizerFast:
    """A Llama-layout SentencePiece BPE (``<unk> <s> </s>``, 256 ``<0xNN>`` byte-fallback tokens, pieces)."""
    lowercase = family == "sp-normalized"
    corpus = [doc.lower() for doc in toy.TOY_CORPUS] if lowercase else toy.TOY_CORPUS
    # merges learned word by word (as SentencePiece does), so no piece joins two words
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(_SP_SPACE, prepend_scheme="always", split=True)
    trainer_tok.train_from_iterator(corpus, trainer=BpeTrainer(vocab_size=420, min_frequency=2,
                                                               show_progress=False, special_tokens=[]))
    trained = json.loads(trainer_tok.to_str())["model"]
    vocab = {tok: i for i, tok in enumerate(_LLAMA_SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True,
                               fuse_unk=True))
    tok.normalizer = _sentencepiece_normalizer(family)
    if family == "llama2-nonlegacy":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(_SP_SPACE, prepend_scheme="first", split=False)
    elif family == "metaspace-always":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(_SP_SPACE, prepend_scheme="always", split=True)
    tok.decoder = decoders.Sequence([decoders.Replace(_SP_SPACE, " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in _LLAMA_SPECIALS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        clean_up_tokenization_spaces=False, name_or_path=f"toy-{family}",
    )


_BUILDERS = {
    "gpt2": _byte_level,
    "gpt2-prefix-space": _byte_level,
    "tiktoken": _byte_level,
    "punct-digits": _byte_level,
    "nfkc-bytelevel": _byte_level,
    "added-tokens": _byte_level,
    "llama2": _sentencepiece,
    "llama2-nonlegacy": _sentencepiece,
    "metaspace-always": _sentencepiece,
    "sp-normalized": _sentencepiece,
    "gemma": lambda family: toy.sentencepiece_bpe_tokenizer(),
    "qwen": lambda family: toy.byte_level_bpe_tokenizer(),
}

#: Names accepted by :func:`family_tokenizer`, one per kind of text boundary.
FAMILIES: tuple[str, ...] = tuple(_BUILDERS)


@lru_cache(maxsize=None)
def _cached(family: str) -> PreTrainedTokenizerFast:
    return _BUILDERS[family](family)


def family_tokenizer(family: str) -> PreTrainedTokenizerFast:
    """A toy tokenizer of ``family`` (one of :data:`FAMILIES`; trained once per process, < 0.5 s).

    Returns:
        A fresh copy (callers may change it); ``eos_token`` is set, ``len(tok)`` counts the added tokens.

    Raises:
        KeyError: an unknown family name.
    """
    if family not in _BUILDERS:
        raise KeyError(f"unknown tokenizer family {family!r}; expected one of {FAMILIES}")
    return toy._copy_tokenizer(_cached(family))
