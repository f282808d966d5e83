"""SLEM drafts as well for every tokenizer family as for byte-level ones (issue #16), and stays exact.

Each family's toy tokenizer (:mod:`hf_hetspec.testing.families`) gets a tiny Llama that memorized the toy
corpus (:func:`hf_hetspec.testing.toy.train_memorizer`); a family is paired with the byte-level ``qwen``
family, as the target and as the drafter. On every pair greedy output equals the target alone token for
token, SLEM's acceptance rate is at least TLI's, and it is within 10 % of a byte-level pair's (``gpt2``
target, ``qwen`` drafter) -- except for the lowercasing ``sp-normalized`` family, whose normalizer changes the
text itself (see the slow test). Before the text-start probe a Llama-2-style target (dummy prefix ``▁``) accepted
about 1 % of SLEM's drafted tokens here. The default run checks that family; the whole matrix is slow
(about 13 s of training per family on two shared cores).
"""

from __future__ import annotations

import pytest

import hf_hetspec
from hf_hetspec.testing import toy
from hf_hetspec.testing.families import FAMILIES, family_tokenizer

PROMPTS = toy.TOY_PROMPTS[:6]
REFERENCE = ("gpt2", "qwen")  # a byte-level target and a byte-level drafter
PARTNER = "qwen"  # the byte-level family each family is paired with


@pytest.fixture(scope="module")
def family_model():
    """Factory ``family -> (tokenizer, model)``, trained once per module."""
    cache = {}

    def get(family: str):
        if family not in cache:
            tokenizer = family_tokenizer(family)
            model, _ = toy.train_memorizer(tokenizer, seed=FAMILIES.index(family), arch="llama")
            cache[family] = (tokenizer, model)
        return cache[family]

    return get


def _acceptance(family_model, target_family: str, drafter_family: str, algorithm: str,
                max_new_tokens: int = 32) -> float:
    """Greedy generation on :data:`PROMPTS`, checked token for token against the target alone; returns
    accepted / drafted tokens over all prompts."""
    (target_tok, target), (drafter_tok, drafter) = family_model(target_family), family_model(drafter_family)
    accepted = drafted = 0
    for prompt in PROMPTS:
        ids = target_tok(prompt, return_tensors="pt").input_ids
        reference = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        hf_hetspec.enable(target)
        try:
            out = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                                  assistant_model=drafter, tokenizer=target_tok,
                                  assistant_tokenizer=drafter_tok, hetspec_algorithm=algorithm)
            stats = hf_hetspec.last_stats(target)
        finally:
            hf_hetspec.disable(target)
        assert out.tolist() == reference.tolist(), (target_family, drafter_family, algorithm, prompt)
        accepted += stats.accepted_tokens
        drafted += stats.drafted_tokens
    return accepted / max(1, drafted)


@pytest.fixture(scope="module")
def reference_acceptance(family_model) -> float:
    return _acceptance(family_model, *REFERENCE, "slem")


def _check_pair(family_model, reference_acceptance, target_family, drafter_family, near_reference=True):
    slem = _acceptance(family_model, target_family, drafter_family, "slem")
    tli = _acceptance(family_model, target_family, drafter_family, "tli")
    assert slem >= tli, (slem, tli)
    if near_reference:
        assert slem >= 0.9 * reference_acceptance, (slem, reference_acceptance)


def test_dummy_prefix_target_drafts_as_well_as_a_byte_level_one(family_model, reference_acceptance):
    assert reference_acceptance > 0.8  # the reference pair really drafts well
    _check_pair(family_model, reference_acceptance, "llama2", PARTNER)


@pytest.mark.slow
@pytest.mark.parametrize("role", ["target", "drafter"])
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != PARTNER])
def test_every_family_drafts_as_well_as_a_byte_level_pair(family_model, reference_acceptance, family, role):
    pair = (family, PARTNER) if role == "target" else (PARTNER, family)
    # A lowercasing tokenizer changes the text itself: as the drafter it cannot spell the target's capitals
    # (SLEM 83 % against 98 %), as the target it hands the byte-level drafter lowercase context it never saw
    # in training (88 % or 96 % by seed). Its conversion is exact (tests/test_boundary.py); the pair is held
    # to exactness and SLEM >= TLI only.
    _check_pair(family_model, reference_acceptance, *pair, near_reference=family != "sp-normalized")


def test_without_the_probe_a_dummy_prefix_target_rejects_slem_drafts(monkeypatch, family_model,
                                                                      reference_acceptance):
    """The check above has power: with the former conversion (windows encoded as text starts) the same pair
    stays exact but accepts almost none of SLEM's drafts (issue #16 measured 2.7 % on real pairs)."""
    monkeypatch.setattr("hf_hetspec.alignment.encode_after", lambda *args, **kwargs: None)
    assert _acceptance(family_model, "llama2", PARTNER, "slem") < 0.5 * reference_acceptance
