"""A hf_hetspec ``generate()`` call, decided once before any work: a frozen :class:`DecodingPlan`.

The plan is made by small named steps, each the one source of its rule:

1. :func:`check_call` -- the models, tokenizers, prompt, mask, positions and hf_hetspec's own keywords;
2. :func:`check_generation_config` -- what the merged ``GenerationConfig`` asks for (beams, caches, ...), and
   :func:`hf_hetspec.inputs.check_generate_inputs` -- every other argument, honoured or refused; and
   :func:`check_loop` -- what transformers' loop (``hetspec_loop="transformers"``) cannot honour;
3. :func:`choose_algorithm` -- what ``hetspec_algorithm="auto"`` resolves to, and why (``hf-hetspec analyze``
   and the pairing cards recommend through the same function); then :func:`check_draft_temperature` and
   :func:`check_verification`, the keywords that make sense only for some algorithms, and
   :func:`choose_draft_temperature` and :func:`choose_draft_policy`, how TLI and SLRS draft;
4. :func:`hf_hetspec.model_checks.check_drafter_weights`, then :func:`hf_hetspec.runtime.prepare_drafter` -- the
   drafter in the runtime that really runs (``hetspec_drafter``, resolved here once, after any fallback);
5. :func:`hf_hetspec.schedule.choose_schedule` -- the draft-length schedule (lookahead, adaptation, confidence
   stop) of that runtime, or the call's own ``hetspec_schedule`` (:func:`hf_hetspec.schedule.check_schedule`);

:func:`make_plan` runs them in that order on the generation config merged once from the call
(``target._prepare_generation_config``); :func:`build_proposer` turns a plan into the algorithm's proposer
for the prompt transformers hands to the decoding loop. Every check raises before a forward pass and before
the drafter's copy is made, with a message that names the argument and the fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from .alignment import Vocabulary, vocabulary
from .drafter import model_device
from .inputs import check_generate_inputs
from .intersection import VocabularyIntersection, intersection_for, prefix_map_for
from .model_checks import (
    check_drafter_weights,
    check_not_changed_by_assisted_generation,
    check_peft_adapters,
    peft_base_model,
)
from .proposer import DraftPolicy, HeterogeneousProposer
from .runtime import PreparedDrafter, prepare_drafter, resolve_runtime
from .schedule import (  # noqa: F401 -- re-exported: the schedule's old import path
    DEFAULT_LOOKAHEAD,
    MAX_LOOKAHEAD,
    SLEM_DEFAULTS,
    TOKEN_LEVEL_FLOORS,
    DraftStop,
    Schedule,
    SlemDefault,
    check_schedule,
    choose_schedule,
)
from .slem import SLEMProposer
from .slrs import SLRSProposer
from .stats import DecodingStats
from .support import check_model_supported
from .tli import TLIProposer

ALGORITHMS = ("auto", "slem", "tli", "slrs")
IMPLEMENTED = ("slem", "tli", "slrs")
#: ``hetspec_verification``: how TLI and SLRS verify a sampled draft against its ``q`` / ``psi`` -- token by
#: token (``verify.verify_speculative_sampling``, the default) or as a block (``verify.verify_block``).
VERIFICATIONS = ("token", "block")
#: ``hetspec_loop``: whose draft-verify loop runs a call -- hf_hetspec's own (``decoding.speculative_generate``,
#: the default) or transformers' ``_assisted_decoding`` with the generators of ``candidates.py``.
LOOPS = ("hetspec", "transformers")
#: How TLI and SLRS draft in a sampled call of a heterogeneous pair without ``hetspec_draft_temperature``
#: (:func:`choose_draft_temperature`): ``0``, the drafter's argmax (over the intersection for TLI, of ``psi`` for
#: SLRS), verified by speculative sampling against the one-hot ``q`` it came from, so a draft token ``x`` is
#: accepted with probability ``p(x)``. A sample of ``q`` at the call's temperature (Algorithms 3 and 4 as
#: written; ``hetspec_draft_temperature=<the call's temperature>``) is accepted with probability
#: ``sum min(p, q)``, lower when the drafter is less sure than the target. Either is exact (Leviathan et al.
#: 2023, Thm. 1, for any ``q`` the draft was drawn from). Measured with benchmarks/compare_draft_settings.py,
#: T=1, int8-static SmolLM2-135M drafter, HumanEval/20-26 x seeds 0-1 (benchmarks/README.md): TLI 1.86x the
#: target alone with greedy drafts against 1.71x with sampled ones, SLRS 1.92x against 1.83x. With the eager
#: drafter (c = 0.165) greedy drafts had measured level with sampled ones (TLI, HumanEval/20-21: 75.4 s against
#: 76.5 s).
DEFAULT_DRAFT_TEMPERATURE = 0.0
#: TLI needs at least this share of the drafter's tokens in the vocabulary intersection.
MIN_TLI_SHARE = 0.01
#: The only ``cache_implementation`` values whose cache can be rolled back after a rejection.
_DYNAMIC_CACHES = (None, "dynamic")


@dataclass(frozen=True)
class DecodingPlan:
    """Everything a hf_hetspec call decided before its first forward pass.

    Attributes:
        algorithm: ``"slem"``, ``"tli"`` or ``"slrs"`` (``"auto"`` resolved).
        reason: why that algorithm (:func:`choose_algorithm`).
        schedule: the draft-length schedule (:func:`~hf_hetspec.schedule.choose_schedule` for ``drafter``'s
            runtime, or the call's ``hetspec_schedule``).
        drafter: the drafter as it runs (:func:`~hf_hetspec.runtime.prepare_drafter`): its model (a cached
            copy for most runtimes), the runtime in effect after any fallback, what preparing it cost.
        generation_config: the call's ``GenerationConfig``, merged once from the model's defaults, a passed
            config and the keyword arguments; ``stop_strings`` cleared (the plan carries them).
        model_kwargs: the call's model inputs (``input_ids``, ``attention_mask``, ...), passed on unchanged.
        stop_strings: the call's ``stop_strings`` (``None``, a string or a list of strings).
        target_vocab, drafter_vocab: byte tables padded to each model's LM-head rows.
        identical: both tokenizers spell every id with the same bytes (standard speculative decoding).
        intersection: TLI's vocabulary intersection, else ``None``.
        prefix_map (``torch.LongTensor`` of shape ``(V_drafter,)``): SLRS's longest-target-prefix map, else ``None``.
        draft_temperature: how a sampled TLI or SLRS call drafts (:func:`choose_draft_temperature`): ``0`` the
            drafter's argmax, ``t > 0`` a sample at temperature ``t``; ``None`` for SLEM and greedy calls.
        draft_policy: TLI's and SLRS's draft policy, argmax or sample, its warpers, whether a ``q`` is handed
            to verification (:func:`choose_draft_policy`); ``None`` for SLEM.
        drafter_prompt: ``assistant_input_ids`` as drafter ids, else ``None``.
        verification: ``hetspec_verification``, one of ``VERIFICATIONS`` (:func:`check_verification`).
    """

    algorithm: str
    reason: str
    schedule: Schedule
    drafter: PreparedDrafter
    generation_config: GenerationConfig
    model_kwargs: dict
    stop_strings: object
    target_vocab: Vocabulary
    drafter_vocab: Vocabulary
    identical: bool
    intersection: VocabularyIntersection | None = None
    prefix_map: torch.Tensor | None = None
    draft_temperature: float | None = None
    draft_policy: DraftPolicy | None = None
    drafter_prompt: tuple[int, ...] | None = None
    verification: str = "token"

    @property
    def note(self) -> str:
        """The line :class:`~hf_hetspec.stats.DecodingStats` shows about the pair (empty for most pairs)."""
        return f"identical vocabularies: standard speculative decoding ({self.algorithm})" if self.identical else ""


@dataclass(frozen=True)
class HetspecArguments:
    """hf_hetspec's own ``generate()`` keywords (README "Python API").

    Attributes:
        algorithm: ``hetspec_algorithm`` (default ``"auto"``).
        generator: ``hetspec_generator``, a ``torch.Generator`` on the target's device, or ``None``.
        draft_temperature: ``hetspec_draft_temperature``, a real number >= 0, or ``None``.
        drafter_prompt (``torch.LongTensor`` of shape ``(1, m)``): ``assistant_input_ids``, or ``None``.
        drafter_runtime: ``hetspec_drafter``, the drafter's runtime (:mod:`hf_hetspec.runtime`), default
            ``"auto"``.
        verification: ``hetspec_verification``, ``"token"`` (default) or ``"block"`` (:func:`check_verification`).
        schedule: ``hetspec_schedule``, a :class:`~hf_hetspec.schedule.Schedule` used instead of the default
            (:func:`~hf_hetspec.schedule.check_schedule`), or ``None``.
        loop: ``hetspec_loop``, ``"hetspec"`` (default) or ``"transformers"`` (one of ``LOOPS``).
    """

    algorithm: str = "auto"
    generator: torch.Generator | None = None
    draft_temperature: float | None = None
    drafter_prompt: torch.Tensor | None = None
    drafter_runtime: str = "auto"
    verification: str = "token"
    schedule: Schedule | None = None
    loop: str = "hetspec"

    KEYWORDS = ("hetspec_algorithm", "hetspec_generator", "hetspec_draft_temperature", "assistant_input_ids",
                "hetspec_drafter", "hetspec_verification", "hetspec_schedule", "hetspec_loop")

    @classmethod
    def pop_from(cls, kwargs: dict) -> tuple["HetspecArguments", bool]:
        """Remove hf_hetspec's keywords from ``kwargs``; returns them and whether any was given."""
        values = [kwargs.pop(name, None) for name in cls.KEYWORDS]
        given = any(value is not None for value in values)
        (algorithm, generator, draft_temperature, drafter_prompt, drafter_runtime, verification, schedule,
         loop) = values
        return cls("auto" if algorithm is None else algorithm, generator, draft_temperature, drafter_prompt,
                   "auto" if drafter_runtime is None else drafter_runtime,
                   "token" if verification is None else verification, schedule,
                   "hetspec" if loop is None else loop), given


# --------------------------------------------------------------------------------------------------------
# 1. the call
# --------------------------------------------------------------------------------------------------------


def check_call(target, drafter, target_tokenizer, drafter_tokenizer, args: HetspecArguments,
               inputs, model_kwargs: dict) -> None:
    """Check everything about a call that does not need its generation config.

    Args:
        target, drafter: the models (``drafter`` is ``assistant_model``).
        target_tokenizer, drafter_tokenizer: ``tokenizer=`` and ``assistant_tokenizer=``.
        args: hf_hetspec's keywords.
        inputs (``torch.LongTensor`` of shape ``(1, n)``): the prompt (``inputs=`` or ``input_ids=``).
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
    # hetspec_drafter known and possible for this drafter (a check only: make_plan resolves it when it prepares)
    resolve_runtime(drafter, args.drafter_runtime)
    _check_prompt(inputs, model_kwargs)


def _check_prompt(inputs, model_kwargs: dict) -> None:
    if inputs is None:
        raise ValueError("no prompt: pass the prompt's token ids as `input_ids` (shape (1, n), n >= 1); hf_hetspec "
                         "drafts from token ids and does not take `inputs_embeds`.")
    if not torch.is_tensor(inputs) or inputs.dim() != 2 or inputs.dtype not in (torch.int64, torch.int32):
        raise ValueError("`input_ids` must be an integer tensor of shape (batch, sequence_length).")
    if inputs.shape[0] != 1:
        raise NotImplementedError(
            f"hf_hetspec decodes one sequence at a time; got a batch of {inputs.shape[0]}. "
            "Call generate() once per prompt."
        )
    if inputs.shape[1] < 1:
        raise ValueError("`input_ids` is empty: the prompt needs at least one token.")
    mask = model_kwargs.get("attention_mask")
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
# 2. the generation config
# --------------------------------------------------------------------------------------------------------


def check_generation_config(config: GenerationConfig) -> None:
    """Refuse what the merged generation config asks for and hf_hetspec cannot do exactly.

    Raises:
        ValueError / NotImplementedError: naming the setting and the fix.
    """
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


def choose_draft_temperature(value, algorithm: str, do_sample: bool, identical: bool = False) -> float | None:
    """The draft temperature in effect: ``hetspec_draft_temperature`` when given (checked by
    :func:`check_draft_temperature`), else :data:`DEFAULT_DRAFT_TEMPERATURE` for a sampled TLI or SLRS call
    with different vocabularies, else ``None``: SLEM and greedy calls always draft greedily, and a drafter with
    the target's vocabulary (standard speculative sampling) samples at the call's temperature -- a drafter
    whose ``q`` nears ``p`` is accepted with probability ``sum min(p, q)`` near 1, where a greedy draft stays
    at ``p(argmax)``; the greedy default was measured on heterogeneous pairs only."""
    if value is not None:
        return float(value)
    return DEFAULT_DRAFT_TEMPERATURE if do_sample and algorithm in ("tli", "slrs") and not identical else None


def check_verification(value, algorithm: str, do_sample: bool) -> None:
    """``hetspec_verification``: one of ``VERIFICATIONS``, and ``"block"`` only where it changes something.

    ``"token"`` (the default) is each algorithm's own verification and is accepted everywhere. ``"block"``
    (:func:`hf_hetspec.verify.verify_block`) replaces token-level speculative sampling, so it needs a sampled
    call (``do_sample=True``) with TLI or SLRS, whose drafts come with ``q`` / ``psi`` over target ids. SLEM
    verifies re-tokenized text by exact match and has no ``q``; a greedy call verifies against the argmax,
    where block verification would accept exactly the same prefix (with a one-hot ``p`` its weights are 1 up
    to the first mismatch and 0 after it). There it would be a silent no-op, so it is refused, like a
    positive ``hetspec_draft_temperature``.

    Raises:
        ValueError: an unknown value, or ``"block"`` where it would have no effect.
    """
    if not isinstance(value, str) or value not in VERIFICATIONS:
        raise ValueError(f"hetspec_verification={value!r} is not known; use one of {', '.join(VERIFICATIONS)}.")
    if value == "block" and (algorithm == "slem" or not do_sample):
        raise ValueError(
            "hetspec_verification='block' has no effect here: "
            + ("SLEM verifies by exact match and its drafts have no q over target ids" if algorithm == "slem"
               else "a greedy call (do_sample=False) verifies by exact match against the target's argmax")
            + "; drop the argument (or pass do_sample=True with hetspec_algorithm='tli'/'slrs')."
        )


_OWN_LOOP = "; run the call in hf_hetspec's own loop (`hetspec_loop=\"hetspec\"`, the default), which "
_PER_BLOCK = (
    "transformers' assisted-generation loop checks stopping criteria once per verified block, so it would keep "
    "the tokens of an accepted block past the stop" + _OWN_LOOP + "checks them after every token."
)


def check_loop(args: HetspecArguments, stop_strings, call: dict, model_kwargs: dict) -> None:
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


# --------------------------------------------------------------------------------------------------------
# 3. the algorithm
# --------------------------------------------------------------------------------------------------------


def choose_algorithm(requested: str, *, identical: bool, do_sample: bool, drafter_share: float) -> tuple[str, str]:
    """The algorithm a call runs, and why: the one rule behind ``hetspec_algorithm="auto"``, ``hf-hetspec
    analyze`` and the pairing cards.

    ``auto``: identical vocabularies reduce every algorithm to standard speculative decoding -- SLEM (exact
    match) for greedy calls, TLI (plain speculative sampling) for sampled ones. Different vocabularies: SLEM,
    greedy and sampled: it was measured fastest on both zoo pairs, greedy and at T=1 (the numbers, with their
    settings and dates, are in docs/results.md; ``hf-hetspec bench`` measures a pair). Exact match accepts
    any drafter token whose text the target also writes, needs no intersection, and its acceptance
    probability ``p(x)`` beats TLI's and SLRS's ``min(1, p/q)`` when the drafter is confident and wrong. The
    reasons returned name no measured number (numbers in messages go stale): they point to the docs.

    Args:
        requested: ``hetspec_algorithm`` (``"auto"``, ``"slem"``, ``"tli"`` or ``"slrs"``).
        identical: both tokenizers spell every id with the same bytes.
        do_sample: the call samples.
        drafter_share: share of the drafter's ids in the vocabulary intersection, in ``[0, 1]``.

    Returns:
        ``(algorithm, reason)``.

    Raises:
        ValueError: ``"tli"`` requested for a pair sharing under ``MIN_TLI_SHARE`` of the drafter's tokens.
    """
    if requested != "auto":
        if requested == "tli" and drafter_share < MIN_TLI_SHARE:
            raise ValueError(
                f"hetspec_algorithm='tli': only {drafter_share:.2%} of the drafter's tokens are shared with the "
                f"target (TLI needs at least {MIN_TLI_SHARE:.0%}); use hetspec_algorithm='slem'."
            )
        return requested, "requested"
    if identical:
        if do_sample:
            return "tli", "identical vocabularies: standard speculative sampling (TLI)"
        return "slem", "identical vocabularies: standard speculative decoding with exact match (SLEM)"
    if do_sample:
        return "slem", ("sampling with different vocabularies: exact-match sampling (SLEM) measured fastest on "
                        "both zoo pairs (docs/results.md; measure yours with `hf-hetspec bench`)")
    return "slem", ("greedy with different vocabularies: exact match accepts every drafter token whose text the "
                    "target also writes, with the drafter's whole vocabulary")


# --------------------------------------------------------------------------------------------------------
# the plan
# --------------------------------------------------------------------------------------------------------


def make_plan(target, call: dict, model_kwargs: dict, args: HetspecArguments) -> DecodingPlan:
    """Check a hf_hetspec ``generate()`` call and decide it (the module docstring's steps, in order).

    Args:
        target: the enabled target model.
        call: ``generate()``'s named parameters as given (``inputs``, ``generation_config``,
            ``assistant_model``, ...).
        model_kwargs: every other keyword argument (generation settings and model inputs), with ``tokenizer``
            and ``assistant_tokenizer`` still in it and hf_hetspec's own keywords already removed.
        args: hf_hetspec's keywords.

    Raises:
        ValueError / TypeError / NotImplementedError: with a message naming the argument and the fix.
    """
    model_kwargs = dict(model_kwargs)
    drafter = call.get("assistant_model")
    target_tokenizer = model_kwargs.pop("tokenizer", None)
    drafter_tokenizer = model_kwargs.pop("assistant_tokenizer", None)
    inputs = call.get("inputs")
    if inputs is None:
        inputs = model_kwargs.get("input_ids")
    check_call(target, drafter, target_tokenizer, drafter_tokenizer, args, inputs, model_kwargs)
    drafter_prompt = check_drafter_prompt(args.drafter_prompt, drafter_tokenizer)

    user_config = call.get("generation_config")
    config, rest = target._prepare_generation_config(user_config, **model_kwargs)
    check_generation_config(config)
    check_generate_inputs(call, config, rest)

    target_table, drafter_table = vocabulary(target_tokenizer), vocabulary(drafter_tokenizer)
    identical = target_table.same_as(drafter_table)
    target_vocab = target_table.padded(_rows(target))
    drafter_vocab = drafter_table.padded(_rows(drafter))
    intersection = None
    if args.algorithm == "tli" or (args.algorithm == "auto" and identical and config.do_sample):
        intersection = intersection_for(target_vocab, drafter_vocab)
    share = 1.0 if intersection is None else intersection.drafter_shared / max(1, len(drafter_tokenizer))
    algorithm, reason = choose_algorithm(args.algorithm, identical=identical, do_sample=bool(config.do_sample),
                                         drafter_share=share)
    check_draft_temperature(args.draft_temperature, algorithm, bool(config.do_sample))
    check_verification(args.verification, algorithm, bool(config.do_sample))

    def explicit(name):  # a setting the user gave (keyword or passed GenerationConfig), not a model default
        if model_kwargs.get(name) is not None:
            return model_kwargs[name]
        return getattr(user_config, name, None) if isinstance(user_config, GenerationConfig) else None

    schedule_settings = {name: explicit(name) for name in
                         ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")}
    if args.schedule is not None:
        check_schedule(args.schedule, schedule_settings)
    check_loop(args, config.stop_strings, call, rest)
    check_drafter_weights(drafter)
    # the one resolution of hetspec_drafter: the schedule is that of the runtime that runs, after any fallback
    prepared = prepare_drafter(drafter, args.drafter_runtime)
    schedule = args.schedule or choose_schedule(algorithm, drafter_runtime=prepared.runtime, **schedule_settings)
    draft_temperature = choose_draft_temperature(args.draft_temperature, algorithm, bool(config.do_sample), identical)
    stop_strings, config.stop_strings = config.stop_strings, None
    # transformers tells "20 new tokens by default" from "max_length=20" by whether the call set it: leave the
    # lengths nobody set unset, so its own merge of this config fills them exactly as for plain decoding
    for name in ("max_length", "min_length"):
        if explicit(name) is None and getattr(target.generation_config, name, None) is None:
            setattr(config, name, None)
    return DecodingPlan(
        algorithm=algorithm,
        reason=reason,
        schedule=schedule,
        drafter=prepared,
        generation_config=config,
        model_kwargs=rest,
        stop_strings=stop_strings,
        target_vocab=target_vocab,
        drafter_vocab=drafter_vocab,
        identical=identical,
        intersection=intersection if algorithm == "tli" else None,
        prefix_map=prefix_map_for(target_vocab, drafter_vocab) if algorithm == "slrs" else None,
        draft_temperature=draft_temperature,
        draft_policy=choose_draft_policy(algorithm, config, draft_temperature),
        drafter_prompt=drafter_prompt,
        verification=args.verification,
    )


def _rows(model) -> int:
    """Rows of the model's output layer (its padded vocabulary size); also for a quantized head, whose
    ``weight`` is not a tensor (e.g. ``torch.ao.quantization.quantize_dynamic`` drafters on CPU)."""
    head = model.get_output_embeddings()
    if head is not None and isinstance(getattr(head, "out_features", None), int):
        return head.out_features
    return (head if head is not None else model.get_input_embeddings()).weight.shape[0]


# --------------------------------------------------------------------------------------------------------
# from the plan to a proposer
# --------------------------------------------------------------------------------------------------------


def build_proposer(plan: DecodingPlan, drafter, input_ids: torch.LongTensor, generation_config: GenerationConfig,
                   stats: DecodingStats, generator: torch.Generator | None) -> HeterogeneousProposer:
    """The planned algorithm's proposer for one call.

    Args:
        plan: the call's plan.
        drafter: the drafter model.
        input_ids (``torch.LongTensor`` of shape ``(1, n)``): the prompt in target ids.
        generation_config: the config transformers decodes with (its ``max_length`` is final).
        stats: the call's statistics.
        generator: the call's ``hetspec_generator`` (the drafter's own generator is seeded from it).
    """
    common = dict(
        schedule=plan.schedule,
        max_length=generation_config.max_length,
        stats=stats,
        drafter_prompt=list(plan.drafter_prompt) if plan.drafter_prompt else None,
    )
    args = (plan.target_vocab, drafter, plan.drafter_vocab, input_ids)
    if plan.algorithm == "slem":
        return SLEMProposer(*args, **common)
    common.update(
        policy=plan.draft_policy,
        generator=_drafter_generator(generator, model_device(drafter)),
        target_eos_ids=_eos_ids(generation_config),
    )
    if plan.algorithm == "slrs":
        return SLRSProposer(*args, prefix_map=plan.prefix_map, target_size=len(plan.target_vocab), **common)
    return TLIProposer(*args, intersection=plan.intersection, **common)


def choose_draft_policy(algorithm: str, config: GenerationConfig, draft_temperature: float | None) -> DraftPolicy | None:
    """How TLI and SLRS draft in this call (:class:`~hf_hetspec.proposer.DraftPolicy`): a greedy call drafts the
    argmax and verifies by exact match; a sampled one hands verification a ``q``, and draws each token from it
    unless ``draft_temperature`` (:func:`choose_draft_temperature`) is ``0`` (the argmax, one-hot ``q``).
    ``None`` for SLEM."""
    if algorithm == "slem":
        return None
    if not config.do_sample:
        return DraftPolicy()
    return DraftPolicy(sample=draft_temperature != 0, warpers=drafter_warpers(config, draft_temperature), needs_q=True)


def drafter_warpers(config: GenerationConfig, draft_temperature: float | None = None) -> LogitsProcessorList:
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
