"""A hf_hetspec ``generate()`` call, decided once before any work: a frozen :class:`DecodingPlan`.

The plan is made by small named steps, each the one source of its rule. Every refusal is in
:mod:`hf_hetspec.checks`; the plan calls them, and decides the rest:

1. :func:`~hf_hetspec.checks.check_call` and :func:`~hf_hetspec.checks.check_drafter_prompt` -- the models,
   tokenizers, prompt, mask, positions and hf_hetspec's own keywords;
2. :func:`~hf_hetspec.checks.check_generation_config` -- what the merged ``GenerationConfig`` asks for (beams,
   caches, ...), and :func:`~hf_hetspec.checks.check_generate_inputs` -- every other argument, honoured or
   refused;
3. :func:`choose_algorithm` -- what ``hetspec_algorithm="auto"`` resolves to, and why (``hf-hetspec analyze``
   and the pairing cards recommend through the same function); then
   :func:`~hf_hetspec.checks.check_draft_temperature` and :func:`~hf_hetspec.checks.check_verification`, the
   keywords that make sense only for some algorithms, :func:`~hf_hetspec.checks.check_schedule` (a call's own
   ``hetspec_schedule``), :func:`~hf_hetspec.checks.check_batch` -- what a batch cannot have -- and
   :func:`~hf_hetspec.checks.check_loop` -- what transformers' loop (``hetspec_loop="transformers"``) cannot
   honour;
4. :func:`~hf_hetspec.checks.check_drafter_weights`, then :func:`hf_hetspec.packed_target.prepare_target` -- the
   target's layers as they compute in the call (``hetspec_target``), which set ``v``
   (:func:`~hf_hetspec.schedule.verify_cost`) -- and :func:`hf_hetspec.runtime.prepare_drafter` -- the drafter in
   the runtime that really runs (``hetspec_drafter``, resolved here once, after any fallback; no copy where the
   source policy never drafts, :func:`hf_hetspec.sources.never_drafts`);
5. :func:`hf_hetspec.schedule.choose_schedule` -- the draft-length schedule (lookahead, adaptation, confidence
   stop) of that runtime, or the call's own ``hetspec_schedule``; then :func:`choose_draft_temperature` and
   :func:`choose_draft_policy`, how TLI and SLRS draft.

:func:`make_plan` runs them in that order on the generation config merged once from the call
(``target._prepare_generation_config``); :func:`build_proposer` turns a plan into the algorithm's proposer
for the prompt transformers hands to the decoding loop. Every check raises before a forward pass and before
the target's or the drafter's copy is made, with a message that names the argument and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig, LogitsProcessorList
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from .alignment import Vocabulary, vocabulary
from .calibration import measured_cost_ratio, measured_verify_cost, needs_measured_cost_ratio, needs_measuring
from .checks import (  # noqa: F401 -- the constants and the checks' old import path (plan.check_call, ...)
    ALGORITHMS,
    HETSPEC_KEYWORDS,
    IMPLEMENTED,
    LOOPS,
    VERIFICATIONS,
    check_batch,
    check_call,
    check_draft_temperature,
    check_drafter_prompt,
    check_drafter_weights,
    check_generate_inputs,
    check_generation_config,
    check_loop,
    check_schedule,
    check_verification,
)
from .drafter import model_device
from .intersection import VocabularyIntersection, intersection_for, prefix_map_for
from .proposer import DraftPolicy, HeterogeneousProposer, Proposer
from .packed_target import PreparedTarget, prepare_target
from .runtime import PreparedDrafter, prepare_drafter, resolve_runtime
from .schedule import (  # noqa: F401 -- re-exported: the schedule's old import path
    COST_RATIOS,
    DEFAULT_LOOKAHEAD,
    VERIFY_COST,
    MAX_LOOKAHEAD,
    SLEM_DEFAULTS,
    TOKEN_LEVEL_FLOORS,
    DraftStop,
    Schedule,
    SlemDefault,
    choose_schedule,
    verify_cost,
)
from .slem import SLEMProposer
from .sources import never_drafts, with_sources
from .slrs import SLRSProposer
from .stats import DecodingStats
from .tli import TLIProposer

#: How TLI and SLRS draft in a sampled call of a heterogeneous pair without ``hetspec_draft_temperature``
#: (:func:`choose_draft_temperature`): ``0``, the drafter's argmax (over the intersection for TLI, of ``psi`` for
#: SLRS), verified by exact-match sampling, so a draft token ``x`` is accepted with probability ``p(x)`` (as
#: speculative sampling against the one-hot ``q`` it came from would, :class:`~hf_hetspec.proposer.DraftPolicy`). A sample of ``q`` at the call's temperature (Algorithms 3 and 4 as
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
        verify_cost: ``v`` of the target as it computes (:func:`~hf_hetspec.schedule.verify_cost`).
        cost_ratio: ``c`` of the drafter as it runs, measured on this device
            (:func:`~hf_hetspec.calibration.measured_cost_ratio`: a large target off the CPU), else ``None``: the
            table's value for its runtime (:data:`~hf_hetspec.schedule.COST_RATIOS`).
        drafts_note: why the call draws no drafts where a measured ``c`` rules them out (empty otherwise).
        target: the target's runtime in this call (:func:`~hf_hetspec.packed_target.prepare_target`): its
            layers as they are, or packed as fp16 on a CPU without bf16 instructions.
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
    verify_cost: float = VERIFY_COST
    cost_ratio: float | None = None
    drafts_note: str = ""
    target: PreparedTarget = field(default_factory=lambda: PreparedTarget("eager"))

    @property
    def note(self) -> str:
        """The line :class:`~hf_hetspec.stats.DecodingStats` shows about the pair (empty for most pairs)."""
        pair = f"identical vocabularies: standard speculative decoding ({self.algorithm})" if self.identical else ""
        return "; ".join(filter(None, (pair, self.drafts_note)))


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
            (:func:`~hf_hetspec.checks.check_schedule`), or ``None``.
        loop: ``hetspec_loop``, ``"hetspec"`` (default) or ``"transformers"`` (one of ``LOOPS``).
        target_runtime: ``hetspec_target``, how the target's layers compute (:mod:`hf_hetspec.packed_target`),
            default ``"auto"``.
    """

    algorithm: str = "auto"
    generator: torch.Generator | None = None
    draft_temperature: float | None = None
    drafter_prompt: torch.Tensor | None = None
    drafter_runtime: str = "auto"
    verification: str = "token"
    schedule: Schedule | None = None
    loop: str = "hetspec"
    target_runtime: str = "auto"

    KEYWORDS = HETSPEC_KEYWORDS

    @classmethod
    def pop_from(cls, kwargs: dict) -> tuple["HetspecArguments", bool]:
        """Remove hf_hetspec's keywords from ``kwargs``; returns them and whether any was given."""
        values = [kwargs.pop(name, None) for name in cls.KEYWORDS]
        given = any(value is not None for value in values)
        (algorithm, generator, draft_temperature, drafter_prompt, drafter_runtime, verification, schedule,
         loop, target_runtime) = values
        return cls("auto" if algorithm is None else algorithm, generator, draft_temperature, drafter_prompt,
                   "auto" if drafter_runtime is None else drafter_runtime,
                   "token" if verification is None else verification, schedule,
                   "hetspec" if loop is None else loop, "auto" if target_runtime is None else target_runtime), given


# --------------------------------------------------------------------------------------------------------
# the algorithm, and how TLI and SLRS draft
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


def choose_draft_temperature(value, algorithm: str, do_sample: bool, identical: bool = False) -> float | None:
    """The draft temperature in effect: ``hetspec_draft_temperature`` when given (checked by
    :func:`~hf_hetspec.checks.check_draft_temperature`), else :data:`DEFAULT_DRAFT_TEMPERATURE` for a sampled
    TLI or SLRS call with different vocabularies, else ``None``: SLEM and greedy calls always draft
    greedily, and a drafter with the target's vocabulary (standard speculative sampling) samples at the call's
    temperature -- a drafter whose ``q`` nears ``p`` is accepted with probability ``sum min(p, q)`` near 1, where
    a greedy draft stays at ``p(argmax)``; the greedy default was measured on heterogeneous pairs only."""
    if value is not None:
        return float(value)
    return DEFAULT_DRAFT_TEMPERATURE if do_sample and algorithm in ("tli", "slrs") and not identical else None


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
    check_verification(args.verification, algorithm, bool(config.do_sample), args.draft_temperature)

    def explicit(name):  # a setting the user gave (keyword or passed GenerationConfig), not a model default
        if model_kwargs.get(name) is not None:
            return model_kwargs[name]
        return getattr(user_config, name, None) if isinstance(user_config, GenerationConfig) else None

    schedule_settings = {name: explicit(name) for name in
                         ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")}
    if args.schedule is not None:
        check_schedule(args.schedule, schedule_settings)
    check_batch(target, args, call, config, rest)
    check_loop(args, config.stop_strings, call, rest)
    check_drafter_weights(drafter)
    prepared_target = prepare_target(target, args.target_runtime)
    target_verify_cost = verify_cost(model_device(target), target.dtype, prepared_target.runtime)
    if needs_measuring(target, prepared_target.runtime):  # a CPU target's own layers: no table knows its v
        measured = measured_verify_cost(target)
        target_verify_cost = target_verify_cost if measured is None else measured

    def schedule_for(runtime: str) -> Schedule:
        return args.schedule or choose_schedule(algorithm, drafter_runtime=runtime, verify_cost=target_verify_cost,
                                                sample=bool(config.do_sample), **schedule_settings)

    # no drafter copy where the call's source policy (either loop's) will never draft
    planned_runtime = resolve_runtime(drafter, args.drafter_runtime)[0]
    planned = schedule_for(planned_runtime)
    drafts = not never_drafts(planned.back_off, *policy_costs(planned, target_verify_cost,
                                                               COST_RATIOS[planned_runtime]))
    # the one resolution of hetspec_drafter: the schedule is that of the runtime that runs, after any fallback
    prepared = prepare_drafter(drafter, args.drafter_runtime, drafts=drafts)
    schedule = schedule_for(prepared.runtime)
    # off the CPU both models' eager steps are launch-bound: no table knows c there (hf_hetspec.calibration)
    measured_c = (measured_cost_ratio(target, prepared.model, prepared.runtime)
                  if drafts and needs_measured_cost_ratio(target) else None)
    drafts_note = ""
    if measured_c is not None and schedule.cost_ratio is None and never_drafts(
            schedule.back_off, *policy_costs(schedule, target_verify_cost, measured_c)):
        drafts_note = (f"no drafts: a drafter step ({prepared.runtime}) costs {measured_c:.2f} target steps on this "
                       "device (measured), so no draft can pay"
                       + ("; hetspec_drafter='compiled' replays the step as one CUDA graph (needs Triton)"
                          if prepared.runtime != "compiled" and model_device(target).type == "cuda" else ""))
    draft_temperature = choose_draft_temperature(args.draft_temperature, algorithm, bool(config.do_sample), identical)
    if args.verification == "block" and draft_temperature == 0:  # block verification needs drafts with a q
        draft_temperature = float(config.temperature or 1.0)
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
        verify_cost=target_verify_cost,
        cost_ratio=measured_c,
        drafts_note=drafts_note,
        target=prepared_target,
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
                   stats: DecodingStats, generator: torch.Generator | None, *, tree: bool = False) -> Proposer:
    """The planned algorithm's proposer for one call, with the schedule's draft sources
    (:mod:`hf_hetspec.sources`: context lookup, back-off).

    Args:
        plan: the call's plan.
        drafter: the drafter model.
        input_ids (``torch.LongTensor`` of shape ``(1, n)``): the prompt in target ids.
        generation_config: the config transformers decodes with (its ``max_length`` is final).
        stats: the call's statistics.
        generator: the call's ``hetspec_generator`` (the drafter's own generator is seeded from it).
        tree: the loop verifies draft trees (:mod:`hf_hetspec.tree`, one row): SLEM's drafts and TLI's and
            SLRS's argmax drafts then carry sibling branches by the schedule's ``sibling_min_joint`` and
            ``sibling_runner_ups``.
    """
    common = dict(
        schedule=plan.schedule,
        max_length=generation_config.max_length,
        stats=stats,
        drafter_prompt=list(plan.drafter_prompt) if plan.drafter_prompt else None,
    )
    args = (plan.target_vocab, drafter, plan.drafter_vocab, input_ids)
    if plan.algorithm == "slem":
        siblings = plan.schedule.sibling_min_joint if tree else 0.0
        proposer = SLEMProposer(*args, sibling_min_joint=siblings, runner_ups=plan.schedule.sibling_runner_ups,
                                **common)
        return _with_sources(plan, proposer, input_ids, generation_config, stats)
    common.update(
        policy=plan.draft_policy,
        generator=_drafter_generator(generator, model_device(drafter)),
        target_eos_ids=_eos_ids(generation_config),
    )
    common.update(sibling_min_joint=plan.schedule.sibling_min_joint if tree else 0.0,
                  runner_ups=plan.schedule.sibling_runner_ups)
    if plan.algorithm == "slrs":
        proposer = SLRSProposer(*args, prefix_map=plan.prefix_map, target_size=len(plan.target_vocab), **common)
    else:
        proposer = TLIProposer(*args, intersection=plan.intersection, **common)
    return _with_sources(plan, proposer, input_ids, generation_config, stats)


def policy_costs(schedule: Schedule, verify_cost: float, cost_ratio: float) -> tuple[float, float]:
    """``(v, c)`` the source policy counts (:func:`hf_hetspec.sources.never_drafts`): the schedule's own figures
    where it sets them (``Schedule(verify_cost=..., cost_ratio=...)``), else ``verify_cost`` and ``cost_ratio``
    (the target's and the drafter runtime's, measured or from the tables)."""
    return (schedule.verify_cost if schedule.verify_cost is not None else verify_cost,
            schedule.cost_ratio if schedule.cost_ratio is not None else cost_ratio)


def _with_sources(plan: DecodingPlan, proposer, input_ids, generation_config, stats) -> Proposer:
    """``proposer`` with the schedule's context lookup and back-off (:func:`hf_hetspec.sources.with_sources`),
    counting the drafter's steps at the cost ratio of the runtime that really runs (the schedule's, else the one
    measured on this device, else its runtime's table value)."""
    schedule = plan.schedule
    v, cost_ratio = policy_costs(schedule, plan.verify_cost, plan.cost_ratio if plan.cost_ratio is not None
                                 else COST_RATIOS[plan.drafter.runtime])
    return with_sources(proposer, input_ids, cost_ratio=cost_ratio, verify_cost=v,
                        lookup=schedule.context_lookup, back_off=schedule.back_off,
                        max_length=generation_config.max_length, stats=stats)


def choose_draft_policy(algorithm: str, config: GenerationConfig, draft_temperature: float | None) -> DraftPolicy | None:
    """How TLI and SLRS draft in this call (:class:`~hf_hetspec.proposer.DraftPolicy`): a greedy call drafts the
    argmax and verifies by exact match; a sampled one draws each token from ``q`` and hands ``q`` to
    verification, unless ``draft_temperature`` (:func:`choose_draft_temperature`) is ``0``: the drafter's argmax,
    verified by exact-match sampling, which accepts each token with the same probability as speculative
    sampling against a one-hot ``q`` (``p(x)``) and samples the same residual after a rejection, without a
    ``(k, V_target)`` tensor per draft. ``None`` for SLEM."""
    if algorithm == "slem":
        return None
    if not config.do_sample:
        return DraftPolicy()
    sample = draft_temperature != 0
    return DraftPolicy(sample=sample, warpers=drafter_warpers(config, draft_temperature), needs_q=sample)


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
