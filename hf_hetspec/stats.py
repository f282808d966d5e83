"""Per-call statistics of speculative decoding.

Conventions (the field's, written down once):

* a *target forward* is one forward pass of the target over the last accepted token plus the draft (in the
  first round, over the uncached prompt plus the draft). Where the target prefills its prompt but the last token
  on its own while the drafter prefills beside it (:func:`hf_hetspec.decoding.overlaps_prefill`), that prefill
  verifies nothing and is not counted (its time is in ``target_s``), so the count does not depend on whether the
  machine had a core to spare;
* ``drafted_tokens`` counts draft tokens in the *target* vocabulary handed to verification;
* ``accepted_tokens`` counts draft tokens the target accepted (the target's own correction/bonus token is
  not a draft token and is not counted here);
* ``acceptance_rate = accepted_tokens / drafted_tokens``;
* ``rejections`` counts target forwards whose verification rejected a drafted token, and
  ``alpha = accepted_tokens / (accepted_tokens + rejections)`` estimates Leviathan et al.'s (2023) acceptance
  rate alpha, the chance that a drafted token is accepted given that verification reaches it: the drafted
  tokens after a round's first rejection are never examined, so ``alpha >= acceptance_rate`` and the two
  differ most for long drafts;
* ``verification`` is the call's ``hetspec_verification`` (``"token"`` or ``"block"``). Block verification
  decides a round's accepted length jointly, not token by token: ``rejections`` still counts the rounds that
  kept fewer tokens than were drafted, and ``alpha`` is the same formula, but no longer the chance that one
  drafted token is accepted;
* ``mean_accepted_per_forward = new_tokens / target_forwards``: target tokens produced per target forward,
  *including* the bonus/correction token (1.0 means no speedup from drafting);
* times are wall-clock seconds: ``drafter_s`` drafter forwards, ``translation_s`` text conversion between
  vocabularies, ``target_s`` target forwards plus verification, ``total_s`` the whole decoding call;
* ``skipped_drafts`` counts rounds in which the target went on alone (no room before ``max_length``, the
  target stopped inside a UTF-8 character, or the drafter's maximum context was full);
  ``drafter_truncated_tokens`` counts the oldest drafter-context tokens dropped to stay within the
  drafter's ``max_position_embeddings`` (the target always sees everything; the output is unchanged);
* ``lookup_drafts`` counts rounds drafted by the context lookup and ``lookup_accepted`` the tokens verification
  kept of them; ``backed_off`` counts rounds in which the source policy chose no draft because drafting was
  yielding less than the target alone (:mod:`hf_hetspec.sources`);
* ``tree_rounds`` counts rounds verified as a draft tree (the chain and SLEM's sibling branches,
  :mod:`hf_hetspec.tree`), ``tree_nodes`` the sibling nodes verified beyond the chain, and ``sibling_rounds`` the
  rounds whose accepted path left the chain; in a tree round ``accepted_tokens`` counts the accepted nodes of
  whichever branch, ``drafted_tokens`` the chain's, and a round that left the chain counts as a rejection;
* ``drafter_head_rows``: rows of the drafter's LM head computed per drafter step when TLI prunes it to the
  vocabulary intersection (0: the full head);
* ``drafter_runtime`` is the runtime the drafter ran in (:mod:`hf_hetspec.runtime`), ``drafter_memory_bytes``
  the bytes its copy holds (0: the drafter itself ran), ``drafter_prepare_s`` the seconds this call spent
  making the copy (0 when it was cached; not part of ``total_s``); ``target_runtime``, ``target_memory_bytes``
  and ``target_prepare_s`` the same for the target (:mod:`hf_hetspec.packed_target`);
* ``drafter_step_s = drafter_s / drafter_forwards`` and ``target_step_s = target_s / target_forwards`` (a
  target step verifies a whole draft), and the cost ratio ``cost_ratio = drafter_step_s / target_step_s``:
  Leviathan et al.'s ``c``, measured within the call.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field


def acceptance_rate(accepted_tokens: int, drafted_tokens: int) -> float | None:
    """Accepted draft tokens / drafted tokens (module docstring), ``None`` when nothing was drafted."""
    return accepted_tokens / drafted_tokens if drafted_tokens else None


def alpha(accepted_tokens: int, rejections: int) -> float | None:
    """Leviathan et al.'s alpha, accepted / (accepted + rejections) (module docstring), ``None`` when
    verification examined no drafted token."""
    examined = accepted_tokens + rejections
    return accepted_tokens / examined if examined else None


@dataclass
class DecodingStats:
    """Statistics of one ``generate()`` call (see the module docstring for definitions)."""

    algorithm: str = ""
    verification: str = "token"
    note: str = ""
    prompt_tokens: int = 0
    new_tokens: int = 0
    target_forwards: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    rejections: int = 0
    drafter_forwards: int = 0
    skipped_drafts: int = 0
    lookup_drafts: int = 0
    lookup_accepted: int = 0
    backed_off: int = 0
    tree_rounds: int = 0
    tree_nodes: int = 0
    sibling_rounds: int = 0
    drafter_truncated_tokens: int = 0
    drafter_head_rows: int = 0
    drafter_runtime: str = "eager"
    drafter_memory_bytes: int = 0
    drafter_prepare_s: float = 0.0
    target_runtime: str = "eager"
    target_memory_bytes: int = 0
    target_prepare_s: float = 0.0
    drafter_s: float = 0.0
    target_s: float = 0.0
    translation_s: float = 0.0
    total_s: float = 0.0
    lookaheads: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / drafted tokens (0.0 when nothing was drafted)."""
        return acceptance_rate(self.accepted_tokens, self.drafted_tokens) or 0.0

    @property
    def alpha(self) -> float:
        """Accepted / (accepted + rejections): the share of drafted tokens reached by verification that were
        accepted, Leviathan et al.'s alpha (0.0 when nothing was examined)."""
        return alpha(self.accepted_tokens, self.rejections) or 0.0

    @property
    def mean_accepted_per_forward(self) -> float:
        """New target tokens per target forward, bonus token included."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def drafter_step_s(self) -> float:
        """Mean seconds per drafter forward (0.0 without one)."""
        return self.drafter_s / self.drafter_forwards if self.drafter_forwards else 0.0

    @property
    def target_step_s(self) -> float:
        """Mean seconds per target forward, verification included (0.0 without one)."""
        return self.target_s / self.target_forwards if self.target_forwards else 0.0

    @property
    def cost_ratio(self) -> float:
        """``c`` = :attr:`drafter_step_s` / :attr:`target_step_s` (0.0 when either was not measured)."""
        return self.drafter_step_s / self.target_step_s if self.drafter_step_s and self.target_step_s else 0.0

    @property
    def tokens_per_second(self) -> float:
        """New target tokens per wall-clock second of the decoding call."""
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    @contextmanager
    def timer(self, attribute: str):
        """Add the wall time of the ``with`` block to ``attribute`` (a ``*_s`` field)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, attribute, getattr(self, attribute) + time.perf_counter() - start)

    def as_dict(self) -> dict:
        """All fields plus the derived rates, JSON-serializable."""
        d = asdict(self)
        d.update(
            acceptance_rate=self.acceptance_rate,
            alpha=self.alpha,
            mean_accepted_per_forward=self.mean_accepted_per_forward,
            tokens_per_second=self.tokens_per_second,
            drafter_step_s=self.drafter_step_s,
            target_step_s=self.target_step_s,
            cost_ratio=self.cost_ratio,
        )
        return d

    def _drafts_summary(self) -> str:
        """Acceptance and alpha, or, for a call that drafted nothing, that it drafted nothing and why (rounds the
        target went on alone, rounds the source policy backed off): a rate of 0.00 would read as drafts that all
        failed."""
        if self.drafted_tokens:
            return f"acceptance {self.acceptance_rate:.2f} (alpha {self.alpha:.2f})"
        reasons = [f"{n} {what}" for n, what in ((self.skipped_drafts, "rounds the target went on alone"),
                                                 (self.backed_off, "rounds backed off")) if n]
        return "no drafts" + (f" ({', '.join(reasons)})" if reasons else "")

    def summary(self) -> str:
        """One line for humans."""
        return (
            f"{self.algorithm}" + (f" ({self.verification} verification)" if self.verification != "token" else "")
            + f": {self.new_tokens} tokens in {self.total_s:.2f}s "
            f"({self.tokens_per_second:.1f} tok/s), {self.target_forwards} target forwards, "
            + self._drafts_summary()
            + f", {self.mean_accepted_per_forward:.2f} tokens/forward, {self.drafter_runtime} drafter"
            + (f" c={self.cost_ratio:.3f}" if self.drafter_forwards else " (not run)")
            + (f" (copy made in {self.drafter_prepare_s:.2f}s)" if self.drafter_prepare_s else "")
            + (f", {self.tree_rounds} tree rounds ({self.sibling_rounds} took a sibling)" if self.tree_rounds else "")
            + (f" [{self.note}]" if self.note else "")
        )
