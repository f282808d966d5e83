"""hf_hetspec.stats: the metric conventions, written once and used by the library and the tools."""

from __future__ import annotations

import pytest

from hf_hetspec.stats import DecodingStats, acceptance_rate, alpha


def test_acceptance_rate_and_alpha():
    # 3 rounds of 4 drafted tokens: all accepted, 1 accepted then a rejection, 2 accepted then a rejection
    assert acceptance_rate(7, 12) == pytest.approx(7 / 12)
    assert alpha(7, 2) == pytest.approx(7 / 9)  # tokens after a round's first rejection are never examined
    assert acceptance_rate(0, 0) is None and alpha(0, 0) is None


def test_decoding_stats_derived_values():
    stats = DecodingStats(algorithm="slem", new_tokens=20, target_forwards=8, drafted_tokens=24,
                          accepted_tokens=12, rejections=6, total_s=2.0)
    assert stats.acceptance_rate == pytest.approx(0.5)
    assert stats.alpha == pytest.approx(12 / 18)
    assert stats.alpha >= stats.acceptance_rate
    assert stats.mean_accepted_per_forward == pytest.approx(2.5)  # bonus tokens included
    assert stats.tokens_per_second == pytest.approx(10.0)
    d = stats.as_dict()
    assert d["alpha"] == stats.alpha and d["acceptance_rate"] == 0.5 and d["new_tokens"] == 20
    assert "acceptance 0.50 (alpha 0.67)" in stats.summary() and "2.50 tokens/forward" in stats.summary()
    assert "tree" not in stats.summary()
    stats.tree_rounds, stats.sibling_rounds = 5, 2
    assert ", 5 tree rounds (2 took a sibling)" in stats.summary()


def test_a_call_that_drafted_nothing_says_so_rather_than_a_zero_acceptance():
    stats = DecodingStats(algorithm="slem", new_tokens=12, target_forwards=12, skipped_drafts=12, total_s=1.0,
                          drafter_runtime="int8-static")
    line = stats.summary()
    assert "no drafts (12 rounds the target went on alone)" in line and "acceptance" not in line
    assert "int8-static drafter (not run)" in line and "c=" not in line
    stats.skipped_drafts, stats.backed_off = 0, 5
    assert "no drafts (5 rounds backed off)" in stats.summary()


def test_empty_stats_are_zero_not_errors():
    stats = DecodingStats()
    assert (stats.acceptance_rate, stats.alpha, stats.mean_accepted_per_forward, stats.tokens_per_second) == (
        0.0, 0.0, 0.0, 0.0)


def test_timer_adds_wall_time():
    stats = DecodingStats()
    with stats.timer("drafter_s"):
        pass
    first = stats.drafter_s
    with stats.timer("drafter_s"):
        sum(range(10_000))
    assert 0.0 <= first <= stats.drafter_s
