"""Verification math (hf_hetspec.verify): exact values, Monte-Carlo chi-square with power; block verification
exactly by enumeration, by chi-square with stated power, and against a plain-Python reference."""

import itertools
import math

import pytest
import torch
from scipy.stats import chisquare

import hf_hetspec.verify
from hf_hetspec.testing import _bin_groups, check_lossless, sample_outcomes
from hf_hetspec.verify import (
    block_weights,
    residual_distribution,
    verify_block,
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


@pytest.mark.parametrize("verify", [verify_speculative_sampling, verify_block], ids=["token", "block"])
def test_sampled_verification_accepts_everything_when_q_equals_p(verify):
    """q == p: every draft token is accepted, then the bonus token (token-level and block verification)."""
    p = _dist(4, 4)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        draft = torch.stack([torch.multinomial(p[i], 1, generator=g)[0] for i in range(3)])
        tokens, n = verify(draft, p[:3], p, g)
        assert n == 3 and tokens[:3].tolist() == draft.tolist() and tokens.shape[0] == 4


# ---------------------------------------------------------------------------------------------------
# Block verification (Sun et al. 2025, Algorithm 2)
# ---------------------------------------------------------------------------------------------------


class _Chain:
    """A toy target ``p(. | prefix)`` and drafter ``q(. | prefix)`` over ``V`` tokens for prefixes of up to
    ``k`` tokens (float64, seeded). With ``zeros`` every ``p`` row has a token it never emits that ``q``
    proposes, and every ``q`` row a token it never proposes that ``p`` emits."""

    def __init__(self, V: int, k: int, seed: int, zeros: bool, scale: float = 1.5):
        self.V, self.k = V, k
        self.p, self.q = {}, {}
        g = torch.Generator().manual_seed(seed)
        for length in range(k + 1):
            for prefix in itertools.product(range(V), repeat=length):
                p = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * scale, -1)
                q = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * scale, -1)
                if zeros:
                    never = int(torch.randint(V, (1,), generator=g))
                    p[never] = 0.0
                    q[(never + 1) % V] = 0.0
                self.p[prefix], self.q[prefix] = p / p.sum(), q / q.sum()

    def rows(self, draft: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """``(draft_probs [k, V], target_probs [k + 1, V])`` along ``draft``."""
        q = torch.stack([self.q[draft[:i]] for i in range(len(draft))]) if draft else torch.zeros(0, self.V)
        return q.to(torch.float64), torch.stack([self.p[draft[:i]] for i in range(len(draft) + 1)])

    def draft_probability(self, draft: tuple) -> float:
        return math.prod(float(self.q[draft[:i]][x]) for i, x in enumerate(draft))

    def target_distribution(self) -> dict:
        """Exact distribution of ``k + 1`` tokens sampled from the target alone."""
        out = {}
        for seq in itertools.product(range(self.V), repeat=self.k + 1):
            prob = math.prod(float(self.p[seq[:i]][x]) for i, x in enumerate(seq))
            if prob > 0:
                out[seq] = prob
        return out

    def continue_with_target(self, prefix: tuple, mass: float, out: dict) -> None:
        """Add ``mass`` times the target's distribution of the continuations of ``prefix`` to ``k + 1``
        tokens into ``out``."""
        if len(prefix) == self.k + 1:
            out[prefix] = out.get(prefix, 0.0) + mass
            return
        for y, p_y in enumerate(self.p[prefix].tolist()):
            if p_y > 0:
                self.continue_with_target(prefix + (y,), mass * p_y, out)


def _exact_block_output(chain: _Chain) -> tuple[dict, float]:
    """Exact distribution of the ``k + 1`` tokens that one round of block verification emits (continued by
    the target), and the exact ``E[tau]``, by enumerating every draft and integrating over ``eta``:
    ``P(tau = i | draft) = h_i prod_{j > i} (1 - h_j)``. It calls ``hf_hetspec.verify.block_weights`` and
    ``residual_distribution`` through the module, so a test that monkeypatches them gets the broken variant's
    exact distribution."""
    out, mean_tau = {}, 0.0
    for draft in itertools.product(range(chain.V), repeat=chain.k):
        q_draft = chain.draft_probability(draft)
        if q_draft == 0:
            continue
        draft_probs, target_probs = chain.rows(draft)
        ids = torch.tensor(draft, dtype=torch.long)
        w, h = hf_hetspec.verify.block_weights(ids, draft_probs, target_probs)
        h = h.tolist()
        for tau in range(chain.k + 1):
            p_tau = h[tau] * math.prod(1.0 - h_j for h_j in h[tau + 1:])
            if p_tau == 0:
                continue
            mean_tau += q_draft * p_tau * tau
            if tau == chain.k:
                last = target_probs[tau]
            else:
                last = hf_hetspec.verify.residual_distribution(target_probs[tau], draft_probs[tau], w[tau])
            for y, p_y in enumerate(last.tolist()):
                if p_y > 0:
                    chain.continue_with_target(draft[:tau] + (y,), q_draft * p_tau * p_y, out)
    return out, mean_tau


def _exact_token_level_mean_accepted(chain: _Chain) -> float:
    """Exact ``E[n_accepted]`` of :func:`verify_speculative_sampling`: ``P(n >= i | x_1 .. x_i)`` is
    ``prod_{j <= i} min(1, p/q)``, so ``E[n] = sum_i sum_{x_1..x_i} prod_j min(q_j(x_j), p_j(x_j))``."""
    total = 0.0
    for length in range(1, chain.k + 1):
        for prefix in itertools.product(range(chain.V), repeat=length):
            total += math.prod(min(float(chain.q[prefix[:i]][x]), float(chain.p[prefix[:i]][x]))
                               for i, x in enumerate(prefix))
    return total


def _paper_recursion(draft_probs, target_probs, draft):
    """Plain-Python ``w`` and ``h`` of Sun et al.'s Algorithm 2 (the paper's ``p_i`` is ``w_i``)."""
    k = len(draft)
    w = [1.0]
    for i, x in enumerate(draft):
        p_x, q_x = float(target_probs[i][x]), float(draft_probs[i][x])
        w.append(min(1.0, w[-1] * p_x / q_x) if q_x > 0 else float(p_x > 0 and w[-1] > 0))
    h = [1.0]
    for i in range(1, k):
        mass = sum(max(0.0, w[i] * float(p) - float(q)) for p, q in zip(target_probs[i], draft_probs[i]))
        h.append(mass / (mass + 1.0 - w[i]) if mass > 0 else 0.0)
    if k:
        h.append(w[k])
    return w, h


CHAINS = {  # name: (V, k, seed, zeros, scale)
    "V3-k1-zeros": (3, 1, 0, True, 1.5),
    "V3-k2": (3, 2, 8, False, 1.5),
    "V3-k3-zeros": (3, 3, 30, True, 1.0),
    "V4-k2-zeros": (4, 2, 22, True, 2.0),
    "V4-k3": (4, 3, 1, False, 2.0),
    "V5-k2-zeros": (5, 2, 3, True, 1.5),
}


@pytest.mark.parametrize("name", list(CHAINS))
def test_block_weights_follow_the_papers_recursion(name):
    """The vectorized ``w`` (cumsum / cummax in log space) and ``h`` equal the plain loop, on every draft of
    the chain, in float64 and (to rounding) float32."""
    chain = _Chain(*CHAINS[name])
    for draft in itertools.product(range(chain.V), repeat=chain.k):
        if chain.draft_probability(draft) == 0:
            continue
        draft_probs, target_probs = chain.rows(draft)
        w_ref, h_ref = _paper_recursion(draft_probs.tolist(), target_probs.tolist(), draft)
        ids = torch.tensor(draft, dtype=torch.long)
        w, h = block_weights(ids, draft_probs, target_probs)
        torch.testing.assert_close(w, torch.tensor(w_ref, dtype=torch.float64), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(h, torch.tensor(h_ref, dtype=torch.float64), rtol=1e-12, atol=1e-14)
        w32, h32 = block_weights(ids, draft_probs.float(), target_probs.float())
        torch.testing.assert_close(w32, w.float(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(h32, h.float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(CHAINS))
def test_block_verification_is_exactly_the_target_distribution(name):
    """Level 1 (exact): the distribution of the ``k + 1`` emitted tokens, enumerated over every draft and
    integrated over ``eta``, equals the target's to float64 rounding, zeros of ``p`` and ``q`` included;
    its ``E[tau]`` is never below token-level speculative sampling's."""
    chain = _Chain(*CHAINS[name])
    expected = chain.target_distribution()
    got, mean_tau = _exact_block_output(chain)
    assert set(got) == set(expected)
    for outcome, prob in expected.items():
        assert got[outcome] == pytest.approx(prob, rel=1e-9, abs=1e-15)
    assert mean_tau >= _exact_token_level_mean_accepted(chain) - 1e-12


def test_block_verification_accepts_more_on_the_papers_example():
    """Sun et al., Section 1: context-free ``p = (1/3, 2/3)``, ``q = (2/3, 1/3)``, ``k = 2``: token-level
    verification accepts 10/9 draft tokens per round on average, block verification 11/9."""
    chain = _Chain(2, 2, 0, False)
    for prefix in chain.p:
        chain.p[prefix] = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64)
        chain.q[prefix] = torch.tensor([2 / 3, 1 / 3], dtype=torch.float64)
    got, mean_tau = _exact_block_output(chain)
    assert mean_tau == pytest.approx(11 / 9, rel=1e-12)
    assert _exact_token_level_mean_accepted(chain) == pytest.approx(10 / 9, rel=1e-12)
    expected = chain.target_distribution()
    assert all(got[o] == pytest.approx(p, rel=1e-12) for o, p in expected.items())


def test_block_verification_accepts_at_least_as_much_as_token_level_on_random_chains():
    """Optimality (Sun et al.): exact ``E[tau]`` >= token-level's on every chain, strictly on most."""
    gains = []
    for seed in range(8):
        chain = _Chain(3, 3, seed, zeros=seed % 2 == 1)
        _, block = _exact_block_output(chain)
        token = _exact_token_level_mean_accepted(chain)
        assert block >= token - 1e-12, (seed, block, token)
        gains.append(block - token)
    assert sum(g > 1e-6 for g in gains) >= 6, gains


BLOCK_N = 3000


def _block_round_sampler(chain: _Chain, taus: list | None = None):
    """``sampler(generator) -> outcome``: draft ``k`` tokens from ``q``, one round of
    ``hf_hetspec.verify.verify_block`` in float32 (as in decoding), then the target alone up to ``k + 1``."""
    rows = {}
    q32 = {prefix: q.float() for prefix, q in chain.q.items()}
    p32 = {prefix: p.float() for prefix, p in chain.p.items()}

    def run(g):
        draft = ()
        for _ in range(chain.k):
            draft += (int(torch.multinomial(q32[draft], 1, generator=g)),)
        if draft not in rows:
            rows[draft] = tuple(t.float() for t in chain.rows(draft))
        tokens, tau = hf_hetspec.verify.verify_block(torch.tensor(draft), *rows[draft], g)
        if taus is not None:
            taus.append(tau)
        out = tuple(tokens.tolist())
        while len(out) < chain.k + 1:
            out += (int(torch.multinomial(p32[out], 1, generator=g)),)
        return out

    return run


def _power_against(expected: dict, alternative: dict, n: int, alpha: float) -> float:
    """Power of ``check_lossless(expected, counts of n samples, alpha)`` when the samples come from
    ``alternative`` (noncentral chi-square on the test's own bins; an outcome impossible under ``expected``
    is rejected outright, so its mass only adds power)."""
    from scipy.stats import chi2, ncx2

    bins = _bin_groups(expected, n, 5.0)
    expected_mass = [sum(expected[o] for o in group) for group in bins]
    alternative_mass = [sum(alternative.get(o, 0.0) for o in group) for group in bins]
    noncentrality = n * sum((a - e) ** 2 / e for a, e in zip(alternative_mass, expected_mass))
    dof = len(bins) - 1
    return float(ncx2.sf(chi2.isf(alpha, dof), dof, noncentrality))


@pytest.mark.parametrize("name", ["V3-k3-zeros", "V4-k2-zeros",
                                  pytest.param("V4-k3", marks=pytest.mark.slow),
                                  pytest.param("V5-k2-zeros", marks=pytest.mark.slow)])
def test_verify_block_samples_have_the_target_distribution(name):
    """Level 2 (Monte Carlo): ``BLOCK_N`` rounds of ``verify_block`` (draft sampled from ``q``) against the
    exact target distribution of ``k + 1`` tokens, chi-square at ``alpha = 1e-3``; the mean accepted length
    matches the exact ``E[tau]`` within 5 standard errors."""
    chain = _Chain(*CHAINS[name])
    expected = chain.target_distribution()
    taus = []
    counts = sample_outcomes(_block_round_sampler(chain, taus), BLOCK_N, seed=1)
    report = check_lossless(expected, counts, 1e-3)
    print(report)
    assert report.passed and report.num_bins >= 8, str(report)
    _, mean_tau = _exact_block_output(chain)
    taus = torch.tensor(taus, dtype=torch.float64)
    assert abs(float(taus.mean()) - mean_tau) < 5 * float(taus.std()) / BLOCK_N ** 0.5 + 1e-9
    assert 0 < mean_tau < chain.k  # both the correction and the bonus paths run


def _token_residual_at_the_end(p, q, weight=1.0):
    """BROKEN block verification: the correction after ``x_1 .. x_tau`` is token-level's
    ``norm(max(0, p - q))``, ignoring the weight ``w_tau`` the accepted prefix carries."""
    return residual_distribution(p, q)


def _stop_with_w_everywhere(draft_ids, draft_probs, target_probs):
    """BROKEN block verification: ``h_i = w_i`` at every position (the residual term ``R_i / (R_i + 1 - w_i)``
    omitted), as if each prefix were the end of the block."""
    w, _ = block_weights(draft_ids, draft_probs, target_probs)
    return w, torch.cat([w.new_ones(1), w[1:]])


BROKEN_BLOCK = {"token-residual": ("residual_distribution", _token_residual_at_the_end),
                "h-is-w": ("block_weights", _stop_with_w_everywhere)}


@pytest.mark.parametrize("broken", list(BROKEN_BLOCK))
def test_verify_block_test_rejects_broken_block_verifiers(monkeypatch, broken):
    """The same chi-square test has power: on ``V3-k3-zeros`` each broken variant's exact output distribution
    (enumerated as above) gives the test power >= 0.999 at ``BLOCK_N`` samples (noncentrality 130 for
    token-residual, TV 0.050; 1190 for h-is-w, TV 0.18; 14 degrees of freedom), and the sampled run is
    rejected at p < 1e-6."""
    chain = _Chain(*CHAINS["V3-k3-zeros"])
    expected = chain.target_distribution()
    monkeypatch.setattr(hf_hetspec.verify, *BROKEN_BLOCK[broken])
    alternative, _ = _exact_block_output(chain)
    power = _power_against(expected, alternative, BLOCK_N, 1e-3)
    assert power >= 0.999, power
    report = check_lossless(expected, sample_outcomes(_block_round_sampler(chain), BLOCK_N, seed=1), 1e-3)
    print(f"{broken}: power {power:.6f}; {report}")
    assert not report.passed and report.p_value < 1e-6, str(report)


def test_verify_block_edge_cases():
    p = _dist(4, 4)
    g = torch.Generator().manual_seed(0)
    # (q == p is test_sampled_verification_accepts_everything_when_q_equals_p[block])
    # an empty draft: one token from p_0
    tokens, n = verify_block(torch.tensor([], dtype=torch.long), p[:0], p[:1], g)
    assert n == 0 and tokens.shape == (1,)
    # a first draft token the target never emits: w = 0 from there on, nothing is accepted
    target = p.clone()
    target[0, 2] = 0.0
    target[0] /= target[0].sum()
    draft = torch.tensor([2, 1, 0])
    w, h = block_weights(draft, p[:3], target)
    assert w[1:].eq(0).all() and h[1:].eq(0).all()
    for _ in range(20):
        tokens, n = verify_block(draft, p[:3], target, g)
        assert n == 0 and tokens.tolist() != [2]
    with pytest.raises(ValueError, match="draft_probs of shape"):
        verify_block(draft, p[:2], p, g)
    with pytest.raises(ValueError, match="target_probs of shape"):
        verify_block(draft, p[:3], p[:3], g)


def test_verify_block_with_one_draft_token_is_speculative_sampling():
    """``k = 1``: ``h_1 = w_1 = min(1, p/q)`` and the correction is ``norm(max(0, p - q))``."""
    p, q = _dist(0, 2), _dist(1, 1)
    for token in range(V):
        w, h = block_weights(torch.tensor([token]), q, p)
        ratio = min(1.0, float(p[0, token] / q[0, token]))
        assert float(w[1]) == pytest.approx(ratio, rel=1e-6) and float(h[1]) == pytest.approx(ratio, rel=1e-6)
