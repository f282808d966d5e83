"""Tiny, self-contained tokenizers and models for tests, examples and notebooks.

Nothing here touches the network: the tokenizers are trained in well under a second with the
``tokenizers`` library on a built-in corpus of a few KB, and the models are tiny random (or briefly
trained) ``transformers`` causal LMs.

* :func:`byte_level_bpe_tokenizer` -- a GPT-2 / Qwen-style byte-level BPE (``Ġ`` space marker, the Qwen
  regex split, ``<|endoftext|>`` / ``<|im_start|>`` / ``<|im_end|>`` appended after the regular vocabulary,
  ChatML chat template).
* :func:`sentencepiece_bpe_tokenizer` -- a Gemma-3 / Llama-style BPE (``▁`` space marker, byte fallback
  with all 256 ``<0xNN>`` tokens, ``<pad> <eos> <bos> <unk>`` at ids 0-3, a post-processor that prepends
  ``<bos>``, Gemma chat template).
* :func:`tiny_causal_lm` -- a random ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` sized for a tokenizer.
* :func:`correlated_pair` -- a target and a drafter with *different* tokenizers, both trained for a few
  seconds to memorize the same corpus, so their greedy continuations agree and speculative decoding
  actually accepts drafted tokens. Works for the toy tokenizers and for real ones (Qwen2.5, SmolLM2,
  Gemma-3: the expensive full-vocabulary rows are never trained, see :func:`train_memorizer`).
* :func:`measure_agreement` -- how far the two models' greedy continuations agree, compared as text.

Example (about 5 s on two CPU cores)::

    pair = correlated_pair()              # byte-level Qwen2 target, sentencepiece Llama drafter
    report = measure_agreement(pair)      # greedy continuations of pair.prompts, compared as text
    print(report)                         # mean agreement 1.00, mean common prefix 45.0 chars ...
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers.trainers import BpeTrainer
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

__all__ = [
    "TOY_CORPUS",
    "TOY_PROMPTS",
    "CHATML_TEMPLATE",
    "GEMMA_TEMPLATE",
    "byte_level_bpe_tokenizer",
    "sentencepiece_bpe_tokenizer",
    "tiny_causal_lm",
    "CorrelatedPair",
    "train_memorizer",
    "correlated_pair",
    "AgreementReport",
    "measure_agreement",
    "greedy_continuation",
]

# --------------------------------------------------------------------------------------------------------
# Built-in corpus
# --------------------------------------------------------------------------------------------------------

#: Documents of the built-in corpus: English prose, Python with indentation, numbers, CJK, emoji, lines
#: with trailing spaces and tabs. The models of :func:`correlated_pair` memorize these; prompts are prefixes.
#: (No string that a real tokenizer parses as a special token, e.g. ``<eos>`` or ``<|im_end|>``, occurs.)
TOY_CORPUS: tuple[str, ...] = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He counted one hundred and "
    "twelve steps, polished the great lens with a soft cloth, and wrote the weather in a leather book. "
    "Ships passed far out on the grey water, and none of them ever knew his name.",
    "def fibonacci(n: int) -> int:\n"
    '    """Return the n-th Fibonacci number."""\n'
    "    a, b = 0, 1\n"
    "    for _ in range(n):\n"
    "        a, b = b, a + b\n"
    "    return a\n"
    "\n"
    "\n"
    "if __name__ == \"__main__\":\n"
    "    print([fibonacci(i) for i in range(10)])\n",
    "Speculative decoding lets a small drafter propose several tokens that a large target model then "
    "verifies in a single forward pass. When the drafter guesses well, many tokens are accepted at once "
    "and generation becomes faster, while the output distribution stays exactly the same.",
    "class Stack:\n"
    "    def __init__(self):\n"
    "        self.items = []\n"
    "\n"
    "    def push(self, item):\n"
    "        self.items.append(item)\n"
    "\n"
    "    def pop(self):\n"
    "        if not self.items:\n"
    "            raise IndexError(\"pop from an empty stack\")\n"
    "        return self.items.pop()\n",
    "On 14 March 2024 the station recorded 3.14159 mm of rain, 27 km/h winds and a pressure of 1013.25 hPa. "
    "The next morning was clear: 18 degrees at 07:30, 24 degrees by noon, and 2,048 visitors on the beach.",
    "Our small garden grows tomatoes, basil, beans and three kinds of mint. In summer we water it twice a "
    "day; in winter we cover the beds with straw and wait for the first green shoots of spring.",
    "今天天气很好，我们去公园散步。春天来了，花都开了。\n"
    "東京の駅はとても大きいです。毎朝たくさんの人が電車に乗ります。\n"
    "서울의 가을 하늘은 맑고 높습니다.",
    "Party checklist 🎉: cake 🎂, candles 🕯️, music 🎵 and friends 😀! "
    "Do not forget the gifts 🎁 and "
    "the photos 📷. The cat 🐈 will sleep through all of it.",
    "Shopping list:   \n"
    "  - eggs (12)  \n"
    "  - flour, 500 g\t\n"
    "  - milk, 1.5 l   \n"
    "Remember: the shop closes at 8 pm.  ",
    "import json\n"
    "\n"
    "def load_config(path):\n"
    "    with open(path, encoding=\"utf-8\") as handle:\n"
    "        data = json.load(handle)\n"
    "    return {key.lower(): value for key, value in data.items()}\n",
    "A river does not hurry, yet it reaches the sea. It carves valleys from stone one grain at a time, "
    "and every bend it makes was once a choice between two easier paths.",
    '{"name": "hetspec", "version": "0.1.0", "tags": ["speculative", "decoding"], "max_tokens": 256, '
    '"temperature": 0.7, "stop": null}',
    "Recipe for pancakes: mix 200 g of flour, 2 eggs and 300 ml of milk. Let the batter rest for 30 minutes, "
    "then cook each pancake for 90 seconds on each side in a hot pan.",
    "for row in range(3):\n"
    "\tfor col in range(4):\n"
    "\t\tprint(row * col, end=\" \")\n"
    "\tprint()\n",
)

#: Prompts for :func:`correlated_pair`: prefixes of :data:`TOY_CORPUS` documents cut after a word (never
#: before a space), so a model that memorized the corpus continues them deterministically.
TOY_PROMPTS: tuple[str, ...] = (
    "The lighthouse keeper climbed",
    'def fibonacci(n: int) -> int:\n    """Return',
    "Speculative decoding lets a small",
    "class Stack:\n    def __init__(self):\n        self.items",
    "On 14 March 2024 the station",
    "Our small garden grows",
    "import json\n\ndef load_config(path):\n    with open(path,",
    "A river does not hurry,",
    "Party checklist 🎉: cake",
    "Recipe for pancakes: mix",
)

#: ChatML chat template (Qwen / SmolLM2 style) used by :func:`byte_level_bpe_tokenizer`.
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


def _corpus(corpus: Sequence[str] | None) -> tuple[str, ...]:
    if corpus is None:
        return TOY_CORPUS
    if isinstance(corpus, str):
        raise TypeError("corpus must be a sequence of documents (strings), not a single string")
    docs = tuple(corpus)
    if not docs or not all(isinstance(d, str) and d for d in docs):
        raise ValueError("corpus must be a non-empty sequence of non-empty strings")
    return docs


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


# --------------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------------

_ARCHS = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}


def _special_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int | None]:
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    bos = tokenizer.bos_token_id
    return {"eos_token_id": eos, "pad_token_id": pad, "bos_token_id": bos}


def _make_config(
    arch: str,
    vocab_size: int,
    ids: dict[str, int | None],
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int | None,
    intermediate: int | None,
    max_position_embeddings: int,
    tie_word_embeddings: bool,
    attn_implementation: str,
):
    if arch not in _ARCHS:
        raise ValueError(f"arch must be one of {sorted(_ARCHS)}, got {arch!r}")
    if hidden % heads:
        raise ValueError(f"hidden={hidden} is not divisible by heads={heads}")
    kv_heads = heads if kv_heads is None else kv_heads
    if heads % kv_heads:
        raise ValueError(f"heads={heads} is not divisible by kv_heads={kv_heads}")
    config_cls, _ = _ARCHS[arch]
    extra = {"use_sliding_window": False} if arch == "qwen2" else {}
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate if intermediate is not None else 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        rms_norm_eps=1e-6,
        **ids,
        **extra,
    )
    config._attn_implementation = attn_implementation
    return config


def _instantiate(config, seed: int) -> PreTrainedModel:
    _, model_cls = _ARCHS[config.model_type]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    return model.to(torch.float32).eval()


def tiny_causal_lm(
    tokenizer: PreTrainedTokenizerBase,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    *,
    heads: int = 4,
    kv_heads: int | None = 2,
    intermediate: int | None = None,
    arch: str = "llama",
    pad_vocab_to: int | None = None,
    vocab_size: int | None = None,
    tie_word_embeddings: bool = False,
    max_position_embeddings: int = 2048,
    attn_implementation: str = "sdpa",
) -> PreTrainedModel:
    """A tiny random causal LM whose vocabulary matches ``tokenizer`` (float32, eval mode).

    The embedding / LM-head size is ``len(tokenizer)`` (all ids, added tokens included), rounded up to a
    multiple of ``pad_vocab_to`` if given -- as in real checkpoints whose logits are wider than the
    tokenizer (Qwen2.5: 151,936 logits for 151,665 tokens; the GGUF-derived tokenizer in ``../shared``
    fills that gap with ``[PAD151665]``-style regular tokens). Padding rows are ordinary random rows, so
    padded ids receive small but nonzero probability, as they may in real models.
    ``model.generation_config`` gets ``eos_token_id`` / ``pad_token_id`` (eos if the tokenizer has no pad)
    / ``bos_token_id`` from the tokenizer. The global torch RNG is left untouched (initialization runs
    under ``torch.random.fork_rng``), and the same arguments give the same weights.

    Args:
        tokenizer: the tokenizer the model will be used with.
        seed: initialization seed.
        hidden: hidden size; must be divisible by ``heads``.
        layers: number of decoder layers.
        heads, kv_heads: attention heads and key/value heads (GQA); ``kv_heads`` must divide ``heads``
            (``None``: same as ``heads``).
        intermediate: MLP width, default ``2 * hidden``.
        arch: ``"llama"`` (``LlamaForCausalLM``) or ``"qwen2"`` (``Qwen2ForCausalLM``).
        pad_vocab_to: round the vocabulary size up to a multiple of this (e.g. 64); ``None`` = exact.
        vocab_size: explicit embedding / LM-head size (e.g. a real checkpoint's ``config.vocab_size``);
            takes precedence over ``pad_vocab_to``; must be ``>= len(tokenizer)``.
        tie_word_embeddings: share the input embedding and LM head.
        max_position_embeddings: RoPE context size recorded in the config.
        attn_implementation: ``"sdpa"`` or ``"eager"``.

    Returns:
        The model; ``model.config.vocab_size >= len(tokenizer)``; logits have shape
        ``(batch, seq, model.config.vocab_size)``.

    Raises:
        ValueError: unknown ``arch``, indivisible head counts, ``pad_vocab_to < 1`` or
            ``vocab_size < len(tokenizer)``.
    """
    if vocab_size is None:
        vocab_size = _padded(len(tokenizer), pad_vocab_to)
    elif vocab_size < len(tokenizer):
        raise ValueError(f"vocab_size={vocab_size} is smaller than len(tokenizer)={len(tokenizer)}")
    config = _make_config(
        arch, vocab_size, _special_ids(tokenizer), hidden, layers, heads, kv_heads, intermediate,
        max_position_embeddings, tie_word_embeddings, attn_implementation,
    )
    model = _instantiate(config, seed)
    _set_generation_config(model, tokenizer)
    return model


def _padded(n: int, multiple: int | None) -> int:
    if multiple is None:
        return n
    if multiple < 1:
        raise ValueError(f"pad_vocab_to must be >= 1, got {multiple}")
    return int(math.ceil(n / multiple) * multiple)


def _set_generation_config(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    ids = _special_ids(tokenizer)
    model.generation_config = GenerationConfig(**ids, do_sample=False)


# --------------------------------------------------------------------------------------------------------
# Correlated pairs
# --------------------------------------------------------------------------------------------------------


@dataclass
class CorrelatedPair:
    """A target / drafter pair with different tokenizers that memorized the same corpus.

    Attributes:
        target, drafter: the models (float32, eval mode, ``requires_grad`` off).
        target_tokenizer, drafter_tokenizer: their tokenizers.
        prompts: prompt strings (prefixes of corpus documents) on which their greedy continuations agree.
        corpus: the training documents.
        final_loss: ``{"target": ..., "drafter": ...}`` mean training cross-entropy (nats per token) over
            the last 10 % of steps.
        train_seconds: ``{"target": ..., "drafter": ...}`` wall time of building + training each model.
    """

    target: PreTrainedModel
    drafter: PreTrainedModel
    target_tokenizer: PreTrainedTokenizerBase
    drafter_tokenizer: PreTrainedTokenizerBase
    prompts: list[str]
    corpus: tuple[str, ...] = ()
    final_loss: dict[str, float] = field(default_factory=dict)
    train_seconds: dict[str, float] = field(default_factory=dict)


def _corpus_stream(tokenizer: PreTrainedTokenizerBase, corpus: Sequence[str]) -> tuple[list[int], list[int]]:
    """Token stream ``encode(doc) + [eos]`` over the documents (``encode`` adds ``<bos>`` where the tokenizer
    does), and the stream offset of each document."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no eos_token; correlated_pair needs one")
    stream: list[int] = []
    starts: list[int] = []
    for doc in corpus:
        starts.append(len(stream))
        stream.extend(tokenizer(doc, add_special_tokens=True)["input_ids"])
        stream.append(eos)
    return stream, starts


def train_memorizer(
    tokenizer: PreTrainedTokenizerBase,
    corpus: Sequence[str] | None = None,
    *,
    seed: int = 0,
    steps: int = 250,
    batch_size: int = 12,
    window: int = 48,
    lr: float = 5e-3,
    **model_kwargs,
) -> tuple[PreTrainedModel, float]:
    """Build :func:`tiny_causal_lm` for ``tokenizer`` and train it briefly to memorize ``corpus``.

    Training never touches the full vocabulary. A *compact* model is trained instead, with one embedding /
    LM-head row per token id that occurs in the corpus stream (plus the tokenizer's special ids) and one
    extra "any other token" row whose logit is offset by ``log(n_other)`` -- exactly the total probability
    of ``n_other`` tokens sharing that row -- so training also drives the probability of every unused token
    (padding rows included) towards zero. Windows of the stream are sampled at random, half of them
    starting at a document start (where inference prompts start); the loss is the next-token cross-entropy
    over the compact vocabulary (exactly the full-vocabulary loss of the resulting model, up to the small
    random part below). Afterwards the compact rows are scattered into a full-size :func:`tiny_causal_lm`
    (same seed): used ids get their trained rows, every other LM-head row becomes the trained "other" row
    plus its own small random initialization (so unused logits are low but not tied), other embedding rows
    keep their random initialization. A 262,144-token vocabulary thus costs only the full model's
    initialization (about 0.3 s).

    Args:
        tokenizer: the model's tokenizer (must have an eos token).
        corpus: documents, default :data:`TOY_CORPUS`.
        seed: seed for initialization and window sampling.
        steps, batch_size, window, lr: Adam steps, windows per step, window length (tokens), peak learning
            rate (5 % linear warm-up, cosine decay to 10 %; gradients clipped to norm 1).
        **model_kwargs: forwarded to :func:`tiny_causal_lm` (``hidden``, ``layers``, ``arch``,
            ``pad_vocab_to``, ...).

    Returns:
        ``(model, final_loss)``: the eval-mode model with gradients disabled, and the mean training
        cross-entropy (nats per token) of the last 10 % of steps.

    Raises:
        ValueError: the tokenizer has no eos token, or an invalid model argument.
    """
    docs = _corpus(corpus)
    full = tiny_causal_lm(tokenizer, seed, **model_kwargs)
    full_vocab = full.config.vocab_size
    stream, starts = _corpus_stream(tokenizer, docs)
    used_set = set(stream) | {i for i in _special_ids(tokenizer).values() if i is not None}
    used = torch.tensor(sorted(used_set), dtype=torch.long)
    remap = {int(t): i for i, t in enumerate(used)}
    n_other = full_vocab - len(used)
    compact_stream = torch.tensor([remap[t] for t in stream], dtype=torch.long)

    compact_ids = {k: (None if v is None else remap[v]) for k, v in _special_ids(tokenizer).items()}
    compact_vocab = len(used) + (1 if n_other else 0)
    compact_config = type(full.config)(
        **{**full.config.to_dict(), **compact_ids, "vocab_size": compact_vocab}
    )
    compact_config._attn_implementation = full.config._attn_implementation
    compact = _instantiate(compact_config, seed + 1).train()
    logit_offset = torch.zeros(compact_vocab)
    if n_other:
        logit_offset[-1] = math.log(n_other)

    gen = torch.Generator().manual_seed(seed)
    n = len(compact_stream)
    cyclic = torch.cat([compact_stream.repeat(1 + window // n), compact_stream[: window + 1]])
    starts_t = torch.tensor(starts, dtype=torch.long)
    opt = torch.optim.Adam(compact.parameters(), lr=lr)
    warmup = max(1, steps // 20)

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(step, steps) / steps))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    offsets = torch.arange(window + 1)
    n_doc = batch_size // 2
    losses: list[float] = []
    for _ in range(steps):
        doc_starts = starts_t[torch.randint(len(starts_t), (n_doc,), generator=gen)]
        rand_starts = torch.randint(n, (batch_size - n_doc,), generator=gen)
        batch = cyclic[torch.cat([doc_starts, rand_starts])[:, None] + offsets]  # (batch, window + 1)
        logits = compact(input_ids=batch[:, :-1], use_cache=False).logits + logit_offset  # (B, window, V)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, compact_vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(compact.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    compact.eval()

    with torch.no_grad():
        full_state = full.state_dict()
        unused = torch.ones(full_vocab, dtype=torch.bool)
        unused[used] = False
        head_names = {"lm_head.weight"}
        if full.config.tie_word_embeddings:
            head_names.add("model.embed_tokens.weight")
        for name, value in compact.state_dict().items():
            target = full_state[name]
            if value.shape == target.shape:
                target.copy_(value)
                continue
            # embedding / LM head, shape (vocab, hidden): scatter the trained rows
            target[used] = value[: len(used)]
            if name in head_names and n_other:
                target[unused] += value[-1]
    full.requires_grad_(False)
    tail = max(1, steps // 10)
    return full, sum(losses[-tail:]) / tail


def correlated_pair(
    target_tokenizer: PreTrainedTokenizerBase | None = None,
    drafter_tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    corpus: Sequence[str] | None = None,
    prompts: Sequence[str] | None = None,
    seed: int = 0,
    steps: int = 250,
    target_kwargs: dict | None = None,
    drafter_kwargs: dict | None = None,
) -> CorrelatedPair:
    """A tiny target and a tiny drafter with different tokenizers whose greedy continuations agree.

    Random tiny models practically never agree, so speculative decoding would reject every draft. Here both
    models are trained (:func:`train_memorizer`, a few seconds each on 2 CPU cores, independent of the
    vocabulary size) to memorize the same corpus; on prompts that are prefixes of corpus documents both then
    continue the document, i.e. produce the same *text* in their own tokenizations.

    Args:
        target_tokenizer: default :func:`byte_level_bpe_tokenizer`. Real tokenizers work too
            (``AutoTokenizer.from_pretrained`` of Qwen2.5, SmolLM2, Gemma-3; pass the checkpoint's
            ``vocab_size`` in ``target_kwargs`` to get its exact logit width).
        drafter_tokenizer: default :func:`sentencepiece_bpe_tokenizer`; real tokenizers work too.
        corpus: documents; default :data:`TOY_CORPUS`.
        prompts: default :data:`TOY_PROMPTS` (with a custom corpus: the first four words of each document).
        seed: target seed; the drafter uses ``seed + 1000``.
        steps: training steps per model.
        target_kwargs, drafter_kwargs: extra :func:`tiny_causal_lm` / :func:`train_memorizer` arguments
            (``hidden``, ``layers``, ``arch``, ``pad_vocab_to``, ``vocab_size``, ``lr``, ...), overriding the
            defaults: the target is a ``Qwen2ForCausalLM`` with its logits padded to a multiple of 64
            (``arch="qwen2", pad_vocab_to=64``), the drafter a ``LlamaForCausalLM`` (``arch="llama"``)
            with exactly ``len(drafter_tokenizer)`` logits; both hidden size 64, 2 layers.

    Returns:
        A :class:`CorrelatedPair`.

    Raises:
        ValueError: a tokenizer without eos token, or invalid model arguments.
    """
    docs = _corpus(corpus)
    if target_tokenizer is None:
        target_tokenizer = byte_level_bpe_tokenizer(corpus=None if corpus is None else docs)
    if drafter_tokenizer is None:
        drafter_tokenizer = sentencepiece_bpe_tokenizer(corpus=None if corpus is None else docs)
    if prompts is None:
        prompts = TOY_PROMPTS if corpus is None else tuple(_first_words(d, 4) for d in docs)
    t_kwargs = {"arch": "qwen2", "pad_vocab_to": 64, **(target_kwargs or {})}
    d_kwargs = {"arch": "llama", **(drafter_kwargs or {})}
    t0 = time.perf_counter()
    target, t_loss = train_memorizer(target_tokenizer, docs, seed=seed, steps=steps, **t_kwargs)
    t1 = time.perf_counter()
    drafter, d_loss = train_memorizer(drafter_tokenizer, docs, seed=seed + 1000, steps=steps, **d_kwargs)
    t2 = time.perf_counter()
    return CorrelatedPair(
        target=target,
        drafter=drafter,
        target_tokenizer=target_tokenizer,
        drafter_tokenizer=drafter_tokenizer,
        prompts=list(prompts),
        corpus=docs,
        final_loss={"target": t_loss, "drafter": d_loss},
        train_seconds={"target": t1 - t0, "drafter": t2 - t1},
    )


def _first_words(doc: str, k: int) -> str:
    """The prefix of ``doc`` ending just before the space after its ``k``-th word (all of ``doc`` if shorter).

    Cutting before a space keeps the prompt's tokenization a prefix of the document's tokenization for both
    byte-level (the space starts the next pre-token) and sentencepiece-style (``▁`` starts the next word)
    tokenizers.
    """
    count = 0
    for i, ch in enumerate(doc):
        if ch == " " and i > 0 and not doc[i - 1].isspace():
            count += 1
            if count == k:
                return doc[:i]
    return doc


# --------------------------------------------------------------------------------------------------------
# Agreement
# --------------------------------------------------------------------------------------------------------


@torch.no_grad()
def greedy_continuation(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompt: str, max_new_tokens: int = 32
) -> str:
    """Greedy continuation of ``prompt`` as text (``model.generate(do_sample=False)``).

    The prompt is encoded with the tokenizer's default special tokens (a ``<bos>`` for Gemma-style
    tokenizers). The continuation is the decoded full sequence (special tokens skipped) minus the decoded
    prompt, so a token that straddles the boundary (e.g. a byte-fallback sequence) is decoded whole; if the
    full decode does not start with the prompt's decode, the continuation tokens are decoded alone.

    Returns:
        The continuation text (may be shorter than ``max_new_tokens`` tokens if eos was produced).
    """
    enc = tokenizer(prompt, return_tensors="pt")
    out = model.generate(
        input_ids=enc["input_ids"],
        attention_mask=enc["attention_mask"],
        max_new_tokens=max_new_tokens,
        do_sample=False,
    )
    prompt_len = enc["input_ids"].shape[1]
    head = tokenizer.decode(enc["input_ids"][0], skip_special_tokens=True)
    full = tokenizer.decode(out[0], skip_special_tokens=True)
    if full.startswith(head):
        return full[len(head):]
    return tokenizer.decode(out[0, prompt_len:], skip_special_tokens=True)


@dataclass
class AgreementReport:
    """Agreement of a pair's greedy continuations, compared as text.

    Attributes:
        prompts: the prompts used.
        target_texts, drafter_texts: greedy continuations.
        common_prefix: per prompt, the length (characters) of the longest common prefix of the two texts.
        compared: per prompt, ``min(len(target_text), len(drafter_text))``.
    """

    prompts: list[str]
    target_texts: list[str]
    drafter_texts: list[str]
    common_prefix: list[int]
    compared: list[int]

    @property
    def fractions(self) -> list[float]:
        """Per prompt ``common_prefix / compared`` (1.0 when nothing was compared)."""
        return [c / m if m else 1.0 for c, m in zip(self.common_prefix, self.compared)]

    @property
    def mean_fraction(self) -> float:
        """Mean of :attr:`fractions`."""
        return sum(self.fractions) / len(self.fractions)

    @property
    def mean_common_prefix(self) -> float:
        """Mean common-prefix length in characters."""
        return sum(self.common_prefix) / len(self.common_prefix)

    def __str__(self) -> str:
        lines = [
            f"mean agreement {self.mean_fraction:.2f}, "
            f"mean common prefix {self.mean_common_prefix:.1f} chars"
        ]
        for p, t, d, c in zip(self.prompts, self.target_texts, self.drafter_texts, self.common_prefix):
            lines.append(f"  {p!r}: {c} chars | T {t!r} | D {d!r}")
        return "\n".join(lines)


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def measure_agreement(
    pair: CorrelatedPair, prompts: Sequence[str] | None = None, max_new_tokens: int = 24
) -> AgreementReport:
    """Greedy-decode ``max_new_tokens`` with the target and the drafter on each prompt and compare the text.

    Args:
        pair: the pair.
        prompts: default ``pair.prompts``.
        max_new_tokens: tokens generated by each model (their texts have different lengths: the tokenizers
            differ, so the comparison covers the shorter text).

    Returns:
        An :class:`AgreementReport`; e.g. ``report.mean_fraction`` is 1.0 when every drafter continuation
        and target continuation agree over their common length.
    """
    prompts = list(pair.prompts if prompts is None else prompts)
    t_texts, d_texts, common, compared = [], [], [], []
    for p in prompts:
        t = greedy_continuation(pair.target, pair.target_tokenizer, p, max_new_tokens)
        d = greedy_continuation(pair.drafter, pair.drafter_tokenizer, p, max_new_tokens)
        t_texts.append(t)
        d_texts.append(d)
        common.append(_common_prefix(t, d))
        compared.append(min(len(t), len(d)))
    return AgreementReport(prompts, t_texts, d_texts, common, compared)
