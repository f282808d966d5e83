"""The speculative decoding loop for a batch: several rows drafted one by one, verified in ONE target forward.

``generate()`` with ``input_ids`` of shape ``(B, n)`` (left padding and an ``attention_mask``), or with
``num_return_sequences > 1`` (transformers expands the rows before the decoding method runs, exactly as for
plain decoding), runs here; one unpadded prompt runs in :func:`hf_hetspec.decoding.speculative_generate`.

Per round:

1. every unfinished row's own proposer (the algorithm's, :func:`hf_hetspec.plan.build_proposer`, one per row:
   the drafter is cheap) drafts from that row's accepted ids, cut to :func:`draft_cap` tokens so that the
   round's verification forward stays within a token budget -- or, when that leaves too short a draft to pay,
   no row drafts and every row goes on alone (plain batched decoding) that round;
2. each row's block -- the tokens not yet in the target's cache (the prompt in round one, else the last new
   token) and its draft -- is right-padded to the round's longest draft, and the target runs ONE forward over
   the ``(rows, width)`` blocks with the one batched ``DynamicCache``, an explicit 2-D attention mask and
   explicit per-row position ids (:class:`BatchState`);
3. each row is verified alone, exactly as :func:`~hf_hetspec.decoding.speculative_generate` verifies one row
   (the target's logits processors on that row's sequence, the same functions of :mod:`hf_hetspec.verify`),
   and its stopping criteria are checked after every accepted token; a row that stops is padded with
   ``pad_token_id`` like transformers' batched ``generate()`` and leaves the batch (its cache rows are dropped).

Why each row gets exactly what it alone would get
-------------------------------------------------
The cache holds, for every row, one slot per fed position; slots are shared across rows, so a row has
*holes*: its left padding, the right padding of its blocks, and the draft tokens the target rejected. After
each round the slots no row accepted are cropped away and the others stay. The attention mask gives a
row's valid slots 1 and its holes 0, and every fed token gets as position id the number of the row's valid
tokens before it (its prompt's positions as transformers prepares them: ``cumsum(mask) - 1``, or the ones
passed; then one more per token). So each query of row ``r`` attends to exactly the keys of ``r``'s own
accepted prefix (and, inside its block, its own earlier draft tokens), in sequence order (slots are only
ever appended, so the causal order of slots is the sequence order), each key computed at its own position;
masked keys get weight exactly 0 (the mask adds the dtype's minimum before the softmax, whose ``exp``
underflows to 0, or SDPA's boolean mask), and every kept slot's key and value were computed from that same
prefix: an accepted draft token is the token the target would have fed, seen after the same prefix. Rows
never see each other (attention is per row). The target's logits for a row's draft are therefore those of
the row alone up to float rounding -- the same rounding as any batched forward, transformers' own batched
``generate()`` included -- and verification, stopping and padding follow the single-row loop, so greedy
output is token-identical to the target alone on that row and sampled output has the target's distribution
per row (rows draw fresh randomness from the one generator, so they are also independent). Only attention
layers whose keys hold one slot per position across the whole sequence allow holes:
:func:`hf_hetspec.checks.check_batch` refuses sliding-window and chunked layers in a batch (their window
counts slots, not tokens) and attention implementations other than ``sdpa``/``eager``.

Each row's logits processors and stopping criteria see the row as transformers' batched ``generate()``
shows it: its left-padded prompt followed by its own generated tokens (``input_ids`` of shape ``(1, n + t)``).
For processors that ignore padding (temperature, top-k/top-p, EOS, ``max_new_tokens``, stop strings, ...)
that is the row alone; ``max_length``, ``min_length`` and processors that read the padding token
(repetition penalty when ``pad_token_id`` appears in the prompt) count it, as transformers' batched
``generate()`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.generation import GenerateDecoderOnlyOutput

from .compat import cache_kwargs, output_cache_kwargs
from .decoding import _process
from .drafter import batch_rows, model_device, rollback_cache
from .proposer import Draft, Proposer
from .schedule import VERIFY_COST, VERIFY_COSTS
from .stats import DecodingStats
from .verify import verify_block, verify_exact_match_sampling, verify_greedy, verify_speculative_sampling

#: Drafting pays in a batch only while the target's verification forward stays cheap: on a CPU a forward over
#: many tokens costs about as much as that many one-token forwards once the weights' memory traffic is shared,
#: and the drafter runs once per row. A round with ``rows`` unfinished rows feeds at most this many tokens: each
#: row's draft is cut to ``BATCH_DRAFT_TOKEN_BUDGET // rows - 1`` target tokens (:func:`draft_cap`). Measured
#: (bf16 Qwen2.5-Coder-1.5B, one thread, after 200 tokens): 4 rows of 1 token 311 ms, of 4 tokens 422 ms, of 12
#: 648 ms. Tuned with ``benchmarks/batched_throughput.py --batch-sizes 4 --budgets 48 32 24 16`` on the demo
#: prompts 0-3, greedy 1.26x / 1.40x / 1.40x / 1.42x the target's batched ``generate()``, T=1 24 above 32 over
#: three seeds; reported on prompts 4-7 (two repeats) for 48 / 32 / 24: greedy 1.10x / 1.13x / 1.18x, T=1
#: 0.93x / 1.02x / 0.99x (docs/results.md, 2026-12-02 night).
BATCH_DRAFT_TOKEN_BUDGET = 24
#: ... and when that cut leaves fewer than this many draft tokens per row, the round does not draft at all
#: (plain batched decoding, one token per row): the drafter's steps would cost more than the few tokens they can
#: add. Tuned with the budget.
MIN_BATCH_DRAFT = 3

#: The cache is compacted (:meth:`BatchState.compact`) when at least this share of its slots are holes...
COMPACT_HOLE_SHARE = 0.5
#: ... and it holds at least this many slots (compacting a short cache costs more than its holes).
COMPACT_MIN_SLOTS = 64


def draft_cap(rows: int, verify_cost: float = VERIFY_COST, rows_per_pass: int | None = None) -> int | None:
    """The most target tokens a row's draft may keep in a round with ``rows`` unfinished rows: ``None`` (no cap)
    for a single row, else ``budget // rows - 1``, or ``0`` -- no drafting, plain batched decoding -- when that is
    below :data:`MIN_BATCH_DRAFT`. ``budget`` is :data:`BATCH_DRAFT_TOKEN_BUDGET` where verifying a token costs
    at most a float32 CPU target's 0.10 forwards, and shrinks in proportion to ``VERIFY_COST / verify_cost``
    where it costs more (``verify_cost``, the plan's :func:`~hf_hetspec.schedule.verify_cost`: bf16 on a CPU
    without bf16 instructions, 1.0, leaves 1 token, so no drafting at all). Where the target's products run in
    passes of ``rows_per_pass`` token rows (its layers packed as fp16,
    :attr:`hf_hetspec.packed_target.PreparedTarget.rows_per_pass`), the budget is one pass: a second pass reads
    every weight again, about one more step, and each row's drafter steps come on top (B = 4 on AVX2, demo
    prompts: plain batched decoding on the packed layers 7.12 / 6.50 tokens/s greedy / T=1 against 6.89 / 5.75
    with drafts within a 24-token budget; docs/results.md, 2026-12-03 late night).
    Cutting a draft is exact: its first ``c`` tokens, with the distributions they were drawn from, are a draft of
    their own."""
    if rows <= 1:
        return None
    budget = BATCH_DRAFT_TOKEN_BUDGET
    if verify_cost > VERIFY_COSTS["cpu-float32"]:
        budget = int(BATCH_DRAFT_TOKEN_BUDGET * VERIFY_COST / verify_cost)
    if rows_per_pass is not None:
        budget = min(budget, rows_per_pass)
    cap = budget // rows - 1
    return cap if cap >= MIN_BATCH_DRAFT else 0


@dataclass
class BatchState:
    """Where each unfinished row stands in the one batched target cache.

    Attributes:
        slot_mask (``torch.LongTensor`` of shape ``(rows, L)``): 1 where the cache slot holds one of the row's
            accepted tokens, 0 for a hole (left padding, right padding of a block, a rejected draft token).
        feed_ids, feed_mask, feed_positions (``torch.LongTensor`` of shape ``(rows, u)``): the tokens not yet in
            the cache (the padded prompt in the first round, then each row's last new token), their mask and
            their position ids.
    """

    slot_mask: torch.Tensor
    feed_ids: torch.Tensor
    feed_mask: torch.Tensor
    feed_positions: torch.Tensor

    def block(self, drafts: list[list[int]], fill: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The round's forward inputs: ``(input_ids, attention_mask, position_ids)`` of shapes ``(rows, u + K)``,
        ``(rows, L + u + K)`` and ``(rows, u + K)``, ``K`` the longest draft; each row's draft follows its fed
        tokens, right-padded with ``fill`` (masked)."""
        device = self.feed_ids.device
        longest = max(len(d) for d in drafts)
        draft_ids = torch.full((len(drafts), longest), fill, dtype=self.feed_ids.dtype, device=device)  # [rows, K]
        for row, draft in enumerate(drafts):
            if draft:
                draft_ids[row, : len(draft)] = torch.tensor(draft, dtype=draft_ids.dtype, device=device)
        lengths = torch.tensor([len(d) for d in drafts], device=device)
        steps = torch.arange(longest, device=device)
        draft_mask = (steps[None, :] < lengths[:, None]).to(self.slot_mask.dtype)  # [rows, K]
        draft_positions = block_positions(self.feed_positions[:, -1], longest)
        ids = torch.cat([self.feed_ids, draft_ids], dim=1)
        mask = torch.cat([self.slot_mask, self.feed_mask, draft_mask], dim=1)
        positions = torch.cat([self.feed_positions, draft_positions], dim=1)
        return ids, mask, positions

    def advance(self, accepted: torch.Tensor, longest: int, last_tokens: torch.Tensor, cache) -> None:
        """After a verified round: the fed tokens and each row's ``accepted`` draft tokens stay, the rest of the
        block becomes holes (:func:`kept_slots`); slots past the longest accepted draft are cropped from the
        cache. ``last_tokens`` (``(rows,)``, each row's correction or bonus token) are fed next round."""
        kept = kept_slots(accepted, longest).to(self.slot_mask.dtype)
        self.slot_mask = torch.cat([self.slot_mask, self.feed_mask, kept], dim=1)
        length = self.slot_mask.shape[1] - (longest - int(accepted.max()))
        rollback_cache(cache, length)
        self.slot_mask = self.slot_mask[:, :length]
        self.feed_positions = (self.feed_positions[:, -1] + 1 + accepted)[:, None]
        self.feed_ids = last_tokens[:, None].to(self.feed_ids.dtype)
        self.feed_mask = torch.ones_like(self.feed_ids, dtype=self.slot_mask.dtype)

    def select(self, rows: torch.Tensor, cache) -> None:
        """Keep only ``rows`` (indices into the current rows) here and in ``cache``."""
        cache.batch_select_indices(rows)
        self.slot_mask = self.slot_mask[rows]
        self.feed_ids, self.feed_mask, self.feed_positions = (
            self.feed_ids[rows], self.feed_mask[rows], self.feed_positions[rows])

    def compact(self, cache) -> bool:
        """Move each row's valid slots to the right end of a cache as long as the row with the most of them,
        when holes make up at least :data:`COMPACT_HOLE_SHARE` of at least :data:`COMPACT_MIN_SLOTS` slots. Keys
        keep the positions they were computed at, and attention does not depend on the order of past keys, so
        outputs are unchanged; only the wasted attention work goes. Returns whether it compacted."""
        rows, slots = self.slot_mask.shape
        valid = self.slot_mask.sum(dim=1)  # [rows]
        if slots < COMPACT_MIN_SLOTS or int(valid.sum()) > (1 - COMPACT_HOLE_SHARE) * rows * slots:
            return False
        layers = getattr(cache, "layers", None)
        if not layers or any(type(layer) is not DynamicLayer for layer in layers):
            return False  # only plain full-attention layers are gathered here (check_batch allows no other)
        width = int(valid.max())
        # a stable sort puts holes (0) first and valid slots (1) last, each group in slot order
        order = torch.sort(self.slot_mask, dim=1, stable=True).indices[:, slots - width:]  # [rows, width]
        for layer in layers:
            if not layer.is_initialized or layer.keys.numel() == 0:
                continue
            index = order.to(layer.keys.device)[:, None, :, None]
            layer.keys = layer.keys.gather(2, index.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3]))
            layer.values = layer.values.gather(2, index.expand(-1, layer.values.shape[1], -1, layer.values.shape[3]))
        self.slot_mask = torch.gather(self.slot_mask, 1, order)
        return True


def block_positions(last: torch.Tensor, width: int) -> torch.Tensor:
    """Position ids of ``width`` draft slots after tokens at positions ``last`` (``(rows,)``): ``last + 1 + j``
    (``(rows, width)``); a row's valid draft tokens are its next tokens, whatever holes its cache has."""
    return last[:, None] + 1 + torch.arange(width, device=last.device)[None, :]


def kept_slots(accepted: torch.Tensor, width: int) -> torch.Tensor:
    """Which of a block's ``width`` draft slots stay valid: the first ``accepted[r]`` of row ``r`` (``(rows,
    width)`` bool); rejected tokens and right padding become holes."""
    return torch.arange(width, device=accepted.device)[None, :] < accepted[:, None]


def batched_generate(
    target,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    make_proposer: Callable[[torch.LongTensor, int], Proposer],
    stats: DecodingStats,
    *,
    attention_mask: torch.LongTensor | None = None,
    position_ids: torch.LongTensor | None = None,
    past_key_values=None,
    generator: torch.Generator | None = None,
    verification: str = "token",
    verify_cost: float = VERIFY_COST,
    rows_per_pass: int | None = None,
):
    """Decode a batch with draft-then-verify, one target forward per round for all rows (module docstring).

    Args:
        target: the target model.
        input_ids (``torch.LongTensor`` of shape ``(B, n)``): the prompts, left-padded (every row's last column
            is a real token; :func:`hf_hetspec.checks.check_batch`), rows already repeated for
            ``num_return_sequences`` by transformers.
        logits_processor, stopping_criteria, generation_config: as prepared by ``generate()``; called one row
            at a time on ``(1, n + t)`` ids.
        make_proposer: ``make_proposer(row_ids, max_length)`` builds one row's proposer for its unpadded prompt
            ``row_ids`` (``(1, n_r)``) and its own ``max_length`` (the call's minus the row's padding).
        stats: filled in place, summed over rows (``target_forwards`` counts batched forwards, ``drafted_tokens``
            the drafts as verified, after :func:`draft_cap`; a row that goes on alone in a round without drafts
            counts one ``skipped_drafts``).
        attention_mask (``torch.LongTensor`` of shape ``(B, n)``, optional): 0 at padding; ``None``: no padding.
        position_ids (``torch.LongTensor`` of shape ``(B, n)`` or ``(1, n)``, optional): the prompt's positions
            (``None``: ``cumsum(mask) - 1``); generated tokens continue from each row's last one.
        past_key_values: an empty cache to fill (transformers <= 5.23 prepares one), or ``None``.
        generator: randomness for sampling (``None`` = global RNG), shared by the rows in turn.
        verification: ``"token"`` or ``"block"`` (the plan's ``hetspec_verification``).
        verify_cost: ``v`` of the target (the plan's, :func:`hf_hetspec.schedule.verify_cost`): the token budget of a
            round shrinks where verifying a token costs more (:func:`draft_cap`).
        rows_per_pass: token rows per pass of the target's packed products (the plan's
            ``target.rows_per_pass``), ``None`` for its own layers: a round's tokens stay within one pass
            (:func:`draft_cap`).

    Returns:
        ``torch.LongTensor`` of shape ``(B, n + T)``, ``T`` the most tokens any row generated; a row that
        stopped earlier is right-padded with ``pad_token_id``. ``GenerateDecoderOnlyOutput`` (``sequences``
        only; no cache: the batched cache has holes) when ``return_dict_in_generate``.

    Raises:
        ValueError: a row stopped before the others and the call has no ``pad_token_id`` to pad it with.
    """
    device = model_device(target)
    ids = input_ids.to(device)
    rows, n = ids.shape
    mask = torch.ones_like(ids) if attention_mask is None else attention_mask.to(device=device, dtype=torch.long)
    if position_ids is None:
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    else:
        positions = position_ids.to(device=device, dtype=torch.long).expand(rows, n)
    pad = generation_config._pad_token_tensor
    pad = None if pad is None else int(pad.flatten()[0])
    do_sample = bool(generation_config.do_sample)
    cache = past_key_values if past_key_values is not None else DynamicCache(config=target.config)
    stats.prompt_tokens = int(mask.sum())

    padded = [ids[r : r + 1] for r in range(rows)]  # each row as transformers' batched generate shows it
    proposers = []
    with batch_rows():  # each row's drafter context gets a cache of its own
        for r in range(rows):
            prompt = ids[r : r + 1, mask[r].bool()]  # [1, n_r] the row alone
            proposers.append(make_proposer(prompt, generation_config.max_length - (n - prompt.shape[1])))
    generated: list[list[int]] = [[] for _ in range(rows)]
    active = list(range(rows))  # output row of each row in the batch state
    state = BatchState(slot_mask=mask.new_zeros(rows, 0), feed_ids=ids, feed_mask=mask, feed_positions=positions)
    fill = 0 if pad is None else pad

    while active:
        cap = draft_cap(len(active), verify_cost, rows_per_pass)
        drafting = cap != 0
        drafts: list[Draft] = []
        for r in active:
            if drafting:
                row_ids = torch.cat([padded[r][:, mask[r].bool()], _tensor(generated[r], ids)], dim=1)
                drafts.append(_cut(proposers[r].propose(row_ids), cap))
            else:
                drafts.append(Draft([]))
                stats.skipped_drafts += 1
        longest = max(len(d.target_ids) for d in drafts)
        with stats.timer("target_s"):
            block_ids, block_mask, block_positions_ = state.block([d.target_ids for d in drafts], fill)
            out = target(input_ids=block_ids, attention_mask=block_mask, position_ids=block_positions_,
                         use_cache=True, logits_to_keep=longest + 1, **cache_kwargs(target, cache))
            logits = out.logits[:, -(longest + 1):].to(device=device, dtype=torch.float32)  # [rows, K+1, V_target]
            accepted_per_row, last_tokens, finished = [], [], []
            for slot, (r, draft) in enumerate(zip(active, drafts)):
                k = len(draft.target_ids)
                context = torch.cat([padded[r], _tensor(generated[r], ids)], dim=1)  # [1, n + t]
                tokens, accepted = _verify_row(draft, context, logits[slot, : k + 1], logits_processor, do_sample,
                                               generator, verification)
                keep, stopped = _stop_point(stopping_criteria, context, tokens)
                generated[r].extend(tokens[:keep].tolist())
                stats.drafted_tokens += k
                stats.accepted_tokens += accepted
                stats.rejections += int(accepted < k)
                if drafting:
                    proposers[r].update_schedule(accepted)
                accepted_per_row.append(accepted)
                last_tokens.append(int(tokens[accepted]))
                finished.append(stopped)
        stats.target_forwards += 1
        state.advance(torch.tensor(accepted_per_row, device=device), longest,
                      torch.tensor(last_tokens, device=device), cache)
        if any(finished):
            still = [slot for slot, done in enumerate(finished) if not done]
            active = [active[slot] for slot in still]
            if active:
                state.select(torch.tensor(still, device=device), cache)
        if active:
            state.compact(cache)

    stats.new_tokens = sum(len(g) for g in generated)
    stats.drafter_truncated_tokens = sum(p.truncated_tokens for p in proposers)
    longest_output = max(len(g) for g in generated)
    if pad is None and any(len(g) < longest_output for g in generated):
        raise ValueError("rows of the batch stopped at different lengths and the call has no pad_token_id to pad "
                         "the shorter ones: pass pad_token_id= (e.g. the tokenizer's pad or EOS id).")
    tails = torch.full((rows, longest_output), fill, dtype=ids.dtype, device=device)
    for r, tokens in enumerate(generated):
        if tokens:
            tails[r, : len(tokens)] = torch.tensor(tokens, dtype=ids.dtype, device=device)
    sequences = torch.cat([ids, tails], dim=1)
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=sequences, **output_cache_kwargs(GenerateDecoderOnlyOutput, None))
    return sequences


def _cut(draft: Draft, cap: int | None) -> Draft:
    """``draft``'s first ``cap`` tokens (and rows of ``q``); the whole draft when ``cap`` is ``None``."""
    if cap is None or len(draft.target_ids) <= cap:
        return draft
    return Draft(draft.target_ids[:cap], None if draft.q is None else draft.q[:cap])


def _tensor(tokens: list[int], like: torch.Tensor) -> torch.Tensor:
    """``tokens`` as a ``(1, len)`` tensor of ``like``'s dtype and device."""
    return torch.tensor([tokens], dtype=like.dtype, device=like.device).reshape(1, len(tokens))


def _verify_row(draft: Draft, context: torch.Tensor, logits: torch.Tensor, logits_processor, do_sample: bool,
                generator, verification: str) -> tuple[torch.Tensor, int]:
    """One row's verification, as :func:`hf_hetspec.decoding.speculative_generate` verifies its one row.

    Args:
        draft: the row's draft (``k`` target ids, its ``q`` or ``None``).
        context (``torch.LongTensor`` of shape ``(1, m)``): the row's ids so far (left-padded prompt + generated).
        logits (``torch.FloatTensor`` of shape ``(k + 1, V_target)``): the target's raw logits at the row's last
            token and each draft token.
    """
    k = len(draft.target_ids)
    drafted = torch.tensor(draft.target_ids, dtype=context.dtype, device=context.device)  # [k]
    candidate = torch.cat([context, drafted[None]], dim=1)
    processed = _process(logits_processor, candidate, context.shape[1], logits)
    if not do_sample:
        return verify_greedy(drafted, processed)
    target_probs = processed.softmax(dim=-1)  # [k+1, V_target]
    if draft.q is None or k == 0:
        return verify_exact_match_sampling(drafted, target_probs, generator)
    verify = verify_block if verification == "block" else verify_speculative_sampling
    return verify(drafted, draft.q.to(target_probs), target_probs, generator)


def _stop_point(stopping_criteria, context: torch.Tensor, tokens: torch.Tensor) -> tuple[int, bool]:
    """How many of ``tokens`` (``(a + 1,)``) the row keeps, and whether it stopped: its stopping criteria are
    checked after every token, so an EOS or stop string inside an accepted block ends it exactly there."""
    full = torch.cat([context, tokens[None, :].to(context.dtype)], dim=1)
    m = context.shape[1]
    for j in range(tokens.shape[0]):
        if bool(stopping_criteria(full[:, : m + j + 1], None).any()):
            return j + 1, True
    return tokens.shape[0], False
