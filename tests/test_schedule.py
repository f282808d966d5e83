"""hf_hetspec.schedule: the draft schedule as one value -- its defaults, the adaptive rule, the per-call
``hetspec_schedule`` and its checks. (choose_schedule's defaults per algorithm and runtime: test_plan.)"""

from __future__ import annotations

import pytest
import torch

import hf_hetspec
from conftest import hetspec_generate
from hf_hetspec import drafter, plan, proposer, schedule
from hf_hetspec.checks import check_schedule
from hf_hetspec.schedule import MAX_LOOKAHEAD, AdaptiveLookahead, DraftStop, Schedule

NO_SETTINGS = {"num_assistant_tokens": None, "num_assistant_tokens_schedule": None,
               "assistant_confidence_threshold": None}


def test_the_old_import_paths_name_the_same_objects():
    assert plan.Schedule is Schedule
    assert drafter.DraftStop is plan.DraftStop is hf_hetspec.DraftStop is DraftStop
    assert plan.SLEM_DEFAULTS is schedule.SLEM_DEFAULTS and plan.TOKEN_LEVEL_FLOORS is schedule.TOKEN_LEVEL_FLOORS
    assert proposer.MAX_LOOKAHEAD == MAX_LOOKAHEAD == 16 and plan.choose_schedule is schedule.choose_schedule


def test_the_adaptive_rule_is_transformers_heuristic():
    state = AdaptiveLookahead.start(Schedule(5, True, min_lookahead=2))
    moves = []
    for drafted, accepted in [(5, 5), (7, 7), (9, 3), (0, 0), (8, 0), (7, 1), (6, 0), (5, 0), (4, 0), (3, 0), (2, 2)]:
        state.update(drafted, accepted)
        moves.append(state.value)
    assert moves == [7, 9, 8, 8, 7, 6, 5, 4, 3, 2, 4]
    capped = AdaptiveLookahead.start(Schedule(15, True))
    capped.update(15, 15)
    assert capped.value == MAX_LOOKAHEAD
    fixed = AdaptiveLookahead.start(Schedule(3, False))
    fixed.update(3, 3)
    assert fixed.value == 3


@pytest.mark.parametrize("value, settings, error, match", [
    ((3, False), {}, TypeError, "hf_hetspec.Schedule"),
    (Schedule(0, False), {}, ValueError, "lookahead=0"),
    (Schedule(4, True, min_lookahead=0), {}, ValueError, "min_lookahead=0"),
    (Schedule(4, False, DraftStop(1.5)), {}, ValueError, "cut-offs in \\[0, 1\\)"),
    (Schedule(4, False), {"num_assistant_tokens": 3}, ValueError, "`num_assistant_tokens`: pass one of them"),
    (Schedule(4, False, sibling_min_joint=1.0), {}, ValueError, "sibling_min_joint=1.0"),
    (Schedule(4, False, sibling_min_joint=True), {}, ValueError, "sibling_min_joint=True"),
    (Schedule(4, False, sibling_runner_ups=0), {}, ValueError, "sibling_runner_ups=0"),
    (Schedule(4, False, sibling_runner_ups=True), {}, ValueError, "sibling_runner_ups=True"),
])
def test_check_schedule_refuses(value, settings, error, match):
    with pytest.raises(error, match=match):
        check_schedule(value, {**NO_SETTINGS, **settings})


def test_a_schedule_passed_per_call_is_the_calls(toy_pair):
    """``hetspec_schedule`` replaces the default (SLEM drafts up to 12 tokens with an eager drafter): drafts of
    exactly two drafter tokens, the output still the target's own."""
    ids = toy_pair.target_tokenizer("def add(a, b):", return_tensors="pt").input_ids
    reference = toy_pair.target.generate(ids, max_new_tokens=20, do_sample=False)
    two = Schedule(2, False)
    out = hetspec_generate(toy_pair, ids, "slem", max_new_tokens=20, do_sample=False, hetspec_schedule=two)
    assert torch.equal(out, reference)
    stats = hf_hetspec.last_stats(toy_pair.target)
    assert stats.lookaheads and set(stats.lookaheads) == {2}
    with pytest.raises(ValueError, match="hetspec_schedule was given with `num_assistant_tokens`"):
        hetspec_generate(toy_pair, ids, "slem", max_new_tokens=5, hetspec_schedule=two, num_assistant_tokens=3)
    with pytest.raises(ValueError, match="without `assistant_model`"):
        hf_hetspec.enable(toy_pair.target)
        try:
            toy_pair.target.generate(ids, max_new_tokens=5, hetspec_schedule=two)
        finally:
            hf_hetspec.disable(toy_pair.target)


def test_slems_default_drafts_siblings_worth_their_verification():
    """A sibling branch costs only its tokens in the verification (v each): SLEM's default proposes those whose
    drafter-estimated chance reaches v, none where verification is dear; token-level drafts have none."""
    from hf_hetspec.schedule import VERIFY_COSTS, choose_schedule

    assert choose_schedule("slem", drafter_runtime="int8-static").sibling_min_joint == VERIFY_COSTS["native"]
    assert choose_schedule("slem", verify_cost=VERIFY_COSTS["cpu-float32"]).sibling_min_joint == 0.10
    assert choose_schedule("slem", verify_cost=VERIFY_COSTS["cpu-emulated-half"]).sibling_min_joint == 0.0
    assert choose_schedule("tli").sibling_min_joint == 0.0
    # runner-ups per position: more where the target samples (SIBLING_RUNNER_UPS)
    assert choose_schedule("slem").sibling_runner_ups == 1
    assert choose_schedule("slem", sample=True).sibling_runner_ups == 2
    assert choose_schedule("slem", num_assistant_tokens=4).sibling_min_joint == 0.0
