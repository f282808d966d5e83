"""Tiny random models of real transformers architectures, for checking that every architecture is either
decoded exactly or refused (:mod:`hf_hetspec.support`).

Each entry of :data:`TINY_ARCHITECTURES` is a transformers config class name and the few arguments that make
it tiny (hidden size 32, 2 layers, short sliding windows so that a window is passed within a few tokens);
:func:`tiny_model` adds the vocabulary size and special ids and builds the model class transformers maps
the config to (``AutoModelForCausalLM``, or ``AutoModelForSeq2SeqLM`` for encoder-decoder configs).
"""

from __future__ import annotations

import copy

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, GenerationConfig, PreTrainedModel

_LLAMA_LIKE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2)

#: name -> (transformers config class name, tiny config arguments). Decoder-only attention models first
#: (sliding windows of 4 tokens, shorter than the tests' outputs), then models hf_hetspec refuses as
#: target (:data:`REFUSED_TARGETS`).
#: Some get a wider ``initializer_range``: at 0.02 their greedy output repeats one token, so every draft would be
#: accepted and no rollback exercised.
TINY_ARCHITECTURES: dict[str, tuple[str, dict]] = {
    "gpt2": ("GPT2Config", dict(n_embd=32, n_layer=2, n_head=4, n_positions=256, initializer_range=0.1)),
    "gpt_neox": ("GPTNeoXConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4)),
    "falcon": ("FalconConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     initializer_range=0.3)),
    "bloom": ("BloomConfig", dict(hidden_size=32, n_layer=2, n_head=4, initializer_range=0.3)),
    "opt": ("OPTConfig", dict(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                              word_embed_proj_dim=32, max_position_embeddings=256)),
    "gptj": ("GPTJConfig", dict(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=256)),
    "phi": ("PhiConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)),
    "phi3": ("Phi3Config", dict(_LLAMA_LIKE, pad_token_id=None)),
    "mistral": ("MistralConfig", dict(_LLAMA_LIKE, sliding_window=4)),
    "mixtral": ("MixtralConfig", dict(_LLAMA_LIKE, sliding_window=4, num_local_experts=4,
                                      num_experts_per_tok=2)),
    "gemma2": ("Gemma2Config", dict(_LLAMA_LIKE, head_dim=8, sliding_window=4, final_logit_softcapping=30.0,
                                    attn_logit_softcapping=50.0)),
    "gemma3": ("Gemma3TextConfig", dict(_LLAMA_LIKE, head_dim=8, sliding_window=4)),
    "qwen2": ("Qwen2Config", dict(_LLAMA_LIKE)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(_LLAMA_LIKE, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                         num_experts=4, num_experts_per_tok=2)),
    "qwen3": ("Qwen3Config", dict(_LLAMA_LIKE, head_dim=8)),
    "llama": ("LlamaConfig", dict(_LLAMA_LIKE)),
    "stablelm": ("StableLmConfig", dict(_LLAMA_LIKE)),
    "cohere": ("CohereConfig", dict(_LLAMA_LIKE, initializer_range=0.3)),
    "olmo2": ("Olmo2Config", dict(_LLAMA_LIKE, initializer_range=0.1)),
    "granitemoe": ("GraniteMoeConfig", dict(_LLAMA_LIKE, num_local_experts=4, num_experts_per_tok=2)),
    # refused: recurrent / linear-attention state in the cache, a cache of their own, or an encoder-decoder.
    # Jamba with a wider initialization: at 0.02 its mamba layers barely move the logits (1e-5), which would
    # hide what a wrong recurrent state does to the output.
    "jamba": ("JambaConfig", dict(_LLAMA_LIKE, num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1,
                                  expert_layer_period=2, expert_layer_offset=1, num_experts=2,
                                  mamba_d_state=4, mamba_expand=2, mamba_dt_rank=4, initializer_range=0.3)),
    "mamba": ("MambaConfig", dict(hidden_size=32, num_hidden_layers=2, state_size=4, expand=2,
                                  use_mambapy=False)),
    "mamba2": ("Mamba2Config", dict(hidden_size=32, num_hidden_layers=2, state_size=4, expand=2, num_heads=8,
                                    head_dim=8, n_groups=1, chunk_size=8)),
    "rwkv": ("RwkvConfig", dict(hidden_size=32, num_hidden_layers=2, attention_hidden_size=32, intermediate_size=64,
                                context_length=256)),
    "t5": ("T5Config", dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0)),
}

#: Names in :data:`TINY_ARCHITECTURES` that hf_hetspec must refuse as target.
REFUSED_TARGETS = ("jamba", "mamba", "mamba2", "rwkv", "t5")
#: ... and as drafter (recurrent drafters are rolled back from state snapshots, :mod:`hf_hetspec.recurrent`).
REFUSED_DRAFTERS = ("rwkv", "t5")


def tiny_model(name: str, vocab_size: int, special_ids: dict[str, int | None] | None = None,
               seed: int = 0) -> PreTrainedModel:
    """A tiny random model of architecture ``name`` (float32, eval mode, eager attention).

    Args:
        name: a key of :data:`TINY_ARCHITECTURES`.
        vocab_size: rows of its embedding and LM head (at least the tokenizer's length).
        special_ids: ``{"eos_token_id": ..., "bos_token_id": ..., "pad_token_id": ...}`` from the tokenizer;
            also set as the model's generation config (greedy by default).
        seed: initialization seed; the global torch RNG is left untouched.

    Raises:
        KeyError: unknown ``name``.
    """
    class_name, kwargs = TINY_ARCHITECTURES[name]
    ids = {k: v for k, v in (special_ids or {}).items() if v is not None}
    config = getattr(transformers, class_name)(**{**kwargs, **ids, "vocab_size": vocab_size})
    config._attn_implementation = "eager"
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto.from_config(config)
    model.generation_config = GenerationConfig(**ids, do_sample=False)
    return model.to(torch.float32).eval().requires_grad_(False)


def perturbed_copy(model: PreTrainedModel, scale: float, seed: int = 0) -> PreTrainedModel:
    """A copy of ``model`` with Gaussian noise of ``scale`` times each parameter tensor's standard deviation
    added: a drafter that agrees with ``model`` on most but not all tokens, whatever the architecture (a
    stand-in for a drafter trained on the target's outputs)."""
    noisy = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in noisy.parameters():
            spread = param.std() if param.numel() > 1 else param.abs()
            param.add_(torch.randn(param.shape, generator=gen) * float(spread) * scale)
    return noisy
