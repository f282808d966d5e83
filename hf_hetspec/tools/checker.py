"""Greedy losslessness check against the target alone: moved to :mod:`hf_hetspec.testing.greedy` (the test
helpers' layer); this is its old import path."""

from ..testing.greedy import TIE_ULPS, GreedyComparison, compare_greedy, tie_tolerance  # noqa: F401
