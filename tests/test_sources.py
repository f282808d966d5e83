"""Draft sources (hf_hetspec/sources.py): the context lookup, the back-off, and their exactness.

Expected outputs come from the target alone; distributions from the target's exact distribution.
"""

from __future__ import annotations

import pytest
import torch

import hf_hetspec
import hf_hetspec.decoding
from hf_hetspec import Schedule
from hf_hetspec.proposer import Draft
from hf_hetspec.schedule import COST_RATIOS, VERIFY_COST, choose_schedule
from hf_hetspec.sources import (BACK_OFF_AFTER, MIN_BACK_OFF, PROBE_INTERVAL, ContextLookup, SourcedProposer,
                                SourcePolicy)
from hf_hetspec.testing import check_lossless, exact_target_distribution, hetspec_sampler, required_samples
from hf_hetspec.testing import sample_outcomes

ALPHA = 1e-3
REJECT = 1e-6

# ---------------------------------------------------------------------------------------------------
# ContextLookup
# ---------------------------------------------------------------------------------------------------


def test_lookup_proposes_what_followed_the_most_recent_longest_match():
    lookup = ContextLookup(max_ngram=3, min_ngram=2, max_tokens=3)
    #        0  1  2  3  4  5  6  7  8  9 10 11
    ids = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # the 3-gram (5?) no; the 2-gram (2, 3) last occurred at 5-6, followed by 7, 8, 5
    assert lookup.continuation(ids, 10) == [7, 8, 5]
    # a longer match wins over a more recent shorter one: (1, 2, 3) at 0-2 and 4-6
    assert lookup.continuation(ids + [4, 1, 2, 3], 10) == [7, 8, 5]
    assert lookup.continuation(ids + [4, 1, 2, 3, 6], 10) == []  # (3, 6) never seen before


def test_lookup_respects_the_limit_and_never_matches_the_suffix_itself():
    lookup = ContextLookup(max_ngram=2, min_ngram=2, max_tokens=8)
    assert lookup.continuation([4, 5], 5) == []  # the only (4, 5) is the suffix: nothing follows it
    assert lookup.continuation([4, 5, 6, 4, 5], 1) == [6]
    assert lookup.continuation([4, 5, 6, 4, 5], 0) == []
    # periodic text: the continuation may run into the suffix itself
    assert ContextLookup(2, 2, 8).continuation([1, 2, 1, 2, 1, 2], 8) == [1, 2]


def test_lookup_grows_with_the_ids_and_refuses_other_ids():
    lookup = ContextLookup(max_ngram=2, min_ngram=2, max_tokens=4)
    assert lookup.continuation([1, 2, 3], 4) == []
    assert lookup.continuation([1, 2, 3, 1, 2], 4) == [3, 1, 2]
    with pytest.raises(ValueError, match="do not extend"):
        lookup.continuation([1, 9], 4)
    with pytest.raises(ValueError, match="min_ngram"):
        ContextLookup(max_ngram=1, min_ngram=2)


# ---------------------------------------------------------------------------------------------------
# SourcePolicy
# ---------------------------------------------------------------------------------------------------


def test_policy_tries_the_lookup_then_takes_the_better_rate():
    policy = SourcePolicy(cost_ratio=0.1, verify_cost=0.03)
    assert policy.choose(lookup_available=False) == "drafter"
    assert policy.choose(lookup_available=True) == "lookup"  # untried
    policy.record("lookup", drafted=8, accepted=0, drafter_forwards=0)  # 1 token for 1.24 forwards
    assert policy.choose(lookup_available=True) == "drafter"  # untried: rate inf
    policy.record("drafter", drafted=4, accepted=3, drafter_forwards=5)  # 4 tokens for 1.62 forwards
    assert policy.choose(lookup_available=True) == "drafter"
    for _ in range(PROBE_INTERVAL - 1):
        policy.record("drafter", drafted=4, accepted=3, drafter_forwards=5)
    assert policy.choose(lookup_available=True) == "lookup"  # idle long enough: tried again
    policy.record("lookup", drafted=8, accepted=8, drafter_forwards=0)  # 9 tokens for 1.24 forwards
    assert policy.estimates["lookup"].rate > policy.estimates["drafter"].rate
    assert policy.choose(lookup_available=True) == "lookup"
    assert SourcePolicy(0.1, 0.03, lookup=False).choose(lookup_available=True) == "drafter"


def _run_policy(policy, outcomes):
    """Sources chosen while the drafter's rounds yield as ``outcomes`` says (accepted tokens of a 5-token draft),
    in order, until the outcomes run out."""
    chosen, outcomes = [], list(outcomes)
    while outcomes:
        source = policy.choose(lookup_available=False)
        chosen.append(source)
        if source == "drafter":
            policy.record("drafter", drafted=5, accepted=outcomes.pop(0), drafter_forwards=5)
        else:
            policy.record("none", 0, 0, 0)
    return chosen


def _gaps(chosen):
    """Rounds without a draft between drafter rounds."""
    runs, count = [], 0
    for source in chosen:
        if source == "none":
            count += 1
        elif count:
            runs.append(count)
            count = 0
    return runs


def test_policy_backs_off_where_drafts_keep_failing_and_waits_longer_after_each_failed_try():
    # a 5-token draft with 5 drafter steps costs 2.15 forwards at c = 0.2: 0 accepted is a loss, 4 a gain
    policy = SourcePolicy(cost_ratio=0.2, verify_cost=0.03, lookup=False)
    chosen = _run_policy(policy, [0] * (BACK_OFF_AFTER + 4) + [4] * 6)
    assert chosen[:BACK_OFF_AFTER] == ["drafter"] * BACK_OFF_AFTER and chosen[BACK_OFF_AFTER] == "none"
    gaps = _gaps(chosen)
    assert gaps[:4] == [MIN_BACK_OFF * 2 ** i for i in range(4)]  # each failed try doubles the wait
    assert chosen[-4:] == ["drafter"] * 4  # successful tries end the back-off
    # a drafter that loses on average without failing in a row: backed off by its running rate
    mixed = SourcePolicy(cost_ratio=0.2, verify_cost=0.03, lookup=False)
    assert "none" in _run_policy(mixed, [0, 1] * BACK_OFF_AFTER)  # 1.5 tokens per 2.15 forwards
    good = SourcePolicy(cost_ratio=0.2, verify_cost=0.03, lookup=False)
    assert "none" not in _run_policy(good, [0, 4] * 3 * BACK_OFF_AFTER)  # 3 tokens per 2.15 forwards
    off = SourcePolicy(cost_ratio=0.2, verify_cost=0.03, lookup=False, back_off=False)
    assert "none" not in _run_policy(off, [0] * 3 * BACK_OFF_AFTER)
    # an empty drafter round (no room, the target inside a character) says nothing about the drafter
    empty = SourcePolicy(cost_ratio=0.2, verify_cost=0.03)
    for _ in range(2 * BACK_OFF_AFTER):
        empty.record("drafter", drafted=0, accepted=0, drafter_forwards=0)
    assert empty.failures == 0 and empty.choose(lookup_available=False) == "drafter"
    # a verified token that costs a whole forward: no draft can pay, none is made
    assert SourcePolicy(cost_ratio=0.05, verify_cost=1.0).choose(lookup_available=True) == "none"
    # nor where v + c reaches 0.9 of a forward (a measured float32 CPU target's 0.91 with an int8 drafter's c);
    # just below, the policy drafts and lets the back-off judge
    assert SourcePolicy(cost_ratio=0.056, verify_cost=0.85).choose(lookup_available=True) == "none"
    assert SourcePolicy(cost_ratio=0.0, verify_cost=0.85).choose(lookup_available=True) == "lookup"
    assert SourcePolicy(cost_ratio=0.04, verify_cost=0.85).choose(lookup_available=False) == "drafter"


def test_default_schedules_draft_from_the_context_and_explicit_ones_do_not():
    for algorithm in ("slem", "tli", "slrs"):
        schedule = choose_schedule(algorithm, drafter_runtime="int8-static")
        assert schedule.context_lookup and schedule.back_off
        explicit = choose_schedule(algorithm, num_assistant_tokens=3)
        assert not explicit.context_lookup and not explicit.back_off
    assert set(COST_RATIOS) == set(hf_hetspec.runtime.RUNTIMES) - {"auto"}


# ---------------------------------------------------------------------------------------------------
# Through generate(): greedy identity, exact sampling, a broken variant rejected
# ---------------------------------------------------------------------------------------------------


def _generate(pair, ids, **kwargs):
    hf_hetspec.enable(pair.target)
    try:
        out = pair.target.generate(ids, assistant_model=pair.drafter, tokenizer=pair.target_tokenizer,
                                   assistant_tokenizer=pair.drafter_tokenizer, **kwargs)
        return out, hf_hetspec.last_stats(pair.target)
    finally:
        hf_hetspec.disable(pair.target)


def _copying_prompt(pair) -> torch.LongTensor:
    """A prompt the target continues by copying from it: a corpus passage, then its first words again."""
    text = pair.prompts[0]
    ids = pair.target_tokenizer(text, return_tensors="pt").input_ids
    passage = pair.target.generate(ids, do_sample=False, max_new_tokens=40)
    copied = pair.target_tokenizer.decode(passage[0]) + "\n" + text
    return pair.target_tokenizer(copied, return_tensors="pt").input_ids


@pytest.mark.parametrize("pair_name, algorithm", [
    ("toy_pair", "slem"), ("toy_pair_reversed", "tli"), ("toy_pair", "slrs"),
    pytest.param("toy_pair_reversed", "slem", marks=pytest.mark.slow),
    pytest.param("toy_pair", "tli", marks=pytest.mark.slow),
    pytest.param("toy_pair_reversed", "slrs", marks=pytest.mark.slow),
])
def test_greedy_with_lookup_is_the_target_alone(request, algorithm, pair_name):
    """Greedy output with the default schedule (lookup and back-off) equals the target alone's, and the lookup
    really drafted and was accepted (on ``toy_pair_reversed`` TLI's drafter never is)."""
    pair = request.getfixturevalue(pair_name)
    ids = _copying_prompt(pair)
    expected = pair.target.generate(ids, do_sample=False, max_new_tokens=40)
    out, stats = _generate(pair, ids, hetspec_algorithm=algorithm, do_sample=False, max_new_tokens=40)
    assert out.tolist() == expected.tolist()
    assert stats.lookup_drafts > 0 and stats.lookup_accepted > 0, stats
    off, off_stats = _generate(pair, ids, hetspec_algorithm=algorithm, do_sample=False, max_new_tokens=40,
                               hetspec_schedule=Schedule(5, True))
    assert off.tolist() == expected.tolist() and off_stats.lookup_drafts == 0
    # copied text: no more target forwards with the lookup than without; strictly fewer where the drafter's
    # drafts are never accepted (TLI on toy_pair_reversed), as the toy drafters otherwise copy well too
    assert stats.target_forwards <= off_stats.target_forwards, (stats, off_stats)
    if off_stats.accepted_tokens == 0:
        assert stats.target_forwards < off_stats.target_forwards, (stats, off_stats)


def test_back_off_decodes_alone_where_drafts_fail(toy_pair_reversed):
    """TLI's drafts on ``toy_pair_reversed`` are never accepted: the policy stops asking the drafter (rounds
    without a draft) and the output is still the target's."""
    pair = toy_pair_reversed
    ids = pair.target_tokenizer("    ", return_tensors="pt").input_ids
    expected = pair.target.generate(ids, do_sample=False, max_new_tokens=30)
    schedule = Schedule(3, False, back_off=True)
    out, stats = _generate(pair, ids, hetspec_algorithm="tli", do_sample=False, max_new_tokens=30,
                           hetspec_schedule=schedule)
    assert out.tolist() == expected.tolist()
    assert stats.backed_off >= 15 and stats.accepted_tokens == 0, stats


#: Sampling prompt: the lookup proposes " with a" after " the lens" (a 3-gram seen before); at temperature 2 /
#: top-k 5 the target keeps both about half the time (outcomes spread over many bins).
LOOKUP_PROMPT = " the lens with a soft, the lens"
LOOKUP_SETTING = dict(temperature=2.0, top_k=5)
LOOKUP_TOKENS = 3


def _lookup_report(pair, algorithm, n=None, **extra):
    ids = pair.target_tokenizer(LOOKUP_PROMPT, return_tensors="pt").input_ids
    expected = exact_target_distribution(pair.target, ids, LOOKUP_TOKENS, **LOOKUP_SETTING)
    n = n or required_samples(expected, 0.15, 0.9, ALPHA)
    sampler = hetspec_sampler(pair.target, pair.drafter, pair.target_tokenizer, pair.drafter_tokenizer, ids,
                              algorithm, LOOKUP_TOKENS, **LOOKUP_SETTING, **extra)
    lookups = []
    original = SourcedProposer.propose

    def counting(self, input_ids):
        draft = original(self, input_ids)
        lookups.append(self._round[0] == "lookup" and bool(draft.target_ids))
        return draft

    SourcedProposer.propose = counting
    try:
        report = check_lossless(expected, sample_outcomes(sampler, n, 0), ALPHA)
    finally:
        SourcedProposer.propose = original
    return report, sampler, sum(lookups)


@pytest.mark.parametrize("algorithm, extra", [
    ("slem", {}),
    ("tli", {"hetspec_draft_temperature": 2.0}),
    ("slrs", {}),
])
def test_sampling_with_lookup_is_lossless(toy_pair, algorithm, extra):
    """Every sample's first round is a lookup draft (untried source, a match in the prompt), the second a
    drafter round; the three-token outcome has the target's exact distribution."""
    report, sampler, lookups = _lookup_report(toy_pair, algorithm, **extra)
    print(report)
    assert report.num_bins >= 3 and report.passed, str(report)
    assert lookups >= report.n and sampler.accepted_tokens > 0


def test_rejects_lookup_drafts_verified_as_if_they_were_sampled(toy_pair, monkeypatch):
    """BROKEN: a lookup draft (a point mass) handed to speculative sampling with ``q(x) = 1/2`` on each token,
    so it is kept with probability ``min(1, 2 p(x))`` instead of ``p(x)``."""
    original = SourcedProposer.propose

    def half_sure(self, input_ids):
        draft = original(self, input_ids)
        if self._round[0] != "lookup" or not draft.target_ids:
            return draft
        size = self.inner.target_size
        q = torch.full((len(draft.target_ids), size), 0.5 / (size - 1))
        q[torch.arange(len(draft.target_ids)), torch.tensor(draft.target_ids)] = 0.5
        return Draft(draft.target_ids, q)

    monkeypatch.setattr(SourcedProposer, "propose", half_sure)
    report, _, _ = _lookup_report(toy_pair, "tli", n=600, hetspec_draft_temperature=2.0)
    print(report)
    assert not report.passed and report.p_value < REJECT, str(report)


def test_seeded_sampling_with_sources_is_reproducible(toy_pair):
    """The policy counts tokens, not seconds: the same seed gives the same tokens."""
    ids = toy_pair.target_tokenizer(LOOKUP_PROMPT, return_tensors="pt").input_ids

    def run():
        out, _ = _generate(toy_pair, ids, do_sample=True, max_new_tokens=24, **LOOKUP_SETTING,
                           hetspec_generator=torch.Generator().manual_seed(5))
        return out.tolist()

    assert run() == run()


def test_sources_settings_are_checked(toy_pair):
    ids = toy_pair.target_tokenizer("the", return_tensors="pt").input_ids
    for bad, words in ((Schedule(3, False, context_lookup="yes"), "context_lookup"),
                       (Schedule(3, False, cost_ratio=1.5), "cost_ratio")):
        with pytest.raises(ValueError, match=words):
            _generate(toy_pair, ids, max_new_tokens=2, hetspec_schedule=bad)
    assert VERIFY_COST > 0


def test_verify_cost_follows_how_the_target_computes(monkeypatch):
    """``v`` is a property of the machine: float32 and CPU half precision with or without the CPU's own
    half-precision instructions (oneDNN's check, stubbed here both ways), and any GPU."""
    from hf_hetspec.schedule import VERIFY_COSTS, verify_cost

    cpu = torch.device("cpu")
    assert verify_cost(cpu, torch.float32) == VERIFY_COSTS["cpu-float32"]
    assert verify_cost(torch.device("cuda", 0), torch.bfloat16) == VERIFY_COSTS["native"]
    for native, expected in ((True, "native"), (False, "cpu-emulated-half")):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda native=native: native)
        assert verify_cost(cpu, torch.bfloat16) == VERIFY_COSTS[expected]
    assert verify_cost(cpu, torch.bfloat16, "fp16-packed") == VERIFY_COSTS["cpu-fp16-packed"]  # packed_target


def test_dear_verification_shortens_the_default_drafts():
    """Where a verified token costs a whole target forward (bf16 on a CPU without bf16 instructions), SLEM drafts
    only while the drafter's joint estimate exceeds c + v (capped at 0.95), and TLI/SLRS start from one token; explicit
    settings are the user's."""
    from hf_hetspec.schedule import SLEM_DEFAULTS, VERIFY_COSTS

    dear = VERIFY_COSTS["cpu-emulated-half"]
    cheap_slem = choose_schedule("slem", drafter_runtime="int8-static")
    dear_slem = choose_schedule("slem", drafter_runtime="int8-static", verify_cost=dear)
    assert cheap_slem.stop.min_joint == SLEM_DEFAULTS["int8-static"].min_joint
    assert dear_slem.stop.min_joint == pytest.approx(min(0.95, dear + COST_RATIOS["int8-static"]))
    half_dear = choose_schedule("slem", drafter_runtime="int8-static", verify_cost=0.5)
    assert half_dear.stop.min_joint == pytest.approx(0.5 + COST_RATIOS["int8-static"])
    dear_tli = choose_schedule("tli", drafter_runtime="int8-static", verify_cost=dear)
    assert (dear_tli.lookahead, dear_tli.min_lookahead) == (1, 1) and dear_tli.adaptive
    assert choose_schedule("tli", drafter_runtime="int8-static").min_lookahead == 3
    assert choose_schedule("slem", num_assistant_tokens=7, verify_cost=dear).lookahead == 7


def test_the_plan_counts_the_targets_verify_cost(toy_pair):
    """The toy target computes in float32 on the CPU: the plan and the policy use that ``v``, and a schedule's
    own ``verify_cost`` wins."""
    from hf_hetspec.plan import HetspecArguments, make_plan
    from hf_hetspec.schedule import VERIFY_COSTS

    ids = toy_pair.target_tokenizer("the", return_tensors="pt").input_ids
    kwargs = {"tokenizer": toy_pair.target_tokenizer, "assistant_tokenizer": toy_pair.drafter_tokenizer}
    call = {"inputs": ids, "assistant_model": toy_pair.drafter, "max_new_tokens": 4}
    plan = make_plan(toy_pair.target, call, dict(kwargs), HetspecArguments("slem"))
    assert plan.verify_cost == VERIFY_COSTS["cpu-float32"] and plan.target.runtime == "eager"
    with pytest.raises(ValueError, match="verify_cost"):
        _generate(toy_pair, ids, max_new_tokens=2, hetspec_schedule=Schedule(3, False, verify_cost=-1.0))
