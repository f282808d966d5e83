"""Tiny random ``transformers`` causal LMs sized for a tokenizer (:mod:`hf_hetspec.testing.toy`)."""

from __future__ import annotations

import math

import torch
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

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
