"""Which ``generate()`` arguments a hf_hetspec call honours and which it refuses, decided in one place.

A hf_hetspec call must give what ``target.generate()`` without a drafter gives. An argument is therefore
either *honoured* -- used by the target exactly as plain decoding would use it -- or *refused* before any
model runs, with a message that names it and says what to do. Nothing is dropped silently.

Honoured (README "Hardening" has the full table): the prompt as ``input_ids``; ``attention_mask`` (no
padding), ``position_ids``, ``cache_position`` and a ``past_key_values``/``cache`` holding part or all of the
prompt; every generation setting that becomes a logits processor or stopping criterion (temperature, top-k,
top-p, min-p, typical, epsilon/eta, top-h, repetition and n-gram penalties, bad words, sequence bias,
suppressed/forced tokens, min/max length, EOS lists, stop strings, ``max_time``, the green-list watermark);
``logits_processor``, ``stopping_criteria``, ``prefix_allowed_tokens_fn``, ``streamer``,
``generation_config``, ``return_dict_in_generate`` with scores/logits. Settings that plain decoding ignores
without beams or guidance (``length_penalty``, ``early_stopping``, ``diversity_penalty``, ``low_memory``,
``negative_prompt_ids`` without ``guidance_scale``) are ignored here too, as are the window sizes of
transformers' own vocabulary translation (``assistant_lookbehind``, ``target_lookbehind``: hf_hetspec aligns
by bytes) and compilation settings; none of them can change the output.

The target's logits processors are called once per verified position, on the sequence up to that position
(:func:`hf_hetspec.decoding.speculative_generate`), also for positions after a rejected draft token. That is
exact for processors that are functions of ``(input_ids, scores)``; processors that keep state between calls
(classifier-free guidance's cache of the unconditional prompt, SynthID's n-gram history) would be corrupted,
so they are refused.

Refused: everything a target forward would need besides token ids (``inputs_embeds``, ``pixel_values`` and
any other model input: the verification forwards carry only the ids, mask, positions and cache); decoding
methods other than greedy/sampling (contrastive search, DoLa, constrained beam search); drafting methods
other than ``assistant_model``; settings whose processor keeps state; options of transformers' own loop
that ours does not implement (``custom_generate``, ``synced_gpus``, ``prefill_chunk_size``, a passed cache
that cannot be rolled back). The plan's other steps (:mod:`hf_hetspec.plan`) refuse beams, batches, padding,
``use_cache=False`` and caches other than the dynamic one; this check runs right after them, on the same
merged generation config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from transformers import GenerationConfig
from transformers.generation import (
    SynthIDTextWatermarkingConfig,
    SynthIDTextWatermarkLogitsProcessor,
    UnbatchedClassifierFreeGuidanceLogitsProcessor,
)
from transformers.generation.configuration_utils import GenerationMode

from .compat import cache_from_kwargs

#: Model inputs the verification forwards carry (the prompt, its mask and positions, the target's cache).
CARRIED_MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "cache_position", "past_key_values", "cache")
#: Generation settings that transformers keeps among the model kwargs; the call's validation checks them.
SETTINGS_AMONG_MODEL_KWARGS = ("output_attentions", "output_hidden_states")
#: ``generate()`` keywords that transformers reads only for a Hub ``custom_generate`` (refused below), so they
#: have no effect on a plain call either.
NO_EFFECT_KEYWORDS = ("trust_remote_code",)
#: Decoding methods ``GenerationConfig.get_generation_mode`` can select, other than greedy and sampling
#: (beams are refused by the call's validation), with the settings that select them.
OTHER_DECODING_METHODS = {
    GenerationMode.CONTRASTIVE_SEARCH: "penalty_alpha",
    GenerationMode.CONSTRAINED_BEAM_SEARCH: "constraints`/`force_words_ids",
    GenerationMode.DOLA_GENERATION: "dola_layers",
}
#: Logits processors that keep state between calls: refused in ``logits_processor``.
STATEFUL_PROCESSORS = (
    UnbatchedClassifierFreeGuidanceLogitsProcessor,
    SynthIDTextWatermarkLogitsProcessor,
)

_OTHER_DRAFTER = (
    "selects another way of drafting; hf_hetspec drafts with `assistant_model`: drop it (or call generate() "
    "without `assistant_model` to use it)."
)
_PER_CALL_STATE = (
    "keeps state between processor calls, but speculative decoding scores every drafted position (k + 1 per "
    "target forward, including positions after a rejected draft token), which would corrupt it: drop it, or "
    "call generate() without `assistant_model`."
)


@dataclass(frozen=True)
class SettingRule:
    """A generation setting that a hf_hetspec call refuses when ``active(value)``; ``reason`` says why and the
    fix (the message is ``"{name}={value!r} {reason}"``)."""

    name: str
    active: Callable[[Any], bool]
    error: type[Exception]
    reason: str


def _set(value) -> bool:
    return value is not None and value is not False


SETTING_RULES = (
    SettingRule(
        "guidance_scale", lambda value: value is not None and value != 1, NotImplementedError,
        "turns on classifier-free guidance, whose processor keeps its own cache of the unconditional prompt and "
        + _PER_CALL_STATE,
    ),
    SettingRule(
        "watermarking_config", lambda value: isinstance(value, SynthIDTextWatermarkingConfig), NotImplementedError,
        "selects SynthID watermarking, whose processor " + _PER_CALL_STATE
        + " (the green-list `WatermarkingConfig` is stateless and honoured.)",
    ),
    SettingRule(
        "token_healing", _set, NotImplementedError,
        "rewrites the prompt's last tokens before decoding: heal the prompt first, "
        "`input_ids = target.heal_tokens(input_ids, tokenizer=tokenizer)`, then call without `token_healing`.",
    ),
    SettingRule("prompt_lookup_num_tokens", _set, ValueError, _OTHER_DRAFTER),
    SettingRule("assistant_early_exit", _set, ValueError, _OTHER_DRAFTER),
    SettingRule("use_mtp", _set, ValueError, _OTHER_DRAFTER),
    SettingRule("speculation_type", _set, ValueError, _OTHER_DRAFTER),
    SettingRule(
        "assistant_ensemble_weight", _set, ValueError,
        "mixes the drafter's distribution into the verification, so the output is no longer the target's; "
        "hf_hetspec verifies exactly: drop it.",
    ),
    SettingRule(
        "prefill_chunk_size", _set, NotImplementedError,
        "asks for a chunked prefill; hf_hetspec's loop prefills the prompt in one target forward: drop it.",
    ),
)


def check_generate_inputs(call: dict, config: GenerationConfig, model_kwargs: dict) -> None:
    """Refuse, before any work, every argument of a hf_hetspec ``generate()`` call that it would not honour.

    Args:
        call: ``generate()``'s named parameters as the user bound them (``inputs``, ``logits_processor``,
            ``custom_generate``, ``synced_gpus``, ...), without ``**kwargs``.
        config: the call's merged ``GenerationConfig`` (the model's defaults, the passed config and the
            keyword settings), as transformers' ``_prepare_generation_config`` returns it.
        model_kwargs: the keyword arguments that are not generation settings (model inputs such as
            ``attention_mask``, ``pixel_values``, ``inputs_embeds``, the cache), from the same function.

    Raises:
        ValueError: a setting that selects another decoding or drafting method, or an option that contradicts
            hf_hetspec (``custom_generate``, a cache longer than the prompt); the message names it.
        NotImplementedError: an input that would change the target's output but is not carried through the
            verification forwards, or a processor that keeps state between calls; the message names it.
    """
    _check_decoding_options(call)
    _check_decoding_method(config)
    for rule in SETTING_RULES:
        value = getattr(config, rule.name, None)
        if rule.active(value):
            raise rule.error(f"`{rule.name}={value!r}` {rule.reason}")
    _check_logits_processors(call.get("logits_processor"))
    _check_model_inputs(model_kwargs)
    _check_cache(model_kwargs, _prompt(call, model_kwargs))


def _check_decoding_options(call: dict) -> None:
    if call.get("custom_generate") is not None:
        raise ValueError(
            "`custom_generate` with `assistant_model`: hf_hetspec is itself the decoding method of this call and "
            "would replace yours. Drop `custom_generate`, or call generate() without `assistant_model` (or call "
            "hf_hetspec.disable(model) first to use it without hf_hetspec)."
        )
    if call.get("synced_gpus"):
        raise NotImplementedError(
            "`synced_gpus=True`: hf_hetspec's loop does not keep several processes' forwards in step "
            "(DeepSpeed ZeRO-3 / FSDP); run the target in one process, e.g. split with `device_map`."
        )


def _check_decoding_method(config: GenerationConfig) -> None:
    mode = config.get_generation_mode()
    if mode in OTHER_DECODING_METHODS:
        raise ValueError(
            f"`{OTHER_DECODING_METHODS[mode]}` selects {mode.value.replace('_', ' ')}, another decoding method than "
            "greedy decoding or sampling, which speculative decoding reproduces: drop it."
        )


def _check_logits_processors(processors) -> None:
    for processor in processors or ():
        if isinstance(processor, STATEFUL_PROCESSORS):
            raise NotImplementedError(
                f"`logits_processor` holds a {type(processor).__name__}, which " + _PER_CALL_STATE
            )


def _check_model_inputs(model_kwargs: dict) -> None:
    for name, value in model_kwargs.items():
        if name in (*CARRIED_MODEL_INPUTS, *SETTINGS_AMONG_MODEL_KWARGS, *NO_EFFECT_KEYWORDS) or value is None:
            continue
        if name == "inputs_embeds":
            raise NotImplementedError(
                "`inputs_embeds`: hf_hetspec drafts from the prompt's text, which embeddings do not carry, and its "
                "verification forwards take token ids: pass the prompt as `input_ids` (or call generate() without "
                "`assistant_model`)."
            )
        raise NotImplementedError(
            f"`{name}`: hf_hetspec's verification forwards carry only the target's input_ids, attention_mask, "
            f"position_ids and cache, so `{name}` (an image, audio or other model input) would not reach the "
            "target and the output would differ from target.generate(): call generate() without "
            "`assistant_model` for it (or check the argument's spelling)."
        )


def _prompt(call: dict, model_kwargs: dict) -> torch.Tensor | None:
    inputs = call.get("inputs")
    return model_kwargs.get("input_ids") if inputs is None else inputs


def _check_cache(model_kwargs: dict, prompt: torch.Tensor | None) -> None:
    """A cache passed to ``generate()`` must be croppable and hold at most the prompt (the loop recomputes the
    last prompt position when it holds all of it, :func:`hf_hetspec.decoding.speculative_generate`)."""
    cache = cache_from_kwargs(model_kwargs)
    if cache is None:
        return
    if not (hasattr(cache, "crop") and hasattr(cache, "get_seq_length")):
        raise NotImplementedError(
            f"the cache passed to generate() is a {type(cache).__name__}; hf_hetspec rolls the target's cache back "
            "after every rejected draft token and needs a `DynamicCache`: pass one, or none."
        )
    if torch.is_tensor(prompt) and prompt.dim() == 2 and cache.get_seq_length() > prompt.shape[1]:
        raise ValueError(
            f"the cache passed to generate() holds {cache.get_seq_length()} positions but the prompt has "
            f"{prompt.shape[1]} tokens: pass the whole sequence the cache was built from as `input_ids` (the "
            "cache may hold part or all of it)."
        )
