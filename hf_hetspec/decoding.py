"""The speculative decoding loop: draft, verify in one target forward, accept, roll back.

It runs inside ``model.generate()`` as transformers' ``custom_generate`` decoding method, so everything
``generate()`` prepares -- the merged ``GenerationConfig``, the target's logits processors (temperature,
top-k, top-p, repetition penalty, ...), stopping criteria (``max_new_tokens``, EOS lists, ``stop_strings``,
custom criteria), the streamer and the target's KV cache -- is used exactly as transformers' own decoding
would use it. Why our own loop rather than transformers' ``_assisted_decoding``: the verification math must
live in :mod:`hf_hetspec.verify` with explicit randomness for every algorithm, stopping criteria must be
checked after every accepted token (transformers checks once per block, so a stop string or an EOS inside
an accepted block would be overrun), and transformers 5.x decides "different tokenizers" by ``vocab_size``.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import torch
from transformers import DynamicCache
from transformers.generation import GenerateDecoderOnlyOutput

from .compat import cache_kwargs, output_cache_kwargs
from .drafter import model_device, rollback_cache
from .proposer import Draft, Proposer
from .stats import DecodingStats
from .tree import DraftTree, keep_path, supports_tree, tree_attention_mask, tree_position_ids, walk_tree
from .verify import verify_block, verify_exact_match_sampling, verify_greedy, verify_speculative_sampling


def _process(logits_processor, candidate_ids: torch.Tensor, n: int, logits: torch.Tensor) -> torch.Tensor:
    """Apply the target's logits processors position by position.

    Args:
        candidate_ids (``torch.LongTensor`` of shape ``(1, n + k)``).
        n: number of accepted tokens (the context of row 0).
        logits (``torch.FloatTensor`` of shape ``(k + 1, V_target)``).
    """
    if not len(logits_processor):
        return logits
    rows = [logits_processor(candidate_ids[:, : n + i], logits[i : i + 1]) for i in range(logits.shape[0])]
    return torch.cat(rows, dim=0)


def _positions(prompt_positions: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Position ids of sequence indices ``start .. end - 1`` (``(1, end - start)``) when the user gave the
    prompt's: the prompt's own for its tokens, then one more per generated token (transformers' rule)."""
    n = prompt_positions.shape[0]
    index = torch.arange(start, end, device=prompt_positions.device)
    generated = prompt_positions[-1] + 1 + (index - n)
    return torch.where(index < n, prompt_positions[index.clamp(max=n - 1)], generated)[None]


#: Prompts whose drafter tokens not yet in its cache number at least this many are prefilled by the drafter on a
#: second thread while the target prefills (:func:`overlaps_prefill`). Splitting the target's first forward costs
#: one extra pass over its weights, about one decoding step (0.22-0.25 s for a bf16 Qwen2.5-Coder-1.5B, one
#: thread, on the project's CPU with bf16 instructions), and hides the drafter's float32 prefill, 3-4 ms per token
#: for SmolLM2-135M: it pays from about 70-100 drafter tokens. Measured there (2026-12-03,
#: ``benchmarks/overlap_prefill.py``, tuning-half prompts, greedy, interleaved): from 32 tokens on, the first
#: token of 38-55-token prompts came 0.04-0.13 s later than without the overlap, of 100-170-token prompts
#: 0.03-0.25 s sooner; HumanEval chat prompts (124-168 drafter tokens) ran 3.97x / 5.10x / 3.98x the target
#: alone from 96 against 3.47x / 4.70x / 3.60x from 384 (the former value, set on a CPU whose bf16 target step
#: took 0.35-0.45 s).
OVERLAP_PREFILL_MIN = 96


def overlaps_prefill(target, proposer: Proposer) -> bool:
    """Whether the drafter prefills its prompt, and makes its first draft, on a second thread while the target
    prefills its own (the first draft depends on the prompt alone): both models
    on the CPU, a core left beyond PyTorch's intra-op threads and not taken by other processes (the 1-minute
    load average, this process's own included, below the core count minus one half), and at least
    :data:`OVERLAP_PREFILL_MIN` drafter tokens to prefill. A prefill is compute-bound, so the two run side by
    side at nearly full speed on two free cores; on a GPU both would queue on the same device. Never where the
    source policy never drafts (``v + c >= 0.9``, :attr:`hf_hetspec.sources.SourcePolicy.never_drafts`): there the
    drafter's prefill would only take memory bandwidth from the target's and split its prompt into two forwards.

    Measured (``benchmarks/overlap_prefill.py``, 3 Spec-Bench summarization prompts of 422-709 tokens, SLEM
    greedy, one thread): 2.28x the target alone with the overlap against 2.15x without on an idle 2-core
    machine; with another benchmark on the second core, 1.96x against 2.05x (hence the load check)."""
    if not hasattr(proposer, "prefill_drafter"):  # not a PrefillingProposer (e.g. scripted drafts)
        return False
    if getattr(proposer, "never_drafts", False):  # the drafter will not run: its prefill would be wasted
        return False
    uncached = proposer.prefill_tokens
    on_cpu = model_device(target).type == "cpu" and proposer.drafter_device.type == "cpu"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return on_cpu and torch.get_num_threads() < cores and busy < cores - 0.5 and uncached >= OVERLAP_PREFILL_MIN


def _prefill_and_draft(proposer: Proposer, ids: torch.LongTensor) -> Draft:
    """The drafter's prompt prefilled, then the first draft after the prompt ``ids`` (``(1, n)``): the work of the
    second thread while the target prefills (:func:`overlaps_prefill`)."""
    proposer.prefill_drafter()
    return proposer.propose(ids)


def _forward_kwargs(target, cache, prompt_positions: torch.LongTensor | None, start: int, end: int) -> dict:
    """The target's cache keywords for a forward over sequence indices ``start .. end - 1``, with their position
    ids when the user gave the prompt's (:func:`_positions`)."""
    extra = cache_kwargs(target, cache)
    if prompt_positions is not None:
        extra["position_ids"] = _positions(prompt_positions, start, end)
    return extra


def _verify_tree(target, cache, ids: torch.LongTensor, tree: DraftTree, logits_processor,
                 prompt_positions: torch.LongTensor | None, do_sample: bool, generator: torch.Generator | None):
    """Verify a draft tree in one target forward (:mod:`hf_hetspec.tree`): greedily, or by exact-match sampling
    (Timor et al. 2025, Algorithm 2, over several branches: at each node the target samples its token, and the
    walk goes on while the sample is one of the node's children).

    Args:
        target: the target model (:func:`~hf_hetspec.tree.supports_tree` holds for it and ``cache``).
        cache: its ``DynamicCache``, holding a prefix of ``ids``; on return it holds ``ids`` and then the
            accepted nodes, in order, followed by the other nodes (the caller crops them).
        ids (``torch.LongTensor`` of shape ``(1, n)``): the accepted ids.
        tree: the draft tree (``N`` nodes).
        logits_processor: the target's processors, applied along the walk with each position's own context.
        prompt_positions (``torch.LongTensor`` of shape ``(n_prompt,)``, optional): the prompt's position ids
            when the user gave them (:func:`_positions`).
        do_sample: sample each emitted token from the processed distribution (else its argmax).
        generator: randomness for sampling, on the target's logits device (``None`` = global RNG).

    Returns:
        ``(tokens, path, processed, logits)``: the emitted target ids (``(a + 1,)``), the accepted nodes, and the
        processed and raw logits of the emitted tokens (``(a + 1, V_target)`` each, float32).
    """
    device = ids.device
    n = ids.shape[1]
    cached = cache.get_seq_length()
    tail = n - cached
    nodes = torch.tensor([tree.tokens], dtype=ids.dtype, device=device)
    feed = torch.cat([ids[:, cached:], nodes], dim=1)  # [1, tail + N]
    mask = tree_attention_mask(tree, cached, tail, target.dtype, device)
    if prompt_positions is None:
        tail_positions = torch.arange(cached, n, device=device)
    else:
        tail_positions = _positions(prompt_positions, cached, n)[0]
    positions = tree_position_ids(tree, tail_positions)
    out = target(input_ids=feed, attention_mask=mask, position_ids=positions, use_cache=True,
                 logits_to_keep=len(tree) + 1, **cache_kwargs(target, cache))
    raw = out.logits[0]  # [N + 1, V_target]: after the last accepted id, then after each node
    rows_raw, rows = [], []

    def choose(node: int, path_tokens: list[int]) -> int:
        row = raw[node + 1 : node + 2].to(device=device, dtype=torch.float32)
        context = torch.cat([ids, torch.tensor([path_tokens], dtype=ids.dtype, device=device)], dim=1)
        processed = _process(logits_processor, context, context.shape[1], row)
        rows_raw.append(row)
        rows.append(processed)
        if do_sample:  # a sample from p given the path: exact whatever the tree holds
            return int(torch.multinomial(processed.softmax(dim=-1), 1, generator=generator))
        return int(processed.argmax(dim=-1))

    path, tokens = walk_tree(tree, choose)
    keep_path(cache, n, path)
    emitted = torch.tensor(tokens, dtype=ids.dtype, device=device)
    return emitted, path, torch.cat(rows), torch.cat(rows_raw)


def speculative_generate(
    target,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    proposer: Proposer,
    stats: DecodingStats,
    *,
    streamer=None,
    generator: torch.Generator | None = None,
    past_key_values=None,
    position_ids: torch.LongTensor | None = None,
    verification: str = "token",
):
    """Decode with draft-then-verify until a stopping criterion fires.

    Args:
        target: the target model.
        input_ids (``torch.LongTensor`` of shape ``(1, n)``): the prompt in target ids.
        logits_processor (``LogitsProcessorList``): the target's processors, as prepared by ``generate()``.
        stopping_criteria (``StoppingCriteriaList``): as prepared by ``generate()``.
        generation_config: the merged ``GenerationConfig`` of the call.
        proposer: a :class:`~hf_hetspec.proposer.Proposer` (what the loop may use of it); ``proposer.propose(ids)``
            gives the next :class:`~hf_hetspec.proposer.Draft`. A sampled call verifies it against the draft's ``q``
            when it has one (``verification``), otherwise by exact-match sampling. A draft with sibling
            ``branches`` and no ``q`` is verified as one tree (:func:`_verify_tree`) when the target and its
            cache allow it (:func:`~hf_hetspec.tree.supports_tree`), else as its chain.
        stats: filled in place.
        streamer: receives only accepted tokens, one block per target forward.
        generator: randomness for sampling (on the target's logits device); ``None`` = global RNG.
        past_key_values: the target's KV cache: the one passed to ``generate()`` (empty, or holding part or
            all of the prompt), or prepared by it; a ``DynamicCache`` is made when there is none.
        position_ids (``torch.LongTensor`` of shape ``(1, n)``, optional): the prompt's position ids as the
            user passed them to ``generate()``; generated tokens continue from the last one, as in
            transformers' own decoding. They are the target's: the drafter numbers its own tokens.
        verification: how a sampled draft with a ``q`` is verified: ``"token"``, token-level speculative
            sampling (:func:`~hf_hetspec.verify.verify_speculative_sampling`), or ``"block"``, block
            verification (:func:`~hf_hetspec.verify.verify_block`); the plan's ``hetspec_verification``.

    Returns:
        ``torch.LongTensor`` of shape ``(1, n + new_tokens)``, or ``GenerateDecoderOnlyOutput`` when
        ``return_dict_in_generate``.
    """
    # transformers <= 5.23 prepares the cache before calling a custom_generate method, 5.24 does not
    cache = past_key_values if past_key_values is not None else DynamicCache(config=target.config)
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    # A cache passed to generate() may hold the whole prompt (a prefix cache re-used for this prompt): the
    # prompt's last position is then recomputed, because its logits give the first new token.
    rollback_cache(cache, input_ids.shape[1] - 1)
    device = model_device(target)
    do_sample = bool(generation_config.do_sample)
    want_scores = generation_config.return_dict_in_generate and generation_config.output_scores
    want_logits = generation_config.return_dict_in_generate and generation_config.output_logits
    scores, raw_logits = [], []
    stats.prompt_tokens = input_ids.shape[1]
    ids = input_ids.to(device)
    prompt_positions = None if position_ids is None else position_ids[0].to(device)
    cached = cache.get_seq_length()
    first_draft = None
    if ids.shape[1] - cached >= 2 and overlaps_prefill(target, proposer):
        # the target's prompt but its last token (that one is fed with the first draft), the drafter's prompt
        # and then its first draft on a second thread meanwhile: the first draft depends on the prompt alone
        # (and the drafter's own randomness, drawn in the same order), so outputs are unchanged, and the
        # drafter's prefill and first draft leave the critical path. This prefill verifies nothing, so it is not
        # a target forward (DecodingStats): the call counts the forwards it would count without the overlap
        with ThreadPoolExecutor(max_workers=1) as pool:
            drafting = pool.submit(_prefill_and_draft, proposer, ids)
            with stats.timer("target_s"):
                extra = _forward_kwargs(target, cache, prompt_positions, cached, ids.shape[1] - 1)
                target(input_ids=ids[:, cached:-1], use_cache=True, logits_to_keep=1, **extra)
            first_draft = drafting.result()
    finished = False
    while not finished:
        n = ids.shape[1]
        draft_tokens = first_draft if first_draft is not None else proposer.propose(ids)
        first_draft = None
        k = len(draft_tokens.target_ids)
        tree, left_chain = None, False
        if draft_tokens.branches and draft_tokens.q is None and supports_tree(target, cache):
            tree = DraftTree.from_branches(draft_tokens.target_ids, draft_tokens.branches)
            tree = None if tree.is_chain() else tree
        with stats.timer("target_s"):
            if tree is not None:
                tokens, path, processed, logits = _verify_tree(target, cache, ids, tree, logits_processor,
                                                               prompt_positions, do_sample, generator)
                accepted = len(path)
                left_chain = path != list(range(accepted))
                stats.tree_rounds += 1
                stats.tree_nodes += len(tree) - k
                stats.sibling_rounds += int(left_chain)
            else:
                drafted = torch.tensor([draft_tokens.target_ids], dtype=ids.dtype, device=device)  # [1, k]
                candidate_ids = torch.cat([ids, drafted], dim=1)
                cached = cache.get_seq_length()
                feed = candidate_ids[:, cached:]
                extra = _forward_kwargs(target, cache, prompt_positions, cached, candidate_ids.shape[1])
                out = target(input_ids=feed, use_cache=True, logits_to_keep=k + 1, **extra)
                logits = out.logits[0, -(k + 1) :].to(device=device, dtype=torch.float32)  # [k+1, V_target]
                processed = _process(logits_processor, candidate_ids, n, logits)
                draft = candidate_ids[0, n:]
                if not do_sample:
                    tokens, accepted = verify_greedy(draft, processed)
                else:
                    target_probs = processed.softmax(dim=-1)  # [k+1, V_target]
                    if draft_tokens.q is None:
                        tokens, accepted = verify_exact_match_sampling(draft, target_probs, generator)
                    else:
                        draft_probs = draft_tokens.q.to(target_probs)  # [k, V_target]
                        verify = verify_block if verification == "block" else verify_speculative_sampling
                        tokens, accepted = verify(draft, draft_probs, target_probs, generator)
        stats.target_forwards += 1
        stats.drafted_tokens += k
        stats.accepted_tokens += accepted
        stats.rejections += int(accepted < k or left_chain)

        # Append one token at a time so that EOS, stop strings and custom criteria inside the block stop
        # generation exactly where plain decoding would have stopped.
        full = torch.cat([ids, tokens[None, :].to(ids.dtype)], dim=1)
        keep = tokens.shape[0]
        for j in range(tokens.shape[0]):
            if bool(stopping_criteria(full[:, : n + j + 1], None).any()):
                keep, finished = j + 1, True
                break
        ids = full[:, : n + keep]
        if want_scores:
            scores.extend(processed[i : i + 1] for i in range(keep))
        if want_logits:
            raw_logits.extend(logits[i : i + 1] for i in range(keep))
        if streamer is not None:
            streamer.put(ids[0, n:].cpu())
        # positions n .. n+accepted-1 hold accepted drafts; the last new token is fed next round
        rollback_cache(cache, n + keep - 1)
        proposer.update_schedule(accepted)

    if streamer is not None:
        streamer.end()
    stats.new_tokens = ids.shape[1] - input_ids.shape[1]
    stats.drafter_truncated_tokens = proposer.truncated_tokens
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(
            sequences=ids,
            scores=tuple(scores) if want_scores else None,
            logits=tuple(raw_logits) if want_logits else None,
            **output_cache_kwargs(GenerateDecoderOnlyOutput, cache if generation_config.use_cache else None),
        )
    return ids
