"""Greedy losslessness check against the target alone.

In float32 hf_hetspec's greedy output must equal ``target.generate()`` token for token. In bf16/fp16 a
multi-token verification forward rounds differently from one-token decoding, so two tokens whose logits
tie within rounding can swap. :func:`compare_greedy` classifies an output as

* ``"identical"``: the same tokens;
* ``"tie"``: the first differing position is a numerical tie: in the target's own one-token-at-a-time
  forward over the common prefix, the two tokens' logits differ by at most ``tolerance``
  (``TIE_ULPS`` units of the dtype's rounding at the logits' magnitude); the gap is reported;
* ``"different"``: anything else, which is a bug.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..compat import model_device

TIE_ULPS = 4


@dataclass(frozen=True)
class GreedyComparison:
    """Result of :func:`compare_greedy`.

    Attributes:
        verdict: ``"identical"``, ``"tie"`` or ``"different"``.
        divergence: index (into the new tokens) of the first differing token, ``None`` when identical.
        gap: ``logit(reference token) - logit(candidate token)`` at the divergence, in the target's
            one-token forward (``None`` when identical or when one sequence simply ended earlier).
        tolerance: the largest gap counted as a tie, in logits.
    """

    verdict: str
    divergence: int | None = None
    gap: float | None = None
    tolerance: float | None = None

    def __str__(self) -> str:
        if self.verdict == "identical":
            return "identical"
        gap = "" if self.gap is None else f", gap {self.gap:.4g} (tolerance {self.tolerance:.3g})"
        return f"{self.verdict} at new token {self.divergence}{gap}"


def tie_tolerance(dtype: torch.dtype, magnitude: float) -> float:
    """Largest logit gap treated as a rounding tie: ``TIE_ULPS * eps(dtype) * max(1, |logit|)``."""
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else torch.finfo(torch.float32).eps
    return TIE_ULPS * eps * max(1.0, magnitude)


@torch.no_grad()
def compare_greedy(target, prompt_ids: torch.Tensor, reference: torch.Tensor, candidate: torch.Tensor) -> GreedyComparison:
    """Compare a greedy output with the target-alone greedy output.

    Args:
        target: the target model (its dtype sets the tie tolerance).
        prompt_ids (``torch.LongTensor`` of shape ``(1, n)``): the prompt.
        reference (``torch.LongTensor`` of shape ``(1, n + m)``): ``target.generate()`` output.
        candidate (``torch.LongTensor`` of shape ``(1, n + m')``): the output to check.

    Returns:
        a :class:`GreedyComparison`.
    """
    n = prompt_ids.shape[1]
    ref = reference[0, n:].tolist()
    cand = candidate[0, n:].tolist()
    if ref == cand:
        return GreedyComparison("identical")
    d = next((i for i, (a, b) in enumerate(zip(ref, cand)) if a != b), min(len(ref), len(cand)))
    if d >= len(ref) or d >= len(cand):
        # one output stopped earlier: only a stopping criterion could do that, never a tie
        return GreedyComparison("different", divergence=d)
    context = reference[:, : n + d].to(model_device(target))
    logits = target(input_ids=context).logits[0, -1].float()
    a, b = logits[ref[d]].item(), logits[cand[d]].item()
    dtype = next(target.parameters()).dtype
    tol = tie_tolerance(dtype, max(abs(a), abs(b)))
    gap = a - b
    return GreedyComparison("tie" if abs(gap) <= tol else "different", divergence=d, gap=gap, tolerance=tol)
