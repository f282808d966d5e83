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
import inspect
from typing import Callable

import torch
from transformers import DynamicCache, PreTrainedModel

from .alignment import TextWindowConverter, Vocabulary, common_prefix_length


def rollback_cache(cache: DynamicCache, length: int) -> None:
    """Crop ``cache`` so that it holds the first ``length`` positions."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def model_device(model: PreTrainedModel) -> torch.device:
    """Device of the input embeddings (the first shard of a model split with ``device_map``)."""
    return model.get_input_embeddings().weight.device


class DrafterContext:
    """Drafter token ids + KV cache for one ``generate()`` call, synchronized on accepted text.

    ``ids[:n_synced]`` spell the accepted text up to byte ``synced_len`` (the prompt, then everything
    the target accepted at the last :meth:`sync`); ``ids[n_synced:]`` are the latest draft. The accepted
    text only grows, so a sync compares the draft with the newly accepted bytes alone, in the target's
    byte coordinates (a drafter tokenizer that normalizes text, e.g. NFC, cannot make it drift). The KV
    cache always holds fewer positions than ``ids`` has tokens, so a forward over the uncached tail yields
    the logits of the next token.

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
        # padded rows of the LM head are no tokens: never draft them
        self.n_tokens = len(vocab.tokenizer)
        self.cache = DynamicCache(config=model.config)
        if hasattr(self.cache, "activate_past_recording"):
            self.cache.activate_past_recording()
        self._logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.forwards = 0

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

    @torch.no_grad()
    def draft(self, n_tokens: int, select: Callable[[torch.Tensor], torch.Tensor]) -> list[int]:
        """Extend the sequence by ``n_tokens`` drafter tokens chosen by ``select``.

        Args:
            n_tokens: number of drafter forwards (the lookahead, in drafter tokens), >= 1.
            select: maps the next-token logits (``torch.FloatTensor`` of shape ``(1, V_drafter)``, padded
                rows of the LM head cut off) to the
                chosen token (``torch.LongTensor`` of shape ``(1, 1)``), on the drafter's device.

        Returns:
            the drafted token ids (list of ``n_tokens`` ints); they are also appended to ``ids``.
        """
        feed = self._uncached_tail()
        chosen = []
        for _ in range(n_tokens):
            feed = select(self._forward(feed))
            chosen.append(feed)
        drafted = torch.cat(chosen, dim=1)[0].tolist()  # one host sync per draft
        self.ids.extend(drafted)
        return drafted

    @torch.no_grad()
    def next_logits(self) -> torch.Tensor:
        """One drafter forward over the uncached tail: next-token logits (``(1, V_drafter)``, padded rows cut)."""
        return self._forward(self._uncached_tail())

    def _uncached_tail(self) -> torch.Tensor:
        """The tokens not yet in the KV cache, ``(1, m)`` on the drafter's device (``m >= 1``)."""
        return torch.tensor([self.ids[self.cache.get_seq_length() :]], device=self.device)

    def _forward(self, feed: torch.Tensor) -> torch.Tensor:
        """Feed ``feed`` (``(1, m)``) through the drafter with its cache; next-token logits, padded rows cut."""
        kwargs = {"logits_to_keep": 1} if self._logits_to_keep else {}
        out = self.model(input_ids=feed, past_key_values=self.cache, use_cache=True, **kwargs)
        self.forwards += 1
        return out.logits[:, -1, : self.n_tokens]

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
