"""The drafter's side of the conversation: its token sequence, its KV cache, and how both follow the text
the target accepted.

The drafter never sees target token ids. After each verification the accepted target text (bytes) is
handed to :meth:`DrafterContext.sync`, which keeps the longest prefix of the drafter's own tokens that still
spells that text, crops the KV cache to it (:func:`rollback_cache`) and appends only the re-tokenized
remainder -- the drafter's context is never re-encoded as a whole (Timor et al. 2025, Section 3, SLEM
"the drafter continues from the accepted string").
"""

from __future__ import annotations

import bisect
import contextvars
import inspect
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicSlidingWindowLayer
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

from .alignment import TextWindowConverter, Vocabulary, common_prefix_length
from .compat import cache_kwargs, model_device, quiet_quantization_warnings  # model_device: also its old path
from .recurrent import SnapshotCache, is_state_layer
from .schedule import DraftStop  # also the old import path of DraftStop
from .static_drafter import StaticCacheDrafter

#: Positions kept free after the synced context for one draft (lookahead <= 16 target tokens, a few drafter
#: tokens each); at most half of the drafter's maximum context.
DRAFT_RESERVE = 64


class DrafterContextFull(RuntimeError):
    """A drafter forward would pass the drafter's maximum context (``max_position_embeddings``); the
    decoding loop lets the target go on alone for that round."""


def max_positions(model: PreTrainedModel) -> int | None:
    """The drafter's maximum context in tokens (``max_position_embeddings`` or ``n_positions`` of its text
    config), ``None`` when the config states none."""
    config = model.config
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


_BATCH_ROWS = contextvars.ContextVar("hf_hetspec_batch_rows", default=False)


@contextmanager
def batch_rows() -> Iterator[None]:
    """Drafter contexts made inside this block are rows of one batch (:mod:`hf_hetspec.batched`): each gets a
    KV cache of its own, even from a drafter whose compiled step keeps one cache per drafter
    (:meth:`hf_hetspec.static_drafter.StaticCacheDecoder.new_cache`): rows sharing it would overwrite each
    other's keys and values (their drafts, never their outputs, would suffer)."""
    token = _BATCH_ROWS.set(True)
    try:
        yield
    finally:
        _BATCH_ROWS.reset(token)


def rollback_cache(cache: DynamicCache, length: int) -> None:
    """Crop ``cache`` so that it holds the first ``length`` positions."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


#: A pruned LM head is used only when it keeps at most this share of the drafter's rows (below it, the copy of
#: the kept rows costs memory for little time).
PRUNE_MAX_SHARE = 0.8

_HEAD_CHECKED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_PRUNED_HEADS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _head_is_linear(model: PreTrainedModel) -> bool:
    """Whether ``model``'s logits are exactly ``linear(decoder(x).last_hidden_state, lm_head)``: checked once per
    model on a 3-token input (no softcapping, logit scaling or other post-processing we would miss)."""
    if model in _HEAD_CHECKED:
        return _HEAD_CHECKED[model]
    ok = False
    head = model.get_output_embeddings()
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    linear = isinstance(head, (torch.nn.Linear, DynamicQuantizedLinear))
    if linear and decoder is not None and decoder is not model:
        ids = torch.tensor([[1, 2, 3]], device=model_device(model))
        with torch.no_grad():
            full = model(input_ids=ids, use_cache=False).logits[0, -1].float()
            hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state[0, -1]
            mine = head(hidden[None].to(model_device(model)))[0].float().to(full.device)
        ok = full.shape == mine.shape and torch.allclose(full, mine, rtol=1e-2, atol=1e-2 * float(full.abs().max()))
    _HEAD_CHECKED[model] = ok
    return ok


def _linear_rows(head: torch.nn.Module, rows: torch.Tensor) -> torch.nn.Module:
    """A linear layer computing only the outputs ``rows`` of ``head``: an ``nn.Linear``, or a dynamically
    quantized one (:mod:`hf_hetspec.runtime`'s int8 drafter), whose int8 rows and scales are kept as is."""
    if isinstance(head, DynamicQuantizedLinear):
        weight, bias = head._weight_bias()
        index = rows.to(weight.device)
        with quiet_quantization_warnings():
            if weight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
                # PyTorch indexes only per-tensor quantized tensors: take the rows of int8 values and scales
                kept = torch._make_per_channel_quantized_tensor(
                    weight.int_repr()[index], weight.q_per_channel_scales()[index],
                    weight.q_per_channel_zero_points()[index], 0)
            else:
                kept = weight[index]
            pruned = DynamicQuantizedLinear(head.in_features, rows.numel(), dtype=weight.dtype)
            pruned.set_weight_bias(kept, None if bias is None else bias[index].contiguous())
        return pruned
    index = rows.to(head.weight.device)
    pruned = torch.nn.Linear(head.in_features, rows.numel(), bias=head.bias is not None,
                             device=head.weight.device, dtype=head.weight.dtype)
    with torch.no_grad():
        pruned.weight.copy_(head.weight[index])
        if head.bias is not None:
            pruned.bias.copy_(head.bias[index])
    return pruned.requires_grad_(False)


class PrunedHead:
    """The drafter's LM head restricted to the rows ``rows`` (drafter ids, ascending): logits of only the
    tokens a token-level algorithm may draft (TLI's vocabulary intersection). Restricting the next-token
    distribution to those rows and renormalizing is what TLI does anyway (Timor et al. 2025, Algorithm 4),
    so computing only their logits changes nothing but the cost: the head of Gemma-3-270M is 262,144 x 640,
    about half of a drafter step on CPU. transformers' universal speculative decoding prunes the same way.

    The kept rows are copied once per drafter and row set (and cached while the drafter lives; copied again
    after the head's weights change in place); the drafter itself is never changed.

    Args:
        model: the drafter.
        rows (``torch.LongTensor`` of shape ``(R,)``): drafter ids to keep, ascending.
    """

    def __init__(self, model: PreTrainedModel, rows: torch.Tensor):
        head = model.get_output_embeddings()
        self.decoder = model.get_decoder()
        per_model = _PRUNED_HEADS.setdefault(model, {})
        key = (rows.shape[0], hash(tuple(rows.tolist())))
        # a head changed since the copy (training steps, resized embeddings) is copied again
        if isinstance(head, DynamicQuantizedLinear):
            version = (id(head._packed_params), head.out_features)
        else:
            version = (head.weight.data_ptr(), head.weight._version, tuple(head.weight.shape))
        if key not in per_model or per_model[key][0] != version:
            per_model[key] = (version, _linear_rows(head, rows))
        _, self.linear = per_model[key]
        self.head_device = head.weight.device if isinstance(head, torch.nn.Linear) else torch.device("cpu")
        self.rows = rows.to(model_device(model))

    @classmethod
    def build(cls, model: PreTrainedModel, rows: torch.Tensor, n_tokens: int) -> "PrunedHead | None":
        """A pruned head when it pays (``len(rows) <= PRUNE_MAX_SHARE * n_tokens``) and the model's logits are a
        plain linear head over its decoder's last hidden state; else ``None`` (the full head is used: slower,
        same output)."""
        if rows.numel() == 0 or rows.numel() > PRUNE_MAX_SHARE * n_tokens or not _head_is_linear(model):
            return None
        return cls(model, rows)

    def __call__(self, feed: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        """Logits of the kept rows for the last position of ``feed`` (``(1, R)``, float32 accumulation as the
        head's dtype gives)."""
        out = self.decoder(input_ids=feed, use_cache=True, **cache_kwargs(self.decoder, cache))
        return self.linear(out.last_hidden_state[:, -1].to(self.head_device))


@dataclass
class DrafterSteps:
    """What :meth:`DrafterContext.draft` drafted.

    Attributes:
        ids: the drafted drafter token ids (1 to ``n_tokens``), also appended to the context.
        probs: per drafted token, the distribution it was drawn from (``torch.FloatTensor`` of shape
            ``(1, C)``, ``C`` = the logits' columns), when the selector reported one; else empty.
    """

    ids: list[int]
    probs: list[torch.Tensor]


class DrafterContext:
    """Drafter token ids + KV cache for one ``generate()`` call, synchronized on accepted text.

    ``ids[:n_synced]`` spell the accepted text up to byte ``synced_len`` (the prompt, then everything
    the target accepted at the last :meth:`sync`); ``ids[n_synced:]`` are the latest draft. The accepted
    text only grows, so a sync compares the draft with the newly accepted bytes alone, in the target's
    byte coordinates (a drafter tokenizer that normalizes text, e.g. NFC, cannot make it drift). The KV
    cache always holds fewer positions than ``ids`` has tokens, so a forward over the uncached tail yields
    the logits of the next token.

    Maximum context: a drafter holds at most ``max_positions(model)`` tokens (a model with learned
    position embeddings fails beyond them, a RoPE model degrades). The context keeps
    ``DRAFT_RESERVE`` positions free for a draft: a longer prompt keeps only its last tokens (after the
    drafter's BOS), and when the synced context grows past the limit the oldest half is dropped and the KV
    cache is rebuilt. ``truncated_tokens`` counts the dropped tokens (``DecodingStats.drafter_truncated_tokens``).
    Only the drafter's view shrinks: the target always sees the whole sequence, so the output is unchanged.
    A forward that would still pass the limit raises :class:`DrafterContextFull`.

    Args:
        model: the drafter (any causal LM with a KV cache).
        vocab: the drafter tokenizer's byte table.
        prompt_ids: the prompt in drafter token ids (non-empty list of ints).
        window: re-tokenization window (tokens) used in :meth:`sync`.
    """

    def __init__(self, model: PreTrainedModel, vocab: Vocabulary, prompt_ids: list[int], window: int = 4):
        if not prompt_ids:
            raise ValueError("the drafter prompt is empty: the prompt text tokenizes to no drafter token")
        self.model = model
        self.vocab = vocab
        self.device = model_device(model)
        self.ids: list[int] = list(prompt_ids)
        self.n_prompt = len(prompt_ids)
        self.n_synced = len(prompt_ids)
        self.synced_len = 0
        self.converter = TextWindowConverter(vocab, window)
        self.own_cache = _BATCH_ROWS.get()  # a row of a batch (batch_rows): never a cache shared per drafter
        # padded rows of the LM head are no tokens: never draft them
        self.n_tokens = len(vocab.tokenizer)
        self.cache = self._new_cache()
        self.head: PrunedHead | None = None
        self._logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.forwards = 0
        self.capacity = max_positions(model)
        self.reserve = 0 if self.capacity is None else min(DRAFT_RESERVE, self.capacity // 2)
        prefix = list(vocab.bos_prefix)
        self.n_sink = len(prefix) if prefix and self.ids[: len(prefix)] == prefix else 0
        self.truncated_tokens = 0
        if self.capacity is not None and len(self.ids) > self.capacity - self.reserve:
            self._drop_oldest(self.capacity - self.reserve)

    def _new_cache(self) -> DynamicCache:
        """The drafter's KV cache. Sliding-window layers keep only the window plus what was fed since their last
        crop, so a re-tokenization that replaces older tokens could not be rolled back (transformers raises a
        shape error in attention once the context passes the window, e.g. Gemma-3's 512 tokens); for such
        models every layer keeps its whole past instead -- the model's sliding-window mask still applies, so
        the logits are the same. A drafter run by hf_hetspec's own step brings its preallocated cache
        (:class:`~hf_hetspec.static_drafter.StaticKVCache`); a row of a batch (:func:`batch_rows`) gets one of its
        own, run by the eager step, where the step is compiled (whose cache is one per drafter)."""
        if isinstance(self.model, StaticCacheDrafter):
            return self.model.model.temporary_cache() if self.own_cache else self.model.new_cache()
        cache = DynamicCache(config=self.model.config)
        if any(is_state_layer(layer) for layer in cache.layers):
            # recurrent drafters (Mamba, Jamba, ...): rolled back from state snapshots, see hf_hetspec.recurrent
            return SnapshotCache(self.model.config.get_text_config(decoder=True))
        if any(isinstance(layer, DynamicSlidingWindowLayer) for layer in cache.layers):
            cache = DynamicCache()
        if hasattr(cache, "activate_past_recording"):
            cache.activate_past_recording()
        return cache

    def _drop_oldest(self, keep: int) -> None:
        """Keep the BOS sink and the last tokens, ``keep`` in all (no draft pending); restart the cache."""
        keep = max(keep, self.n_sink + 1)
        drop = len(self.ids) - keep
        if drop <= 0:
            return
        del self.ids[self.n_sink : self.n_sink + drop]
        self.n_synced -= drop
        self.n_prompt = max(self.n_sink, self.n_prompt - drop)
        self.truncated_tokens += drop
        self.cache = self._new_cache()

    @property
    def draft_ids(self) -> list[int]:
        """Drafter tokens drafted since the last sync."""
        return self.ids[self.n_synced :]

    def sync(self, text: bytes) -> None:
        """Follow the accepted text ``text`` (bytes of complete UTF-8 characters, append-only).

        Keeps the longest prefix of the draft whose bytes match the newly accepted bytes, re-tokenizes the
        rest through a window of known tokens (which may replace the last few tokens), and rolls the KV
        cache back to the first changed position.

        Accepted text never shrinks; if ``text`` is shorter than the text already synced anyway, the
        drafter restarts from the end of its prompt.
        """
        if len(text) < self.synced_len:
            del self.ids[self.n_prompt :]
            self.n_synced, self.synced_len = self.n_prompt, 0
        new = text[self.synced_len :]
        tb = self.vocab.token_bytes
        draft = self.draft_ids
        cum = [0]
        for tok in draft:
            cum.append(cum[-1] + len(tb[tok]))
        common = common_prefix_length(b"".join(tb[t] for t in draft), new)
        keep = bisect.bisect_right(cum, common) - 1
        # the remainder must start on a character boundary to be re-encoded as text
        while keep > 0 and cum[keep] < len(new) and (new[cum[keep]] & 0xC0) == 0x80:
            keep -= 1
        rest = new[cum[keep] :]
        n_keep, new_ids = self.converter.resync(self.ids, self.n_synced + keep, rest.decode("utf-8"))
        del self.ids[n_keep:]
        self.ids.extend(new_ids)
        self.n_synced = len(self.ids)
        self.synced_len = len(text)
        rollback_cache(self.cache, min(self.cache.get_seq_length(), n_keep, len(self.ids) - 1))
        if self.capacity is not None and len(self.ids) > self.capacity - self.reserve:
            self._drop_oldest((self.capacity - self.reserve) // 2)

    @torch.no_grad()
    def draft(
        self,
        n_tokens: int,
        select: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]
                         | tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]],
        stop: DraftStop | None = None,
    ) -> DrafterSteps:
        """Extend the sequence by up to ``n_tokens`` drafter tokens chosen by ``select``.

        Args:
            n_tokens: the most drafter forwards (the lookahead, in drafter tokens), >= 1.
            select: maps the next-token logits (``torch.FloatTensor`` of shape ``(1, V_drafter)``, padded
                rows of the LM head cut off; ``(1, R)`` after :meth:`restrict_head`) to the chosen column
                (``torch.LongTensor`` of shape ``(1, 1)``) and the distribution it was drawn from (``(1, C)``,
                or ``None`` for a deterministic choice), on the drafter's device; the column is the drafter
                token id, or indexes the kept rows after :meth:`restrict_head`. A selector that has computed
                the chosen token's probability anyway may return it as a third element (``(1, 1)``): the
                stop then uses it instead of a softmax of its own.
            stop: ends the draft early from the drafter's confidence (:class:`DraftStop`); ``None`` or a
                disabled stop drafts ``n_tokens``. Costs one host sync per token when enabled.

        Returns:
            the drafted ids and the distributions ``select`` reported (:class:`DrafterSteps`).
        """
        n_tokens = min(n_tokens, self.room())
        if n_tokens < 1:
            raise DrafterContextFull(f"the drafter holds at most {self.capacity} positions")
        stop = stop if stop is not None and stop.enabled else None
        feed = self._uncached_tail()
        chosen, probs, joint = [], [], 1.0
        for i in range(n_tokens):
            logits = self._forward(feed)
            picked = select(logits)
            column, q = picked[0], picked[1]
            if q is not None:
                probs.append(q)
            feed = column if self.head is None else self.head.rows[column]
            chosen.append(feed)
            if stop is not None and i + 1 < n_tokens:
                chosen_p = picked[2] if len(picked) > 2 else logits.float().softmax(dim=-1).gather(-1, column)
                confidence = float(chosen_p)
                joint *= confidence
                if stop.ends(confidence, joint):
                    break
        drafted = torch.cat(chosen, dim=1)[0].tolist()  # one host sync per draft
        self.ids.extend(drafted)
        return DrafterSteps(drafted, probs)

    @torch.no_grad()
    def prefill(self) -> int:
        """Feed every uncached token but the last into the KV cache (the next :meth:`draft` feeds the last one
        and drafts from its logits); returns how many were fed (0 when at most one is uncached). Grad mode is
        per thread: this may run on a second thread (:func:`hf_hetspec.decoding.speculative_generate`)."""
        tail = self.ids[self.cache.get_seq_length() :]
        if len(tail) < 2:
            return 0
        self._forward(torch.tensor([tail[:-1]], device=self.device))
        return len(tail) - 1

    def room(self) -> int:
        """How many tokens a draft can still have before the drafter's context is full (a large number for a
        drafter without a position limit); a draft of ``n`` tokens feeds ``n - 1`` of them."""
        if self.capacity is None:
            return 1 << 30
        return self.capacity - len(self.ids) + 1

    @torch.no_grad()
    def next_logits(self) -> torch.Tensor:
        """One drafter forward over the uncached tail: next-token logits (``(1, V_drafter)``, padded rows cut)."""
        return self._forward(self._uncached_tail())

    def _uncached_tail(self) -> torch.Tensor:
        """The tokens not yet in the KV cache, ``(1, m)`` on the drafter's device (``m >= 1``)."""
        return torch.tensor([self.ids[self.cache.get_seq_length() :]], device=self.device)

    def restrict_head(self, rows: torch.Tensor) -> bool:
        """From now on compute logits only for the drafter ids ``rows`` (ascending ``torch.LongTensor``), when
        :meth:`PrunedHead.build` finds that it pays and is exact. Returns whether it does; logits from
        :meth:`draft` and :meth:`next_logits` are then ``(1, len(rows))``, column ``j`` being drafter id
        ``rows[j]``."""
        self.head = PrunedHead.build(self.model, rows, self.n_tokens)
        return self.head is not None

    def _forward(self, feed: torch.Tensor) -> torch.Tensor:
        """Feed ``feed`` (``(1, m)``) through the drafter with its cache; next-token logits, padded rows cut
        (only the kept rows after :meth:`restrict_head`)."""
        if self.capacity is not None and self.cache.get_seq_length() + feed.shape[1] > self.capacity:
            raise DrafterContextFull(f"the drafter holds at most {self.capacity} positions")
        if isinstance(self.cache, SnapshotCache):
            # one token at a time over a non-empty recurrent cache: a longer forward would restart its scan from
            # a zero state, and each position gets a snapshot to roll back to
            if self.cache.get_seq_length() > 0:
                for i in range(feed.shape[1] - 1):
                    self._forward_once(feed[:, i : i + 1])
                    self.cache.advance(1)
                feed = feed[:, -1:]
            logits = self._forward_once(feed)
            self.cache.advance(feed.shape[1])
            return logits
        return self._forward_once(feed)

    def _forward_once(self, feed: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        if self.head is not None:
            return self.head(feed, self.cache)
        kwargs = {"logits_to_keep": 1} if self._logits_to_keep else {}
        out = self.model(input_ids=feed, use_cache=True, **kwargs, **cache_kwargs(self.model, self.cache))
        return out.logits[:, -1, : self.n_tokens]

    def append_id(self, drafter_id: int) -> None:
        """Extend the context by one drafter token (its logits are computed by the next forward)."""
        self.ids.append(drafter_id)

    def append_text(self, text: str) -> None:
        """Extend the context by ``text`` (re-tokenized with the window; the last tokens may be replaced and
        the cache is rolled back to the first changed position)."""
        n_keep, new_ids = self.converter.resync(self.ids, len(self.ids), text, floor=self.n_synced)
        del self.ids[n_keep:]
        self.ids.extend(new_ids)
        rollback_cache(self.cache, min(self.cache.get_seq_length(), n_keep, len(self.ids) - 1))

    def discard_draft_after(self, n: int) -> None:
        """Forget draft tokens after the first ``n`` (e.g. past a special token)."""
        del self.ids[self.n_synced + n :]
        rollback_cache(self.cache, min(self.cache.get_seq_length(), len(self.ids) - 1))
