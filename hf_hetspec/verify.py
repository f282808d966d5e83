"""Verification math for every algorithm: exact match, speculative sampling, block verification, residual
sampling.

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


def residual_distribution(
    p: torch.Tensor, q: torch.Tensor, weight: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """``norm(max(0, weight * p - q))``: where to sample after a rejection.

    ``weight = 1`` is speculative sampling's residual (Leviathan et al. 2023, Alg. 1); block verification
    (:func:`verify_block`) passes the weight ``w_tau`` of the accepted prefix.

    Args:
        p, q (``torch.FloatTensor`` of shape ``(V_target,)``).
        weight: a number in ``[0, 1]`` (or a 0-d tensor).

    Returns:
        ``torch.FloatTensor`` of shape ``(V_target,)`` summing to 1. With ``weight = 1`` a rejection has
        probability ``sum(max(0, q - p)) = sum(max(0, p - q))``, and in block verification a correction at a
        position has probability proportional to its residual mass, so when that mass is zero no correction
        can be sampled there; ``p`` is returned then to keep the function total.
    """
    residual = (weight * p - q).clamp_min_(0.0)
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


def block_weights(
    draft_ids: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights ``w`` and stop probabilities ``h`` of block verification (:func:`verify_block`).

    With ``x_1 .. x_k`` the draft, ``p_i`` / ``q_i`` rows ``i`` of ``target_probs`` / ``draft_probs``:

    * ``w_0 = 1``, ``w_i = min(1, w_{i-1} * p_{i-1}(x_i) / q_{i-1}(x_i))`` for ``i = 1 .. k``;
    * ``R_i = sum_x max(0, w_i * p_i(x) - q_i(x))`` for ``i = 0 .. k-1``;
    * ``h_0 = 1``, ``h_i = R_i / (R_i + 1 - w_i)`` for ``1 <= i < k`` (``0`` when ``R_i = 0``), ``h_k = w_k``.

    ``w_i = min(1, w_{i-1} r_i)`` is a random walk reflected at 0 in log space, so with
    ``S_i = sum_{j <= i} log r_j`` (``S_0 = 0``) it is ``w_i = exp(S_i - max_{j <= i} S_j)``: one ``cumsum``
    and one ``cummax`` instead of a loop. ``p(x_i) = 0`` gives ``log r_i = -inf`` and ``w = 0`` from there on,
    exactly as the recursion; ``q(x_i) = 0`` (a draft its ``q`` could not have produced) counts as
    ``r_i = p / tiny``, i.e. ``w_i = min(1, +inf) = 1`` unless ``p(x_i) = 0`` or ``w_{i-1} = 0``.

    Args:
        draft_ids (``torch.LongTensor`` of shape ``(k,)``): draft tokens, target vocabulary.
        draft_probs (``torch.FloatTensor`` of shape ``(k, V_target)``): ``q`` (or ``psi``).
        target_probs (``torch.FloatTensor`` of shape ``(k + 1, V_target)``): ``p``.

    Returns:
        ``(w, h)``, both ``torch.FloatTensor`` of shape ``(k + 1,)``, in ``[0, 1]``.
    """
    k = draft_ids.shape[0]
    rows = torch.arange(k, device=draft_ids.device)
    p_draft = target_probs[rows, draft_ids]  # [k]
    q_draft = draft_probs[rows, draft_ids].clamp_min(torch.finfo(draft_probs.dtype).tiny)  # [k]
    steps = torch.cat([p_draft.new_zeros(1), p_draft.log() - q_draft.log()])  # [k+1]
    walk = steps.cumsum(0)  # [k+1]: S_0 .. S_k
    w = (walk - walk.cummax(0).values).exp()  # [k+1]
    mass = (w[:k, None] * target_probs[:k] - draft_probs).clamp_min(0.0).sum(-1)  # [k]: R_0 .. R_{k-1}
    stay = (mass + 1.0 - w[:k]).clamp_min(torch.finfo(w.dtype).tiny)
    h = torch.cat([w.new_ones(1), (mass / stay)[1:], w[k:]]) if k else w.new_ones(1)  # [k+1]
    return w, h


def verify_block(
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, int]:
    """Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR 2025,
    arXiv 2403.10444, Algorithm 2): a drop-in replacement for :func:`verify_speculative_sampling` on one
    draft chain (TLI and SLRS, whose ``q`` / ``psi`` are distributions over target ids).

    Token-level speculative sampling decides each draft token on its own ratio ``p_i(x_{i+1}) / q_i(x_{i+1})``
    and stops at the first rejection. Block verification decides the accepted length ``tau`` from the whole
    block: a token the drafter over-proposes can be kept when later tokens make up for it, and the correction
    is drawn from a residual that accounts for the mass carried forward. With rows ``p_i`` / ``q_i`` of
    ``target_probs`` / ``draft_probs`` (distributions after ``i`` draft tokens) and the draft ``x_1 .. x_k``:

    1. weights (the paper's ``p_i``, called ``w_i`` here because ``p`` is the target's distribution):
       ``w_0 = 1``, ``w_i = min(1, w_{i-1} p_{i-1}(x_i) / q_{i-1}(x_i))``;
    2. residuals ``r_i(x) = max(0, w_i p_i(x) - q_i(x))`` with mass ``R_i = sum_x r_i(x)``, ``0 <= i < k``;
    3. stop probabilities ``h_i = R_i / (R_i + 1 - w_i)`` for ``1 <= i < k`` and ``h_k = w_k``;
    4. ``eta_1 .. eta_k ~ U(0, 1)`` independent; ``tau`` is the largest ``i >= 1`` with ``eta_i < h_i``,
       else 0 (sampled backwards: ``i = k, k-1, ..., 1``, the first success wins);
    5. output ``x_1 .. x_tau``, then one token from ``p_k`` if ``tau = k`` (bonus), else from
       ``norm(r_tau)`` (correction; at ``tau = 0`` this is ``norm(max(0, p_0 - q_0))``, as in token-level).

    Why lossless (for any ``q`` the draft was really drawn from). Backwards from ``i = k``:
    ``P(tau >= i | x_1 .. x_i) = w_i``. At ``k`` it is ``h_k = w_k``; one step down,
    ``E_{x_{i+1} ~ q_i}[w_{i+1}] = sum_x min(q_i(x), w_i p_i(x)) = w_i - R_i``, so
    ``P(tau < i | x_1 .. x_i) = (1 - h_i)(1 - w_i + R_i) = 1 - w_i``. With ``Q(x_1 .. x_i)`` the draft's
    probability, ``W(x_1 .. x_i) = Q w_i = P(draft starts x_1 .. x_i and tau >= i)``. After such a prefix
    the next output token is ``y`` either as draft token (``tau >= i + 1``), with probability
    ``W(x_1 .. x_i y) = min(Q(x_1 .. x_i y), W(x_1 .. x_i) p_i(y))``, or as the correction at ``tau = i``,
    with probability ``Q(x_1 .. x_i) r_i(y) = max(0, W(x_1 .. x_i) p_i(y) - Q(x_1 .. x_i y))`` (at ``i = k``:
    ``W p_k(y)``, the bonus). The two add to ``W(x_1 .. x_i) p_i(y)``, so by induction over the length every
    output prefix, continued by the target, has exactly the target's probability ``prod_i p_i``.
    ``E[tau] = sum_i sum_{x_1..x_i} W(x_1 .. x_i)``, never below token-level's
    ``sum_i sum prod_j min(q_j, p_j)``; Sun et al. prove it optimal among valid verifications. With ``k = 1``
    both are the same rule (``h_1 = w_1 = min(1, p_0 / q_0)``).

    Args:
        draft_ids (``torch.LongTensor`` of shape ``(k,)``): draft tokens, target vocabulary.
        draft_probs (``torch.FloatTensor`` of shape ``(k, V_target)``): ``q`` (or ``psi``).
        target_probs (``torch.FloatTensor`` of shape ``(k + 1, V_target)``): ``p``.
        generator: source of randomness on ``target_probs.device``.

    Returns:
        ``(tokens, n_accepted)`` as in the module docstring (``n_accepted = tau``).

    Raises:
        ValueError: the shapes do not fit together.
    """
    k = draft_ids.shape[0]
    vocab = target_probs.shape[1:]
    if (draft_probs.shape[0], target_probs.shape[0], draft_probs.shape[1:]) != (k, k + 1, vocab):
        raise ValueError(
            f"verify_block: {k} draft ids need draft_probs of shape ({k}, V) and target_probs of shape "
            f"({k + 1}, V); got {tuple(draft_probs.shape)} and {tuple(target_probs.shape)}."
        )
    w, h = block_weights(draft_ids, draft_probs, target_probs)
    eta = torch.rand(k, generator=generator, device=target_probs.device, dtype=target_probs.dtype)  # [k]
    stops = torch.arange(1, k + 1, device=target_probs.device) * (eta < h[1:])  # [k]: i if eta_i < h_i else 0
    tau = int(stops.max()) if k else 0
    if tau < k:
        dist = residual_distribution(target_probs[tau], draft_probs[tau], w[tau])
    else:
        dist = target_probs[k]
    last = torch.multinomial(dist, 1, generator=generator)  # [1]
    return torch.cat([draft_ids[:tau], last]), tau
