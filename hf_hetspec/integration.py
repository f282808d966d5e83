"""The only module that touches transformers' generation internals.

``enable(model)`` puts a ``generate`` wrapper on the model *instance* (the class is untouched;
``disable(model)`` deletes it again). When ``generate()`` is called with ``assistant_model=``, the wrapper

1. decides the call before any work (:func:`hf_hetspec.plan.make_plan`: clear errors that name the argument
   and the fix, the algorithm, the drafter in its runtime, the draft schedule, the generation config merged
   once);
2. calls transformers' own ``generate()`` with that config and ``custom_generate=`` set to our decoding loop
   (:func:`~hf_hetspec.decoding.speculative_generate`), so the logits processors, stopping criteria, streamer
   and KV cache are prepared by transformers exactly as for plain decoding; the loop builds the algorithm's
   proposer (:func:`hf_hetspec.plan.build_proposer`) for the prompt transformers hands it; a batch (several
   rows or a padded one) goes to :func:`hf_hetspec.batched.batched_generate`, one proposer per row.

Only token ids and text cross between the models: the call's ``attention_mask``,
``position_ids`` and cache are the target's and never reach the drafter, whose sequence has another length
(it numbers its own positions and keeps its own cache); ``assistant_input_ids=`` gives the drafter its own
prompt (e.g. its own chat template, :func:`hf_hetspec.chat_inputs`).

With ``hetspec_loop="transformers"`` step 2 hands transformers' own ``_assisted_decoding`` the algorithm's
``CandidateGenerator`` (:mod:`hf_hetspec.candidates`) instead, through :func:`assisted_decoding_with`.

Without ``assistant_model`` the call goes to transformers unchanged. Supported: transformers 5.x
(``custom_generate`` callables and ``GenerationMixin._prepare_generation_config``); the contract test
``tests/test_integration.py`` pins what is used.
"""

from __future__ import annotations

import copy
import inspect
import threading
import time
import types
import weakref
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel, StoppingCriteriaList, StopStringCriteria
from transformers.generation.utils import GenerationMixin

from .candidates import GENERATORS, HetspecCandidateGenerator
from .batched import batched_generate
from .compat import cache_from_kwargs
from .decoding import speculative_generate
from .plan import DecodingPlan, HetspecArguments, build_proposer, make_plan
from .stats import DecodingStats

_GENERATE_SIGNATURE = inspect.signature(GenerationMixin.generate)
# Statistics per thread and per model: two threads generating on one target each read their own call's.
_THREAD = threading.local()
_MARK = "_hf_hetspec_enabled"
_SAVED = "_hf_hetspec_saved_generate"
_REDUCE = "__reduce_ex__"
#: The method of transformers' ``_assisted_decoding`` that builds its candidate generator (overridden on the
#: instance for one call by :func:`assisted_decoding_with`).
_GET_CANDIDATE_GENERATOR = "_get_candidate_generator"


def enable(model: PreTrainedModel) -> PreTrainedModel:
    """Install hf_hetspec on ``model`` (idempotent). Returns ``model``.

    After this, ``model.generate(..., assistant_model=drafter, tokenizer=target_tokenizer,
    assistant_tokenizer=drafter_tokenizer, hetspec_algorithm="slem")`` runs heterogeneous-vocabulary
    speculative decoding. Only the instance gets a ``generate`` attribute (and a ``__reduce_ex__``, so that
    ``pickle``, ``torch.save`` and ``copy`` give an enabled copy bound to itself); weights, configs and the
    generation config are not touched. A ``generate`` already on the instance (another library's wrapper) is
    kept and called through.

    ``generate()`` keyword arguments added by hf_hetspec (all need ``assistant_model=``):

    * ``hetspec_algorithm``: ``"auto"`` (default), ``"slem"``, ``"tli"`` or ``"slrs"``.
    * ``hetspec_generator`` (``torch.Generator`` on the target's device): randomness of a sampled call.
    * ``hetspec_drafter``: the drafter's runtime, ``"auto"`` (default), ``"eager"``, ``"float32"``, ``"int8"``
      or ``"int8-static"`` (:mod:`hf_hetspec.runtime`): a faster copy of the drafter, made once and cached
      while the drafter lives; the drafter passed in is never changed and the output distribution never
      depends on the runtime. Refused before any work (``ValueError``) when unknown, or an int8 runtime for a
      drafter off the CPU.
    * ``hetspec_draft_temperature`` (float >= 0, TLI and SLRS with ``do_sample=True``): how the drafter picks
      its draft tokens. ``0``: its argmax, verified by exact-match sampling (acceptance ``p(x)``, as speculative
      sampling against its one-hot ``q`` would give); the default with different vocabularies
      (:data:`hf_hetspec.plan.DEFAULT_DRAFT_TEMPERATURE`). ``t > 0``: a sample of its distribution at
      temperature ``t`` (the call's top-k/top-p still apply; ``t`` = the call's temperature is Algorithms 3 and
      4 as written, and the default with the target's own vocabulary). The output has the target's
      distribution whatever the value: only the speed changes (docs/api.md "Draft temperature").
    * ``hetspec_verification``: ``"token"`` (default) or ``"block"``: how TLI and SLRS verify a sampled draft,
      token by token (speculative sampling) or as a block (Sun et al.'s block verification,
      :func:`hf_hetspec.verify.verify_block`; accepts at least as many tokens in expectation). Both keep the
      target's distribution exactly. ``"block"`` is refused before any work (``ValueError``) for SLEM and for
      greedy calls, which verify by exact match and where it would change nothing (docs/verification.md).
    * ``hetspec_loop``: ``"hetspec"`` (default) or ``"transformers"``: whose draft-verify loop runs the call --
      hf_hetspec's own (:func:`~hf_hetspec.decoding.speculative_generate`) or transformers'
      ``_assisted_decoding`` with the algorithm's ``CandidateGenerator`` (:mod:`hf_hetspec.candidates`, put in
      place for this call only by :func:`assisted_decoding_with`). Both are exact; in transformers' loop
      ``hetspec_generator``, ``hetspec_verification="block"``, ``stop_strings``, ``stopping_criteria`` and a
      passed cache are refused before any work (``ValueError``,
      :func:`hf_hetspec.checks.check_loop`).
    * ``hetspec_schedule`` (:class:`hf_hetspec.Schedule`): the draft schedule of this call -- first lookahead,
      +2/-1 adaptation and its floor, confidence stop (:class:`hf_hetspec.DraftStop`) -- instead of the default
      for the algorithm and drafter runtime (:mod:`hf_hetspec.schedule`). Refused before any work with
      ``num_assistant_tokens``, ``num_assistant_tokens_schedule`` or ``assistant_confidence_threshold`` (one of
      the two would be dropped), and when a lookahead is below 1 or a cut-off outside ``[0, 1)``. Changes speed
      only.
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
    _install(model)
    return model


def _install(model) -> None:
    """Put hf_hetspec's ``generate`` and pickling hook on ``model``'s instance dict (bound to ``model``)."""
    model.__dict__["generate"] = types.MethodType(_generate, model)
    model.__dict__[_REDUCE] = types.MethodType(_reduce_enabled, model)
    model.__dict__[_MARK] = True


def _reduce_enabled(model, protocol: int):
    """``__reduce_ex__`` of an enabled model (``pickle``, ``torch.save``, ``copy.copy``, ``copy.deepcopy``).

    The model is reduced as its class would reduce it, minus the bound methods hf_hetspec installed (a bound
    method pickles by name and would point at the original); the copy is enabled again as it is created, so
    its ``generate`` is bound to the copy. A ``generate`` that was on the instance before :func:`enable`
    travels in the state as before.
    """
    create, args, state, *rest = type(model).__reduce_ex__(model, protocol)
    if isinstance(state, dict):
        state = {k: v for k, v in state.items() if k not in ("generate", _REDUCE, _MARK)}
    return (_create_enabled, (create, args), state, *rest)


def _create_enabled(create, args):
    """Create the object as its class's reduction would, then enable it (state is set afterwards)."""
    model = create(*args)
    _install(model)
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
    model.__dict__.pop(_REDUCE, None)
    del model.__dict__[_MARK]
    return model


@contextmanager
def assisted_decoding_with(model: PreTrainedModel, candidate_generator: HetspecCandidateGenerator):
    """Make ``model._assisted_decoding`` use ``candidate_generator`` inside the ``with`` block.

    transformers 5.x has no argument for a candidate generator: ``_assisted_decoding`` builds its own with
    ``self._get_candidate_generator(...)``. This puts a ``_get_candidate_generator`` returning
    ``candidate_generator`` on the *instance* (the class is untouched) and deletes it when the block ends,
    also on an exception. Not re-entrant: one such block per model at a time (two threads decoding on one
    target in transformers' loop would share the hook).

    Example (docs/api.md "transformers' loop")::

        generator = hf_hetspec.TLICandidateGenerator.for_call(target, drafter, input_ids, config,
                                                               tokenizer=tok, assistant_tokenizer=dtok)
        with hf_hetspec.assisted_decoding_with(target, generator):
            out = target._assisted_decoding(input_ids, logits_processor, stopping_criteria, config, **kwargs)

    Raises:
        RuntimeError: a block for ``model`` is already open.
    """
    if _GET_CANDIDATE_GENERATOR in model.__dict__:
        raise RuntimeError(
            "another call on this model is already running transformers' loop with an hf_hetspec candidate "
            "generator (another thread?): run one such call per model at a time, or use hetspec_loop='hetspec'."
        )
    model.__dict__[_GET_CANDIDATE_GENERATOR] = lambda *args, **kwargs: candidate_generator
    try:
        yield candidate_generator
    finally:
        model.__dict__.pop(_GET_CANDIDATE_GENERATOR, None)


def is_enabled(model: PreTrainedModel) -> bool:
    """Whether :func:`enable` is in effect on ``model``."""
    return bool(model.__dict__.get(_MARK))


def last_stats(model: PreTrainedModel) -> DecodingStats | None:
    """Statistics of the last hf_hetspec ``generate()`` call on ``model`` *in the calling thread* (``None``
    before the first). Two threads generating on the same target each get their own call's statistics."""
    return _stats_by_model().get(model)


def _stats_by_model() -> "weakref.WeakKeyDictionary[PreTrainedModel, DecodingStats]":
    """This thread's ``{model: statistics of its last call}`` (weak keys: a dropped model is not kept)."""
    if not hasattr(_THREAD, "last_stats"):
        _THREAD.last_stats = weakref.WeakKeyDictionary()
    return _THREAD.last_stats


class _HetSpecDecoding:
    """The ``custom_generate`` callable handed to transformers' ``generate()``.

    Stop strings are turned into a ``StopStringCriteria`` by the wrapper, and the streamer travels here,
    because transformers 5.x hands neither ``tokenizer`` nor ``streamer`` on when ``custom_generate`` is a
    callable (it keeps only the keyword arguments that ``_sample`` does not declare).
    """

    def __init__(self, plan: DecodingPlan, drafter, stats: DecodingStats, generator: torch.Generator | None,
                 streamer=None):
        self.plan = plan
        self.drafter = drafter
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
        mask = model_kwargs.get("attention_mask")
        if input_ids.shape[0] > 1 or (mask is not None and not bool((mask == 1).all())):
            out = self._batch(model, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs)
            self.stats.total_s = time.perf_counter() - began
            return out
        # the proposer times its own conversion of the prompt (translation_s): not timed again here
        proposer = build_proposer(self.plan, self.drafter, input_ids, generation_config, self.stats, self.generator,
                                  tree=True)
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
            verification=self.plan.verification,
        )
        self.stats.total_s = time.perf_counter() - began
        return out

    def _batch(self, model, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs):
        """Several rows, or a padded one: :func:`hf_hetspec.batched.batched_generate`, one proposer per row."""

        def make_proposer(row_ids, max_length):
            config = copy.copy(generation_config)
            config.max_length = max_length  # the row's own length budget: the call's minus its padding
            return build_proposer(self.plan, self.drafter, row_ids, config, self.stats, self.generator)

        return batched_generate(model, input_ids, logits_processor, stopping_criteria, generation_config,
                                make_proposer, self.stats, attention_mask=model_kwargs.get("attention_mask"),
                                position_ids=model_kwargs.get("position_ids"),
                                past_key_values=cache_from_kwargs(model_kwargs), generator=self.generator,
                                verification=self.plan.verification, verify_cost=self.plan.verify_cost,
                                rows_per_pass=self.plan.target.rows_per_pass)


class _TransformersLoop:
    """The ``custom_generate`` callable of a ``hetspec_loop="transformers"`` call: transformers' own
    ``_assisted_decoding`` with the plan's candidate generator (:mod:`hf_hetspec.candidates`), on the inputs
    transformers prepared exactly as for plain decoding. The streamer travels here for the reason given in
    :class:`_HetSpecDecoding`."""

    def __init__(self, plan: DecodingPlan, drafter, stats: DecodingStats, streamer=None):
        self.plan = plan
        self.drafter = drafter
        self.stats = stats
        self.streamer = streamer

    def __call__(self, model, input_ids, logits_processor=None, stopping_criteria=None, generation_config=None,
                 synced_gpus=False, streamer=None, **model_kwargs):
        began = time.perf_counter()
        generator = GENERATORS[self.plan.algorithm].from_plan(self.plan, self.drafter, input_ids, generation_config,
                                                              self.stats)
        if self.streamer is not None:
            self.streamer.put(input_ids.cpu())
        with assisted_decoding_with(model, generator):
            out = model._assisted_decoding(input_ids, logits_processor, stopping_criteria, generation_config,
                                           synced_gpus=False, streamer=self.streamer, **model_kwargs)
        sequences = out.sequences if hasattr(out, "sequences") else out
        self.stats.prompt_tokens = input_ids.shape[1]
        self.stats.new_tokens = sequences.shape[1] - input_ids.shape[1]
        self.stats.drafter_truncated_tokens = generator.proposer.truncated_tokens
        self.stats.total_s = time.perf_counter() - began
        return out


def _generate(self, *args, **kwargs):
    bound = _GENERATE_SIGNATURE.bind_partial(self, *args, **kwargs)
    call = dict(bound.arguments)
    call.pop("self")
    extra = call.pop("kwargs", {})
    hetspec, given = HetspecArguments.pop_from(extra)
    # a generate another library put on the instance before enable() is called through, not bypassed
    original = self.__dict__.get(_SAVED) or types.MethodType(type(self).generate, self)
    if call.get("assistant_model") is None:
        if given:
            raise ValueError(
                f"`{'`/`'.join(HetspecArguments.KEYWORDS)}` were given without `assistant_model`: pass the "
                "drafter as `assistant_model=` (or drop these arguments for plain decoding)."
            )
        return original(**call, **extra)

    plan = make_plan(self, call, extra, hetspec)
    prepared = plan.drafter  # the drafter's runtime (hf_hetspec.runtime): a copy made once per drafter, cached
    stats = DecodingStats(algorithm=plan.algorithm, verification=plan.verification,
                          note="; ".join(filter(None, (plan.note, prepared.note, plan.target.note))),
                          drafter_runtime=prepared.runtime, drafter_prepare_s=prepared.prepare_s,
                          drafter_memory_bytes=prepared.memory_bytes, target_runtime=plan.target.runtime,
                          target_prepare_s=plan.target.prepare_s, target_memory_bytes=plan.target.memory_bytes)
    _stats_by_model()[self] = stats
    if plan.stop_strings:
        # transformers drops `tokenizer` for custom_generate callables, so it cannot build this criterion
        criteria = StoppingCriteriaList(call.get("stopping_criteria") or [])
        criteria.append(StopStringCriteria(tokenizer=extra["tokenizer"], stop_strings=plan.stop_strings))
        call["stopping_criteria"] = criteria
    # transformers does not hand `streamer` to custom_generate callables either: we stream ourselves
    streamer = call.pop("streamer", None)
    call.pop("assistant_model")
    call["generation_config"] = plan.generation_config
    if hetspec.loop == "transformers":
        call["custom_generate"] = _TransformersLoop(plan, prepared.model, stats, streamer)
    else:
        call["custom_generate"] = _HetSpecDecoding(plan, prepared.model, stats, hetspec.generator, streamer)
    with torch.no_grad(), plan.target.running():
        return original(**call, **plan.model_kwargs)
