"""Every refusal of a hf_hetspec ``generate()`` call, in one module: the checks that raise, before any forward
pass and before the drafter's copy is made, on what a call cannot have exactly, with a message that names the
argument and the fix.

:func:`hf_hetspec.plan.make_plan` calls them in this order:

1. :func:`check_call` -- the models (:func:`check_not_changed_by_assisted_generation`,
   :func:`check_peft_adapters`, :func:`check_model_supported`), tokenizers, generator, ``hetspec_drafter``
   (:func:`hf_hetspec.runtime.resolve_runtime`, which refuses a runtime this drafter cannot run), the prompt,
   mask and positions; then :func:`check_drafter_prompt`;
2. :func:`check_generation_config` -- what the merged ``GenerationConfig`` asks for (beams, caches, ...), and
   :func:`check_generate_inputs` -- every other argument, honoured or refused (the rules below);
3. :func:`check_draft_temperature` and :func:`check_verification` -- the keywords that make sense only for some
   algorithms (after the algorithm is chosen; :func:`hf_hetspec.plan.choose_algorithm` refuses TLI for a pair
   that shares too few tokens); :func:`check_schedule` -- a call's own ``hetspec_schedule``;
4. :func:`check_batch` -- what a batch (several rows, padding, ``num_return_sequences``) cannot have;
   :func:`check_loop` -- what transformers' loop (``hetspec_loop="transformers"``) cannot honour;
5. :func:`check_drafter_weights` -- the drafter's weights on a real device and finite.

What is not a refusal stays with its subject: which cache layers a crop rolls back (:mod:`hf_hetspec.support`),
the PEFT helpers (:mod:`hf_hetspec.model_checks`), the runtime's choice (:mod:`hf_hetspec.runtime`).

Every ``generate()`` argument is honoured or refused (:func:`check_generate_inputs`). A hf_hetspec call must
give what ``target.generate()`` without a drafter gives, so an argument is either *honoured* -- used by the
target exactly as plain decoding would use it -- or *refused* before any model runs. Nothing is dropped
silently.

Honoured (README "Hardening" has the full table): the prompt as ``input_ids``, also a left-padded batch with
``num_return_sequences`` (:func:`check_batch` refuses what a batch cannot have); ``attention_mask``, ``position_ids``, ``cache_position`` and a ``past_key_values``/``cache`` holding part or all of the
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
that cannot be rolled back). The other checks here refuse beams, right padding, ``use_cache=False`` and
caches other than the dynamic one; :func:`check_generate_inputs` runs right after them, on the same merged
generation config.
"""

from __future__ import annotations

import difflib
import math
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch
from transformers import DynamicCache, GenerationConfig, PreTrainedModel
from transformers.cache_utils import DummyLayer, DynamicLayer
from transformers.generation import (
    SynthIDTextWatermarkingConfig,
    SynthIDTextWatermarkLogitsProcessor,
    UnbatchedClassifierFreeGuidanceLogitsProcessor,
)
from transformers.generation.configuration_utils import GenerationMode

from .compat import cache_from_kwargs
from .drafter import model_device
from .model_checks import is_peft_model, peft_base_model
from .packed_target import resolve_target_runtime
from .runtime import check_runtime, resolve_runtime  # noqa: F401 -- check_runtime lives with the runtime's choice
from .schedule import DraftStop, Schedule
from .support import ROLES, model_support

ALGORITHMS = ("auto", "slem", "tli", "slrs")
IMPLEMENTED = ("slem", "tli", "slrs")
#: ``hetspec_verification``: how TLI and SLRS verify a sampled draft against its ``q`` / ``psi`` -- token by
#: token (``verify.verify_speculative_sampling``, the default) or as a block (``verify.verify_block``).
VERIFICATIONS = ("token", "block")
#: ``hetspec_loop``: whose draft-verify loop runs a call -- hf_hetspec's own (``decoding.speculative_generate``,
#: the default) or transformers' ``_assisted_decoding`` with the generators of ``candidates.py``.
LOOPS = ("hetspec", "transformers")
#: The only ``cache_implementation`` values whose cache can be rolled back after a rejection.
_DYNAMIC_CACHES = (None, "dynamic")


# --------------------------------------------------------------------------------------------------------
# 1. the call
# --------------------------------------------------------------------------------------------------------


def check_call(target, drafter, target_tokenizer, drafter_tokenizer, args,
               inputs, model_kwargs: dict) -> None:
    """Check everything about a call that does not need its generation config.

    Args:
        target, drafter: the models (``drafter`` is ``assistant_model``).
        target_tokenizer, drafter_tokenizer: ``tokenizer=`` and ``assistant_tokenizer=``.
        args: hf_hetspec's keywords (:class:`~hf_hetspec.plan.HetspecArguments`).
        inputs (``torch.LongTensor`` of shape ``(B, n)``): the prompt (``inputs=`` or ``input_ids=``), left-padded
            when ``B > 1``.
        model_kwargs: the call's other keyword arguments (``attention_mask``, ``position_ids``, ...).

    Raises:
        ValueError / TypeError / NotImplementedError: with a message naming the argument and the fix.
    """
    if args.algorithm not in ALGORITHMS:
        raise ValueError(f"hetspec_algorithm={args.algorithm!r} is not known; use one of {', '.join(ALGORITHMS)}.")
    if args.algorithm not in IMPLEMENTED and args.algorithm != "auto":
        raise NotImplementedError(
            f"hetspec_algorithm={args.algorithm!r} is not available in this version of hf_hetspec; "
            f"available: {', '.join(IMPLEMENTED)} (or 'auto')."
        )
    if not isinstance(args.loop, str) or args.loop not in LOOPS:
        raise ValueError(f"hetspec_loop={args.loop!r} is not known; use one of {', '.join(LOOPS)}.")
    if not isinstance(peft_base_model(drafter), PreTrainedModel):
        raise TypeError(f"assistant_model must be a transformers PreTrainedModel (or a PEFT PeftModel of one), got "
                        f"{type(drafter).__name__}.")
    for role, model in (("target", target), ("drafter", drafter)):  # a user's model with a history
        check_not_changed_by_assisted_generation(model, role)
        check_peft_adapters(model, role)
    # a cache that a crop cannot roll back exactly would make the output differ from the target's
    check_model_supported(target, "target")
    check_model_supported(drafter, "drafter")
    if target_tokenizer is None or drafter_tokenizer is None:
        missing = "tokenizer" if target_tokenizer is None else "assistant_tokenizer"
        raise ValueError(
            f"`{missing}` is missing: hf_hetspec needs both `tokenizer=` (the target's) and "
            "`assistant_tokenizer=` (the drafter's) to compare their vocabularies and translate drafts."
        )
    for name, tok, model in (("tokenizer", target_tokenizer, target), ("assistant_tokenizer", drafter_tokenizer, drafter)):
        rows = model.get_input_embeddings().weight.shape[0]
        if len(tok) > rows:
            raise ValueError(
                f"`{name}` has {len(tok)} tokens but its model's embedding has {rows} rows: pass the tokenizer "
                "that belongs to that model."
            )
    generator = args.generator
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"hetspec_generator must be a torch.Generator, got {type(generator).__name__}.")
    if generator is not None and generator.device.type != model_device(target).type:
        raise ValueError(
            f"hetspec_generator is on {generator.device.type} but the target's logits are on "
            f"{model_device(target)}: create it there, e.g. torch.Generator(device='{model_device(target).type}')."
        )
    # hetspec_drafter and hetspec_target known and possible (checks only: make_plan resolves them when it prepares)
    resolve_runtime(drafter, args.drafter_runtime)
    resolve_target_runtime(target, args.target_runtime)
    _check_prompt(inputs, model_kwargs)


def _check_prompt(inputs, model_kwargs: dict) -> None:
    if inputs is None:
        raise ValueError("no prompt: pass the prompt's token ids as `input_ids` (shape (1, n), n >= 1); hf_hetspec "
                         "drafts from token ids and does not take `inputs_embeds`.")
    if not torch.is_tensor(inputs) or inputs.dim() != 2 or inputs.dtype not in (torch.int64, torch.int32):
        raise ValueError("`input_ids` must be an integer tensor of shape (batch, sequence_length).")
    if inputs.shape[0] < 1 or inputs.shape[1] < 1:
        raise ValueError("`input_ids` is empty: the prompt needs at least one token.")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and tuple(mask.shape) != tuple(inputs.shape):
        raise ValueError(
            f"`attention_mask` has shape {tuple(mask.shape)} but `input_ids` has {tuple(inputs.shape)}: pass "
            "the mask of this prompt (or none)."
        )
    if mask is not None and not bool((mask[:, -1] == 1).all()):
        raise NotImplementedError(
            "`attention_mask` ends in padding (zeros in its last column): hf_hetspec decodes left-padded batches, "
            "like transformers' own batched generate(); pad on the left (`tokenizer.padding_side = 'left'`)."
        )
    positions = model_kwargs.get("position_ids")
    if positions is not None and (
        not torch.is_tensor(positions)
        or positions.is_floating_point()
        or tuple(positions.shape) != tuple(inputs.shape)
    ):
        raise ValueError(
            f"`position_ids` must be an integer tensor of the prompt's shape {tuple(inputs.shape)} (they are the "
            "target's; the drafter numbers its own tokens): pass one position per prompt token, or none."
        )


def check_drafter_prompt(value, drafter_tokenizer) -> tuple[int, ...] | None:
    """``assistant_input_ids`` checked, as drafter ids (``None`` when not given).

    Args:
        value (``torch.LongTensor`` of shape ``(1, m)``, ``m >= 1``): the prompt in drafter ids, or ``None``.
        drafter_tokenizer: ``assistant_tokenizer``; every id must be below its length.

    Raises:
        ValueError / NotImplementedError: not an integer tensor of shape ``(1, m)`` with ``m >= 1``, or ids
            outside the drafter tokenizer's vocabulary.
    """
    if value is None:
        return None
    fix = ("pass the prompt in drafter token ids, e.g. `assistant_tokenizer.apply_chat_template(messages, "
           "add_generation_prompt=True, return_tensors='pt')['input_ids']` or `hf_hetspec.chat_inputs(...)`")
    if not torch.is_tensor(value) or value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise ValueError(f"`assistant_input_ids` must be an integer tensor of shape (1, m): {fix}.")
    if value.dim() != 2:
        raise ValueError(f"`assistant_input_ids` has shape {tuple(value.shape)}, expected (1, m): {fix}.")
    if value.shape[0] != 1:
        raise NotImplementedError(
            f"`assistant_input_ids` holds a batch of {value.shape[0]}; hf_hetspec decodes one sequence at a time: "
            "pass one prompt of shape (1, m)."
        )
    if value.shape[1] < 1:
        raise ValueError(f"`assistant_input_ids` is empty: the drafter's prompt needs at least one token; {fix}.")
    ids = value[0].tolist()
    bad = [i for i in ids if not 0 <= i < len(drafter_tokenizer)]
    if bad:
        raise ValueError(
            f"`assistant_input_ids` holds ids outside the drafter vocabulary (0..{len(drafter_tokenizer) - 1}), "
            f"e.g. {bad[0]}: they must come from `assistant_tokenizer`, not the target's tokenizer; {fix}."
        )
    return tuple(ids)


# --------------------------------------------------------------------------------------------------------
# the models: checked in check_call (1), the drafter's weights last (5)
# --------------------------------------------------------------------------------------------------------


def check_model_supported(model, role: str) -> None:
    """Refuse ``model`` as ``role`` (``"target"`` or ``"drafter"``) unless
    :func:`hf_hetspec.support.model_support` accepts it.

    Called once per ``generate()`` call, before any model forward. Cost: building an empty ``DynamicCache``
    (no tensors are allocated).

    Raises:
        ValueError: ``role`` is not ``"target"`` or ``"drafter"``.
        NotImplementedError: the model cannot be rolled back exactly; the message names the model class,
            the reason and what to use instead.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    verdict = model_support(model, role)
    if verdict.supported:
        return
    argument = "the model generate() is called on" if role == "target" else "`assistant_model`"
    raise NotImplementedError(
        f"{type(model).__name__} cannot be the {role} ({argument}) of hf_hetspec: {verdict.reason}, so "
        "speculative decoding would not reproduce the target's output. Use a decoder-only attention model "
        f"as the {role}, or call generate() without `assistant_model` for plain decoding."
    )


#: The layers transformers' universal assisted generation puts in place of a drafter's LM head and input
#: embedding (``AssistantToTargetTranslator`` in transformers/generation/candidate_generator.py, sampled calls
#: with ``assistant_model`` and two tokenizers): the head keeps only the rows of the tokens the drafter shares
#: with that call's target, so the drafter's own distribution ``q`` cannot be computed from it any more.
_ASSISTED_GENERATION_LAYERS = ("_PruneReindexingLMHead", "_MapInputEmbedding")


def check_not_changed_by_assisted_generation(model, role: str) -> None:
    """Refuse a ``role`` model (``"target"`` or ``"drafter"``) whose LM head or input embedding transformers'
    own universal assisted generation replaced in place (:data:`_ASSISTED_GENERATION_LAYERS`).

    Raises:
        ValueError: the message names the replaced layer, what replaced it and the fix (reload the model, or
            hand transformers a copy).
    """
    layers = (("LM head", model.get_output_embeddings()), ("input embedding", model.get_input_embeddings()))
    for where, layer in layers:
        name = type(layer).__name__
        if name in _ASSISTED_GENERATION_LAYERS and type(layer).__module__.startswith("transformers."):
            raise ValueError(
                f"{_argument(role)} was changed in place by transformers' own assisted generation: its "
                f"{where} is transformers' {name}, which a sampled generate(assistant_model=..., tokenizer=..., "
                "assistant_tokenizer=...) without hf_hetspec put there, keeping only the rows shared with that "
                "call's target; the original rows are gone. Reload the model (from_pretrained), and give "
                "transformers' assisted generation a copy (assistant_model=copy.deepcopy(drafter)).")


def _argument(role: str) -> str:
    """How a message names the ``role`` model."""
    return "the target (the model generate() is called on)" if role == "target" else "the drafter (`assistant_model`)"


def check_peft_adapters(model, role: str) -> None:
    """Refuse a ``PeftModel`` ``role`` (``"target"`` or ``"drafter"``) whose active adapter is prompt learning
    (prefix / prompt / P-tuning): those add virtual tokens in ``PeftModel.forward`` rather than in the layers,
    and hf_hetspec runs the layers. Any other model passes.

    Raises:
        NotImplementedError: names the adapter type and what works instead.
    """
    if not is_peft_model(model):
        return
    config = model.active_peft_config
    if getattr(config, "is_prompt_learning", False):
        kind = getattr(config.peft_type, "value", config.peft_type)
        raise NotImplementedError(
            f"{_argument(role)} is a PeftModel with a prompt-learning adapter ({kind}), whose "
            "virtual tokens hf_hetspec does not feed; use an adapter that changes the layers (e.g. LoRA), or "
            "call generate() without `assistant_model`.")


_CHECKED: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()


def _fingerprint(model: torch.nn.Module) -> tuple:
    """Identity, storage and in-place version of every parameter: changes when a weight is replaced or modified."""
    return tuple((name, id(p), p.data_ptr(), p._version) for name, p in model.named_parameters())


def _finite(weight: torch.Tensor) -> bool:
    """Whether every value of ``weight`` is finite: its sum first (one cheap pass), each value if that overflows."""
    with torch.no_grad():
        return bool(torch.isfinite(weight.sum())) or bool(torch.isfinite(weight).all())


def check_drafter_weights(drafter: torch.nn.Module) -> None:
    """Refuse a drafter whose weights are on the ``meta`` device or not finite.

    A drafter on ``meta`` (built under ``init_empty_weights`` or offloaded by a ``device_map``) has no values,
    so its first forward fails deep inside torch; a drafter with NaN or infinite weights yields a NaN draft
    distribution ``q``, on which speculative sampling's ``min(1, p / q)`` and the residual ``max(0, p - q)``
    are undefined. The finiteness check sums every floating-point weight once: a NaN or an infinity makes the
    sum non-finite, and only a sum that overflows is checked element by element. For 135M weights that is
    0.05-0.08 s on a busy 2-core CPU, against 1.9-2.5 s for ``torch.isfinite(weight).all()``. The result is
    remembered per drafter until one of its parameters is replaced or changed in place (torch's per-tensor
    version counter), so repeated ``generate()`` calls do not pay for it again.

    Args:
        drafter: the ``assistant_model`` of a ``generate()`` call (a ``torch.nn.Module``).

    Raises:
        ValueError: a parameter on the ``meta`` device (the message names it: load the weights, e.g.
            ``from_pretrained`` without ``device_map`` offloading), or a floating-point parameter holding NaN
            or an infinite value (named: reload or fix the checkpoint).
    """
    if not isinstance(drafter, torch.nn.Module):
        return  # not a model at all: the call's validation names that
    fingerprint = _fingerprint(drafter)
    if _CHECKED.get(drafter) == fingerprint:
        return
    for name, param in drafter.named_parameters():
        if param.is_meta:
            raise ValueError(
                f"assistant_model: parameter {name!r} is on the meta device (no values loaded, e.g. built under "
                "init_empty_weights or offloaded by device_map); load the drafter's weights onto a real device.")
    for name, param in drafter.named_parameters():
        # plain tensors only: quantized tensor subclasses hold integer codes, not floats to check
        if param.is_floating_point() and type(param.data) is torch.Tensor and not _finite(param):
            raise ValueError(
                f"assistant_model: parameter {name!r} holds NaN or infinite values, so the drafter's distribution "
                "q would be undefined; reload the drafter (or fix its checkpoint).")
    _CHECKED[drafter] = fingerprint


# --------------------------------------------------------------------------------------------------------
# 2. the generation config and every other generate() argument
# --------------------------------------------------------------------------------------------------------


def check_generation_config(config: GenerationConfig) -> None:
    """Refuse what the merged generation config asks for and hf_hetspec cannot do exactly.

    Raises:
        ValueError / NotImplementedError: naming the setting and the fix.
    """
    if (config.num_beams or 1) > 1:
        raise ValueError(f"num_beams={config.num_beams}: speculative decoding is not beam search; use num_beams=1.")
    if config.max_new_tokens is not None and config.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={config.max_new_tokens}: ask for at least one new token.")
    if config.use_cache is False:
        raise ValueError("use_cache=False: speculative decoding needs the target's KV cache; drop use_cache=False.")
    if config.cache_implementation not in _DYNAMIC_CACHES:
        raise ValueError(
            f"cache_implementation={config.cache_implementation!r}: hf_hetspec rolls the cache back after "
            "rejections and needs the dynamic cache; drop cache_implementation."
        )
    if config.return_dict_in_generate and (config.output_attentions or config.output_hidden_states):
        raise NotImplementedError("output_attentions/output_hidden_states are not returned by hf_hetspec; drop them.")
    value = config.num_assistant_tokens
    if value is not None and (not isinstance(value, int) or value < 1):
        raise ValueError(f"num_assistant_tokens={value!r}: the lookahead must be a positive integer.")


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


#: hf_hetspec's own ``generate()`` keywords (:class:`hf_hetspec.plan.HetspecArguments` pops them in this order).
HETSPEC_KEYWORDS = ("hetspec_algorithm", "hetspec_generator", "hetspec_draft_temperature", "assistant_input_ids",
                    "hetspec_drafter", "hetspec_verification", "hetspec_schedule", "hetspec_loop", "hetspec_target")


def _check_model_inputs(model_kwargs: dict) -> None:
    for name, value in model_kwargs.items():
        if name in (*CARRIED_MODEL_INPUTS, *SETTINGS_AMONG_MODEL_KWARGS, *NO_EFFECT_KEYWORDS) or value is None:
            continue
        _check_hetspec_spelling(name)
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


def _check_hetspec_spelling(name: str) -> None:
    """Refuse ``name`` as a misspelled hf_hetspec keyword (``hetspec_algoritm``) rather than as a model input.

    Raises:
        ValueError: ``name`` starts with ``hetspec_`` or is close to one of hf_hetspec's keywords
            (:data:`HETSPEC_KEYWORDS`); the message names the closest one.
    """
    close = difflib.get_close_matches(name, HETSPEC_KEYWORDS, n=1, cutoff=0.8)
    if close or name.startswith("hetspec_"):
        hint = f"did you mean `{close[0]}`? " if close else ""
        raise ValueError(f"`{name}` is not a keyword of generate() or of hf_hetspec: {hint}hf_hetspec's keywords are "
                         + ", ".join(f"`{k}`" for k in HETSPEC_KEYWORDS) + ".")


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


# --------------------------------------------------------------------------------------------------------
# 3. the keywords that make sense only for some algorithms, and the schedule
# --------------------------------------------------------------------------------------------------------


def check_draft_temperature(value, algorithm: str, do_sample: bool) -> None:
    """``hetspec_draft_temperature``: ``None`` or a real number >= 0 that changes how this call drafts.

    Raises:
        ValueError: not such a number, or a positive value where drafts are always greedy (SLEM, or a
            greedy call).
    """
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
        raise ValueError(
            f"hetspec_draft_temperature={value!r}: use a real number >= 0 (0: the drafter's argmax, the default "
            "with different vocabularies; t > 0: sample the drafter at temperature t)."
        )
    if value > 0 and (algorithm == "slem" or not do_sample):
        raise ValueError(
            f"hetspec_draft_temperature={value!r} has no effect here: "
            + ("SLEM always drafts the drafter's greedy string" if algorithm == "slem"
               else "a greedy call (do_sample=False) always drafts the drafter's argmax")
            + "; drop the argument (or pass do_sample=True with hetspec_algorithm='tli'/'slrs')."
        )


def check_verification(value, algorithm: str, do_sample: bool, draft_temperature=None) -> None:
    """``hetspec_verification``: one of ``VERIFICATIONS``, and ``"block"`` only where it changes something.

    ``"token"`` (the default) is each algorithm's own verification and is accepted everywhere. ``"block"``
    (:func:`hf_hetspec.verify.verify_block`) replaces token-level speculative sampling, so it needs a sampled
    call (``do_sample=True``) with TLI or SLRS, whose drafts come with ``q`` / ``psi`` over target ids. SLEM
    verifies re-tokenized text by exact match and has no ``q``; a greedy call verifies against the argmax,
    where block verification would accept exactly the same prefix (with a one-hot ``p`` its weights are 1 up
    to the first mismatch and 0 after it). There it would be a silent no-op, so it is refused, like a
    positive ``hetspec_draft_temperature``. For the same reason it needs sampled drafts: an argmax draft
    (``hetspec_draft_temperature=0``) is a point mass, against which block verification keeps a prefix with the
    same probabilities as exact-match sampling; without ``hetspec_draft_temperature`` the plan drafts at the
    call's temperature (:func:`hf_hetspec.plan.make_plan`).

    Raises:
        ValueError: an unknown value, or ``"block"`` where it would have no effect.
    """
    if not isinstance(value, str) or value not in VERIFICATIONS:
        raise ValueError(f"hetspec_verification={value!r} is not known; use one of {', '.join(VERIFICATIONS)}.")
    if value == "block" and draft_temperature == 0:
        raise ValueError("hetspec_verification='block' with hetspec_draft_temperature=0: argmax drafts are "
                         "verified by exact match, which keeps the same prefix as block verification would; "
                         "pass a positive hetspec_draft_temperature (or none: the call's temperature) for block "
                         "verification, or drop hetspec_verification.")
    if value == "block" and (algorithm == "slem" or not do_sample):
        raise ValueError(
            "hetspec_verification='block' has no effect here: "
            + ("SLEM verifies by exact match and its drafts have no q over target ids" if algorithm == "slem"
               else "a greedy call (do_sample=False) verifies by exact match against the target's argmax")
            + "; drop the argument (or pass do_sample=True with hetspec_algorithm='tli'/'slrs')."
        )


def check_schedule(schedule, explicit: dict) -> Schedule:
    """``generate(hetspec_schedule=...)`` checked; returns it.

    Args:
        schedule: the value passed.
        explicit: transformers' schedule settings the call also gave (``num_assistant_tokens``,
            ``num_assistant_tokens_schedule``, ``assistant_confidence_threshold``; ``None`` when not given).

    Raises:
        TypeError: not a :class:`Schedule`.
        ValueError: a lookahead or floor below 1, a cut-off outside ``[0, 1)``, ``context_lookup`` or
            ``back_off`` not a bool, a ``cost_ratio`` or ``sibling_min_joint`` outside ``[0, 1)``,
            ``sibling_runner_ups`` not an integer >= 1, or transformers' schedule settings given too (one of the
            two would be silently dropped).
    """
    if not isinstance(schedule, Schedule):
        raise TypeError(f"hetspec_schedule must be an hf_hetspec.Schedule, got {type(schedule).__name__}.")
    given = [name for name, value in explicit.items() if value is not None]
    if given:
        raise ValueError(f"hetspec_schedule was given with `{'`, `'.join(given)}`: pass one of them (a Schedule "
                         "holds the lookahead, its adaptation and the confidence stop).")
    for name in ("lookahead", "min_lookahead"):
        value = getattr(schedule, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"hetspec_schedule.{name}={value!r}: must be an integer >= 1.")
    stop = schedule.stop
    if not isinstance(stop, DraftStop) or not all(
            isinstance(v, (int, float)) and 0.0 <= v < 1.0 for v in (stop.min_confidence, stop.min_joint)):
        raise ValueError(f"hetspec_schedule.stop={stop!r}: a DraftStop with cut-offs in [0, 1).")
    siblings = schedule.sibling_min_joint
    if isinstance(siblings, bool) or not isinstance(siblings, (int, float)) or not 0.0 <= siblings < 1.0:
        raise ValueError(f"hetspec_schedule.sibling_min_joint={siblings!r}: must be in [0, 1) (0: no sibling "
                         "branches).")
    runner_ups = schedule.sibling_runner_ups
    if not isinstance(runner_ups, int) or isinstance(runner_ups, bool) or runner_ups < 1:
        raise ValueError(f"hetspec_schedule.sibling_runner_ups={runner_ups!r}: must be an integer >= 1 (the "
                         "drafter's runner-ups per draft position that may become siblings).")
    for name in ("context_lookup", "back_off"):
        if not isinstance(getattr(schedule, name), bool):
            raise ValueError(f"hetspec_schedule.{name}={getattr(schedule, name)!r}: must be True or False.")
    c = schedule.cost_ratio
    if c is not None and not (isinstance(c, (int, float)) and not isinstance(c, bool) and 0.0 <= c < 1.0):
        raise ValueError(f"hetspec_schedule.cost_ratio={c!r}: the drafter step's cost in target forwards, a "
                         "number in [0, 1), or None for the drafter runtime's measured figure.")
    v = schedule.verify_cost
    if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v < 10.0):
        raise ValueError(f"hetspec_schedule.verify_cost={v!r}: the cost of verifying one more draft token in "
                         "target forwards, a number in [0, 10), or None for the target's figure.")
    return schedule


# --------------------------------------------------------------------------------------------------------
# 3b. batches: several prompts, padding, num_return_sequences
# --------------------------------------------------------------------------------------------------------


#: Attention implementations whose 2-D attention mask gives a masked key exactly zero weight, as the batched
#: loop's holes need (:mod:`hf_hetspec.batched`); the others (flash attention's unpadding, paged kernels) are
#: not vouched for.
BATCH_ATTENTION = ("sdpa", "eager")
_ONE_AT_A_TIME = "or call generate() once per prompt"


def batch_rows(inputs, config: GenerationConfig, model_kwargs: dict) -> tuple[int, bool]:
    """``(rows, padded)`` of a call: the rows decoded (``input_ids`` rows times ``num_return_sequences``) and
    whether its ``attention_mask`` has padding. A call with more than one row, or padded, is a batch
    (:mod:`hf_hetspec.batched`)."""
    prompts = inputs.shape[0] if torch.is_tensor(inputs) and inputs.dim() == 2 else 1
    mask = model_kwargs.get("attention_mask")
    padded = torch.is_tensor(mask) and not bool((mask == 1).all())
    return prompts * (config.num_return_sequences or 1), padded


def check_batch(target, args, call: dict, config: GenerationConfig, model_kwargs: dict) -> None:
    """Refuse, before any work, what a batch (several rows or a padded prompt, :func:`batch_rows`) cannot have
    exactly in hf_hetspec's batched loop (:mod:`hf_hetspec.batched`); nothing for one unpadded row.

    Args:
        target: the target model.
        args: hf_hetspec's keywords of the call.
        call: ``generate()``'s named parameters as given (``inputs``, ``streamer``, ``prefix_allowed_tokens_fn``).
        config: the merged generation config.
        model_kwargs: the call's model inputs (``input_ids``, ``attention_mask``, a cache).

    Raises:
        ValueError / NotImplementedError: naming the input and the fix.
    """
    inputs = _prompt(call, model_kwargs)
    rows, padded = batch_rows(inputs, config, model_kwargs)
    if rows == 1 and not padded:
        return
    what = f"a batch of {rows} rows" if rows > 1 else "a padded prompt"
    if args.loop == "transformers":
        raise ValueError(f"hetspec_loop='transformers' with {what}: transformers' assisted-generation loop decodes "
                         "one unpadded sequence; run the call in hf_hetspec's own loop (`hetspec_loop=\"hetspec\"`, "
                         f"the default), which decodes batches exactly, {_ONE_AT_A_TIME}.")
    if call.get("streamer") is not None:
        raise ValueError(f"`streamer` with {what}: a streamer receives one sequence; drop it {_ONE_AT_A_TIME}.")
    if args.drafter_prompt is not None and torch.is_tensor(inputs) and inputs.shape[0] > 1:
        raise NotImplementedError(
            f"`assistant_input_ids` with a batch of {inputs.shape[0]} prompts: it is one drafter prompt; drop it "
            f"(each row's drafter prompt is then converted from its target prompt) {_ONE_AT_A_TIME}.")
    if config.return_dict_in_generate and (config.output_scores or config.output_logits):
        raise NotImplementedError(
            f"output_scores/output_logits with {what}: hf_hetspec's rows advance by different numbers of tokens "
            f"per target forward and it returns only `sequences` for a batch; drop them {_ONE_AT_A_TIME}.")
    if call.get("prefix_allowed_tokens_fn") is not None:
        raise NotImplementedError(
            f"`prefix_allowed_tokens_fn` with {what}: it takes the row's index in the batch, and hf_hetspec's "
            f"batched loop processes each row on its own; {_ONE_AT_A_TIME}.")
    for name in ("encoder_repetition_penalty", "encoder_no_repeat_ngram_size"):
        value = getattr(config, name, None)
        if value not in (None, 0, 1, 1.0):
            raise NotImplementedError(f"`{name}={value!r}` with {what}: its processor indexes the prompt batch by "
                                      f"row, and hf_hetspec's batched loop processes each row on its own; "
                                      f"{_ONE_AT_A_TIME}.")
    if config.pad_token_id is None and config.eos_token_id is None:
        raise ValueError(f"{what} without pad_token_id or eos_token_id: rows that stop early are padded with "
                         "pad_token_id; pass pad_token_id= (e.g. the tokenizer's pad id).")
    cache = cache_from_kwargs(model_kwargs)
    if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
        raise NotImplementedError(f"a filled cache passed to generate() with {what}: hf_hetspec's batched loop "
                                  f"prefills every row itself; pass no cache {_ONE_AT_A_TIME}.")
    attention = getattr(target.config, "_attn_implementation", None) or "eager"
    if attention not in BATCH_ATTENTION:
        raise NotImplementedError(
            f"the target's attn_implementation={attention!r} with {what}: hf_hetspec's batched loop leaves masked "
            f"holes in the cache and relies on a 2-D attention mask, honoured exactly by {', '.join(BATCH_ATTENTION)};"
            f" load the target with attn_implementation='sdpa' {_ONE_AT_A_TIME}.")
    text_config = target.config.get_text_config(decoder=True) if hasattr(target.config, "get_text_config") \
        else target.config
    for layer in DynamicCache(config=text_config).layers:
        if not (type(layer) is DynamicLayer or isinstance(layer, DummyLayer)):
            raise NotImplementedError(
                f"{type(target).__name__} with {what}: its cache has {type(layer).__name__} layers, whose window "
                "counts cache slots, while hf_hetspec's batched loop leaves holes in the cache (rejected draft "
                f"tokens, padding); {_ONE_AT_A_TIME}.")


# --------------------------------------------------------------------------------------------------------
# 4. the loop
# --------------------------------------------------------------------------------------------------------


_OWN_LOOP = "; run the call in hf_hetspec's own loop (`hetspec_loop=\"hetspec\"`, the default), which "
_PER_BLOCK = (
    "transformers' assisted-generation loop checks stopping criteria once per verified block, so it would keep "
    "the tokens of an accepted block past the stop" + _OWN_LOOP + "checks them after every token."
)


def check_loop(args, stop_strings, call: dict, model_kwargs: dict) -> None:
    """``hetspec_loop="transformers"``: refuse, before any work, what a call cannot have in transformers' loop
    (:mod:`hf_hetspec.candidates`) exactly as in plain decoding; nothing for hf_hetspec's own loop.

    transformers' loop samples with torch's global RNG; checks stopping criteria once per verified block
    (EOS and ``max_length`` are cut inside the block, other criteria are not); verifies token by token; and
    prefills from the prompt it is given.

    Args:
        args: hf_hetspec's keywords of the call.
        stop_strings: the call's ``stop_strings`` (merged generation config).
        call: ``generate()``'s named parameters as given (``stopping_criteria``, ...).
        model_kwargs: the call's model inputs.

    Raises:
        ValueError: naming the input, with hf_hetspec's own loop (``hetspec_loop="hetspec"``) as the fix.
    """
    if args.loop != "transformers":
        return
    if args.generator is not None:
        raise ValueError("`hetspec_generator` with hetspec_loop='transformers': transformers' loop samples with "
                         "torch's global RNG (seed it with torch.manual_seed)" + _OWN_LOOP
                         + "samples with your generator.")
    if args.verification != "token":
        raise ValueError(f"`hetspec_verification={args.verification!r}` with hetspec_loop='transformers': "
                         "transformers' loop verifies token by token" + _OWN_LOOP + "verifies blocks.")
    if stop_strings:
        raise ValueError("`stop_strings` with hetspec_loop='transformers': " + _PER_BLOCK)
    if call.get("stopping_criteria"):
        raise ValueError("`stopping_criteria` with hetspec_loop='transformers': " + _PER_BLOCK)
    if any(model_kwargs.get(name) is not None for name in ("past_key_values", "cache")):
        raise ValueError("a cache passed to generate() with hetspec_loop='transformers': transformers' loop "
                         "prefills from the prompt it is given" + _OWN_LOOP + "continues a passed cache.")
