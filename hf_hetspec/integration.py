"""The only module that touches transformers' generation internals.

``enable(model)`` puts a ``generate`` wrapper on the model *instance* (the class is untouched;
``disable(model)`` deletes it again). When ``generate()`` is called with ``assistant_model=``, the wrapper

1. validates every argument before any work is done (clear errors that name the argument and the fix);
2. builds the algorithm's ``CandidateGenerator`` (SLEM: :class:`~hf_hetspec.slem.SLEMCandidateGenerator`);
3. calls transformers' own ``generate()`` with ``custom_generate=`` set to our decoding loop
   (:func:`~hf_hetspec.decoding.speculative_generate`), so the generation config, logits processors,
   stopping criteria, streamer and KV cache are prepared by transformers exactly as for plain decoding.

Only token ids and text cross between the models: the call's ``attention_mask`` (all ones),
``position_ids`` and cache are the target's and never reach the drafter, whose sequence has another length
(it numbers its own positions and keeps its own cache); ``assistant_input_ids=`` gives the drafter its own
prompt (e.g. its own chat template, :func:`hf_hetspec.chat_inputs`).

Without ``assistant_model`` the call goes to transformers unchanged. Supported: transformers 5.x
(``custom_generate`` callables and ``GenerationMixin._prepare_generation_config``); the contract test
``tests/test_integration.py`` pins what is used.
"""

from __future__ import annotations

import inspect
import math
import time
import types
import weakref
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessorList,
    PreTrainedModel,
    StoppingCriteriaList,
    StopStringCriteria,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.utils import GenerationMixin

from .alignment import Vocabulary
from .compat import cache_from_kwargs
from .decoding import speculative_generate
from .drafter import DraftStop, model_device
from .intersection import intersection_for, prefix_map_for
from .slem import SLEMCandidateGenerator
from .slrs import SLRSCandidateGenerator
from .tli import TLICandidateGenerator
from .stats import DecodingStats

ALGORITHMS = ("auto", "slem", "tli", "slrs")
IMPLEMENTED = ("slem", "tli", "slrs")
DEFAULT_LOOKAHEAD = 5
# Default schedule of SLEM: drafts of up to DEFAULT_MAX_LOOKAHEAD drafter tokens, each ended once the
# drafter's probability that all of it is accepted falls below DEFAULT_MIN_JOINT.
# Tuned on HumanEval/20-29 (disjoint from the bench's HumanEval/0-9), SmolLM2-135M drafter, Qwen2.5-Coder-1.5B
# target, bf16 CPU (benchmarks/tune_schedule.py): 0.35/12 ran 2.29x and 2.18x the target alone on the two
# halves; the former default 0.2/32 2.02x, 0.5/32 2.18x, 0.5/12 2.22x (benchmarks/README.md). The threshold
# sits above c + v (drafter step 0.165 + marginal verification cost 0.046 target forwards per draft token)
# because the drafter's confidence overstates how often the target agrees; the cap bounds the cost of
# verifying long drafts.
DEFAULT_MAX_LOOKAHEAD = 12
DEFAULT_MIN_JOINT = 0.35
MIN_TLI_SHARE = 0.01  # TLI needs at least this share of the drafter's tokens in the intersection

_GENERATE_SIGNATURE = inspect.signature(GenerationMixin.generate)
_LAST_STATS: "weakref.WeakKeyDictionary[PreTrainedModel, DecodingStats]" = weakref.WeakKeyDictionary()
_VOCABS: "weakref.WeakKeyDictionary[Any, Vocabulary]" = weakref.WeakKeyDictionary()
_MARK = "_hf_hetspec_enabled"
_SAVED = "_hf_hetspec_saved_generate"


def vocabulary(tokenizer) -> Vocabulary:
    """The (cached) byte table of ``tokenizer``; built once per tokenizer object."""
    try:
        return _VOCABS[tokenizer]
    except (KeyError, TypeError):
        vocab = Vocabulary.from_tokenizer(tokenizer)
        try:
            _VOCABS[tokenizer] = vocab
        except TypeError:
            pass
        return vocab


_PADDED: dict[tuple[int, int], Vocabulary] = {}


def _padded(table: Vocabulary, rows: int) -> Vocabulary:
    """``table.padded(rows)``, the same object for every call (its digest is computed once)."""
    key = (id(table), rows)
    cached = _PADDED.get(key)
    if cached is None or cached.tokenizer is not table.tokenizer:
        cached = _PADDED[key] = table.padded(rows)
    return cached


def enable(model: PreTrainedModel) -> PreTrainedModel:
    """Install hf_hetspec on ``model`` (idempotent). Returns ``model``.

    After this, ``model.generate(..., assistant_model=drafter, tokenizer=target_tokenizer,
    assistant_tokenizer=drafter_tokenizer, hetspec_algorithm="slem")`` runs heterogeneous-vocabulary
    speculative decoding. Only the instance gets a ``generate`` attribute; weights, configs and the
    generation config are not touched.

    ``generate()`` keyword arguments added by hf_hetspec (all need ``assistant_model=``):

    * ``hetspec_algorithm``: ``"auto"`` (default), ``"slem"``, ``"tli"`` or ``"slrs"``.
    * ``hetspec_generator`` (``torch.Generator`` on the target's device): randomness of a sampled call.
    * ``hetspec_draft_temperature`` (float >= 0, TLI and SLRS with ``do_sample=True``): how the drafter picks
      its draft tokens. Default: a sample of its distribution at the call's temperature (Algorithms 3 and 4);
      ``t > 0``: at temperature ``t`` instead (the call's top-k/top-p still apply); ``0``: its argmax, verified
      by speculative sampling against the one-hot ``q`` it came from (acceptance ``p(x)``, as with
      exact-match sampling). The output has the target's distribution whatever the value: only the speed
      changes (README "Draft temperature").
    * ``assistant_input_ids`` (``torch.LongTensor`` of shape ``(1, m)``, ids of ``assistant_tokenizer``): the
      prompt as the drafter should see it, e.g. the drafter's own chat template applied to the same messages
      (:func:`hf_hetspec.chat_inputs`). Default: the target prompt converted by
      :func:`hf_hetspec.alignment.convert_prompt`. It changes only the drafter's proposals, never the output.
      Refused before any work (``ValueError``; ``NotImplementedError`` for a batch) when it is not an integer
      tensor of shape ``(1, m)``, ``m >= 1``, with ids below ``len(assistant_tokenizer)``.

    A prompt longer than the drafter's ``max_position_embeddings`` is fine: the drafter keeps its BOS and the
    last tokens it can hold (``DecodingStats.drafter_truncated_tokens``), the target sees everything.

    Raises:
        TypeError: ``model`` has no ``generate`` method.
    """
    if not hasattr(model, "generate"):
        raise TypeError(f"enable() needs a transformers model with .generate(), got {type(model).__name__}")
    if model.__dict__.get(_MARK):
        return model
    model.__dict__[_SAVED] = model.__dict__.get("generate")
    model.__dict__["generate"] = types.MethodType(_generate, model)
    model.__dict__[_MARK] = True
    return model


def disable(model: PreTrainedModel) -> PreTrainedModel:
    """Undo :func:`enable` exactly (a no-op on a model that was not enabled). Returns ``model``."""
    if not model.__dict__.get(_MARK):
        return model
    saved = model.__dict__.pop(_SAVED, None)
    if saved is None:
        model.__dict__.pop("generate", None)
    else:
        model.__dict__["generate"] = saved
    del model.__dict__[_MARK]
    return model


def is_enabled(model: PreTrainedModel) -> bool:
    """Whether :func:`enable` is in effect on ``model``."""
    return bool(model.__dict__.get(_MARK))


def last_stats(model: PreTrainedModel) -> DecodingStats | None:
    """Statistics of the last hf_hetspec ``generate()`` call on ``model`` (``None`` before the first)."""
    return _LAST_STATS.get(model)


class _HetSpecDecoding:
    """The ``custom_generate`` callable handed to transformers' ``generate()``.

    Stop strings are turned into a ``StopStringCriteria`` by the wrapper, and the streamer travels here,
    because transformers 5.x hands neither ``tokenizer`` nor ``streamer`` on when ``custom_generate`` is a
    callable (it keeps only the keyword arguments that ``_sample`` does not declare).
    """

    def __init__(self, build_proposer, stats: DecodingStats, generator: torch.Generator | None, streamer=None):
        self.build_proposer = build_proposer
        self.stats = stats
        self.generator = generator
        self.streamer = streamer

    def __call__(
        self,
        model,
        input_ids,
        logits_processor=None,
        stopping_criteria=None,
        generation_config=None,
        synced_gpus=False,
        streamer=None,
        **model_kwargs,
    ):
        began = time.perf_counter()
        proposer = self.build_proposer(input_ids, generation_config)  # converts the drafter's prompt
        built = time.perf_counter() - began
        if self.streamer is not None:
            self.streamer.put(input_ids.cpu())
        out = speculative_generate(
            model,
            input_ids,
            logits_processor,
            stopping_criteria,
            generation_config,
            proposer,
            self.stats,
            streamer=self.streamer,
            generator=self.generator,
            past_key_values=cache_from_kwargs(model_kwargs),
            position_ids=model_kwargs.get("position_ids"),
        )
        self.stats.total_s += built  # total_s covers the whole call, as translation_s does
        return out


def _generate(self, *args, **kwargs):
    bound = _GENERATE_SIGNATURE.bind_partial(self, *args, **kwargs)
    call = dict(bound.arguments)
    call.pop("self")
    extra = call.pop("kwargs", {})
    algorithm = extra.pop("hetspec_algorithm", None)
    generator = extra.pop("hetspec_generator", None)
    draft_temperature = extra.pop("hetspec_draft_temperature", None)
    drafter_prompt = extra.pop("assistant_input_ids", None)
    drafter = call.get("assistant_model")
    original = type(self).generate
    if drafter is None:
        if any(value is not None for value in (algorithm, generator, draft_temperature, drafter_prompt)):
            raise ValueError(
                "`hetspec_algorithm`/`hetspec_generator`/`hetspec_draft_temperature`/`assistant_input_ids` were "
                "given without `assistant_model`: pass the drafter as `assistant_model=` (or drop these "
                "arguments for plain decoding)."
            )
        return original(self, **call, **extra)

    target_tokenizer = extra.pop("tokenizer", None)
    drafter_tokenizer = extra.pop("assistant_tokenizer", None)
    algorithm = "auto" if algorithm is None else algorithm
    plan = _validate(self, call, extra, drafter, target_tokenizer, drafter_tokenizer, algorithm, generator,
                     drafter_prompt, draft_temperature)

    stats = DecodingStats(algorithm=plan["algorithm"], note=plan["note"])
    _LAST_STATS[self] = stats
    build_proposer = _proposer_factory(plan, self, drafter, stats, generator)

    if plan["stop_strings"]:
        # transformers drops `tokenizer` for custom_generate callables, so it cannot build this criterion
        criteria = StoppingCriteriaList(call.get("stopping_criteria") or [])
        criteria.append(StopStringCriteria(tokenizer=target_tokenizer, stop_strings=plan["stop_strings"]))
        call["stopping_criteria"] = criteria
        extra["stop_strings"] = None
    # transformers does not hand `streamer` to custom_generate callables either: we stream ourselves
    streamer = call.pop("streamer", None)
    call["assistant_model"] = None
    call["custom_generate"] = _HetSpecDecoding(build_proposer, stats, generator, streamer)
    with torch.no_grad():
        return original(self, **call, **extra)


def _proposer_factory(plan: dict, target, drafter, stats: DecodingStats, generator):
    """A function ``(input_ids, generation_config) -> CandidateGenerator`` for the planned algorithm."""
    target_vocab, drafter_vocab = plan["target_vocab"], plan["drafter_vocab"]

    def build(input_ids, generation_config):
        common = dict(
            lookahead=plan["lookahead"],
            adaptive=plan["adaptive"],
            stop=DraftStop(*plan["stop"]),
            max_length=generation_config.max_length,
            stats=stats,
            drafter_prompt=plan["drafter_prompt"],
        )
        if plan["algorithm"] == "slem":
            return SLEMCandidateGenerator(target_vocab, drafter, drafter_vocab, input_ids, **common)
        sampling = bool(generation_config.do_sample)
        common.update(
            sampling=sampling,
            greedy_draft=plan["draft_temperature"] == 0,
            drafter_processors=_drafter_warpers(generation_config, plan["draft_temperature"]) if sampling else None,
            generator=_drafter_generator(generator, model_device(drafter)),
            target_eos_ids=_eos_ids(generation_config),
        )
        if plan["algorithm"] == "slrs":
            return SLRSCandidateGenerator(
                target_vocab,
                drafter,
                drafter_vocab,
                input_ids,
                prefix_map=plan["prefix_map"],
                target_size=len(target_vocab),
                **common,
            )
        return TLICandidateGenerator(
            target_vocab, drafter, drafter_vocab, input_ids, intersection=plan["intersection"], **common
        )

    return build


def _drafter_warpers(config: GenerationConfig, draft_temperature: float | None = None) -> LogitsProcessorList:
    """The call's vocabulary-independent sampling settings, for the drafter's own logits.

    Only temperature, top-k and top-p: processors that index token ids (repetition penalty, bad words,
    suppressed or forced tokens) belong to the target's vocabulary and are never applied to the drafter.
    A positive ``draft_temperature`` replaces the call's temperature (``0``/``None``: the call's).
    """
    warpers = LogitsProcessorList()
    temperature = draft_temperature if draft_temperature else config.temperature
    if temperature is not None and temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if config.top_k is not None and config.top_k != 0:
        warpers.append(TopKLogitsWarper(top_k=config.top_k))
    if config.top_p is not None and config.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=config.top_p))
    return warpers


def _drafter_generator(generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """A generator on the drafter's device, seeded from the call's generator (``None`` = global RNG)."""
    if generator is None:
        return None
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    return torch.Generator(device=device).manual_seed(seed)


def _eos_ids(config: GenerationConfig) -> list[int]:
    eos = config.eos_token_id
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def _rows(model) -> int:
    """Rows of the model's output layer (its padded vocabulary size); also for a quantized head, whose
    ``weight`` is not a tensor (e.g. ``torch.ao.quantization.quantize_dynamic`` drafters on CPU)."""
    head = model.get_output_embeddings()
    if head is not None and isinstance(getattr(head, "out_features", None), int):
        return head.out_features
    return (head if head is not None else model.get_input_embeddings()).weight.shape[0]


def _input_ids(call: dict, extra: dict) -> torch.Tensor | None:
    inputs = call.get("inputs")
    if inputs is None:
        inputs = extra.get("input_ids")
    return inputs


def _validate(target, call, extra, drafter, target_tokenizer, drafter_tokenizer, algorithm, generator,
              drafter_prompt=None, draft_temperature=None) -> dict:
    """Check a hf_hetspec ``generate()`` call before any work; return the resolved plan.

    ``drafter_prompt`` is ``generate(assistant_input_ids=...)``: the same prompt in drafter ids, shape
    ``(1, m)``, ``m >= 1``, integer ids below ``len(assistant_tokenizer)``. ``draft_temperature`` is
    ``generate(hetspec_draft_temperature=...)``: ``None`` or a real number >= 0.

    Raises:
        ValueError / TypeError / NotImplementedError: with a message naming the argument and the fix.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"hetspec_algorithm={algorithm!r} is not known; use one of {', '.join(ALGORITHMS)}.")
    if algorithm not in IMPLEMENTED and algorithm != "auto":
        raise NotImplementedError(
            f"hetspec_algorithm={algorithm!r} is not available in this version of hf_hetspec; "
            f"available: {', '.join(IMPLEMENTED)} (or 'auto')."
        )
    if not isinstance(drafter, PreTrainedModel):
        raise TypeError(f"assistant_model must be a transformers PreTrainedModel, got {type(drafter).__name__}.")
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
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"hetspec_generator must be a torch.Generator, got {type(generator).__name__}.")
    if generator is not None and generator.device.type != model_device(target).type:
        raise ValueError(
            f"hetspec_generator is on {generator.device.type} but the target's logits are on "
            f"{model_device(target)}: create it there, e.g. torch.Generator(device='{model_device(target).type}')."
        )

    inputs = _input_ids(call, extra)
    if inputs is None:
        raise ValueError("no prompt: pass the prompt's token ids as `input_ids` (shape (1, n), n >= 1).")
    if not torch.is_tensor(inputs) or inputs.dim() != 2 or inputs.dtype not in (torch.int64, torch.int32):
        raise ValueError("`input_ids` must be an integer tensor of shape (batch, sequence_length).")
    if inputs.shape[0] != 1:
        raise NotImplementedError(
            f"hf_hetspec decodes one sequence at a time; got a batch of {inputs.shape[0]}. "
            "Call generate() once per prompt."
        )
    if inputs.shape[1] < 1:
        raise ValueError("`input_ids` is empty: the prompt needs at least one token.")
    mask = extra.get("attention_mask")
    if mask is not None and not bool((mask == 1).all()):
        raise NotImplementedError(
            "`attention_mask` contains padding (zeros); hf_hetspec decodes one unpadded sequence: "
            "pass the prompt without padding."
        )
    if mask is not None and tuple(mask.shape) != tuple(inputs.shape):
        raise ValueError(
            f"`attention_mask` has shape {tuple(mask.shape)} but `input_ids` has {tuple(inputs.shape)}: pass "
            "the mask of this prompt (or none)."
        )
    positions = extra.get("position_ids")
    if positions is not None and (
        not torch.is_tensor(positions)
        or positions.is_floating_point()
        or tuple(positions.shape) != tuple(inputs.shape)
    ):
        raise ValueError(
            f"`position_ids` must be an integer tensor of the prompt's shape {tuple(inputs.shape)} (they are the "
            "target's; the drafter numbers its own tokens): pass one position per prompt token, or none."
        )
    drafter_prompt_ids = _drafter_prompt(drafter_prompt, drafter_tokenizer)

    config, _ = target._prepare_generation_config(call.get("generation_config"), **dict(extra))
    if (config.num_beams or 1) > 1:
        raise ValueError(f"num_beams={config.num_beams}: speculative decoding is not beam search; use num_beams=1.")
    if (config.num_return_sequences or 1) > 1:
        raise NotImplementedError(
            f"num_return_sequences={config.num_return_sequences}: hf_hetspec returns one sequence per call; "
            "call generate() several times."
        )
    if config.max_new_tokens is not None and config.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={config.max_new_tokens}: ask for at least one new token.")
    if config.use_cache is False:
        raise ValueError("use_cache=False: speculative decoding needs the target's KV cache; drop use_cache=False.")
    if config.cache_implementation in ("static", "hybrid", "sliding_window", "offloaded_static"):
        raise ValueError(
            f"cache_implementation={config.cache_implementation!r}: hf_hetspec rolls the cache back after "
            "rejections and needs the dynamic cache; drop cache_implementation."
        )
    if config.return_dict_in_generate and (config.output_attentions or config.output_hidden_states):
        raise NotImplementedError("output_attentions/output_hidden_states are not returned by hf_hetspec; drop them.")
    for name in ("num_assistant_tokens",):
        value = getattr(config, name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name}={value!r}: the lookahead must be a positive integer.")

    # the user's draft-length settings (the schedule is decided once the algorithm is known, below)
    threshold = _user_value(call, extra, "assistant_confidence_threshold")
    if threshold is not None and not (isinstance(threshold, (int, float)) and 0.0 <= threshold < 1.0):
        raise ValueError(
            f"assistant_confidence_threshold={threshold!r}: the drafter-confidence cut-off must be in [0, 1) "
            "(0 disables it)."
        )
    explicit = _user_value(call, extra, "num_assistant_tokens")
    schedule = _user_value(call, extra, "num_assistant_tokens_schedule")

    # identical when every id spells the same bytes and the same ids are special (never by vocab_size);
    # the byte tables are cached per tokenizer, so this costs one list comparison per call
    target_table, drafter_table = vocabulary(target_tokenizer), vocabulary(drafter_tokenizer)
    identical = target_table.fingerprint == drafter_table.fingerprint
    target_vocab = _padded(target_table, _rows(target))
    drafter_vocab = _padded(drafter_table, _rows(drafter))
    resolved = algorithm
    if algorithm == "auto":
        # SLEM, greedy and sampling, measured fastest (README "Measured results"): Qwen2.5-Coder-1.5B +
        # Gemma-3-270M, HumanEval, T=1: SLEM 1.59x the target alone, SLRS 0.74x, TLI 0.72x; greedy: SLEM
        # 2.26x, SLRS 1.32x, TLI 0.87x. Exact match accepts any tokenization of the drafted text and needs no
        # intersection. Identical vocabularies with sampling: standard speculative sampling (TLI).
        resolved = "tli" if identical and config.do_sample else "slem"
    if draft_temperature is not None:
        if isinstance(draft_temperature, bool) or not isinstance(draft_temperature, (int, float)) or not (
            math.isfinite(draft_temperature) and draft_temperature >= 0
        ):
            raise ValueError(
                f"hetspec_draft_temperature={draft_temperature!r}: use a real number >= 0 (0: the drafter's "
                "argmax; t > 0: sample the drafter at temperature t; omit it to sample at the call's temperature)."
            )
        if draft_temperature > 0 and (resolved == "slem" or not config.do_sample):
            raise ValueError(
                f"hetspec_draft_temperature={draft_temperature!r} has no effect here: "
                + ("SLEM always drafts the drafter's greedy string" if resolved == "slem"
                   else "a greedy call (do_sample=False) always drafts the drafter's argmax")
                + "; drop the argument (or pass do_sample=True with hetspec_algorithm='tli'/'slrs')."
            )
    intersection = None
    if resolved == "tli":
        intersection = intersection_for(target_vocab, drafter_vocab)
        share = intersection.drafter_shared / max(1, len(drafter_tokenizer))
        if share < MIN_TLI_SHARE:
            if algorithm == "auto":
                resolved, intersection = "slem", None
            else:
                raise ValueError(
                    f"hetspec_algorithm='tli': only {intersection.drafter_shared} of the drafter's "
                    f"{len(drafter_tokenizer)} tokens ({share:.2%}) are shared with the target "
                    f"({getattr(target_tokenizer, 'name_or_path', 'target')} / "
                    f"{getattr(drafter_tokenizer, 'name_or_path', 'drafter')}); use hetspec_algorithm='slem'."
                )
    prefix_map = prefix_map_for(target_vocab, drafter_vocab) if resolved == "slrs" else None
    # The draft-length schedule. num_assistant_tokens alone: exactly that many; a heuristic schedule:
    # transformers' +2/-1 rule; assistant_confidence_threshold: a per-token cut-off on top. By default SLEM
    # drafts up to DEFAULT_MAX_LOOKAHEAD drafter tokens, each draft ended once the drafter's probability that
    # all of it is accepted falls below DEFAULT_MIN_JOINT (drafter.DraftStop).
    if explicit is not None or schedule is not None:
        lookahead = explicit if explicit is not None else DEFAULT_LOOKAHEAD
        adaptive, min_joint = schedule in ("heuristic", "heuristic_transient"), 0.0
    elif resolved == "slem":
        lookahead, adaptive = DEFAULT_MAX_LOOKAHEAD, False
        min_joint = DEFAULT_MIN_JOINT if threshold is None else 0.0
    else:
        # token-level drafts: transformers' +2/-1 rule. The confidence stop measured slower there, with
        # sampled drafts (SmolLM2, T=1: 1.06x vs 1.26x), greedy drafts at T=1 (HumanEval/20-21: 90.9 s vs
        # 75.4 s) and greedy TLI (Gemma-3: 0.87x): a drafter token the target would tokenize differently is
        # rejected however sure the drafter is.
        lookahead, adaptive, min_joint = DEFAULT_LOOKAHEAD, True, 0.0
    note = f"identical vocabularies: standard speculative decoding ({resolved})" if identical else ""
    return {
        "algorithm": resolved,
        "lookahead": lookahead,
        "adaptive": adaptive,
        "stop": (float(threshold or 0.0), min_joint),
        "draft_temperature": draft_temperature,
        "drafter_prompt": drafter_prompt_ids,
        "note": note,
        "stop_strings": config.stop_strings,
        "target_vocab": target_vocab,
        "drafter_vocab": drafter_vocab,
        "intersection": intersection,
        "prefix_map": prefix_map,
    }


def _drafter_prompt(value, drafter_tokenizer) -> list[int] | None:
    """``assistant_input_ids`` checked and as a list of drafter ids (``None`` when not given).

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
    return ids


def _user_value(call: dict, extra: dict, name: str):
    """A generation setting the user gave explicitly (kwarg or passed GenerationConfig), else ``None``."""
    if extra.get(name) is not None:
        return extra[name]
    config = call.get("generation_config")
    if isinstance(config, GenerationConfig):
        return getattr(config, name, None)
    return None
