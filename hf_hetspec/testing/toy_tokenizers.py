"""Toy tokenizers trained in well under a second on the built-in corpus (:mod:`hf_hetspec.testing.toy`):
a Qwen-style byte-level BPE and a Gemma-3 / Llama-style BPE with byte fallback, with their chat templates."""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from typing import Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers.trainers import BpeTrainer
from transformers import PreTrainedTokenizerFast

from .toy_corpus import _corpus

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: Gemma-style chat template used by :func:`sentencepiece_bpe_tokenizer`. Like Gemma's own template it
#: starts with ``bos_token``, so encoding its output *with* special tokens adds a second ``<bos>``.
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)

# Qwen2 / GPT-4-style pre-tokenization regex (contractions, letters, single digits, punctuation runs,
# newlines, whitespace not followed by a non-space).
_QWEN_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_SP_SPACE = "\u2581"  # ▁
_SP_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>")
_BPE_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


# --------------------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------------------


def byte_level_bpe_tokenizer(
    vocab_size: int = 480, corpus: Sequence[str] | None = None
) -> PreTrainedTokenizerFast:
    """Train a GPT-2 / Qwen-style byte-level BPE tokenizer on a small corpus (< 0.1 s; cached per process).

    Pipeline: no normalizer; pre-tokenizer = Qwen's regex ``Split`` followed by ``ByteLevel`` (bytes mapped to
    printable characters, ``Ġ`` = space, ``Ċ`` = newline); BPE model without unknown token (all 256 byte
    characters are in the vocabulary, so any text encodes); ``ByteLevel`` decoder. As in Qwen, the special
    tokens ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` come *after* the regular vocabulary (ids
    ``vocab_size .. vocab_size + 2`` when the corpus allows ``vocab_size`` regular tokens), and encoding adds
    no BOS. ``eos_token = "<|im_end|>"``, ``pad_token = bos_token = "<|endoftext|>"``; the chat template is
    :data:`CHATML_TEMPLATE`.

    Args:
        vocab_size: regular (non-special) vocabulary size to train, at least 257 (the 256 bytes + 1 merge).
            The result has fewer tokens if the corpus has no more pairs occurring at least twice.
        corpus: documents to train on; default :data:`TOY_CORPUS`.

    Returns:
        A ``PreTrainedTokenizerFast`` (``transformers`` v5: ``TokenizersBackend``); ``len(tok)`` counts the
        special tokens. A new (deep-copied) object per call, so callers may mutate it.

    Raises:
        ValueError: ``vocab_size`` < 257 or an empty corpus.
    """
    if vocab_size < 257:
        raise ValueError(f"vocab_size must be >= 257 (256 byte tokens + merges), got {vocab_size}")
    return _copy_tokenizer(_byte_level_bpe_tokenizer(vocab_size, _corpus(corpus)))


@lru_cache(maxsize=16)
def _byte_level_bpe_tokenizer(vocab_size: int, corpus: tuple[str, ...]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    # Specials after the regular vocabulary, as in Qwen2 / GPT-2.
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in _BPE_SPECIALS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        chat_template=CHATML_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=32768,
        name_or_path="toy-byte-level-bpe",
    )


def sentencepiece_bpe_tokenizer(
    vocab_size: int = 600, corpus: Sequence[str] | None = None
) -> PreTrainedTokenizerFast:
    """Train a Gemma-3 / Llama-style ("SentencePiece BPE") tokenizer on a small corpus (< 0.1 s; cached).

    Pipeline, as in Gemma-3's ``tokenizer.json``: normalizer ``Replace(" ", "▁")``; pre-tokenizer
    ``Split(" ", "merged_with_previous")`` (a no-op after the normalizer: a whole text between added tokens
    is one BPE word; the merges were learned word by word, with a ``Metaspace`` split, so no merge joins
    two words); BPE with ``byte_fallback=True`` and ``<unk>``; decoder
    ``Replace("▁", " ") + ByteFallback + Fuse`` (no ``Strip``: a leading space survives decoding); a
    ``TemplateProcessing`` post-processor that prepends ``<bos>`` to every encoding (while, as with the real
    Gemma-3 tokenizer, ``tok.add_bos_token`` reads ``False``).

    Vocabulary layout: ``0 <pad>, 1 <eos>, 2 <bos>, 3 <unk>, 4 <start_of_turn>, 5 <end_of_turn>`` (all
    special), ``6 .. 261`` = ``<0x00> .. <0xFF>`` (regular tokens, as in Gemma, so
    ``skip_special_tokens`` keeps them), then the trained characters and merges. A character outside the
    training alphabet (e.g. an emoji absent from the corpus) is encoded as its UTF-8 bytes ``<0xNN>``.
    ``eos_token = "<eos>"``; the chat template is :data:`GEMMA_TEMPLATE`.

    Args:
        vocab_size: total vocabulary size to aim for, specials and byte tokens included; must be > 262 + the
            corpus alphabet size. Fewer tokens result when the corpus has no more pairs occurring twice.
        corpus: documents to train on; default :data:`TOY_CORPUS`.

    Returns:
        A fresh ``PreTrainedTokenizerFast`` (``TokenizersBackend``).

    Raises:
        ValueError: ``vocab_size`` too small for the corpus alphabet, or an empty corpus.
    """
    return _copy_tokenizer(_sentencepiece_bpe_tokenizer(vocab_size, _corpus(corpus)))


@lru_cache(maxsize=16)
def _sentencepiece_bpe_tokenizer(vocab_size: int, corpus: tuple[str, ...]) -> PreTrainedTokenizerFast:
    n_fixed = len(_SP_SPECIALS) + 256
    normalizer = normalizers.Replace(" ", _SP_SPACE)
    # 1) learn merges word by word (Metaspace split, no prefix space), so no merge spans two words
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.normalizer = normalizer
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=_SP_SPACE, prepend_scheme="never", split=True
    )
    alphabet = {ch for doc in corpus for ch in doc.replace(" ", _SP_SPACE)}
    if vocab_size <= n_fixed + len(alphabet):
        raise ValueError(
            f"vocab_size={vocab_size} leaves no room for merges: {n_fixed} specials/byte tokens + "
            f"{len(alphabet)} corpus characters"
        )
    trainer = BpeTrainer(
        vocab_size=vocab_size - n_fixed, min_frequency=2, show_progress=False, special_tokens=[]
    )
    trainer_tok.train_from_iterator(corpus, trainer=trainer)
    trained = json.loads(trainer_tok.to_str())["model"]
    # 2) rebuild the model with the Gemma layout: specials, 256 byte-fallback tokens, trained pieces
    vocab = {tok: i for i, tok in enumerate(_SP_SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace(_SP_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in _SP_SPECIALS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        chat_template=GEMMA_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=32768,
        name_or_path="toy-sentencepiece-bpe",
    )


def _copy_tokenizer(tok: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """A deep copy of a cached tokenizer (the ``tokenizers`` backend is deep-copied too)."""
    return copy.deepcopy(tok)
