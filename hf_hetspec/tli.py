"""TLI: token-level intersection (Timor et al. 2025, Algorithm 4).

The drafter's next-token distribution is restricted to the tokens it shares with the target
(:class:`~hf_hetspec.intersection.VocabularyIntersection`) and renormalized, the drafter's own sampling
settings (temperature, top-k, top-p of the call; never the target's vocabulary-specific processors) are
applied, and a token ``d`` is drawn from the result ``q_drafter``. Its target id ``map(d)`` spells the same
bytes. The distribution handed to verification is the push-forward ``q(t) = sum_{map(d) = t} q_drafter(d)``
over the target vocabulary -- exactly the distribution ``map(d)`` was drawn from -- so standard speculative
sampling (:func:`~hf_hetspec.verify.verify_speculative_sampling`, Leviathan et al. 2023, Alg. 1) keeps the
target's distribution. Greedy TLI drafts the argmax over the intersection and is verified by exact match.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList

from .intersection import VocabularyIntersection
from .proposer import HeterogeneousProposer


class TLICandidateGenerator(HeterogeneousProposer):
    """Drafts target tokens from the vocabulary intersection (Timor et al. 2025, Algorithm 4).

    Args:
        intersection: the pair's byte-exact intersection.
        sampling: draw drafts from ``q`` and return it (``do_sample=True``), else draft the argmax.
        drafter_processors: vocabulary-independent warpers applied to the drafter's restricted logits
            before sampling (temperature, top-k, top-p of the call).
        generator: randomness for drafting, on the drafter's device (``None`` = global RNG).
        other arguments: as :class:`~hf_hetspec.proposer.HeterogeneousProposer`.

    Raises:
        ValueError: fewer than 1% of the drafter's tokens are shared (use SLEM for such a pair).
    """

    def __init__(
        self,
        target_vocab,
        drafter,
        drafter_vocab,
        input_ids,
        *,
        intersection: VocabularyIntersection,
        sampling: bool,
        drafter_processors: LogitsProcessorList | None = None,
        generator: torch.Generator | None = None,
        target_eos_ids: list[int] | None = None,
        **kwargs,
    ):
        super().__init__(target_vocab, drafter, drafter_vocab, input_ids, **kwargs)
        device = self.drafter.device
        n = self.drafter.n_tokens
        d2t = intersection.drafter_to_target[:n]
        self.intersection = intersection.to(device)
        self.d2t = d2t.tolist()
        self.mask = torch.where(d2t >= 0, 0.0, float("-inf")).to(device)  # [V_drafter tokens]
        self.sampling = sampling
        self.processors = drafter_processors or LogitsProcessorList()
        self.generator = generator
        self.target_eos = set(target_eos_ids or [])
        self._probs: list[torch.Tensor] = []

    def _select(self, logits: torch.Tensor) -> torch.Tensor:
        scores = logits.float() + self.mask  # [1, V_drafter]
        if not self.sampling:
            return scores.argmax(dim=-1, keepdim=True)
        if len(self.processors):
            scores = self.processors(torch.empty(1, 0, dtype=torch.long, device=scores.device), scores)
        probs = scores.softmax(dim=-1)  # q_drafter, the distribution the draft token is drawn from
        self._probs.append(probs)
        return torch.multinomial(probs, 1, generator=self.generator)

    def _propose(self, budget: int) -> tuple[list[int], torch.Tensor | None]:
        self._probs = []
        with self.stats.timer("drafter_s"):
            drafted = self.drafter.draft(self.draft_len, self._select)
        with self.stats.timer("translation_s"):
            targets = [self.d2t[d] for d in drafted]
            k = min(budget, len(targets))
            for j in range(k):
                if targets[j] in self.target_eos:  # nothing is generated after an accepted EOS
                    k = j + 1
                    break
            if k < len(drafted):
                self.drafter.discard_draft_after(k)
            if not self.sampling or k == 0:
                return targets[:k], None
            q = self.intersection.push_forward(torch.cat(self._probs[:k], dim=0))  # [k, V_target]
            return targets[:k], q.log()[None]
