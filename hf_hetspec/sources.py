"""Where each draft comes from: the drafter, the context (n-gram lookup), or nowhere.

Many prompts are partly copied into the answer: summaries, RAG and QA answers quote their sources, code edits
repeat the code. :class:`ContextLookup` finds the longest recent n-gram of the target's own ids (prompt and
generated text) that ends like the text so far and proposes what followed it (prompt lookup decoding, Saxena
2023; the "copy" drafts of Yang et al. 2023, "Inference with Reference"). Such a draft is already in target
ids and costs no drafter step.

:class:`SourcedProposer` wraps an algorithm's proposer and picks, before every round, the source with the
best expected yield per unit of cost (:class:`SourcePolicy`):

* ``"drafter"``: the algorithm's own draft (SLEM, TLI or SLRS);
* ``"lookup"``: the context's continuation, when the context has a match;
* ``"none"``: no draft; the target decodes one token alone (back-off when drafting keeps failing).

Yield and cost are counted in target tokens and target forwards (Leviathan et al. 2023, Section 3.4): a round
of ``k`` drafted target tokens, ``f`` drafter forwards and ``a`` accepted tokens yields ``a + 1`` tokens at a
cost of ``1 + v k + c f`` target forwards, ``c`` being the drafter runtime's cost ratio and ``v`` the extra
cost of verifying one more token (:data:`~hf_hetspec.schedule.COST_RATIOS`,
:data:`~hf_hetspec.schedule.VERIFY_COST`). Target decoding alone yields exactly 1 per forward.

Exactness: every choice depends only on the accepted ids and on counts of earlier rounds, never on the
randomness of the verification to come, and each draft is verified as any other: a lookup draft has no ``q``
(a point mass on each token), so greedy calls verify it by argmax and sampled calls by exact-match sampling,
which keeps each token with exactly the target's probability (:func:`hf_hetspec.verify.verify_exact_match_sampling`).
Because the policy uses counts, not clocks, a seeded call gives the same tokens on every run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .proposer import Draft, Proposer
from .stats import DecodingStats

#: Sources: ``"none"`` needs no estimate (it yields exactly one token per forward).
SOURCES = ("lookup", "drafter", "none")
ESTIMATED = SOURCES[:2]
#: The longest and shortest n-gram (target tokens) the lookup matches; longer matches are tried first.
LOOKUP_MAX_NGRAM = 4
LOOKUP_MIN_NGRAM = 3
#: Target tokens a lookup draft proposes at most.
LOOKUP_MAX_TOKENS = 8
#: Weight of the past in the running yield and cost of a source, per round of that source.
DECAY = 0.8
#: A source not chosen for this many rounds is tried once more, so that its estimate can recover.
PROBE_INTERVAL = 8
#: Drafter rounds in a row that yield less than the target alone before the policy backs off.
BACK_OFF_AFTER = 6
#: The drafter's running rate (tokens per target-forward of cost) below which it counts as failing: below 1, with
#: a margin for the cost model's approximations (a clear loss, not a near tie).
BACK_OFF_RATE = 0.9
#: Rounds without a draft before the drafter is tried again: at first, and at most (the wait doubles).
MIN_BACK_OFF = 1
MAX_BACK_OFF = 16


class ContextLookup:
    """N-gram lookup in the target's own ids: the continuation of the most recent earlier occurrence of the
    longest matching suffix.

    The index grows with the ids (each new position is indexed once), so a lookup costs
    ``O(new tokens x n-gram sizes)`` dictionary operations per round.

    Args:
        max_ngram, min_ngram: n-gram sizes tried, longest first.
        max_tokens: the longest continuation proposed.
    """

    def __init__(self, max_ngram: int = LOOKUP_MAX_NGRAM, min_ngram: int = LOOKUP_MIN_NGRAM,
                 max_tokens: int = LOOKUP_MAX_TOKENS):
        if not 1 <= min_ngram <= max_ngram or max_tokens < 1:
            raise ValueError(f"ContextLookup: need 1 <= min_ngram <= max_ngram and max_tokens >= 1, got "
                             f"{min_ngram}, {max_ngram}, {max_tokens}")
        self.sizes = range(max_ngram, min_ngram - 1, -1)
        self.max_tokens = max_tokens
        self.ids: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}  # n-gram -> where its most recent continuation starts
        self._indexed = 0  # continuation starts indexed so far (positions 1 .. _indexed - 1)

    def continuation(self, ids: list[int], limit: int) -> list[int]:
        """Up to ``min(limit, max_tokens)`` target ids that followed the longest recent n-gram equal to the
        end of ``ids`` (``ids`` must extend the ids of the previous call); ``[]`` without a match."""
        if ids[: len(self.ids)] != self.ids:
            raise ValueError("ContextLookup.continuation: ids do not extend the ids seen so far")
        self.ids = list(ids)
        end = len(ids)
        # index every n-gram that has at least one token after it (its continuation starts before `end`)
        for start in range(max(self._indexed, 1), end):
            for n in self.sizes:
                if start >= n:
                    self._index[tuple(ids[start - n : start])] = start
        self._indexed = max(self._indexed, end)
        take = min(limit, self.max_tokens)
        if take < 1:
            return []
        for n in self.sizes:
            if end >= n:
                start = self._index.get(tuple(ids[end - n :]))
                if start is not None:
                    return ids[start : start + take]
        return []


@dataclass
class SourceEstimate:
    """Running yield and cost of one source (exponentially weighted sums, :data:`DECAY`).

    Attributes:
        tokens: weighted target tokens produced (accepted + 1 per round).
        cost: weighted cost in target forwards.
        rounds: rounds of this source so far.
        idle: rounds since this source was last chosen.
    """

    tokens: float = 0.0
    cost: float = 0.0
    rounds: int = 0
    idle: int = 0

    @property
    def rate(self) -> float:
        """Target tokens per target-forward of cost (``inf`` before the first round: untried sources go first)."""
        return self.tokens / self.cost if self.rounds else float("inf")

    def add(self, tokens: float, cost: float) -> None:
        self.tokens = DECAY * self.tokens + tokens
        self.cost = DECAY * self.cost + cost
        self.rounds += 1


#: Target forwards per drafted token (``v + c``) from which no draft is made (:func:`never_drafts`).
DRAFT_COST_CEILING = 0.9


def never_drafts(back_off: bool, verify_cost: float, cost_ratio: float = 0.0) -> bool:
    """Whether a policy with ``back_off`` chooses ``"none"`` every round: a drafted token costs
    ``verify_cost + cost_ratio`` target forwards, and a draft of one token pays only where it is accepted with a
    probability above that (``1 + alpha`` tokens for ``1 + v + c`` forwards; longer drafts need more). From
    :data:`DRAFT_COST_CEILING` on, only a draft accepted more than 9 times in 10 would pay, and then by a few
    percent, while every rejected one costs most of a forward: bf16 on a CPU without bf16 instructions (``v``
    1.0), or MKL's float32 forward at one thread on an AVX2 AMD EPYC (measured ``v`` 0.91 with an int8 drafter's
    ``c`` 0.056: drafting ran 0.85x the target alone, 2026-12-04). The one rule behind
    :attr:`SourcePolicy.never_drafts`, the prefill overlap's check (:func:`hf_hetspec.decoding.overlaps_prefill`)
    and the plan's choice to make no drafter copy (:func:`hf_hetspec.plan.make_plan`).

    Args:
        back_off: whether the policy may choose ``"none"``.
        verify_cost: ``v``, target forwards one more verified token adds.
        cost_ratio: ``c``, one drafter step in target forwards.
    """
    return back_off and verify_cost + cost_ratio >= DRAFT_COST_CEILING


@dataclass
class SourcePolicy:
    """Which source drafts the next round (module docstring).

    * The context lookup drafts when it has a match and its running rate (tokens per cost, :class:`SourceEstimate`)
      is at least the drafter's; it is tried once first, and again after :data:`PROBE_INTERVAL` rounds without it.
    * The back-off (``"none"``) starts once the drafter has run :data:`BACK_OFF_AFTER` rounds and yields less
      than the target alone would: its running rate is below :data:`BACK_OFF_RATE`, or that many rounds in a
      row each yielded less than their cost (``accepted + 1 < cost``). The drafter is tried again after :data:`MIN_BACK_OFF` rounds
      without a draft, after twice as many when that try leaves it failing (up to :data:`MAX_BACK_OFF`), and
      the back-off ends when it no longer fails. Where a drafted token costs 0.9 of a forward or more
      (``verify_cost + cost_ratio``, :func:`never_drafts`: bf16 on a CPU without bf16 instructions at one thread)
      no draft can pay, and the policy never drafts.

    Attributes:
        cost_ratio: ``c``, drafter step / target step of the drafter runtime in use.
        verify_cost: ``v``, target forwards added by one more verified token.
        lookup: whether the context lookup is a source.
        back_off: whether ``"none"`` is a source.
        estimates: per source but "none" (:data:`ESTIMATED`).
        failures: drafter rounds in a row that yielded less than their cost.
        wait: rounds without a draft before the drafter is tried again while backed off.
    """

    cost_ratio: float
    verify_cost: float
    lookup: bool = True
    back_off: bool = True
    estimates: dict[str, SourceEstimate] = field(default_factory=lambda: {s: SourceEstimate() for s in ESTIMATED})
    failures: int = 0
    wait: int = MIN_BACK_OFF

    @property
    def never_drafts(self) -> bool:
        """Every round's source is ``"none"`` (:func:`never_drafts`)."""
        return never_drafts(self.back_off, self.verify_cost, self.cost_ratio)

    def choose(self, lookup_available: bool) -> str:
        """The source of the next round."""
        if self.never_drafts:
            return "none"
        lookup, drafter = self.estimates["lookup"], self.estimates["drafter"]
        if self.lookup and lookup_available:
            if lookup.rounds == 0 or lookup.idle >= PROBE_INTERVAL or lookup.rate >= drafter.rate:
                return "lookup"
        if self.back_off and self.failing and drafter.idle < self.wait:
            return "none"
        return "drafter"

    @property
    def failing(self) -> bool:
        """The drafter has run :data:`BACK_OFF_AFTER` rounds or more and yields less than the target alone: its
        running rate is below :data:`BACK_OFF_RATE`, or as many rounds in a row each yielded less than their
        cost."""
        drafter = self.estimates["drafter"]
        return self.failures >= BACK_OFF_AFTER or (drafter.rounds >= BACK_OFF_AFTER and drafter.rate < BACK_OFF_RATE)

    def record(self, source: str, drafted: int, accepted: int, drafter_forwards: int) -> None:
        """After a round of ``source`` that verified ``drafted`` tokens, accepted ``accepted`` and ran the
        drafter ``drafter_forwards`` times (a drafter round without a draft -- no room, or the target inside a
        character -- says nothing about the drafter and is not counted)."""
        if source == "drafter" and drafted == 0:
            return
        for name, estimate in self.estimates.items():
            estimate.idle = 0 if name == source else estimate.idle + 1
        if source == "none":
            return
        cost = 1.0 + self.verify_cost * drafted + self.cost_ratio * drafter_forwards
        was_failing = self.failing
        self.estimates[source].add(accepted + 1.0, cost)
        if source == "drafter":
            failed = accepted + 1.0 < cost
            self.failures = self.failures + 1 if failed else 0
            if was_failing and self.failing:  # a probe that did not pay: wait twice as long
                self.wait = min(2 * self.wait, MAX_BACK_OFF)
            elif not self.failing:
                self.wait = MIN_BACK_OFF


class SourcedProposer:
    """An algorithm's proposer with the context lookup and the back-off (:class:`SourcePolicy`); a
    :class:`~hf_hetspec.proposer.Proposer`.

    Args:
        inner: the algorithm's proposer (SLEM's, TLI's or SLRS's), the ``"drafter"`` source; it follows the
            accepted ids whenever it is asked to draft, however many tokens other sources added meanwhile.
        input_ids (``torch.LongTensor`` of shape ``(1, n)``): the prompt in target ids.
        policy: chooses each round's source.
        max_length: the call's ``max_length``; a lookup draft never crosses it.
        stats: the call's statistics (``lookup_drafts``, ``lookup_accepted``, ``backed_off`` are added here).
        lookup: the n-gram index (default :class:`ContextLookup`).
    """

    def __init__(self, inner, input_ids: torch.LongTensor, *, policy: SourcePolicy, max_length: int,
                 stats: DecodingStats, lookup: ContextLookup | None = None):
        self.inner = inner
        self.policy = policy
        self.max_length = max_length
        self.stats = stats
        self.lookup = lookup or ContextLookup()
        self.target_ids: list[int] = input_ids[0].tolist()
        self._round: tuple[str, int, int] | None = None  # source, drafted, drafter forwards

    def propose(self, input_ids: torch.LongTensor) -> Draft:
        """The next draft after the accepted ids (``(1, n)``), from the source the policy chooses."""
        self.target_ids = input_ids[0].tolist()
        budget = self.max_length - len(self.target_ids) - 1
        found = self.lookup.continuation(self.target_ids, budget) if self.policy.lookup else []
        source = self.policy.choose(bool(found))
        if source == "lookup":
            self.stats.lookup_drafts += 1
            draft = Draft(found)
        elif source == "none":
            self.stats.backed_off += 1
            draft = Draft([])
        else:
            forwards = self.stats.drafter_forwards
            draft = self.inner.propose(input_ids)
            self._round = (source, len(draft.target_ids), self.stats.drafter_forwards - forwards)
            return draft
        self._round = (source, len(draft.target_ids), 0)
        return draft

    def update_schedule(self, num_accepted: int) -> None:
        """The verification kept ``num_accepted`` tokens of the last draft: count it for its source, and let
        the drafter adapt its lookahead after its own drafts."""
        source, drafted, forwards = self._round or ("none", 0, 0)
        self._round = None
        if source == "lookup":
            self.stats.lookup_accepted += num_accepted
        if source == "drafter":
            self.inner.update_schedule(num_accepted)
        self.policy.record(source, drafted, min(num_accepted, drafted), forwards)

    @property
    def never_drafts(self) -> bool:
        """The policy will choose ``"none"`` every round (:attr:`SourcePolicy.never_drafts`): the drafter is never
        run, so nothing prefills it beside the target (:func:`hf_hetspec.decoding.overlaps_prefill`)."""
        return self.policy.never_drafts

    @property
    def truncated_tokens(self) -> int:
        """The drafter's (:class:`~hf_hetspec.proposer.Proposer`)."""
        return self.inner.truncated_tokens

    def __getattr__(self, name: str):
        # the drafter's prefill hooks (PrefillingProposer) and its lookahead, when it has them
        if name in ("prefill_drafter", "prefill_tokens", "drafter_device", "lookahead"):
            return getattr(self.inner, name)
        raise AttributeError(name)


def with_sources(proposer: Proposer, input_ids: torch.LongTensor, *, cost_ratio: float, verify_cost: float,
                 lookup: bool, back_off: bool, max_length: int, stats: DecodingStats) -> Proposer:
    """``proposer`` itself when neither the lookup nor the back-off is on, else wrapped in a
    :class:`SourcedProposer`."""
    if not (lookup or back_off):
        return proposer
    policy = SourcePolicy(cost_ratio, verify_cost, lookup=lookup, back_off=back_off)
    return SourcedProposer(proposer, input_ids, policy=policy, max_length=max_length, stats=stats)
