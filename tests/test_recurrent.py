"""Recurrent drafters (``hf_hetspec.recurrent``): the drafter's state after drafting, partial acceptance and
re-synchronization equals a fresh forward over the same tokens, and a stale snapshot is caught."""

from __future__ import annotations

import pytest
import torch

import hf_hetspec
from hf_hetspec import recurrent
from hf_hetspec.alignment import Vocabulary
from hf_hetspec.drafter import DrafterContext
from hf_hetspec.recurrent import SnapshotCache
from hf_hetspec.support import layer_support
from hf_hetspec.testing import toy
from hf_hetspec.testing.architectures import tiny_model
from transformers.cache_utils import LinearAttentionAndFullAttentionLayer, LinearAttentionLayer

RECURRENT = ("mamba", "mamba2", "jamba")
PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def tokenizer():
    return toy.byte_level_bpe_tokenizer()


def _drafter(name, tokenizer):
    return tiny_model(name, len(tokenizer) + 8, toy._special_ids(tokenizer), seed=1)


def _max_state_error(drafter, tokenizer, rounds: int = 4) -> float:
    """Largest gap between the drafter's next-token logits from its cache and from a fresh forward over its ids,
    over rounds of: draft 4 tokens, accept the first two of them plus a correction the drafter did not draft."""
    context = DrafterContext(drafter, Vocabulary.from_tokenizer(tokenizer), tokenizer(PROMPT)["input_ids"])
    seen = []

    def greedy(logits):
        seen.append(logits)
        return logits.argmax(-1, keepdim=True), None

    accepted, worst = b"", 0.0
    for _ in range(rounds):
        before = list(context.ids)
        seen.clear()
        drafted = context.draft(4, greedy).ids
        fresh = drafter(torch.tensor([before]), use_cache=False).logits[0, -1, : context.n_tokens]
        worst = max(worst, float((seen[0][0] - fresh).abs().max()))
        kept = b"".join(context.vocab.token_bytes[t] for t in drafted[:2])
        accepted += kept + b"Z"  # a correction: the target disagreed at the third drafted token
        context.sync(accepted)
    return worst


@pytest.mark.parametrize("name", RECURRENT)
def test_drafter_state_equals_a_fresh_forward(name, tokenizer):
    assert _max_state_error(_drafter(name, tokenizer), tokenizer) < 1e-4


@pytest.mark.parametrize("name", RECURRENT)
def test_stale_snapshot_is_caught(name, tokenizer, monkeypatch):
    """A rollback that keeps one stale position (restores the state after the first dropped token, under the
    shorter length) fails the check above."""
    exact_crop = SnapshotCache.crop

    def stale_crop(self, tokens_to_remove):
        length = self.length + tokens_to_remove
        if tokens_to_remove < 0 and length + 1 in self._snapshots:
            self._snapshots[length] = self._snapshots[length + 1]
        exact_crop(self, tokens_to_remove)

    monkeypatch.setattr(SnapshotCache, "crop", stale_crop)
    assert _max_state_error(_drafter(name, tokenizer), tokenizer) > 1e-2


def test_missing_snapshot_restarts_the_cache(tokenizer):
    drafter = _drafter("mamba", tokenizer)
    cache = SnapshotCache(drafter.config)
    drafter(input_ids=torch.tensor([[5, 6, 7, 8, 9]]), cache=cache, use_cache=True)
    cache.advance(5)  # a prefill: one snapshot, at length 5
    for token in (10, 11, 12):
        drafter(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True)
        cache.advance(1)
    cache.crop(-2)
    assert cache.get_seq_length() == 6
    cache.crop(-3)  # length 3 lies inside the prefill: no snapshot there
    assert cache.get_seq_length() == 0
    with pytest.raises(ValueError, match="negative"):
        cache.crop(1)


def test_snapshots_are_bounded(tokenizer, monkeypatch):
    monkeypatch.setattr(recurrent, "MAX_SNAPSHOTS", 3)
    drafter = _drafter("mamba", tokenizer)
    cache = SnapshotCache(drafter.config)
    for token in range(5, 11):
        drafter(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True)
        cache.advance(1)
    assert sorted(cache._snapshots) == [4, 5, 6]


def test_only_state_layers_are_drafter_only():
    assert layer_support(LinearAttentionLayer(), "drafter").supported
    assert not layer_support(LinearAttentionLayer(), "target").supported
    # keys and a recurrent state in one layer (Zamba, Falcon-H1): neither role
    assert not layer_support(LinearAttentionAndFullAttentionLayer(), "drafter").supported


@pytest.mark.parametrize("name", RECURRENT)
def test_recurrent_drafter_output_is_the_targets(name, tokenizer):
    drafter_tokenizer = toy.byte_level_bpe_tokenizer()
    drafter_tokenizer.add_tokens(["<drafter-only>"])
    target = tiny_model("llama", len(drafter_tokenizer) + 8, toy._special_ids(tokenizer))
    drafter = tiny_model(name, len(drafter_tokenizer) + 8, toy._special_ids(tokenizer), seed=1)
    prompt = torch.tensor([tokenizer(PROMPT)["input_ids"]])
    expected = target.generate(prompt, max_new_tokens=12, do_sample=False)
    hf_hetspec.enable(target)
    for algorithm in ("slem", "tli", "slrs"):
        out = target.generate(prompt, max_new_tokens=12, do_sample=False, assistant_model=drafter,
                              tokenizer=tokenizer, assistant_tokenizer=drafter_tokenizer, hetspec_algorithm=algorithm)
        assert torch.equal(out, expected), (name, algorithm)
        assert hf_hetspec.last_stats(target).drafted_tokens > 0
