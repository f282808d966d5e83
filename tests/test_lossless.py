"""Losslessness of sampling, proven statistically with :mod:`hf_hetspec.testing`.

Every test compares samples with the *exact* distribution of the target's first two tokens (enumerated with
transformers' own logits processors), by a chi-square goodness-of-fit test. Seeds are fixed, so each test is
deterministic; the thresholds are still chosen as if it were not: a correct sampler must reach
``p >= ALPHA = 1e-3`` (a false alarm would happen for one seed in a thousand), a broken one must be rejected
with ``p < REJECT = 1e-6``.

Prompts. The pairs' own ``pair.prompts`` are continued almost deterministically at temperature 1 (one outcome
has probability > 0.98), so a test there has a single bin and proves nothing. The prompts below are short,
ambiguous contexts where the target spreads its probability over many continuations (several bins: power)
while the drafter's draft still matches the target's sample often (acceptance > 0 is asserted, so the
acceptance, rollback and bonus-token paths are exercised, not only rejections).

Real vocabularies. With two new tokens every sample drafts exactly one token, accepted with probability
``sum_t min(p(t), q(t))`` (``q``: the draft distribution pushed onto target ids). The prompts were chosen per
pair by computing that number exactly, for TLI and SLRS and all three settings, over ~150 short prompts
(corpus openings and prefixes, common words, digits, single CJK characters): each has it between ~0.2 and
~0.9 for every setting (the acceptance and the rejection/residual paths both run; both are asserted) and
>= 3 bins. TLI and the string-level algorithms get different prompts (``TLI_PROMPT``, ``STRING_PROMPT``):
on a prompt whose likely drafter tokens are all shared, SLRS drafts exactly what TLI drafts, and on one whose
likely drafter tokens are not target tokens, TLI may never accept. Sample sizes come from the exact
distribution (``required_samples``: power >= ``POWER`` against every alternative at total variation
``POWER_TV``), not a flat ``n``. The full matrix (6 ordered pairs x SLEM/TLI/SLRS x 3 settings = 54 tests)
is too slow for every run; a Latin square of it runs by default (18 tests: every algorithm with every
setting on two pairs, every pair with every setting), the other 36 are marked ``slow``.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
from transformers import TemperatureLogitsWarper

import hf_hetspec
import hf_hetspec.decoding
import hf_hetspec.verify
from conftest import accept_every_draft
from hf_hetspec.intersection import push_forward
from hf_hetspec.plan import DEFAULT_DRAFT_TEMPERATURE
from hf_hetspec.schedule import DEFAULT_LOOKAHEAD, choose_schedule
from hf_hetspec.proposer import TokenLevelProposer
from hf_hetspec.slrs import SLRSProposer
from hf_hetspec.testing import (
    check_lossless,
    chi_square_power,
    exact_target_distribution,
    hetspec_sampler,
    required_samples,
    sample_outcomes,
    target_sampler,
    transformers_sampler,
    verify_lossless,
)
from hf_hetspec.tli import TLIProposer
from hf_hetspec.verify import _accepted_prefix, residual_distribution

ALPHA = 1e-3
REJECT = 1e-6

#: Ambiguous prompts (see the module docstring), per fixture / real target.
TOY_PROMPT = {"toy_pair": "the", "toy_pair_reversed": "    "}
REAL = ["qwen2.5-coder", "smollm2", "gemma3"]
REAL_PAIRS = list(itertools.permutations(REAL, 2))
#: Prompts per real (target, drafter) pair (module docstring: chosen by the exact acceptance probability).
#: TLI: the drafter's likely tokens are shared with the target. SLRS and SLEM: the drafter's likely tokens
#: are *not* target tokens, so SLRS proposes proper byte-prefixes of them (mass TLI would drop) and SLEM
#: re-tokenizes drafter text. Qwen2.5-Coder <- SmolLM2 has no such prompt among ~150 tried (SmolLM2's likely
#: tokens are all Qwen tokens): there SLRS drafts exactly what TLI drafts (same samples at the same seed).
#: The tiny models are trained on the CPU, whose rounding differs between machines (AVX-512 or AVX2 kernels):
#: a pair may map to several prompts, and :func:`_prompt` takes the first whose exact target distribution is
#: spread enough on this machine (:func:`_spread`). "Our" (Qwen2.5-Coder <- SmolLM2), chosen on an earlier
#: machine, had a top outcome of 0.81-0.95 and an acceptance of 0.9-0.97 on the 2026-12-02 development machine
#: (AVX2); "1" had 0.33-0.49 and 0.6-0.8 there.
TLI_PROMPT = {
    ("qwen2.5-coder", "smollm2"): ("Our", "1"),
    ("qwen2.5-coder", "gemma3"): "1",
    ("smollm2", "qwen2.5-coder"): "1",
    ("smollm2", "gemma3"): "print",
    ("gemma3", "qwen2.5-coder"): "Remember",
    ("gemma3", "smollm2"): "self",
}
#: E.g. after "self" the Qwen drafter's likeliest token (q ~ 0.48) is "):\n", which Gemma-3 does not have:
#: SLRS proposes "):" and accepts ~40%, while TLI's drafter, restricted to the shared tokens, proposes only
#: tokens outside the Gemma-3 target's top 5 and never accepts
#: (``test_tli_never_accepts_where_the_drafter_prefers_an_unshared_token``); likewise "The cat" for
#: Gemma-3 <- SmolLM2.
STRING_PROMPT = {
    ("qwen2.5-coder", "smollm2"): ("Our", "1"),
    ("qwen2.5-coder", "gemma3"): "の",
    ("smollm2", "qwen2.5-coder"): "self",
    ("smollm2", "gemma3"): "我们",
    ("gemma3", "qwen2.5-coder"): "self",
    ("gemma3", "smollm2"): "The cat",
}

T1 = dict(temperature=1.0, top_k=5)
T07 = dict(temperature=0.7, top_k=5)
TOP_P = dict(temperature=1.0, top_k=5, top_p=0.9)



def _ids(pair, text):
    return pair.target_tokenizer(text, return_tensors="pt").input_ids


def _hetspec_report(pair, prompt, algorithm, n, seed=0, **setting):
    """(report, sampler) for hf_hetspec with ``algorithm`` on one prompt and sampling setting."""
    ids = _ids(pair, prompt)
    target_setting = {k: v for k, v in setting.items() if not k.startswith("hetspec_")}
    expected = exact_target_distribution(pair.target, ids, 2, **target_setting)
    sampler = hetspec_sampler(pair.target, pair.drafter, pair.target_tokenizer, pair.drafter_tokenizer, ids,
                              algorithm, 2, **setting)
    report = check_lossless(expected, sample_outcomes(sampler, n, seed), ALPHA)
    report.acceptance_rate = sampler.acceptance_rate
    return report, sampler


def _assert_passes(report, min_bins=3):
    print(report)
    assert report.num_bins >= min_bins, f"too few bins for a meaningful test: {report}"
    assert report.passed, str(report)


# ---------------------------------------------------------------------------------------------------
# The harness itself
# ---------------------------------------------------------------------------------------------------


def test_exact_distribution_sums_to_one_and_agrees_with_plain_sampling(toy_pair):
    """The enumeration is what transformers' own sampling does (all three warpers in play)."""
    ids = _ids(toy_pair, TOY_PROMPT["toy_pair"])
    setting = dict(temperature=0.8, top_k=6, top_p=0.95)
    expected = exact_target_distribution(toy_pair.target, ids, 2, **setting)
    assert sum(expected.values()) == pytest.approx(1.0, abs=1e-9)
    assert all(len(o) == 2 for o in expected) and len(expected) > 5
    assert list(expected.values()) == sorted(expected.values(), reverse=True)
    counts = sample_outcomes(target_sampler(toy_pair.target, ids, 2, **setting), 1000, seed=0)
    report = check_lossless(expected, counts, ALPHA)
    _assert_passes(report, min_bins=6)
    # sample_outcomes leaves torch's global RNG where it was
    state = torch.random.get_rng_state()
    sample_outcomes(target_sampler(toy_pair.target, ids, 2, **setting), 3, seed=1)
    assert torch.equal(state, torch.random.get_rng_state())


def test_exact_distribution_stops_at_eos_and_hetspec_stops_there_too(toy_pair):
    """An EOS at the first position ends the outcome (shorter tuple), for the target and for SLEM."""
    ids = _ids(toy_pair, TOY_PROMPT["toy_pair"])
    base = exact_target_distribution(toy_pair.target, ids, 1, **T1)
    eos = next(iter(base))[0]  # the most likely first token becomes an EOS id
    setting = dict(T1, eos_token_id=[eos, toy_pair.target_tokenizer.eos_token_id])
    expected = exact_target_distribution(toy_pair.target, ids, 2, **setting)
    assert expected[(eos,)] == pytest.approx(base[(eos,)], rel=1e-6)
    assert not any(len(o) == 2 and o[0] == eos for o in expected)
    plain_sampler = target_sampler(toy_pair.target, ids, 2, **setting)
    plain = check_lossless(expected, sample_outcomes(plain_sampler, 500, 0))
    _assert_passes(plain)
    sampler = hetspec_sampler(toy_pair.target, toy_pair.drafter, toy_pair.target_tokenizer,
                              toy_pair.drafter_tokenizer, ids, "slem", 2, **setting)
    report = check_lossless(expected, sample_outcomes(sampler, 500, 0), ALPHA)
    _assert_passes(report)
    assert sampler.accepted_tokens > 0


def test_exact_distribution_refuses_unbounded_support(toy_pair):
    ids = _ids(toy_pair, "the")
    with pytest.raises(ValueError, match="top_k"):  # transformers' default top_k=50 is not support-limiting
        exact_target_distribution(toy_pair.target, ids, 2)
    with pytest.raises(ValueError, match="top_k"):
        exact_target_distribution(toy_pair.target, ids, 2, top_k=0, temperature=1.0)
    with pytest.raises(ValueError, match="max_outcomes"):
        exact_target_distribution(toy_pair.target, ids, 3, top_k=8, max_outcomes=20)
    with pytest.raises(ValueError, match="assistant_model"):
        exact_target_distribution(toy_pair.target, ids, 2, top_k=5, assistant_model=toy_pair.drafter)
    with pytest.raises(ValueError, match=r"\(1, n\)"):
        exact_target_distribution(toy_pair.target, ids.repeat(2, 1), 2, top_k=5)


def test_check_lossless_bins_impossible_outcomes_and_calibration():
    expected = {(1, 2): 0.5, (1, 3): 0.3, (4,): 0.19, (5, 5): 0.009, (6, 6): 0.001}
    exact = {(1, 2): 500, (1, 3): 300, (4,): 190, (5, 5): 9, (6, 6): 1}
    report = check_lossless(expected, exact)
    # (5, 5) and (6, 6) have expected counts 9 and 1: the rare bin (1) is merged into the smallest one
    assert report.passed and report.p_value == pytest.approx(1.0) and report.num_bins == 4 and report.dof == 3
    assert report.total_variation == pytest.approx(0.0) and "PASS" in str(report)
    impossible = check_lossless(expected, {**exact, (7, 7): 1})
    assert not impossible.passed and impossible.p_value == 0.0 and impossible.impossible == ((7, 7),)
    assert "impossible" in str(impossible) and "FAIL" in str(impossible)
    with pytest.raises(ValueError):
        check_lossless({(1,): 0.5}, {(1,): 3})
    # under H0 the rejection rate is alpha; against TV = 0.1 the power is at least the documented bound
    rng = np.random.default_rng(0)
    outcomes = list(expected)
    p = np.array(list(expected.values()))
    q = p + np.array([-0.1, 0.05, 0.05, 0.0, 0.0])  # TV(p, q) = 0.1
    def passes(n, dist):
        return check_lossless(expected, dict(zip(outcomes, rng.multinomial(n, dist))), 0.05).passed

    null = [passes(1000, p) for _ in range(400)]
    alt = [passes(300, q) for _ in range(400)]
    assert 0.02 < 1 - np.mean(null) < 0.09
    assert 1 - np.mean(alt) >= chi_square_power(300, 3, 0.1, 0.05) - 0.05
    assert chi_square_power(2000, 10) > 0.999 and chi_square_power(250, 10) < 0.2


def test_required_samples_meets_the_power_bound_with_the_bins_check_lossless_uses():
    # 4 likely outcomes and 60 rare ones, merged into a fifth bin (each is its own bin only for n >= 1500)
    expected = {(i,): 0.2 for i in range(4)} | {(10 + i,): 0.2 / 60 for i in range(60)}
    n = required_samples(expected, tv=0.2, power=0.9)
    assert n % 25 == 0 and 100 <= n < 2000
    dof = check_lossless(expected, {o: round(n * p) for o, p in expected.items()}).dof
    assert chi_square_power(n, dof, 0.2) >= 0.9 > chi_square_power(n - 25, dof, 0.2)
    assert required_samples(expected, tv=0.1, power=0.9) > n  # a smaller distance needs more samples
    assert required_samples({(1,): 1.0}) == 2000  # one bin: no size has power, the grid's end is returned
    with pytest.raises(ValueError, match="tv"):
        required_samples(expected, tv=0.0)


# ---------------------------------------------------------------------------------------------------
# SLEM is lossless
# ---------------------------------------------------------------------------------------------------

SETTINGS = {"t1": T1, "t0.7": T07, "top_p0.9": TOP_P}


@pytest.mark.parametrize("setting", list(SETTINGS), ids=str)
@pytest.mark.parametrize("pair_name", ["toy_pair", "toy_pair_reversed"])
def test_slem_sampling_is_lossless_on_toy_pairs(request, pair_name, setting):
    pair = request.getfixturevalue(pair_name)
    report, sampler = _hetspec_report(pair, TOY_PROMPT[pair_name], "slem", n=500, **SETTINGS[setting])
    _assert_passes(report)
    assert sampler.accepted_tokens > 0, "no draft was ever accepted: the acceptance path was not tested"


# ---------------------------------------------------------------------------------------------------
# Every algorithm x every ordered pair of real vocabularies x every sampling setting
# ---------------------------------------------------------------------------------------------------

REAL_ALGORITHMS = ("slem", "tli", "slrs")
#: Power of every real-vocabulary test: any sampler at total variation >= POWER_TV from the target (on the
#: bins) is rejected with probability >= POWER (``required_samples`` picks n from the exact distribution).
POWER_TV, POWER = 0.2, 0.9


#: How TLI and SLRS pick draft tokens when sampling: a sample of ``q`` at the call's temperature
#: (``hetspec_draft_temperature`` = the call's) or the drafter's argmax, verified by exact-match sampling (the
#: default, ``plan.DEFAULT_DRAFT_TEMPERATURE``: no keyword).
DRAFTS = ("sampled-draft", "greedy-draft")


def _matrix():
    """(pair, algorithm, draft, setting) for the whole matrix; a Latin square of it runs by default, the rest
    is ``slow``: pair ``i`` and algorithm ``a`` run setting ``(i + a + d) % 3`` by default (``d`` = 0 for
    sampled drafts, 1 for greedy ones) when ``i + a + d`` is even, so every algorithm meets every setting once
    in each draft mode (on three pairs, one per target vocabulary) and every pair runs at least two cells. The
    even rule halved the default cells (30 -> 15, about 2 minutes of CI) when the suite neared CI's 15
    minutes; ``-m "slow or not slow"`` runs all 90. SLEM always drafts greedily."""
    params = []
    for i, names in enumerate(REAL_PAIRS):
        for a, algorithm in enumerate(REAL_ALGORITHMS):
            for d, draft in enumerate(DRAFTS if algorithm != "slem" else ["sampled-draft"]):
                for j, setting in enumerate(SETTINGS):
                    default = j == (i + a + d) % len(SETTINGS) and (i + a + d) % 2 == 0
                    marks = () if default else (pytest.mark.slow,)
                    label = f"{'-'.join(names)}-{algorithm}-{setting}" + ("-greedy-draft" if d else "")
                    params.append(pytest.param(names, algorithm, draft, setting, marks=marks, id=label))
    return params


def _draft_kwargs(draft: str, temperature: float) -> dict:
    """``generate()`` kwargs selecting the draft mode of a call at ``temperature`` (none for the default,
    greedy drafts)."""
    assert draft in DRAFTS and DEFAULT_DRAFT_TEMPERATURE == 0.0
    return {"hetspec_draft_temperature": temperature} if draft == "sampled-draft" else {}


_EXACT: dict = {}


def _exact(pair, prompt, setting):
    """``exact_target_distribution`` of the first two tokens, computed once per target, prompt and setting."""
    key = (id(pair.target), prompt, setting)
    if key not in _EXACT:
        _EXACT[key] = exact_target_distribution(pair.target, _ids(pair, prompt), 2, **SETTINGS[setting])
    return _EXACT[key]


#: A prompt's exact two-token distribution is spread enough when its likeliest outcome has at most this
#: probability and at least three outcomes have 3% or more (several bins; the rejection path has mass).
MAX_TOP_OUTCOME = 0.7


def _spread(expected: dict) -> bool:
    """Whether ``expected`` (outcome -> probability) is spread enough for a test with power (:data:`MAX_TOP_OUTCOME`)."""
    return max(expected.values()) <= MAX_TOP_OUTCOME and sum(p >= 0.03 for p in expected.values()) >= 3


def _prompt(pair, names, algorithm, setting) -> str:
    """The pair's prompt for ``algorithm`` (``TLI_PROMPT`` or ``STRING_PROMPT``): the first candidate whose exact
    distribution under ``setting`` is spread enough on this machine (:func:`_spread`), else the last one."""
    candidates = (TLI_PROMPT if algorithm == "tli" else STRING_PROMPT)[names]
    candidates = (candidates,) if isinstance(candidates, str) else candidates
    return next((c for c in candidates if _spread(_exact(pair, c, setting))), candidates[-1])


def _real_report(pair, names, algorithm, setting, n=None, seed=0, draft="sampled-draft"):
    """(report, sampler) on a real pair's prompt; ``n`` defaults to what the power requirement needs."""
    prompt = _prompt(pair, names, algorithm, setting)
    expected = _exact(pair, prompt, setting)
    n = n or required_samples(expected, POWER_TV, POWER, ALPHA)
    extra = _draft_kwargs(draft, SETTINGS[setting]["temperature"]) if algorithm != "slem" else {}
    sampler = hetspec_sampler(pair.target, pair.drafter, pair.target_tokenizer, pair.drafter_tokenizer,
                              _ids(pair, prompt), algorithm, 2, **SETTINGS[setting], **extra)
    report = check_lossless(expected, sample_outcomes(sampler, n, seed), ALPHA)
    report.acceptance_rate = sampler.acceptance_rate
    return report, sampler


@pytest.mark.parametrize("names, algorithm, draft, setting", _matrix())
def test_sampling_is_lossless_on_real_vocabularies(real_pair, names, algorithm, draft, setting):
    """SLEM, TLI and SLRS keep the target's distribution on the real vocabularies (tiny random models
    correlated on the shared text), with greedy and sampled drafts, with the acceptance and the rejection
    paths both exercised."""
    report, sampler = _real_report(real_pair(*names), names, algorithm, setting, draft=draft)
    _assert_passes(report)
    assert sampler.accepted_tokens > 0, "no draft was ever accepted: the acceptance path was not tested"
    assert sampler.accepted_tokens < sampler.drafted_tokens, "no draft was rejected: the residual is untested"


def test_tli_rarely_accepts_where_the_drafter_prefers_an_unshared_token(real_pair):
    """Why TLI has its own prompts (``TLI_PROMPT``): TLI drafts only shared tokens, and after "self" the
    shared tokens the Qwen drafter proposes are nearly all outside the Gemma-3 target's top 5, while SLRS,
    proposing byte-prefixes of the drafter's unshared favourite "):\n", is accepted often there."""
    names = ("gemma3", "qwen2.5-coder")
    pair = real_pair(*names)
    ids = _ids(pair, STRING_PROMPT[names])
    rates = {}
    for algorithm in ("tli", "slrs"):
        sampler = hetspec_sampler(pair.target, pair.drafter, pair.target_tokenizer, pair.drafter_tokenizer, ids,
                                  algorithm, 2, **T1)
        sample_outcomes(sampler, 40, seed=0)
        assert sampler.drafted_tokens >= 40
        rates[algorithm] = sampler.accepted_tokens / sampler.drafted_tokens
    assert rates["tli"] <= 0.1 and rates["slrs"] >= 0.2, rates
    unshared = pair.drafter_tokenizer.convert_tokens_to_ids("):\u010a")  # byte-level "):\n"
    intersection = hf_hetspec.vocabulary_intersection(pair.target_tokenizer, pair.drafter_tokenizer)
    assert intersection.drafter_to_target[unshared] == -1


@pytest.mark.parametrize("pair_name", ["toy_pair", "toy_pair_reversed"])
@pytest.mark.parametrize("algorithm", [a for a in hf_hetspec.ALGORITHMS if a not in ("auto", "slem")])
def test_other_algorithms_are_lossless(request, algorithm, pair_name):
    """Every other algorithm name (all are implemented: a NotImplementedError fails the test).

    On ``toy_pair`` the drafter's top tokens are all shared with the target, so TLI and SLRS coincide there;
    on ``toy_pair_reversed`` (prompt of four spaces) SLRS proposes target tokens that are proper prefixes of
    the drafter's and accepts them, while TLI's drafts are never accepted (only its rejection path runs).
    """
    pair = request.getfixturevalue(pair_name)
    report = verify_lossless(pair.target, pair.drafter, pair.target_tokenizer, pair.drafter_tokenizer,
                             _ids(pair, TOY_PROMPT[pair_name]), algorithm, n=400, seed=0, alpha=ALPHA, **T07)
    _assert_passes(report)
    if pair_name == "toy_pair":
        assert report.acceptance_rate > 0


#: TLI's argmax drafts with sibling branches (the toy drafter is sure of its argmax, 0.98-0.998: a low cut-off
#: lets its runner-ups in).
TLI_SIBLINGS = dict(hetspec_schedule=dataclasses.replace(choose_schedule("tli", sample=True), sibling_min_joint=1e-6,
                                                         sibling_runner_ups=8))


class _TreeWalks:
    """Spy on the tree walks of a test: how many trees were verified and how many walks left the chain."""

    def __init__(self, monkeypatch, walk=None):
        self.trees = self.left_chain = 0
        walk = walk or hf_hetspec.decoding.walk_tree

        def spy(tree, choose):
            path, tokens = walk(tree, choose)
            self.trees += 1
            self.left_chain += int(path != list(range(len(path))))
            return path, tokens

        monkeypatch.setattr(hf_hetspec.decoding, "walk_tree", spy)


def test_tli_with_sibling_branches_is_lossless(toy_pair, monkeypatch):
    """TLI's argmax drafts of a sampled call with the drafter's runner-ups as sibling branches, verified as one
    tree by exact-match sampling: the target's exact distribution, with samples that took a sibling."""
    walks = _TreeWalks(monkeypatch)
    report, _ = _hetspec_report(toy_pair, TOY_PROMPT["toy_pair"], "tli", n=400, **TLI_SIBLINGS, **T1)
    _assert_passes(report)
    print("trees", walks.trees, "left the chain", walks.left_chain)
    assert walks.trees > 0 and walks.left_chain > 0, (walks.trees, walks.left_chain)


def test_rejects_tli_trees_walked_along_the_first_child(toy_pair, monkeypatch):
    """BROKEN: the walk over TLI's draft tree follows each node's first child whatever the target sampled."""
    walks = _TreeWalks(monkeypatch, walk=_walk_accepting_every_draft)
    report, _ = _hetspec_report(toy_pair, TOY_PROMPT["toy_pair"], "tli", n=200, **TLI_SIBLINGS, **T1)
    assert walks.trees > 0
    _assert_rejected(report)


@pytest.mark.parametrize("draft_temperature", [0.0, 0.5])
def test_verify_lossless_keeps_hetspec_keywords_out_of_the_reference(toy_pair, draft_temperature):
    """Issue #15: ``hetspec_draft_temperature`` used to reach the exact target distribution and fail there."""
    ids = _ids(toy_pair, TOY_PROMPT["toy_pair"])
    report = verify_lossless(toy_pair.target, toy_pair.drafter, toy_pair.target_tokenizer,
                             toy_pair.drafter_tokenizer, ids, "tli", n=300, seed=0, alpha=ALPHA,
                             hetspec_draft_temperature=draft_temperature, **T1)
    _assert_passes(report)
    assert report.acceptance_rate > 0
    with pytest.raises(ValueError, match="hetspec_draft_temperature"):  # it does reach the sampler
        verify_lossless(toy_pair.target, toy_pair.drafter, toy_pair.target_tokenizer, toy_pair.drafter_tokenizer,
                        ids, "tli", n=10, hetspec_draft_temperature=-1.0, **T1)


def test_verify_lossless_with_a_draft_temperature_rejects_a_broken_verifier(toy_pair, monkeypatch):
    """``hetspec_draft_temperature=0`` (argmax drafts) reaches the sampler: its drafts go through exact-match
    sampling, here broken to keep every draft token."""
    monkeypatch.setattr(hf_hetspec.decoding, "verify_exact_match_sampling", accept_every_draft)
    report = verify_lossless(toy_pair.target, toy_pair.drafter, toy_pair.target_tokenizer,
                             toy_pair.drafter_tokenizer, _ids(toy_pair, TOY_PROMPT["toy_pair"]), "tli", n=500,
                             seed=0, alpha=ALPHA, hetspec_draft_temperature=0.0, **T1)
    _assert_rejected(report)


def test_harness_refuses_hetspec_keywords_where_they_do_not_belong(toy_pair):
    ids = _ids(toy_pair, TOY_PROMPT["toy_pair"])
    with pytest.raises(ValueError, match="`hetspec_draft_temperature` is an hf_hetspec keyword"):
        exact_target_distribution(toy_pair.target, ids, 2, hetspec_draft_temperature=0.0, **T1)
    for name, fix in (("hetspec_algorithm", "algorithm="), ("hetspec_generator", "seed=")):
        with pytest.raises(ValueError, match=f"pass {fix} instead of {name}="):
            verify_lossless(toy_pair.target, toy_pair.drafter, toy_pair.target_tokenizer,
                            toy_pair.drafter_tokenizer, ids, "tli", n=10, **{name: None}, **T1)


# ---------------------------------------------------------------------------------------------------
# Power: deliberately broken variants are rejected
# ---------------------------------------------------------------------------------------------------


def _correction_from_p(draft_ids, draft_probs, target_probs, generator=None):
    """BROKEN speculative sampling: after a rejection the correction comes from p, not norm(max(0, p - q))."""
    k = draft_ids.shape[0]
    rows = torch.arange(k, device=draft_ids.device)
    u = torch.rand(k, generator=generator, device=target_probs.device, dtype=target_probs.dtype)
    n = _accepted_prefix(u * draft_probs[rows, draft_ids] < target_probs[rows, draft_ids])
    last = torch.multinomial(target_probs[n], 1, generator=generator)
    return torch.cat([draft_ids[:n], last]), n


def _assert_rejected(report):
    print(report)
    assert not report.passed and report.p_value < REJECT, str(report)


def _walk_accepting_every_draft(tree, choose):
    """BROKEN tree walk (:func:`hf_hetspec.tree.walk_tree`): the target chooses at every node, but the walk
    follows the node's first child whatever it chose."""
    node, path, tokens = -1, [], []
    while True:
        token = choose(node, tokens)
        child = next((c for (parent, _), c in tree.children.items() if parent == node), None)
        if child is None:
            return path, tokens + [token]
        tokens.append(tree.tokens[child])
        path.append(child)
        node = child


@pytest.mark.parametrize("verification", ["chain", "tree"])
def test_rejects_exact_match_that_accepts_every_draft(toy_pair, monkeypatch, verification):
    """SLEM's sampled drafts are verified as a chain, or with their sibling branches as a tree
    (:mod:`hf_hetspec.tree`); each broken variant keeps every draft token unchecked on its own path."""
    if verification == "chain":
        monkeypatch.setattr(hf_hetspec.decoding, "supports_tree", lambda target, cache: False)
        monkeypatch.setattr(hf_hetspec.decoding, "verify_exact_match_sampling", accept_every_draft)
    else:
        monkeypatch.setattr(hf_hetspec.decoding, "walk_tree", _walk_accepting_every_draft)
    report, _ = _hetspec_report(toy_pair, TOY_PROMPT["toy_pair"], "slem", n=200, **T1)
    _assert_rejected(report)


@pytest.mark.parametrize("draft", ["sampled-draft", "greedy-draft"])
def test_rejects_correction_sampled_from_p_instead_of_the_residual(toy_pair, monkeypatch, draft):
    """Sampled drafts: speculative sampling whose correction ignores ``q``. Greedy (argmax) drafts in a
    sampled call are verified by exact-match sampling, which has no residual: there the broken variant keeps
    every draft token unchecked."""
    assert torch.allclose(residual_distribution(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0])),
                          torch.tensor([0.0, 1.0]))
    if draft == "sampled-draft":
        monkeypatch.setattr(hf_hetspec.decoding, "verify_speculative_sampling", _correction_from_p)
    else:
        monkeypatch.setattr(hf_hetspec.decoding, "verify_exact_match_sampling", accept_every_draft)
    report, _ = _hetspec_report(toy_pair, TOY_PROMPT["toy_pair"], "tli", n=500,
                                **_draft_kwargs(draft, T1["temperature"]), **T1)
    _assert_rejected(report)


def test_rejects_verification_that_skips_the_temperature(toy_pair, monkeypatch):
    original = hf_hetspec.decoding._process

    def without_temperature(logits_processor, candidate_ids, n, logits):
        kept = [p for p in logits_processor if not isinstance(p, TemperatureLogitsWarper)]
        kept = type(logits_processor)(kept)
        return original(kept, candidate_ids, n, logits)

    monkeypatch.setattr(hf_hetspec.decoding, "_process", without_temperature)
    report, _ = _hetspec_report(toy_pair, TOY_PROMPT["toy_pair"], "slem", n=300, temperature=0.5, top_k=5)
    _assert_rejected(report)


def test_rejects_tli_whose_q_is_taken_before_the_drafter_warpers(real_pair, monkeypatch):
    """BROKEN TLI: the draft is drawn from the drafter's distribution after its warpers (temperature 0.7,
    top-k), but verification gets ``q`` before them. The same pair, prompt and setting pass unbroken in
    ``test_sampling_is_lossless_on_real_vocabularies[smollm2-gemma3-tli-t0.7]`` (default run). The exact
    first-token distribution of this broken sampler is at chi-square distance 0.28 per sample (TV 0.26) from
    the target's: n = 400 puts the expected statistic near 120 (p ~ 1e-20), far from ``REJECT``."""
    names = ("smollm2", "gemma3")

    def q_before_warpers(self, logits):
        q = self.drafter_distribution(logits)  # [1, columns], warped: what the draft is drawn from
        unwarped = self.restrict(None, logits).softmax(dim=-1)  # BROKEN: reported as the draft's q
        return torch.multinomial(q, 1, generator=self.generator), unwarped

    monkeypatch.setattr(TLIProposer, "select", q_before_warpers)
    report, sampler = _real_report(real_pair(*names), names, "tli", "t0.7", n=400)
    _assert_rejected(report)
    assert sampler.accepted_tokens > 0


def test_rejects_slrs_whose_psi_counts_only_the_intersection(real_pair, monkeypatch):
    """BROKEN SLRS: drafts come from the drafter's whole distribution through ``f``, but ``psi`` counts only
    the drafter tokens shared with the target (renormalized), as if the drafter were restricted like TLI's.
    Gemma-3 <- Qwen2.5-Coder after "self": the drafter's "):\\n" (not a Gemma-3 token) is proposed as "):",
    whose ``psi`` then misses ~0.48 of mass. The same pair, prompt and setting pass unbroken in
    ``test_sampling_is_lossless_on_real_vocabularies[gemma3-qwen2.5-coder-slrs-t1]`` (default run). Exact
    chi-square distance of the broken sampler's first token: 0.71 per sample (TV 0.42)."""
    names = ("gemma3", "qwen2.5-coder")
    pair = real_pair(*names)
    intersection = hf_hetspec.vocabulary_intersection(pair.target_tokenizer, pair.drafter_tokenizer)
    shared = intersection.drafter_to_target >= 0  # [V_drafter]

    def psi_over_the_intersection(self, logits):
        q = self.drafter_distribution(logits)  # [1, V_drafter]: what the draft is drawn from
        kept = q * shared[: q.shape[-1]].to(q)  # BROKEN: mass outside the intersection dropped
        kept = kept / kept.sum().clamp_min(torch.finfo(q.dtype).tiny)
        return q, push_forward(kept, self.map, self.target_size)

    monkeypatch.setattr(SLRSProposer, "_psi", psi_over_the_intersection)
    report, sampler = _real_report(pair, names, "slrs", "t1")
    _assert_rejected(report)
    assert sampler.accepted_tokens > 0


def half_sure_argmax_drafts(propose):
    """``TokenLevelProposer._propose`` BROKEN: an argmax draft (a point mass, verified by exact match) is handed
    to speculative sampling with ``q(x) = 1/2`` on each drafted token, the rest spread over the vocabulary."""

    def broken(self, budget):
        draft = propose(self, budget)
        if self.policy.sample or not draft.target_ids or draft.q is not None:
            return draft
        k = len(draft.target_ids)
        q = torch.full((k, self.target_size), 0.5 / (self.target_size - 1))
        q[torch.arange(k), torch.tensor(draft.target_ids)] = 0.5
        return type(draft)(draft.target_ids, q)

    return broken


@pytest.mark.parametrize("algorithm", ["tli", "slrs"])
def test_rejects_greedy_drafts_verified_as_if_they_were_sampled(real_pair, monkeypatch, algorithm):
    """BROKEN greedy drafting (:func:`half_sure_argmax_drafts`): the draft is the drafter's argmax (certain),
    but verification is told ``q(x) = 1/2``, so a draft token is accepted with probability ``min(1, 2 p(x))``
    instead of ``p(x)``. The same pairs, prompts and setting pass
    unbroken in the ``-greedy-draft`` cells of ``test_sampling_is_lossless_on_real_vocabularies``."""
    names = ("qwen2.5-coder", "smollm2") if algorithm == "tli" else ("gemma3", "qwen2.5-coder")

    monkeypatch.setattr(TokenLevelProposer, "_propose", half_sure_argmax_drafts(TokenLevelProposer._propose))
    report, sampler = _real_report(real_pair(*names), names, algorithm, "t1", draft="greedy-draft")
    _assert_rejected(report)
    assert sampler.accepted_tokens > 0


# ---------------------------------------------------------------------------------------------------
# Block verification (hetspec_verification="block")
# ---------------------------------------------------------------------------------------------------

#: The token-level default schedule of an eager drafter without the context lookup and the back-off, so that
#: every round is a drafter round, verified by block verification (lookup drafts are verified by exact match).
NO_SOURCES = hf_hetspec.Schedule(DEFAULT_LOOKAHEAD, True)
#: Outcomes of three tokens: the first round drafts two, so block verification can stop inside the block
#: (0 < tau < k), the one path where its correction differs from token-level speculative sampling (with one
#: drafted token the two rules coincide, so the harness's default two-token outcomes would not tell them apart).
BLOCK_TOKENS = 3


def _block_samples(pair, prompt: str, setting: dict) -> int:
    """Sample size with power ``POWER`` against every alternative at TV ``POWER_TV`` on three tokens."""
    expected = exact_target_distribution(pair.target, _ids(pair, prompt), BLOCK_TOKENS, **setting)
    return required_samples(expected, POWER_TV, POWER, ALPHA)


def _spy_on_verify_block(monkeypatch) -> list:
    """Record ``(k, tau)`` of every ``verify_block`` call the decoding loop makes (behaviour unchanged)."""
    rounds = []
    original = hf_hetspec.decoding.verify_block

    def spy(draft_ids, draft_probs, target_probs, generator=None):
        tokens, tau = original(draft_ids, draft_probs, target_probs, generator)
        rounds.append((draft_ids.shape[0], tau))
        return tokens, tau

    monkeypatch.setattr(hf_hetspec.decoding, "verify_block", spy)
    return rounds


@pytest.mark.parametrize("algorithm, pair_name, setting", [
    ("tli", "toy_pair", "t1"),
    ("slrs", "toy_pair_reversed", "t1"),
    pytest.param("slrs", "toy_pair", "t1", marks=pytest.mark.slow),
    pytest.param("tli", "toy_pair", "t0.7", marks=pytest.mark.slow),
    pytest.param("slrs", "toy_pair_reversed", "top_p0.9", marks=pytest.mark.slow),
])
def test_block_verification_is_lossless(request, monkeypatch, algorithm, pair_name, setting):
    """TLI and SLRS with ``hetspec_verification="block"`` keep the target's distribution of three tokens, and
    rounds ended inside the block (``0 < tau < k``) did happen, so its own correction was exercised. (TLI on
    ``toy_pair_reversed`` never accepts a draft, ``test_other_algorithms_are_lossless``: no such round.)"""
    pair = request.getfixturevalue(pair_name)
    rounds = _spy_on_verify_block(monkeypatch)
    n = _block_samples(pair, TOY_PROMPT[pair_name], SETTINGS[setting])
    report = verify_lossless(pair.target, pair.drafter, pair.target_tokenizer, pair.drafter_tokenizer,
                             _ids(pair, TOY_PROMPT[pair_name]), algorithm, n=n, seed=0, alpha=ALPHA,
                             num_tokens=BLOCK_TOKENS, hetspec_verification="block", **SETTINGS[setting],
                             **_draft_kwargs("sampled-draft", SETTINGS[setting]["temperature"]),
                             hetspec_schedule=NO_SOURCES)
    _assert_passes(report)
    assert len(rounds) >= n and any(0 < tau < k for k, tau in rounds), rounds[:20]


def _correction_from_p_block(p, q, weight=1.0):
    """BROKEN block verification: the correction after ``x_1 .. x_tau`` is a sample of ``p`` itself, not of
    ``norm(max(0, w_tau p - q))``."""
    return p


def test_rejects_block_verification_whose_correction_comes_from_p(toy_pair, monkeypatch):
    """The same harness rejects a broken block verifier. The subtler block-only bugs (token-level's residual
    at the block's end, ``h_i = w_i``) move the toy pairs' three-token distribution too little to be seen with
    a few hundred generations; ``tests/test_verify.py`` rejects them on toy chains where their exact distance is
    known (power >= 0.999)."""
    n = _block_samples(toy_pair, TOY_PROMPT["toy_pair"], T1)
    monkeypatch.setattr(hf_hetspec.verify, "residual_distribution", _correction_from_p_block)
    report = verify_lossless(toy_pair.target, toy_pair.drafter, toy_pair.target_tokenizer,
                             toy_pair.drafter_tokenizer, _ids(toy_pair, TOY_PROMPT["toy_pair"]), "tli", n=n,
                             seed=0, alpha=ALPHA, num_tokens=BLOCK_TOKENS, hetspec_verification="block", **T1,
                             **_draft_kwargs("sampled-draft", T1["temperature"]))
    _assert_rejected(report)


# ---------------------------------------------------------------------------------------------------
# transformers' own universal assisted generation
# ---------------------------------------------------------------------------------------------------


# the SmolLM2 cell needs 3x the samples (its TV is smaller) and ~30 s: it runs with the slow matrix
@pytest.mark.parametrize("drafter, n", [("gemma3", 200), pytest.param("smollm2", 600, marks=pytest.mark.slow)])
def test_rejects_transformers_universal_assisted_sampling_qwen_target(real_pair, drafter, n):
    """transformers 5.x prunes the drafter's LM head to the shared tokens in ``get_vocab()`` order but
    scatters the pruned logits back in ascending id order, so ``q`` no longer belongs to the sampled token
    (``q(x)`` is mostly 0: every draft that the target's top-k contains is accepted, and the output follows
    the drafter).

    Scattering the logits back in pruning order instead makes this exact check pass for the Gemma-3 drafter
    (p = 0.999 at n = 200, p = 0.018 at n = 1000), which confirms the cause. ``get_vocab()`` order is the
    Rust hash map's, which varies between processes, so the observed counts differ from run to run (Gemma-3:
    TV 0.69-0.73 in four runs, p < 1e-128 at n = 200; SmolLM2: TV 0.18-0.21 in eight runs, p < 2e-12 at
    n = 400, so n = 600 here); the rejection does not. Both drafters of the offline zoo are affected, so transformers' sampling path is lossy for
    either real pairing (the benchmarks mark it). If this test starts failing after a transformers upgrade,
    the bug was fixed."""
    pair = real_pair("qwen2.5-coder", drafter)
    ids = _ids(pair, "On 14")  # the drafter's own distribution differs from the target's here
    expected = exact_target_distribution(pair.target, ids, 2, **T1)
    sampler = transformers_sampler(pair.target, pair.drafter, pair.target_tokenizer, pair.drafter_tokenizer,
                                   ids, 2, **T1)
    _assert_rejected(check_lossless(expected, sample_outcomes(sampler, n, seed=0), ALPHA))
    assert sampler.drafter is not pair.drafter  # the fixture's drafter is never pruned
    assert pair.drafter.get_output_embeddings().weight.shape[0] == pair.drafter.config.vocab_size
