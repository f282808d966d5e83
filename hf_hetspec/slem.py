"""SLEM: string-level exact match (Timor et al. 2025, Algorithm 2).

The drafter drafts ``lookahead`` tokens greedily from its own context; their text is re-tokenized for the
target through a window of the target's accepted tokens (:class:`~hf_hetspec.alignment.TextWindowConverter`);
the target verifies all of them in one forward pass by exact match
(:func:`~hf_hetspec.verify.verify_greedy`, or :func:`~hf_hetspec.verify.verify_exact_match_sampling` when
sampling). Exact matching makes SLEM lossless whatever the drafter proposes: the draft only decides how
many target tokens one forward can confirm.
"""

from __future__ import annotations

import torch
from transformers.generation import CandidateGenerator

from .alignment import TextWindowConverter, Vocabulary, complete_utf8_prefix, sanitize_utf8, valid_utf8_prefix
from .drafter import DrafterContext
from .stats import DecodingStats


def _greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1, keepdim=True)


def drafter_prompt_ids(target_vocab: Vocabulary, drafter_vocab: Vocabulary, target_prompt: list[int]) -> list[int]:
    """The prompt in drafter token ids: the target prompt's text, encoded by the drafter tokenizer.

    Special tokens of the prompt (chat-template markers) are kept as text and become drafter special
    tokens where the drafter has a token of the same content. The drafter's own BOS is added once if its
    tokenizer adds one (and not again if the text already starts with it).
    """
    text = target_vocab.ids_to_bytes(target_prompt).decode("utf-8", errors="replace")
    tok = drafter_vocab.tokenizer
    ids = tok.encode(text, add_special_tokens=True)
    bos = tok.bos_token_id
    if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
        ids = ids[1:]
    return ids


def special_token_map(source: Vocabulary, dest: Vocabulary) -> dict[int, int]:
    """Special tokens of ``source`` whose content is a special token of ``dest`` (e.g. ``<|im_end|>``)."""
    by_content = {dest.token_bytes[i]: i for i in sorted(dest.special_ids)}
    return {i: by_content[source.token_bytes[i]] for i in source.special_ids if source.token_bytes[i] in by_content}


class SLEMCandidateGenerator(CandidateGenerator):
    """Drafts target-token candidates for SLEM (Timor et al. 2025, Algorithm 2).

    Args:
        target_vocab: byte table of the target tokenizer.
        drafter: the drafter model.
        drafter_vocab: byte table of the drafter tokenizer.
        input_ids (``torch.LongTensor`` of shape ``(1, n)``): the prompt in target ids.
        lookahead: drafter tokens per draft (initial value when ``adaptive``), >= 1.
        adaptive: grow the lookahead by 2 after a fully accepted draft, shrink it by 1 otherwise
            (transformers' "heuristic" schedule), within ``[1, max_lookahead]``.
        max_length: the target's ``generation_config.max_length``; drafts never cross it.
        stats: statistics of the call, updated in place.
        window: tokens of context re-encoded with new text on either side.
    """

    def __init__(
        self,
        target_vocab: Vocabulary,
        drafter,
        drafter_vocab: Vocabulary,
        input_ids: torch.LongTensor,
        *,
        lookahead: int,
        adaptive: bool,
        max_length: int,
        stats: DecodingStats,
        max_lookahead: int = 16,
        window: int = 4,
    ):
        self.target_vocab = target_vocab
        self.drafter_vocab = drafter_vocab
        self.lookahead = lookahead
        self.adaptive = adaptive
        self.max_lookahead = max(max_lookahead, lookahead)
        self.max_length = max_length
        self.stats = stats
        self.target_ids: list[int] = input_ids[0].tolist()
        self.target_gen_bytes = b""
        self.converter = TextWindowConverter(target_vocab, window)
        self.special_to_target = special_token_map(drafter_vocab, target_vocab)
        with stats.timer("translation_s"):
            prompt = drafter_prompt_ids(target_vocab, drafter_vocab, self.target_ids)
        self.drafter = DrafterContext(drafter, drafter_vocab, prompt, window)
        self._last_draft_len = 0

    def _observe(self, input_ids: torch.LongTensor) -> None:
        new = input_ids[0, len(self.target_ids) :].tolist()
        self.target_ids.extend(new)
        self.target_gen_bytes += self.target_vocab.ids_to_bytes(new)

    def get_candidates(self, input_ids: torch.LongTensor, **kwargs) -> tuple[torch.LongTensor, None]:
        """Return ``(candidate_input_ids, None)``.

        Args:
            input_ids (``torch.LongTensor`` of shape ``(1, n)``): accepted target ids.

        Returns:
            ``candidate_input_ids`` (``torch.LongTensor`` of shape ``(1, n + k)``): ``input_ids`` followed by
            ``k >= 0`` draft tokens in the target vocabulary; no distribution (exact matching needs none).
        """
        self._last_draft_len = 0
        self._observe(input_ids)
        budget = self.max_length - len(self.target_ids) - 1
        text = self.target_gen_bytes
        complete = complete_utf8_prefix(text)
        if budget < 1 or complete < len(text):
            # The target stopped inside a character: let it finish the character on its own.
            self.stats.skipped_drafts += 1
            return input_ids, None
        with self.stats.timer("translation_s"):
            self.drafter.sync(sanitize_utf8(text))
        with self.stats.timer("drafter_s"):
            drafted = self.drafter.draft(self.lookahead, _greedy)
        self.stats.drafter_forwards += self.lookahead
        with self.stats.timer("translation_s"):
            candidates = self._to_target(drafted)[:budget]
        if not candidates:
            return input_ids, None
        self._last_draft_len = len(candidates)
        self.stats.lookaheads.append(self.lookahead)
        extra = torch.tensor([candidates], dtype=input_ids.dtype, device=input_ids.device)
        return torch.cat([input_ids, extra], dim=1), None

    def _to_target(self, drafted: list[int]) -> list[int]:
        """Target ids spelling the drafted text (cut at the first special drafter token)."""
        tail: list[int] = []
        for j, tok in enumerate(drafted):
            if tok in self.drafter_vocab.special_ids:
                if tok in self.special_to_target:
                    tail = [self.special_to_target[tok]]
                self.drafter.discard_draft_after(j)
                drafted = drafted[:j]
                break
        data = self.drafter_vocab.ids_to_bytes(drafted)
        valid = valid_utf8_prefix(data)
        if valid < len(data):  # the draft ends inside a character, or holds bytes that are not text
            data, tail = data[:valid], []
        if not data:
            return tail if not drafted else []
        return self.converter.continuation(self.target_ids, data.decode("utf-8")) + tail

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int):
        """Adapt the lookahead: +2 after a fully accepted draft, -1 otherwise (when ``adaptive``)."""
        if not self.adaptive or self._last_draft_len == 0:
            return
        if num_matches >= self._last_draft_len:
            self.lookahead = min(self.lookahead + 2, self.max_lookahead)
        else:
            self.lookahead = max(1, self.lookahead - 1)
