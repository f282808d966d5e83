"""hf_hetspec.intersection: TLI's byte-exact intersection, SLRS's longest-prefix map and the push-forward,
each against a plain-Python reference on the toy vocabularies (both directions) and the real ones."""

from __future__ import annotations

import pytest
import torch

from hf_hetspec.intersection import intersection_for, prefix_map_for, push_forward, special_token_pairs

PAIRS = [("toy-bytelevel", "toy-sentencepiece"), ("toy-sentencepiece", "toy-bytelevel"),
         ("qwen2.5-coder", "gemma3"), ("gemma3", "smollm2")]


@pytest.fixture(params=PAIRS, ids=["-".join(p) for p in PAIRS])
def tables(request, byte_tables):
    target_name, drafter_name = request.param
    if target_name not in byte_tables or drafter_name not in byte_tables:
        pytest.skip("real tokenizers not available (fresh clone without ../shared)")
    return byte_tables[target_name], byte_tables[drafter_name]


def test_intersection_pairs_exactly_the_tokens_spelling_the_same_bytes(tables):
    target, drafter = tables
    inter = intersection_for(target, drafter, use_cache=False)
    target_bytes = {data for i, data in enumerate(target.token_bytes) if data and i not in target.special_ids}
    specials = dict(special_token_pairs(target, drafter))
    for d_id, t_id in enumerate(inter.drafter_to_target.tolist()):
        data = drafter.token_bytes[d_id]
        if d_id in specials:
            assert t_id == specials[d_id]
        elif d_id in drafter.special_ids or not data:
            assert t_id == -1  # a control token without a counterpart, or a padded row: never shared
        elif data in target_bytes:
            assert target.token_bytes[t_id] == data  # same bytes, and every such token is shared
        else:
            assert t_id == -1
    for t_id, d_id in enumerate(inter.target_to_drafter.tolist()):
        if d_id >= 0:
            assert inter.drafter_to_target[d_id] == t_id


def test_prefix_map_is_the_longest_target_prefix(tables):
    target, drafter = tables
    f = prefix_map_for(target, drafter, use_cache=False).tolist()
    target_bytes = {data for i, data in enumerate(target.token_bytes) if data and i not in target.special_ids}
    shared = intersection_for(target, drafter, use_cache=False).drafter_to_target.tolist()
    for d_id in range(0, len(drafter), max(1, len(drafter) // 2000)):  # a sample of the big vocabularies
        data = drafter.token_bytes[d_id]
        if not data or d_id in drafter.special_ids:
            continue
        longest = max((n for n in range(1, len(data) + 1) if data[:n] in target_bytes), default=0)
        if longest == 0:
            assert f[d_id] == -1
            continue
        assert target.token_bytes[f[d_id]] == data[:longest]
        if shared[d_id] >= 0:
            assert f[d_id] == shared[d_id]  # a shared token proposes itself, as in TLI


def test_push_forward_adds_the_mass_of_every_drafter_id_with_the_same_image():
    drafter_to_target = torch.tensor([2, -1, 0, 2, 1])
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.15, 0.25]])
    out = push_forward(probs, drafter_to_target, target_size=4)
    expected = torch.zeros(1, 4)
    for d, t in enumerate(drafter_to_target.tolist()):
        if t >= 0:
            expected[0, t] += probs[0, d]
    torch.testing.assert_close(out, expected)
    assert out[0, 3] == 0 and out.sum() == pytest.approx(0.8)  # unmapped mass is dropped, never moved


def test_the_disk_cache_returns_the_same_maps(tables, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HETSPEC_HOME", str(tmp_path))
    target, drafter = tables
    fresh = intersection_for(target, drafter, use_cache=False)
    cached = intersection_for(target, drafter)
    assert torch.equal(fresh.drafter_to_target, cached.drafter_to_target)
    assert torch.equal(prefix_map_for(target, drafter), prefix_map_for(target, drafter, use_cache=False))


def test_the_memory_keeps_only_the_last_pairs(tmp_path, monkeypatch):
    """Issue #25: the in-memory copy of the maps grew with every pair a process met."""
    from hf_hetspec import intersection

    monkeypatch.setenv("HF_HETSPEC_HOME", str(tmp_path))
    monkeypatch.setattr(intersection, "_MEMORY", type(intersection._MEMORY)())
    builds = []
    for i in range(intersection.MEMORY_PAIRS + 3):
        intersection._cached(f"pair-{i}", lambda i=i: builds.append(i) or {"map": torch.tensor([i])})
    assert len(intersection._MEMORY) == intersection.MEMORY_PAIRS
    last = f"pair-{intersection.MEMORY_PAIRS + 2}"
    assert list(intersection._MEMORY)[-1] == last
    assert intersection._cached(last, lambda: pytest.fail("rebuilt a remembered map"))["map"].item() == len(builds) - 1
