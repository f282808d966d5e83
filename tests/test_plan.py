"""hf_hetspec.plan: each named step of deciding a call, and the plan a real call gets."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from transformers import GenerationConfig

import hf_hetspec
from conftest import ForwardCounter
from conftest import hetspec_generate as _hetspec
from hf_hetspec import plan, runtime
from hf_hetspec.drafter import DraftStop
from hf_hetspec.plan import (
    HetspecArguments,
    check_draft_temperature,
    check_drafter_prompt,
    check_generation_config,
    check_verification,
    choose_algorithm,
    choose_draft_temperature,
    choose_schedule,
    make_plan,
)


@pytest.mark.parametrize(
    "identical, do_sample, expected",
    [(False, False, "slem"), (False, True, "slem"), (True, False, "slem"), (True, True, "tli")],
)
def test_auto_rule(identical, do_sample, expected):
    algorithm, reason = choose_algorithm("auto", identical=identical, do_sample=do_sample, drafter_share=0.5)
    assert algorithm == expected and reason
    # issue #25: a measured number in a message goes stale (it said 1.1-1.3x where the README had 1.8x)
    assert not re.search(r"\d(\.\d+)?x\b", reason), reason
    if "measured" in reason:
        assert "docs/results.md" in reason


@pytest.mark.parametrize("requested", ["slem", "tli", "slrs"])
def test_a_requested_algorithm_is_kept(requested):
    assert choose_algorithm(requested, identical=False, do_sample=True, drafter_share=0.5)[0] == requested


def test_tli_needs_a_shared_vocabulary():
    with pytest.raises(ValueError, match="hetspec_algorithm='tli'.*slem"):
        choose_algorithm("tli", identical=False, do_sample=True, drafter_share=plan.MIN_TLI_SHARE / 2)
    assert choose_algorithm("slrs", identical=False, do_sample=True, drafter_share=0.0)[0] == "slrs"


def test_default_schedules_per_algorithm():
    slem = choose_schedule("slem")
    assert (slem.lookahead, slem.adaptive) == (plan.SLEM_DEFAULTS["eager"].max_lookahead, False)
    assert slem.stop == DraftStop(0.0, plan.SLEM_DEFAULTS["eager"].min_joint)
    for algorithm in ("tli", "slrs"):
        schedule = choose_schedule(algorithm)
        assert (schedule.lookahead, schedule.adaptive) == (plan.DEFAULT_LOOKAHEAD, True)
        # the +2/-1 rule with SLEM's joint cut-off of the same runtime; a user's per-token threshold replaces it
        assert schedule.stop == DraftStop(0.0, plan.SLEM_DEFAULTS["eager"].min_joint)
        int8 = choose_schedule(algorithm, drafter_runtime="int8-static")
        assert int8.stop == DraftStop(0.0, plan.SLEM_DEFAULTS["int8-static"].min_joint)
        assert choose_schedule(algorithm, assistant_confidence_threshold=0.4).stop == DraftStop(0.4, 0.0)


def test_every_algorithm_drafts_longer_with_a_cheaper_drafter_runtime():
    """Every runtime a plan can resolve to has a SLEM default and a TLI/SLRS floor; the int8 runtimes (c about
    half of eager's) draft longer: SLEM with a lower joint-confidence threshold and a higher cap, TLI and SLRS
    never below 3 drafter tokens (transformers' +2/-1 rule otherwise, as with an eager drafter)."""
    assert set(plan.SLEM_DEFAULTS) == set(plan.TOKEN_LEVEL_FLOORS) == set(runtime.RUNTIMES) - {"auto"}
    eager, int8 = (choose_schedule("slem", drafter_runtime=r) for r in ("eager", "int8-static"))
    assert int8.stop.min_joint < eager.stop.min_joint and int8.lookahead > eager.lookahead
    assert choose_schedule("slem", drafter_runtime="int8") == int8
    for algorithm in ("tli", "slrs"):
        eager, int8 = (choose_schedule(algorithm, drafter_runtime=r) for r in ("eager", "int8-static"))
        assert eager == choose_schedule(algorithm) and eager.adaptive and eager.min_lookahead == 1
        assert int8.adaptive and int8.min_lookahead == 3 and int8.lookahead == eager.lookahead
        # the user's own schedule is transformers' rule, whatever the runtime
        assert choose_schedule(algorithm, drafter_runtime="int8-static", num_assistant_tokens=5,
                               num_assistant_tokens_schedule="heuristic").min_lookahead == 1


def test_the_plan_takes_the_schedule_of_the_runtime_auto_resolves_to(toy_pair, monkeypatch):
    ids = toy_pair.target_tokenizer("the", return_tensors="pt").input_ids
    monkeypatch.setattr(runtime, "AUTO_INT8_MIN_PARAMETERS", 1)
    args = plan.HetspecArguments(algorithm="slem")
    call = {"inputs": ids, "assistant_model": toy_pair.drafter}
    kwargs = {"tokenizer": toy_pair.target_tokenizer, "assistant_tokenizer": toy_pair.drafter_tokenizer,
              "max_new_tokens": 4}
    decided = plan.make_plan(toy_pair.target, call, kwargs, args)
    v = decided.verify_cost  # the float32 toy target's
    assert decided.schedule == choose_schedule("slem", drafter_runtime="int8-static", verify_cost=v)
    monkeypatch.setattr(runtime, "AUTO_INT8_MIN_PARAMETERS", 10**12)
    assert plan.make_plan(toy_pair.target, call, kwargs, args).schedule == choose_schedule("slem", verify_cost=v)
    # and that of the call's kind: a sampled call's SLEM verifies more runner-ups per position
    sampled = plan.make_plan(toy_pair.target, call, dict(kwargs, do_sample=True), args).schedule
    assert sampled == choose_schedule("slem", verify_cost=v, sample=True) and sampled.sibling_runner_ups == 2


def test_explicit_schedules():
    fixed = choose_schedule("slem", num_assistant_tokens=3)
    assert (fixed.lookahead, fixed.adaptive, fixed.stop.enabled) == (3, False, False)
    heuristic = choose_schedule("tli", num_assistant_tokens_schedule="heuristic")
    assert (heuristic.lookahead, heuristic.adaptive) == (plan.DEFAULT_LOOKAHEAD, True)
    # a user's confidence threshold replaces SLEM's joint-confidence stop
    assert choose_schedule("slem", assistant_confidence_threshold=0.4).stop == DraftStop(0.4, 0.0)
    for bad in (1.0, -0.1, "0.5"):
        with pytest.raises(ValueError, match="assistant_confidence_threshold"):
            choose_schedule("slem", assistant_confidence_threshold=bad)


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"num_beams": 2}, "num_beams"),
        ({"use_cache": False}, "use_cache"),
        ({"cache_implementation": "static"}, "cache_implementation"),
        ({"num_assistant_tokens": 0}, "num_assistant_tokens"),
    ],
)
def test_generation_config_refusals(settings, match):
    with pytest.raises((ValueError, NotImplementedError), match=match):
        check_generation_config(GenerationConfig(**settings))
    check_generation_config(GenerationConfig())


def test_draft_temperature_rule():
    check_draft_temperature(None, "slem", False)
    check_draft_temperature(0.0, "tli", True)
    check_draft_temperature(0.7, "slrs", True)
    for bad in (-1.0, float("nan"), True, "1"):
        with pytest.raises(ValueError, match="hetspec_draft_temperature"):
            check_draft_temperature(bad, "tli", True)
    with pytest.raises(ValueError, match="SLEM"):
        check_draft_temperature(0.7, "slem", True)
    with pytest.raises(ValueError, match="greedy call"):
        check_draft_temperature(0.7, "tli", False)


def test_draft_temperature_default():
    """Sampled TLI and SLRS calls of heterogeneous pairs draft the drafter's argmax unless told otherwise; SLEM,
    greedy calls and identical vocabularies have no draft temperature (the call's); a given value is kept."""
    for algorithm in ("tli", "slrs"):
        assert choose_draft_temperature(None, algorithm, True) == plan.DEFAULT_DRAFT_TEMPERATURE
        assert choose_draft_temperature(None, algorithm, False) is None
        assert choose_draft_temperature(0.7, algorithm, True) == 0.7
        assert choose_draft_temperature(None, algorithm, True, identical=True) is None  # standard SD: sampled
    assert choose_draft_temperature(None, "slem", True) is None


def test_verification_rule():
    for algorithm in ("slem", "tli", "slrs"):
        for do_sample in (False, True):
            check_verification("token", algorithm, do_sample)  # the default is every algorithm's own rule
    check_verification("block", "tli", True)
    check_verification("block", "slrs", True)
    for bad in ("blocks", "Token", None, 1):
        with pytest.raises(ValueError, match=r"hetspec_verification=.* is not known; use one of token, block"):
            check_verification(bad, "tli", True)
    with pytest.raises(ValueError, match="'block' has no effect here: SLEM"):
        check_verification("block", "slem", True)
    with pytest.raises(ValueError, match="'block' has no effect here: a greedy call"):
        check_verification("block", "slrs", False)
    assert plan.VERIFICATIONS == ("token", "block")


def test_drafter_prompt_check(toy_sp_tokenizer):
    assert check_drafter_prompt(None, toy_sp_tokenizer) is None
    assert check_drafter_prompt(torch.tensor([[5, 6]]), toy_sp_tokenizer) == (5, 6)
    with pytest.raises(NotImplementedError, match="batch"):
        check_drafter_prompt(torch.tensor([[5], [6]]), toy_sp_tokenizer)
    with pytest.raises(ValueError, match="outside the drafter vocabulary"):
        check_drafter_prompt(torch.tensor([[len(toy_sp_tokenizer)]]), toy_sp_tokenizer)


def test_hetspec_arguments_are_taken_out_of_the_kwargs():
    kwargs = {"hetspec_algorithm": "tli", "max_new_tokens": 3}
    args, given = HetspecArguments.pop_from(kwargs)
    assert given and args.algorithm == "tli" and kwargs == {"max_new_tokens": 3}
    args, given = HetspecArguments.pop_from({})
    assert not given and args == HetspecArguments()
    args, given = HetspecArguments.pop_from({"hetspec_verification": "block"})
    assert given and args.verification == "block" and args.algorithm == "auto"


def test_make_plan_of_a_call(toy_pair):
    ids = toy_pair.target_tokenizer("def add(a, b):", return_tensors="pt").input_ids
    call = {"inputs": ids, "assistant_model": toy_pair.drafter}
    kwargs = {"tokenizer": toy_pair.target_tokenizer, "assistant_tokenizer": toy_pair.drafter_tokenizer,
              "max_new_tokens": 7, "do_sample": True, "stop_strings": ["\n\n"], "attention_mask": torch.ones_like(ids)}
    decided = make_plan(toy_pair.target, call, kwargs, HetspecArguments("slrs"))
    assert decided.algorithm == "slrs" and decided.prefix_map is not None and decided.intersection is None
    assert decided.generation_config.max_new_tokens == 7 and decided.generation_config.do_sample
    # stop strings are the plan's (the hook builds their criterion); the config transformers sees has none
    assert decided.stop_strings == ["\n\n"] and decided.generation_config.stop_strings is None
    assert set(decided.model_kwargs) == {"attention_mask"}  # the tokenizers never reach the target
    assert not decided.identical and decided.note == ""
    assert decided.verification == "token"
    assert decided.draft_temperature == plan.DEFAULT_DRAFT_TEMPERATURE == 0.0  # greedy drafts by default
    sampled = make_plan(toy_pair.target, call, kwargs, HetspecArguments("slrs", draft_temperature=1))
    assert sampled.draft_temperature == 1.0
    block = make_plan(toy_pair.target, call, kwargs, HetspecArguments("slrs", verification="block"))
    assert block.verification == "block"
    with pytest.raises(dataclasses.FrozenInstanceError):
        decided.algorithm = "tli"


def test_the_generation_config_is_merged_once_per_call(toy_pair, monkeypatch):
    """One merge of the model's defaults, a passed config and the keywords: the plan's, handed to transformers
    as the call's config (so transformers' own merge has nothing left to change)."""
    target = toy_pair.target
    ids = toy_pair.target_tokenizer("def add(a, b):", return_tensors="pt").input_ids
    merged = []
    original = type(target)._prepare_generation_config

    def spy(self, generation_config, **kwargs):
        config, model_kwargs = original(self, generation_config, **kwargs)
        merged.append(sorted(k for k in kwargs if hasattr(GenerationConfig(), k)))
        return config, model_kwargs

    monkeypatch.setattr(type(target), "_prepare_generation_config", spy)
    hf_hetspec.enable(target)
    try:
        target.generate(ids, assistant_model=toy_pair.drafter, tokenizer=toy_pair.target_tokenizer,
                        assistant_tokenizer=toy_pair.drafter_tokenizer, max_new_tokens=5, do_sample=False)
    finally:
        hf_hetspec.disable(target)
    # ours with the generation keywords; transformers' own call gets the merged config and no such keyword
    assert merged[0] == ["do_sample", "max_new_tokens"]
    assert all(keys == [] for keys in merged[1:])


# ---------------------------------------------------------------------------------------------------
# Refusals before any forward pass
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("positions", [torch.arange(3), torch.arange(4)[None], torch.arange(3.0)[None]],
                         ids=["1d", "wrong-length", "float"])
def test_bad_position_ids_are_refused(toy_pair, positions):
    counter = ForwardCounter(toy_pair.target, toy_pair.drafter)
    try:
        with pytest.raises(ValueError, match="position_ids"):
            _hetspec(toy_pair, torch.tensor([[5, 6, 7]]), "slem", max_new_tokens=3, position_ids=positions)
    finally:
        counter.close()
    assert counter.count == 0


BAD_DRAFTER_PROMPTS = [
    (torch.tensor([[1.0, 2.0]]), ValueError, "integer"),
    (torch.tensor([5, 6]), ValueError, r"shape \(2,\)"),
    (torch.tensor([[5, 6], [7, 8]]), NotImplementedError, "batch"),
    (torch.ones(1, 0, dtype=torch.long), ValueError, "empty"),
    (torch.tensor([[5, 10_000]]), ValueError, "outside the drafter vocabulary"),
    (torch.tensor([[-1, 5]]), ValueError, "outside the drafter vocabulary"),
    ([[5, 6]], ValueError, "integer tensor"),
]


@pytest.mark.parametrize("value,error,words", BAD_DRAFTER_PROMPTS,
                         ids=["float", "1d", "batch", "empty", "too-large", "negative", "list"])
def test_bad_assistant_input_ids_are_refused(toy_pair, value, error, words):
    counter = ForwardCounter(toy_pair.target, toy_pair.drafter)
    try:
        with pytest.raises(error, match=words) as info:
            _hetspec(toy_pair, torch.tensor([[5, 6, 7]]), "slem", max_new_tokens=3, assistant_input_ids=value)
    finally:
        counter.close()
    assert counter.count == 0 and "assistant_input_ids" in str(info.value)


def test_assistant_input_ids_without_a_drafter_is_refused(toy_pair):
    hf_hetspec.enable(toy_pair.target)
    try:
        with pytest.raises(ValueError, match="assistant_input_ids.*assistant_model"):
            toy_pair.target.generate(torch.tensor([[5, 6]]), max_new_tokens=2,
                                     assistant_input_ids=torch.tensor([[2, 7]]))
    finally:
        hf_hetspec.disable(toy_pair.target)


def test_lengths_nobody_set_keep_their_plain_meaning(toy_pair, caplog):
    """Without max_new_tokens or max_length, plain generate() makes 20 *new* tokens; the plan hands transformers
    a merged config, which must not turn that default into an absolute max_length of 20 (no new token for a
    long prompt) nor warn that both lengths were set."""
    import logging

    from conftest import hetspec_generate

    ids = toy_pair.target_tokenizer(toy_pair.prompts[0] * 3, return_tensors="pt").input_ids
    assert ids.shape[1] > 20
    hf_hetspec.disable(toy_pair.target)
    expected = toy_pair.target.generate(ids, do_sample=False)
    assert expected.shape[1] > ids.shape[1]
    with caplog.at_level(logging.WARNING):
        out = hetspec_generate(toy_pair, ids, "slem", do_sample=False)
        hetspec_generate(toy_pair, ids, "slem", do_sample=False, max_new_tokens=5)
    assert out.tolist() == expected.tolist()
    assert "seem to have been set" not in caplog.text


def test_the_schedule_is_that_of_the_runtime_that_runs(toy_pair, monkeypatch):
    """Issue #25: when ``auto``'s int8 copy failed and the eager drafter ran, SLEM kept the int8 schedule
    (0.2/16 instead of 0.35/12): the plan resolved the runtime before the fallback."""
    import weakref

    monkeypatch.setattr(runtime, "AUTO_INT8_MIN_PARAMETERS", 1)  # auto picks int8-static for the toy drafter
    monkeypatch.setattr(runtime, "_PREPARED", weakref.WeakKeyDictionary())
    monkeypatch.setattr(runtime, "_make_copy", lambda drafter, resolved, version: runtime._Copy(
        version, None, resolved, problem="RuntimeError: simulated failure of the int8 copy"))
    ids = toy_pair.target_tokenizer("def add(a, b):", return_tensors="pt").input_ids
    _hetspec(toy_pair, ids, "slem", max_new_tokens=12, do_sample=False)
    stats = hf_hetspec.last_stats(toy_pair.target)
    assert stats.drafter_runtime == "eager" and "simulated failure" in stats.note
    eager = plan.SLEM_DEFAULTS["eager"]
    assert eager != plan.SLEM_DEFAULTS["int8-static"]
    assert stats.lookaheads and set(stats.lookaheads) == {eager.max_lookahead}
    call = {"inputs": ids, "assistant_model": toy_pair.drafter}
    kwargs = {"tokenizer": toy_pair.target_tokenizer, "assistant_tokenizer": toy_pair.drafter_tokenizer,
              "max_new_tokens": 4}
    decided = plan.make_plan(toy_pair.target, call, kwargs, plan.HetspecArguments("slem"))
    assert decided.drafter.runtime == "eager" and decided.drafter.model is toy_pair.drafter
    assert decided.schedule == choose_schedule("slem", drafter_runtime="eager", verify_cost=decided.verify_cost)
