"""The target's verify cost and the drafter's cost ratio measured on this machine (hf_hetspec/calibration.py):
measured once and stored per machine (and pair), and a call whose verification or drafter step is dear draws no
drafts while its output stays the target's own."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import hf_hetspec
from hf_hetspec import calibration
from hf_hetspec.calibration import (
    PROBE_WIDTHS,
    machine_key,
    measured_cost_ratio,
    measured_verify_cost,
    needs_measured_cost_ratio,
    needs_measuring,
    pair_key,
)
from hf_hetspec.testing.greedy import compare_greedy


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty ``$HF_HETSPEC_HOME`` and no value in memory."""
    monkeypatch.setenv("HF_HETSPEC_HOME", str(tmp_path))
    monkeypatch.setattr(calibration, "_MEMORY", {})
    return tmp_path


def _forwards(v: float, one: float = 0.4):
    """A ``measure`` whose forwards cost ``one`` s for one token and ``v`` more forwards per further token."""
    return lambda target: {w: one * (1 + v * (w - 1)) for w in (1, *PROBE_WIDTHS)}


def test_v_is_measured_once_per_machine_and_stored(toy_pair, fresh_cache, monkeypatch):
    assert measured_verify_cost(toy_pair.target, _forwards(0.46)) == 0.46
    stored = json.loads((fresh_cache / calibration.CACHE_FILE).read_text())
    assert stored == {machine_key(toy_pair.target): 0.46}

    def not_again(target):
        raise AssertionError("measured twice")

    assert measured_verify_cost(toy_pair.target, not_again) == 0.46  # this process remembers it
    monkeypatch.setattr(calibration, "_MEMORY", {})
    assert measured_verify_cost(toy_pair.target, not_again) == 0.46  # a new process reads the file
    assert measured_verify_cost(toy_pair.target, _forwards(-0.5)) == 0.46
    monkeypatch.setattr(torch, "get_num_threads", lambda: 97)  # another thread count is another machine
    assert measured_verify_cost(toy_pair.target, _forwards(0.1)) == 0.1
    assert len(json.loads((fresh_cache / calibration.CACHE_FILE).read_text())) == 2


def test_v_is_the_dearest_widths_cost_per_token_and_a_failed_timing_keeps_the_table(toy_pair, fresh_cache,
                                                                                    monkeypatch):
    """MKL's float32 forward costs more per token at 4 tokens than at 8: ``v`` is the dearest width's; a wide
    forward faster than one token counts as free."""
    assert measured_verify_cost(toy_pair.target, lambda target: {1: 0.4, 2: 0.6, 4: 1.2, 8: 1.4}) == 0.67
    monkeypatch.setattr(calibration, "_MEMORY", {})
    (fresh_cache / calibration.CACHE_FILE).unlink()
    assert measured_verify_cost(toy_pair.target, lambda target: {1: 0.5, 2: 0.4, 4: 0.4, 8: 0.4}) == 0.0

    def fails(target):
        raise RuntimeError("no cache")

    other = copy.deepcopy(toy_pair.target).double()  # another key
    with pytest.warns(UserWarning, match="could not time the target's forwards .RuntimeError: no cache"):
        assert measured_verify_cost(other, fails) is None


def test_time_forwards_runs_the_targets_forwards(toy_pair):
    seconds = calibration.time_forwards(toy_pair.target)
    assert sorted(seconds) == [1, *PROBE_WIDTHS] and all(0 < s < 10 for s in seconds.values())


def test_the_plan_counts_a_measured_v_even_of_zero(toy_pair, fresh_cache, monkeypatch):
    """A measured ``v`` of 0 (a wide forward no dearer than one token) is the plan's ``v``, not the table's."""
    from hf_hetspec.plan import HetspecArguments, make_plan

    monkeypatch.setattr(calibration, "MIN_MEASURED_PARAMETERS", 0)
    monkeypatch.setattr(calibration, "time_forwards", _forwards(0.0))
    ids = toy_pair.target_tokenizer("the", return_tensors="pt").input_ids
    call = {"inputs": ids, "assistant_model": toy_pair.drafter, "max_new_tokens": 4}
    kwargs = {"tokenizer": toy_pair.target_tokenizer, "assistant_tokenizer": toy_pair.drafter_tokenizer}
    assert make_plan(toy_pair.target, call, kwargs, HetspecArguments("slem")).verify_cost == 0.0


def test_only_a_large_cpu_target_on_its_own_layers_is_measured(toy_pair, monkeypatch):
    assert not needs_measuring(toy_pair.target, "eager")  # a toy target: forwards are overheads
    monkeypatch.setattr(calibration, "MIN_MEASURED_PARAMETERS", 0)
    assert needs_measuring(toy_pair.target, "eager")
    assert not needs_measuring(toy_pair.target, "fp16-packed")  # the table knows the packed product


def _generate(pair, ids, **kwargs):
    hf_hetspec.enable(pair.target)
    try:
        out = pair.target.generate(ids, assistant_model=pair.drafter, tokenizer=pair.target_tokenizer,
                                   assistant_tokenizer=pair.drafter_tokenizer, max_new_tokens=24, do_sample=False,
                                   **kwargs)
    finally:
        hf_hetspec.disable(pair.target)
    return out, hf_hetspec.last_stats(pair.target)


@pytest.mark.parametrize("dear", [1.2, 0.8])
def test_a_call_whose_verification_is_dear_draws_no_drafts(toy_pair, fresh_cache, monkeypatch, dear):
    """The toy float32 target (its weights do not pack: it runs its own layers) counted as a large CPU target:
    where one more verified token costs more than a forward (v 1.2), or 0.8 of one with the toy drafter's
    ``c`` 0.165 (``v + c`` above :data:`hf_hetspec.sources.DRAFT_COST_CEILING`), no draft can pay, and the call
    decodes alone, the target's own output; where it costs nothing the same call drafts. The table's float32
    value (0.10) would draft in both."""
    monkeypatch.setattr(calibration, "MIN_MEASURED_PARAMETERS", 0)
    ids = toy_pair.target_tokenizer("the cat sat on the", return_tensors="pt").input_ids
    plain = type(toy_pair.target).generate(toy_pair.target, ids, max_new_tokens=24, do_sample=False)

    monkeypatch.setattr(calibration, "time_forwards", _forwards(dear))
    out, stats = _generate(toy_pair, ids)
    assert compare_greedy(toy_pair.target, ids, plain, out).verdict == "identical"
    assert stats.target_runtime == "eager" and stats.drafted_tokens == 0 and stats.drafter_forwards == 0
    assert stats.target_forwards == stats.new_tokens

    monkeypatch.setattr(calibration, "_MEMORY", {})
    (fresh_cache / calibration.CACHE_FILE).unlink()
    monkeypatch.setattr(calibration, "time_forwards", _forwards(0.0))
    out, stats = _generate(toy_pair, ids)
    assert compare_greedy(toy_pair.target, ids, plain, out).verdict == "identical"
    assert stats.drafted_tokens > 0


# ---------------------------------------------------------------------------------------------------
# c off the CPU
# ---------------------------------------------------------------------------------------------------


def test_c_is_measured_once_per_pair_and_runtime_and_stored(toy_pair, fresh_cache, monkeypatch):
    target, drafter = toy_pair.target, toy_pair.drafter
    assert measured_cost_ratio(target, drafter, "eager", lambda t, d: (0.0418, 0.0425)) == 1.017
    stored = json.loads((fresh_cache / calibration.CACHE_FILE).read_text())
    assert stored == {pair_key(target, drafter, "eager"): 1.017}

    def not_again(t, d):
        raise AssertionError("measured twice")

    monkeypatch.setattr(calibration, "_MEMORY", {})
    assert measured_cost_ratio(target, drafter, "eager", not_again) == 1.017  # a new process reads the file
    assert measured_cost_ratio(target, drafter, "compiled", lambda t, d: (0.0418, 0.0025)) == 0.06  # another runtime
    def fails(t, d):
        raise RuntimeError("no graph")

    other = copy.deepcopy(drafter).double()  # another drafter
    with pytest.warns(UserWarning, match="could not time the models' steps .RuntimeError: no graph"):
        assert measured_cost_ratio(target, other, "eager", fails) is None


def test_time_steps_runs_each_models_step_in_its_own_cache(toy_pair):
    """The drafter as it runs: the user's model (a transformers cache) or a runtime's copy with a cache of its own
    (hf_hetspec's step)."""
    from hf_hetspec.runtime import prepare_drafter

    for drafter in (toy_pair.drafter, prepare_drafter(copy.deepcopy(toy_pair.drafter), "int8-static").model):
        target_s, drafter_s = calibration.time_steps(toy_pair.target, drafter)
        assert 0 < target_s < 10 and 0 < drafter_s < 10


def test_only_a_large_target_off_the_cpu_gets_a_measured_c(toy_pair, monkeypatch):
    assert not needs_measured_cost_ratio(toy_pair.target)  # the CPU: the table's c
    monkeypatch.setattr(calibration, "model_device", lambda model: torch.device("cuda", 0))
    assert not needs_measured_cost_ratio(toy_pair.target)  # a toy target: its steps are overheads
    monkeypatch.setattr(calibration, "MIN_MEASURED_PARAMETERS", 0)
    assert needs_measured_cost_ratio(toy_pair.target)


def test_ranks_of_a_process_group_keep_the_tables_values(toy_pair, monkeypatch):
    """Ranks timing their own forwards could disagree and draft differently, which a sharded forward's collectives
    cannot survive: in a group of several processes neither v nor c is measured."""
    monkeypatch.setattr(calibration, "MIN_MEASURED_PARAMETERS", 0)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    assert not needs_measuring(toy_pair.target, "eager")
    monkeypatch.setattr(calibration, "model_device", lambda model: torch.device("cuda", 0))
    assert not needs_measured_cost_ratio(toy_pair.target)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 1)
    assert needs_measured_cost_ratio(toy_pair.target)


@pytest.mark.parametrize("drafter_s, drafts", [(0.0425, False), (0.0025, True)])
def test_a_call_whose_drafter_step_costs_a_target_step_draws_no_drafts(toy_pair, fresh_cache, monkeypatch,
                                                                        drafter_s, drafts):
    """The toy target counted as a large target on a GPU: an eager drafter whose step costs what the target's does
    (H200: 42.5 ms against 41.8 ms) cannot pay for a draft, and the call decodes alone, the target's own output,
    where the table's eager c (0.165) drafted; a step of 2.5 ms (the compiled runtime there) drafts."""
    import hf_hetspec.plan

    monkeypatch.setattr(hf_hetspec.plan, "needs_measured_cost_ratio", lambda target: True)
    monkeypatch.setattr(calibration, "time_steps", lambda target, drafter: (0.0418, drafter_s))
    ids = toy_pair.target_tokenizer("the cat sat on the", return_tensors="pt").input_ids
    plain = type(toy_pair.target).generate(toy_pair.target, ids, max_new_tokens=24, do_sample=False)
    out, stats = _generate(toy_pair, ids, hetspec_drafter="eager")
    assert compare_greedy(toy_pair.target, ids, plain, out).verdict == "identical"
    assert (stats.drafted_tokens > 0) == drafts and (stats.drafter_forwards > 0) == drafts
    said = "no drafts: a drafter step (eager) costs 1.02 target steps on this device (measured)"
    assert (said in stats.note) != drafts, stats.note


@pytest.mark.parametrize("runtime", ["int8-static", "compiled"])
def test_timing_the_steps_leaves_the_drafters_cache_fit_for_the_decoding(toy_pair, fresh_cache, monkeypatch,
                                                                         runtime):
    """The measurement steps the drafter as it runs, in the cache its runtime keeps (the compiled step's one
    cache, which the decoding then reuses): the decoding that follows still returns the target's own output.
    The timings are real; the value handed on is made small so that the call drafts."""
    import hf_hetspec.plan

    timed, time_steps = [], calibration.time_steps

    def real_steps_small_c(target, drafter):
        timed.append(time_steps(target, drafter))
        return 1.0, 0.01

    monkeypatch.setattr(hf_hetspec.plan, "needs_measured_cost_ratio", lambda target: True)
    monkeypatch.setattr(calibration, "time_steps", real_steps_small_c)
    pair = copy.copy(toy_pair)
    pair.drafter = copy.deepcopy(toy_pair.drafter)  # its own runtime copy, made for this test
    ids = pair.target_tokenizer("the cat sat on the", return_tensors="pt").input_ids
    plain = type(pair.target).generate(pair.target, ids, max_new_tokens=24, do_sample=False)
    out, stats = _generate(pair, ids, hetspec_drafter=runtime)
    assert len(timed) == 1 and stats.drafter_runtime == runtime and stats.drafted_tokens > 0
    assert compare_greedy(pair.target, ids, plain, out).verdict == "identical"


def test_a_schedule_with_its_own_c_is_not_overruled_by_the_measured_one(toy_pair, fresh_cache, monkeypatch):
    """``hetspec_schedule=Schedule(..., cost_ratio=...)`` is the user's figure: the measured ``c`` (here a step as
    dear as the target's, which alone would stop every draft) neither replaces it nor adds its note."""
    import dataclasses

    import hf_hetspec.plan
    from hf_hetspec.schedule import choose_schedule

    monkeypatch.setattr(hf_hetspec.plan, "needs_measured_cost_ratio", lambda target: True)
    monkeypatch.setattr(calibration, "time_steps", lambda target, drafter: (0.0418, 0.0425))
    ids = toy_pair.target_tokenizer("the cat sat on the", return_tensors="pt").input_ids
    plain = type(toy_pair.target).generate(toy_pair.target, ids, max_new_tokens=24, do_sample=False)
    schedule = dataclasses.replace(choose_schedule("slem", drafter_runtime="eager"), cost_ratio=0.05)
    out, stats = _generate(toy_pair, ids, hetspec_drafter="eager", hetspec_schedule=schedule)
    assert compare_greedy(toy_pair.target, ids, plain, out).verdict == "identical"
    assert stats.drafted_tokens > 0 and "no drafts" not in stats.note
