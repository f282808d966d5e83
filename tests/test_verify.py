"""Verification math (hf_hetspec.verify): exact values, Monte-Carlo chi-square with power."""

import pytest
import torch
from scipy.stats import chisquare

from hf_hetspec.verify import (
    residual_distribution,
    verify_exact_match_sampling,
    verify_greedy,
    verify_speculative_sampling,
)

V = 6
N = 20_000


def _dist(seed: int, rows: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(rows, V, generator=g) * 1.5, dim=-1)


def test_verify_greedy_accepts_matching_prefix_and_appends_target_argmax():
    logits = torch.full((4, V), -1.0)
    for row, tok in enumerate([2, 5, 1, 3]):
        logits[row, tok] = 1.0
    tokens, n = verify_greedy(torch.tensor([2, 5, 0]), logits)
    assert n == 2
    assert tokens.tolist() == [2, 5, 1]
    tokens, n = verify_greedy(torch.tensor([2, 5, 1]), logits)
    assert (n, tokens.tolist()) == (3, [2, 5, 1, 3])
    tokens, n = verify_greedy(torch.tensor([4, 5, 1]), logits)
    assert (n, tokens.tolist()) == (0, [2])
    tokens, n = verify_greedy(torch.tensor([], dtype=torch.long), logits[:1])
    assert (n, tokens.tolist()) == (0, [2])


def test_residual_distribution_exact():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.4, 0.2, 0.2])
    torch.testing.assert_close(residual_distribution(p, q), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    p = torch.tensor([0.4, 0.4, 0.2])
    q = torch.tensor([0.1, 0.3, 0.6])
    torch.testing.assert_close(residual_distribution(p, q), torch.tensor([0.75, 0.25, 0.0]))
    # p == q: no rejection can happen; the function stays total and returns p
    torch.testing.assert_close(residual_distribution(p, p.clone()), p)


def _first_two_counts(sample_fn, seed: int) -> torch.Tensor:
    """Counts of the first two emitted tokens over N runs of ``sample_fn(generator)``."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V * V)
    for _ in range(N // 4):
        tokens = sample_fn(g)
        counts[tokens[0] * V + tokens[1]] += 1
    return counts


def _speculative_run(p, q, broken=False):
    def run(g):
        draft = torch.stack([torch.multinomial(q[i], 1, generator=g)[0] for i in range(q.shape[0])])
        if broken:  # the classic bug: sample from p after a rejection instead of the residual
            tokens, n = verify_speculative_sampling(draft, q, p, g)
            if n < q.shape[0]:
                tokens = torch.cat([draft[:n], torch.multinomial(p[n], 1, generator=g)])
            return _extend(tokens, p, g)
        tokens, _ = verify_speculative_sampling(draft, q, p, g)
        return _extend(tokens, p, g)

    return run


def _extend(tokens, p, g):
    # the rows of p do not depend on the context here, so a token after the block comes from the next row
    while tokens.shape[0] < 2:
        tokens = torch.cat([tokens, torch.multinomial(p[tokens.shape[0]], 1, generator=g)])
    return tokens.tolist()


def _expected_first_two(p):
    return (p[0][:, None] * p[1][None, :]).flatten()


@pytest.mark.parametrize("k", [1, 2])
def test_speculative_sampling_matches_target_distribution(k):
    p, q = _dist(0, k + 1), _dist(1, k)
    counts = _first_two_counts(_speculative_run(p, q), seed=k)
    expected = _expected_first_two(p) * counts.sum()
    keep = expected > 0
    stat, pvalue = chisquare(counts[keep].numpy(), expected[keep].numpy())
    assert pvalue > 1e-3, (stat, pvalue)


def test_speculative_sampling_test_has_power_against_skipping_the_residual():
    p, q = _dist(0, 3), _dist(1, 2)
    counts = _first_two_counts(_speculative_run(p, q, broken=True), seed=7)
    expected = _expected_first_two(p) * counts.sum()
    keep = expected > 0
    _, pvalue = chisquare(counts[keep].numpy(), expected[keep].numpy())
    assert pvalue < 1e-6


def test_exact_match_sampling_matches_target_distribution_and_accepts_matches():
    p = _dist(3, 3)
    draft = torch.tensor([int(p[0].argmax()), int(p[1].argmax())])

    def run(g):
        tokens, _ = verify_exact_match_sampling(draft, p, g)
        return _extend(tokens, p, g)

    counts = _first_two_counts(run, seed=11)
    expected = _expected_first_two(p) * counts.sum()
    _, pvalue = chisquare(counts.numpy(), expected.numpy())
    assert pvalue > 1e-3
    # acceptance of the first draft token happens exactly with probability p0(draft0)
    g = torch.Generator().manual_seed(5)
    accepted = sum(verify_exact_match_sampling(draft, p, g)[1] >= 1 for _ in range(4000)) / 4000
    assert abs(accepted - float(p[0, draft[0]])) < 0.03


def test_speculative_sampling_accepts_everything_when_q_equals_p():
    p = _dist(4, 4)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        draft = torch.stack([torch.multinomial(p[i], 1, generator=g)[0] for i in range(3)])
        tokens, n = verify_speculative_sampling(draft, p[:3], p, g)
        assert n == 3 and tokens[:3].tolist() == draft.tolist() and tokens.shape[0] == 4
