"""Verification math for every algorithm: exact match, speculative sampling, residual sampling.

Notation, used everywhere in hf_hetspec:

* ``p``   -- the target's next-token distribution, *after* the target's own logits processors
  (temperature, top-k, top-p, repetition penalty, ...). Shape ``(k + 1, V_target)``: row ``i`` is the
  distribution after the accepted context plus the first ``i`` draft tokens; row ``k`` gives the bonus token.
* ``q``   -- the distribution each draft token was actually sampled from, expressed over the *target*
  vocabulary. Shape ``(k, V_target)``.
* ``psi`` -- the SLRS proposal distribution over target tokens (Timor et al. 2025, Section 3.2); it plays
  the role of ``q`` here.

These are pure tensor functions: no models, no tokenizers. Randomness comes from an explicit
``torch.Generator`` (``None`` = torch's global generator), living on the device of the tensors.
Each function returns ``(tokens, n_accepted)``: ``tokens`` (``torch.LongTensor`` of shape
``(n_accepted + 1,)``) are the accepted draft tokens followed by one token chosen by the target (the
correction at the first rejection, or the bonus token when every draft token was accepted).
"""

from __future__ import annotations

import torch


def _accepted_prefix(accept: torch.Tensor) -> int:
    """Number of leading ``True`` values of ``accept`` (``torch.BoolTensor`` of shape ``(k,)``)."""
    return int(accept.to(torch.int64).cumprod(0).sum())


def verify_greedy(draft_ids: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Exact match against the target's argmax (greedy decoding; SLEM Algorithm 2, TLI and SLRS greedy).

    Args:
        draft_ids (``torch.LongTensor`` of shape ``(k,)``): draft tokens in the target vocabulary.
        target_logits (``torch.FloatTensor`` of shape ``(k + 1, V_target)``): processed target logits.

    Returns:
        ``(tokens, n_accepted)`` as described in the module docstring. The output equals what greedy
        decoding with the target alone produces, token for token.
    """
    k = draft_ids.shape[0]
    target_ids = target_logits.argmax(dim=-1)  # [k+1]
    n = _accepted_prefix(draft_ids == target_ids[:k])
    return target_ids[: n + 1], n


def verify_exact_match_sampling(
    draft_ids: torch.Tensor, target_probs: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, int]:
    """Exact-match verification for sampling (SLEM with ``do_sample=True``; Timor et al. 2025, Alg. 2).

    The target samples one token at every position from ``p``; the longest prefix where its samples equal
    the draft is accepted, followed by the target's own sample at the first mismatch (or the bonus sample).
    Each kept token is a sample from ``p`` given an accepted context, so the output is distributed exactly
    as sampling from the target alone, whatever the draft was.

    Args:
        draft_ids (``torch.LongTensor`` of shape ``(k,)``).
        target_probs (``torch.FloatTensor`` of shape ``(k + 1, V_target)``): ``p``.
        generator: source of randomness on ``target_probs.device``.
    """
    k = draft_ids.shape[0]
    samples = torch.multinomial(target_probs, 1, generator=generator).squeeze(1)  # [k+1]
    n = _accepted_prefix(draft_ids == samples[:k])
    return samples[: n + 1], n


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``norm(max(0, p - q))`` (Leviathan et al. 2023, Alg. 1): where to sample after a rejection.

    Args:
        p, q (``torch.FloatTensor`` of shape ``(V_target,)``).

    Returns:
        ``torch.FloatTensor`` of shape ``(V_target,)`` summing to 1. A rejection has probability
        ``sum(max(0, q - p)) = sum(max(0, p - q))``, so when the residual mass is zero no rejection can
        happen; ``p`` is returned then to keep the function total.
    """
    residual = (p - q).clamp_min_(0.0)
    mass = residual.sum()
    return torch.where(mass > 0, residual / mass.clamp_min(torch.finfo(p.dtype).tiny), p)


def verify_speculative_sampling(
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, int]:
    """Speculative sampling (Leviathan et al. 2023, Alg. 1; TLI Alg. 4 and SLRS Alg. 3 of Timor et al. 2025).

    Draft token ``i`` is accepted with probability ``min(1, p_i(x_i) / q_i(x_i))``; at the first rejection
    the target samples from ``norm(max(0, p_i - q_i))``; if all ``k`` are accepted it samples a bonus token
    from ``p_k``. Lossless exactly when ``x_i`` was sampled from ``q_i``.

    Args:
        draft_ids (``torch.LongTensor`` of shape ``(k,)``): draft tokens, target vocabulary.
        draft_probs (``torch.FloatTensor`` of shape ``(k, V_target)``): ``q`` (or ``psi``).
        target_probs (``torch.FloatTensor`` of shape ``(k + 1, V_target)``): ``p``.
        generator: source of randomness on ``target_probs.device``.
    """
    k = draft_ids.shape[0]
    rows = torch.arange(k, device=draft_ids.device)
    p_draft = target_probs[rows, draft_ids]  # [k]
    q_draft = draft_probs[rows, draft_ids]  # [k]
    u = torch.rand(k, generator=generator, device=target_probs.device, dtype=target_probs.dtype)
    n = _accepted_prefix(u * q_draft < p_draft)  # u < p/q without dividing by q
    if n < k:
        dist = residual_distribution(target_probs[n], draft_probs[n])
    else:
        dist = target_probs[k]
    last = torch.multinomial(dist, 1, generator=generator)  # [1]
    return torch.cat([draft_ids[:n], last]), n
