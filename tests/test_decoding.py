"""hf_hetspec.decoding: the draft -> verify -> accept -> roll back loop, driven by scripted proposers, against
the target alone (greedy identity whatever the drafts, counts of drafted/accepted tokens and rejections)."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.stopping_criteria import MaxLengthCriteria

from hf_hetspec import decoding
from hf_hetspec.proposer import Draft
from hf_hetspec.stats import DecodingStats

NEW_TOKENS = 24


class ScriptedProposer:
    """Drafts from a fixed sequence: the reference continuation (``right`` tokens of it per draft) followed by
    ``wrong`` tokens that are not the reference's next ones."""

    def __init__(self, reference: list[int], right: int, wrong: int, vocab_size: int):
        self.reference, self.right, self.wrong, self.vocab_size = reference, right, wrong, vocab_size
        self.truncated_tokens = 0
        self.accepted_per_round = []

    def propose(self, input_ids: torch.LongTensor) -> Draft:
        n = input_ids.shape[1]
        good = self.reference[n : n + self.right]
        bad = [(t + 1) % self.vocab_size for t in self.reference[n + len(good) : n + len(good) + self.wrong]]
        return Draft(good + bad)

    def update_schedule(self, num_accepted: int) -> None:
        self.accepted_per_round.append(num_accepted)


def _run(target, ids, proposer, stats):
    config = GenerationConfig(do_sample=False, max_length=ids.shape[1] + NEW_TOKENS)
    criteria = StoppingCriteriaList([MaxLengthCriteria(max_length=config.max_length)])
    with torch.no_grad():
        return decoding.speculative_generate(target, ids, LogitsProcessorList(), criteria, config, proposer, stats)


@pytest.fixture(scope="module")
def reference(toy_pair):
    ids = toy_pair.target_tokenizer(toy_pair.prompts[0], return_tensors="pt").input_ids
    with torch.no_grad():
        out = toy_pair.target.generate(ids, do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=None)
    return ids, out[0].tolist()


@pytest.mark.parametrize("right,wrong", [(4, 0), (0, 3), (2, 2), (7, 1)])
def test_greedy_output_is_the_targets_whatever_the_drafts(toy_pair, reference, right, wrong):
    ids, expected = reference
    stats = DecodingStats()
    proposer = ScriptedProposer(expected, right, wrong, toy_pair.target.config.vocab_size)
    out = _run(toy_pair.target, ids, proposer, stats)
    assert out[0].tolist() == expected
    assert stats.new_tokens == NEW_TOKENS and stats.prompt_tokens == ids.shape[1]
    assert stats.accepted_tokens == sum(proposer.accepted_per_round)
    # every round's right tokens are accepted, and a wrong token is a rejection
    assert all(a <= right for a in proposer.accepted_per_round)
    if wrong and not right:
        assert stats.accepted_tokens == 0 and stats.rejections == stats.target_forwards
    if right and not wrong:
        assert stats.rejections == 0 and stats.target_forwards < NEW_TOKENS
    assert stats.drafted_tokens >= stats.accepted_tokens + stats.rejections


def test_a_loop_that_does_not_roll_back_its_cache_is_caught(toy_pair, reference, monkeypatch):
    """BROKEN loop: rejected draft tokens stay in the target's KV cache (one stale position per round). The
    identity test above fails on it: wrong tokens, or the next verification no longer lines up."""
    ids, expected = reference
    original = decoding.rollback_cache
    monkeypatch.setattr(decoding, "rollback_cache", lambda cache, length: original(cache, length + 1))
    proposer = ScriptedProposer(expected, 2, 2, toy_pair.target.config.vocab_size)
    try:
        out = _run(toy_pair.target, ids, proposer, DecodingStats())
    except RuntimeError:
        return
    assert out[0].tolist() != expected


# --------------------------------------------------------------------------------------------------------
# the drafter's prefill on a second thread (long prompts on the CPU)
# --------------------------------------------------------------------------------------------------------


_ORIGINAL_OVERLAPS_PREFILL = decoding.overlaps_prefill


def _with_overlap(monkeypatch):
    """Force the overlapped prefill (the toy prompts are short) and record the thread each drafter prefill ran
    on; returns that list."""
    import threading

    from hf_hetspec.drafter import DrafterContext

    threads = []
    prefill = DrafterContext.prefill

    def recorded(self):
        threads.append(threading.get_ident())
        return prefill(self)

    monkeypatch.setattr(DrafterContext, "prefill", recorded)
    monkeypatch.setattr(decoding, "overlaps_prefill", lambda target, proposer: True)
    return threads


def _toy_generate(toy_pair, ids, algorithm, **kwargs):
    """``(output, DecodingStats)`` of hf_hetspec's ``generate()`` on the toy pair (``NEW_TOKENS`` new tokens); the
    target is disabled again afterwards."""
    import hf_hetspec

    hf_hetspec.enable(toy_pair.target)
    try:
        out = toy_pair.target.generate(ids, assistant_model=toy_pair.drafter, tokenizer=toy_pair.target_tokenizer,
                                       assistant_tokenizer=toy_pair.drafter_tokenizer, hetspec_algorithm=algorithm,
                                       max_new_tokens=NEW_TOKENS, **kwargs)
        return out, hf_hetspec.last_stats(toy_pair.target)
    finally:
        hf_hetspec.disable(toy_pair.target)


@pytest.mark.parametrize("algorithm", ["slem", "tli", "slrs"])
def test_prefilling_the_drafter_on_a_second_thread_keeps_greedy_output(toy_pair, algorithm, monkeypatch):
    import threading

    threads = _with_overlap(monkeypatch)
    ids = toy_pair.target_tokenizer("the cat sat on the", return_tensors="pt").input_ids
    out, stats = _toy_generate(toy_pair, ids, algorithm, do_sample=False)
    plain = type(toy_pair.target).generate(toy_pair.target, ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert torch.equal(out, plain)
    assert threads and threads[0] != threading.get_ident()  # it ran, on another thread
    assert stats.accepted_tokens > 0 and stats.drafter_forwards >= len(stats.lookaheads) + 1


def test_prefilling_the_drafter_on_a_second_thread_keeps_the_sampled_distribution(toy_pair, monkeypatch):
    from hf_hetspec.testing import check_lossless, exact_target_distribution, hetspec_sampler, sample_outcomes

    threads = _with_overlap(monkeypatch)
    ids = toy_pair.target_tokenizer("the cat", return_tensors="pt").input_ids
    setting = dict(temperature=0.7, top_k=5)
    expected = exact_target_distribution(toy_pair.target, ids, 2, **setting)
    sampler = hetspec_sampler(toy_pair.target, toy_pair.drafter, toy_pair.target_tokenizer,
                              toy_pair.drafter_tokenizer, ids, "tli", 2, **setting)
    report = check_lossless(expected, sample_outcomes(sampler, 300, seed=0), 1e-3)
    assert report.num_bins >= 3 and report.passed, str(report)
    assert len(threads) >= 300


@pytest.mark.parametrize("algorithm", ["slem", "tli", "slrs"])
def test_the_prefill_beside_the_drafters_is_not_counted_as_a_target_forward(toy_pair, algorithm, monkeypatch):
    """The target's prefill run beside the drafter's verifies nothing: a greedy call counts the same target
    forwards, drafted and accepted tokens with the overlap as without it, so whether the machine had a core to
    spare does not change the tokens per forward a run reports (it once dropped them below 1.0)."""
    ids = toy_pair.target_tokenizer("the cat sat on the", return_tensors="pt").input_ids
    counts = {}
    for overlap in (False, True):
        monkeypatch.setattr(decoding, "overlaps_prefill", lambda target, proposer, overlap=overlap: overlap)
        _, stats = _toy_generate(toy_pair, ids, algorithm, do_sample=False)
        counts[overlap] = (stats.target_forwards, stats.drafted_tokens, stats.accepted_tokens, stats.new_tokens)
    assert counts[True] == counts[False]
    forwards, _, accepted, new = counts[True]
    assert accepted > 0 and new <= accepted + forwards  # a forward adds its accepted drafts and one token at most


@pytest.mark.parametrize("algorithm", ["slem", "tli"])
def test_the_first_draft_is_made_beside_the_targets_prefill_and_seeded_calls_repeat(toy_pair, algorithm,
                                                                                    monkeypatch):
    """With the overlapped prefill the second thread also makes the first draft (it depends on the prompt alone);
    a seeded sampled call draws the drafter's and the target's randomness in the same order as without the
    overlap, so it writes the same tokens, and greedy output stays the target's."""
    import threading

    from hf_hetspec.drafter import DrafterContext

    ids = toy_pair.target_tokenizer("the cat sat on the", return_tensors="pt").input_ids

    def run(**kwargs):
        return _toy_generate(toy_pair, ids, algorithm, **kwargs)[0]

    sampled = dict(do_sample=True, temperature=1.0, top_k=5)
    alone = run(**sampled, hetspec_generator=torch.Generator().manual_seed(3))
    steps = []  # the thread of each draft (SLEM's) or drafter step (TLI's)
    for name in ("draft", "next_logits"):
        method = getattr(DrafterContext, name)

        def recorded(self, *args, method=method, **kwargs):
            steps.append(threading.get_ident())
            return method(self, *args, **kwargs)

        monkeypatch.setattr(DrafterContext, name, recorded)
    monkeypatch.setattr(decoding, "overlaps_prefill", lambda target, proposer: True)
    beside = run(**sampled, hetspec_generator=torch.Generator().manual_seed(3))
    assert torch.equal(beside, alone)
    assert steps[0] != threading.get_ident() and threading.get_ident() in steps
    plain = type(toy_pair.target).generate(toy_pair.target, ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert torch.equal(run(do_sample=False), plain)


@pytest.mark.parametrize("algorithm", ["slem", "tli", "slrs"])
def test_no_drafter_prefill_beside_the_target_where_the_policy_never_drafts(toy_pair, algorithm, monkeypatch):
    """Where one verified token costs a whole forward (``verify_cost >= 1``: bf16 on a CPU without bf16
    instructions) the source policy never drafts, so the drafter's prefill beside the target's would only slow it
    and split its prompt into two forwards (on such a CPU that split moved a greedy output to a bf16 tie): the
    drafter does not run at all, and the output is the target's. With the default ``v`` the same machine state
    does overlap, so the check can fail."""
    import dataclasses
    import threading

    from hf_hetspec.schedule import choose_schedule

    threads = _with_overlap(monkeypatch)
    monkeypatch.setattr(decoding, "overlaps_prefill", _ORIGINAL_OVERLAPS_PREFILL)  # the real rule, on a free core:
    monkeypatch.setattr(decoding.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(decoding.os, "getloadavg", lambda: (1.0, 1.0, 1.0), raising=False)
    monkeypatch.setattr(decoding.torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(decoding, "OVERLAP_PREFILL_MIN", 1)
    ids = toy_pair.target_tokenizer("the cat sat on the", return_tensors="pt").input_ids
    plain = type(toy_pair.target).generate(toy_pair.target, ids, max_new_tokens=NEW_TOKENS, do_sample=False)

    out, stats = _toy_generate(toy_pair, ids, algorithm, do_sample=False, 
                               hetspec_schedule=dataclasses.replace(choose_schedule(algorithm), verify_cost=1.0))
    assert torch.equal(out, plain)
    assert threads == [] and stats.drafter_forwards == 0 and stats.drafted_tokens == 0

    _toy_generate(toy_pair, ids, algorithm, do_sample=False)  # the default v: the prefill runs beside
    assert threads and threads[0] != threading.get_ident()


def test_the_drafter_prefills_on_a_second_thread_only_for_long_prompts_on_a_free_cpu_core(toy_pair, monkeypatch):
    import hf_hetspec.decoding as module
    from hf_hetspec.drafter import DrafterContext

    class Proposer:
        def __init__(self, n):
            self.context = DrafterContext(toy_pair.drafter, _vocab(toy_pair), list(range(3, 3 + n)))
            self.drafter_device = self.context.device
            self.prefill_tokens = n

        def prefill_drafter(self):
            return self.context.prefill()

    monkeypatch.setattr(module.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(module.os, "getloadavg", lambda: (1.0, 1.0, 1.0), raising=False)  # this process alone
    monkeypatch.setattr(module.torch, "get_num_threads", lambda: 1)
    long, short = Proposer(module.OVERLAP_PREFILL_MIN), Proposer(module.OVERLAP_PREFILL_MIN - 1)
    assert module.overlaps_prefill(toy_pair.target, long) and not module.overlaps_prefill(toy_pair.target, short)
    assert not module.overlaps_prefill(toy_pair.target, ScriptedProposer([], 0, 0, 2))  # no drafter context
    monkeypatch.setattr(module.os, "getloadavg", lambda: (2.0, 2.0, 2.0), raising=False)  # another process
    assert not module.overlaps_prefill(toy_pair.target, long)
    monkeypatch.setattr(module.os, "getloadavg", lambda: (1.0, 1.0, 1.0), raising=False)
    monkeypatch.setattr(module.torch, "get_num_threads", lambda: 2)  # PyTorch's threads take every core
    assert not module.overlaps_prefill(toy_pair.target, long)


def _vocab(pair):
    from hf_hetspec.alignment import vocabulary

    return vocabulary(pair.drafter_tokenizer)
