"""SLRS: string-level rejection sampling (Timor et al. 2025, Algorithm 3), exact and practical.

**What SLRS is.** The drafter proposes a *target* token through a string: drafter tokens are sampled until
a lookahead indicator fires, their text is tokenized for the target, and the first target token ``t`` is
the proposal. Its proposal probability ``psi(t)`` sums the drafter probability of every drafter outcome that
leads to ``t``; verification is speculative sampling with ``psi`` in place of ``q``
(:func:`~hf_hetspec.verify.verify_speculative_sampling`).

**The general indicator is exponential.** With an indicator that fires after several drafter tokens,
``psi(t)`` sums over every drafter token sequence whose string starts with ``t`` -- the paper's Lemma 3.1:
the number of such tokenizations grows exponentially with the length of ``t`` in bytes, each term needing
its own drafter forward. (Residual sampling can avoid the full ``psi`` by rejection from ``p``, which needs
``psi`` only at sampled tokens, but each of those values still costs the exponential sum.)

**The production indicator fires after one drafter token.** Then ``psi`` is the push-forward of the
drafter's next-token distribution ``q`` through a fixed map ``f``: drafter token ``d`` -> the *longest target
token whose bytes are a prefix of d's bytes* (:func:`~hf_hetspec.intersection.prefix_map_for`). Longest,
because it carries the most text per proposal and equals ``d`` itself whenever ``d`` is a shared token, so
SLRS proposes every token TLI would, while drafter mass outside the intersection still proposes a target
token (the prefix) instead of being thrown away. ``psi = scatter_add(q, f)`` over the whole target vocabulary
is one tensor operation, so the residual ``norm(max(0, p - psi))`` is exact and cheap.

**Why this is lossless.** Fix the accepted prefix and the drafter's context (a deterministic function of
the prefix and earlier randomness, fixed before the draw). The drafter samples ``d ~ q`` and proposes
``t = f(d)``; hence ``P(t) = sum_{d: f(d)=t} q(d) = psi(t)`` exactly, for every ``t`` in the support.
Speculative sampling with a proposal drawn from ``psi`` and the same ``psi`` in the acceptance test
returns a sample from ``p`` (Leviathan et al. 2023, Thm. 1); chained positions are lossless by induction,
because the drafter then continues from exactly the text of the proposed target tokens (when ``t`` is a
proper prefix of ``d``, ``d`` is dropped and the text of ``t`` is re-tokenized for the drafter, so the next
``q`` conditions on the proposed prefix, never on the unproposed rest of ``d``).

Drafter tokens that map to no target token (possible only for special tokens without a target
counterpart, e.g. Gemma's ``<unusedN>``) are excluded from sampling: they get probability 0 in ``q``,
and ``q`` is renormalized, which keeps ``psi`` exactly the distribution of the proposals.

Greedy SLRS drafts ``argmax psi`` and is verified by exact match (identical to the target alone); the drafter
then reads the spelling of ``argmax psi`` it prefers (:meth:`SLRSProposer.continuation_id`). By default
with different vocabularies (:class:`~hf_hetspec.proposer.DraftPolicy`,
:data:`~hf_hetspec.plan.DEFAULT_DRAFT_TEMPERATURE`) a sampled
call drafts ``argmax psi`` too and verifies it by exact-match sampling (the acceptance of speculative sampling
with its one-hot proposal, without the tensor); a positive ``hetspec_draft_temperature`` samples ``d ~ q`` as above.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from .intersection import push_forward, remembered
from .proposer import DraftStep, TokenLevelProposer


_EXACT_CACHE: "OrderedDict[tuple[str, str], dict[int, list[int]]]" = OrderedDict()


def _exact_drafter_ids(target_vocab, drafter_vocab, prefix_map: list[int]) -> dict[int, list[int]]:
    """``{target id: drafter ids}`` of the drafter tokens whose prefix-map image spells exactly their bytes,
    ascending; several when the drafter spells the same bytes twice (Gemma-3's byte-fallback ``<0x2C>`` and
    its ``,``). Built once per vocabulary pair (a Python pass over the drafter vocabulary, 0.05-0.2 s for the
    real vocabularies) and kept for the last few pairs (:func:`~hf_hetspec.intersection.remembered`)."""

    def build() -> dict[int, list[int]]:
        exact: dict[int, list[int]] = {}
        tb_target, tb_drafter = target_vocab.token_bytes, drafter_vocab.token_bytes
        for d_id, t_id in enumerate(prefix_map):
            if t_id >= 0 and tb_drafter[d_id] == tb_target[t_id]:
                exact.setdefault(t_id, []).append(d_id)
        return exact

    return remembered(_EXACT_CACHE, (target_vocab.digest, drafter_vocab.digest), build)


class SLRSProposer(TokenLevelProposer):
    """Drafts target tokens by string-level rejection sampling with the one-token indicator.

    Args:
        prefix_map (``torch.LongTensor`` of shape ``(V_drafter,)``): ``f``, target id per drafter id or
            ``-1`` (see the module docstring).
        other arguments: as :class:`~hf_hetspec.proposer.TokenLevelProposer`.
    """

    def __init__(self, target_vocab, drafter, drafter_vocab, input_ids, *, prefix_map: torch.Tensor, **kwargs):
        super().__init__(target_vocab, drafter, drafter_vocab, input_ids, drafter_to_target=prefix_map, **kwargs)
        # greedy: the drafter tokens spelling exactly the proposed target token, to continue without
        # re-tokenizing (sampling knows the drafter token it drew)
        self.exact_drafter_ids = {}
        if not self.policy.sample:
            self.exact_drafter_ids = _exact_drafter_ids(target_vocab, drafter_vocab, self.map_list)

    def _psi(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q, psi)``: the drafter distribution drafts are drawn from (``(1, V_drafter)``) and its
        push-forward through ``f`` (``(1, V_target)``)."""
        q = self.drafter_distribution(logits)
        return q, push_forward(q, self.map, self.target_size)

    def continuation_id(self, logits: torch.Tensor, t: int) -> int | None:
        """The drafter token that continues the drafter's context after the greedy proposal ``t``.

        Of the drafter tokens spelling exactly ``t``'s bytes, the one with the highest logit (``logits``:
        the drafter's next-token logits, ``(1, V_drafter)``): the token the drafter itself would write, not a
        duplicate spelling it never reads in text. Feeding Gemma-3 its byte-fallback ``<0x2C>`` after a
        drafted ``,`` (the lowest id spelling it) derailed its next drafts: greedy decoding of HumanEval/20-25
        had alpha 0.55 with SLRS against TLI's 0.67, and 0.67 with both once fixed
        (``benchmarks/README.md``). Which token is fed never changes the output distribution, only the next
        drafts. ``None`` when no drafter token spells ``t`` (a proper
        prefix): the caller re-tokenizes its text.
        """
        ids = self.exact_drafter_ids.get(t)
        if not ids:
            return None
        if len(ids) == 1:
            return ids[0]
        return ids[int(logits[0, ids].argmax())]

    def _choose(self, logits: torch.Tensor) -> DraftStep:
        q, psi = self._psi(logits)
        if self.policy.sample:
            d = int(torch.multinomial(q[0], 1, generator=self.generator))
            return DraftStep(self.map_list[d], d, psi)
        t = int(self._argmax(psi))  # with sibling branches, psi's runner-ups are kept (TokenLevelProposer)
        return DraftStep(t, self.continuation_id(logits, t), psi)

    def _continue(self, step: DraftStep) -> bool:
        t, d = step.target, step.drafter
        tb_target, tb_drafter = self.target_vocab.token_bytes, self.drafter_vocab.token_bytes
        if d is not None and tb_drafter[d] == tb_target[t]:
            self.context.append_id(d)
            return True
        try:
            text = tb_target[t].decode("utf-8")
        except UnicodeDecodeError:
            return False  # t ends inside a character: the drafter cannot continue from its text
        self.context.append_text(text)
        return True
