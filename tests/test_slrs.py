"""hf_hetspec.slrs: which drafter token greedy SLRS feeds its drafter after a proposal. (SLRS's exactness is
tested in test_lossless; the token fed never changes the output distribution, only the next drafts.)"""

from __future__ import annotations

import pytest
import torch

from hf_hetspec.alignment import vocabulary
from hf_hetspec.intersection import prefix_map_for
from hf_hetspec.plan import Schedule
from hf_hetspec.proposer import DraftPolicy
from hf_hetspec.slrs import SLRSProposer
from hf_hetspec.stats import DecodingStats


def _prompt_ids(pair) -> torch.LongTensor:
    return pair.target_tokenizer(pair.prompts[0], return_tensors="pt").input_ids


def _greedy_slrs(pair, lookahead: int = 1, **kwargs) -> SLRSProposer:
    target_vocab, drafter_vocab = vocabulary(pair.target_tokenizer), vocabulary(pair.drafter_tokenizer)
    return SLRSProposer(target_vocab, pair.drafter, drafter_vocab, _prompt_ids(pair),
                        prefix_map=prefix_map_for(target_vocab, drafter_vocab), target_size=len(target_vocab),
                        policy=DraftPolicy(), schedule=Schedule(lookahead, False), max_length=64,
                        stats=DecodingStats(), **kwargs)


def _duplicate_spelling(proposer: SLRSProposer) -> tuple[int, int, int]:
    """``(target id, byte-fallback drafter id, the drafter's ordinary id)`` of a target token the toy
    SentencePiece drafter spells twice (its ``<0xNN>`` token and an ordinary piece of the same byte)."""
    drafter_tokenizer = proposer.drafter_vocab.tokenizer
    for t, ids in proposer.exact_drafter_ids.items():
        pieces = drafter_tokenizer.convert_ids_to_tokens(ids)
        fallback = [d for d, piece in zip(ids, pieces) if piece.startswith("<0x")]
        ordinary = [d for d, piece in zip(ids, pieces) if not piece.startswith("<0x")]
        if fallback and ordinary and fallback[0] < ordinary[0]:
            return t, fallback[0], ordinary[0]
    pytest.fail("the toy drafter spells no target token twice")


@pytest.mark.parametrize("preferred", ["ordinary", "byte-fallback"])
def test_greedy_slrs_feeds_the_drafter_the_spelling_it_prefers(toy_pair, monkeypatch, preferred):
    """After proposing a target token the drafter spells twice, greedy SLRS feeds the drafter the spelling
    with the higher logit -- the token the drafter itself would write -- not the lowest id (the byte-fallback
    duplicate, which the drafter never reads in text; feeding Gemma-3 ``<0x2C>`` after a drafted ``,`` lowered
    greedy SLRS's alpha from TLI's 0.67 to 0.55 on HumanEval/20-25)."""
    proposer = _greedy_slrs(toy_pair)
    t, fallback, ordinary = _duplicate_spelling(proposer)
    fed, other = (ordinary, fallback) if preferred == "ordinary" else (fallback, ordinary)
    logits = torch.full((1, proposer.context.n_tokens), -10.0)
    logits[0, fed] = 10.0  # the drafter is sure of this spelling: psi's argmax is t
    logits[0, other] = 9.0
    monkeypatch.setattr(proposer.context, "next_logits", lambda: logits)

    draft = proposer.propose(_prompt_ids(toy_pair))

    assert draft.target_ids == [t]
    assert proposer.context.ids[-1] == fed


def test_the_exact_spellings_are_kept_for_the_last_pairs_only(monkeypatch):
    """Issue #25: ``_exact_drafter_ids`` kept every vocabulary pair a process met."""
    from types import SimpleNamespace

    from hf_hetspec import intersection, slrs

    monkeypatch.setattr(slrs, "_EXACT_CACHE", type(slrs._EXACT_CACHE)())
    target = SimpleNamespace(digest="t", token_bytes=[b"a", b"b"])
    for i in range(intersection.MEMORY_PAIRS + 3):
        drafter = SimpleNamespace(digest=f"d{i}", token_bytes=[b"a", b"ab", b"b"])
        assert slrs._exact_drafter_ids(target, drafter, [0, 0, 1]) == {0: [0], 1: [2]}
    assert len(slrs._EXACT_CACHE) == intersection.MEMORY_PAIRS


@pytest.mark.parametrize("cut_off,expected", [
    (0.3, [["T"]]),                  # psi(T) = 0.25 + 0.15 = 0.4 at position 0; 0.6 x 0.4 = 0.24 at position 1
    (0.2, [["T"], ["Ġthe", "T"]]),
])
def test_greedy_slrs_drafts_the_runner_ups_of_psi_as_sibling_branches(toy_pair, monkeypatch, cut_off, expected):
    """Beside its argmax-psi draft ``Ġthe Ġthe``, greedy SLRS drafts psi's runner-up as a sibling branch where
    its estimate (the draft's tokens before it times the runner-up's psi) reaches the cut-off: ``T`` gets the
    probability of both drafter spellings of it (``T`` 0.25 and ``<0x54>`` 0.15), which neither alone reaches."""
    import math

    d, t = toy_pair.drafter_tokenizer, toy_pair.target_tokenizer
    proposer = _greedy_slrs(toy_pair, 2, sibling_min_joint=cut_off, runner_ups=2)
    logits = torch.full((1, proposer.context.n_tokens), -40.0)
    for piece, p in (("▁the", 0.6), ("T", 0.25), ("<0x54>", 0.15)):
        logits[0, d.convert_tokens_to_ids(piece)] = math.log(p)
    monkeypatch.setattr(proposer.context, "next_logits", lambda: logits)
    draft = proposer.propose(_prompt_ids(toy_pair))
    assert draft.target_ids == [t.convert_tokens_to_ids("Ġthe")] * 2 and draft.q is None
    assert draft.branches == [t.convert_tokens_to_ids(branch) for branch in expected]
