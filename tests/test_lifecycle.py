"""An enabled model across its life: pickled, saved, copied, wrapped by another library, shared by threads;
tokenizers freed when dropped; drafters without usable weights refused before any work (issue #15, part 3).

Every output is compared with the target alone (greedy, so token for token)."""

from __future__ import annotations

import copy
import gc
import io
import pickle
import threading
import weakref

import pytest
import torch

import hf_hetspec
from hf_hetspec import integration
from hf_hetspec.alignment import vocabulary
from hf_hetspec.testing import toy


@pytest.fixture(scope="module")
def models():
    """A tiny random byte-level target (logits padded to a multiple of 64) and a sentencepiece drafter."""
    target_tokenizer, drafter_tokenizer = toy.byte_level_bpe_tokenizer(), toy.sentencepiece_bpe_tokenizer()
    target = toy.tiny_causal_lm(target_tokenizer, seed=0, arch="qwen2", pad_vocab_to=64)
    drafter = toy.tiny_causal_lm(drafter_tokenizer, seed=1)
    return target, drafter, target_tokenizer, drafter_tokenizer


def prompt(models):
    return models[2]("The lighthouse keeper", return_tensors="pt").input_ids


def plain(models, max_new_tokens=8):
    target = models[0]
    return type(target).generate(target, prompt(models), max_new_tokens=max_new_tokens, do_sample=False)


def hetspec(model, models, max_new_tokens=8, **kwargs):
    _, drafter, target_tokenizer, drafter_tokenizer = models
    return model.generate(prompt(models), max_new_tokens=max_new_tokens, do_sample=False, assistant_model=drafter,
                          tokenizer=target_tokenizer, assistant_tokenizer=drafter_tokenizer, **kwargs)


@pytest.fixture
def enabled(models):
    hf_hetspec.enable(models[0])
    yield models[0]
    hf_hetspec.disable(models[0])


def assert_enabled_copy(clone, original, models):
    assert clone is not original and hf_hetspec.is_enabled(clone)
    assert clone.generate.__self__ is clone  # bound to the copy, not to the original
    assert torch.equal(hetspec(clone, models), plain(models))
    assert hf_hetspec.last_stats(clone) is not None
    hf_hetspec.disable(clone)
    assert "generate" not in clone.__dict__ and hf_hetspec.is_enabled(original)


@pytest.mark.parametrize("how", ["pickle", "torch.save", "copy.copy", "copy.deepcopy"])
def test_an_enabled_model_copies_and_loads_back_enabled(models, enabled, how):
    if how == "pickle":
        clone = pickle.loads(pickle.dumps(enabled))
    elif how == "torch.save":
        buffer = io.BytesIO()
        torch.save(enabled, buffer)
        buffer.seek(0)
        clone = torch.load(buffer, weights_only=False)
    else:
        clone = getattr(copy, how.split(".")[1])(enabled)
    assert_enabled_copy(clone, enabled, models)
    assert enabled.generate.__self__ is enabled


def test_a_disabled_model_pickles_as_before(models):
    target = models[0]
    hf_hetspec.disable(hf_hetspec.enable(target))
    assert set(vars(pickle.loads(pickle.dumps(target)))) == set(vars(target))


def test_a_generate_put_on_the_instance_before_enable_is_called_through(models):
    target = models[0]
    calls = []

    def other_library_generate(*args, **kwargs):
        calls.append(sorted(kwargs))
        return type(target).generate(target, *args, **kwargs)

    target.generate = other_library_generate
    try:
        hf_hetspec.enable(target)
        assert torch.equal(hetspec(target, models), plain(models))
        assert len(calls) == 1 and "custom_generate" in calls[0]  # hf_hetspec's loop went through it
        assert torch.equal(target.generate(prompt(models), max_new_tokens=8, do_sample=False), plain(models))
        assert len(calls) == 2  # and so does a call without a drafter
        clone = copy.copy(target)
        assert clone.__dict__[integration._SAVED] is other_library_generate
        hf_hetspec.disable(target)
        assert target.generate is other_library_generate
    finally:
        hf_hetspec.disable(target)
        del target.generate


def test_tokenizers_and_their_byte_tables_are_freed_when_dropped(models, enabled):
    """Issue #15: a module-level cache kept every tokenizer (and its byte table) alive."""
    target_tokenizer, drafter_tokenizer = toy.byte_level_bpe_tokenizer(), toy.sentencepiece_bpe_tokenizer()
    out = hetspec(enabled, (models[0], models[1], target_tokenizer, drafter_tokenizer))
    assert torch.equal(out, plain(models))
    tables = [vocabulary(t) for t in (target_tokenizer, drafter_tokenizer)]
    rows = enabled.get_output_embeddings().weight.shape[0]
    padded = tables[0].padded(rows)
    assert padded is not tables[0] and padded is tables[0].padded(rows)  # the call's cached padded table
    tables = [weakref.ref(table) for table in [*tables, padded]]
    tokenizers = [weakref.ref(target_tokenizer), weakref.ref(drafter_tokenizer)]
    del target_tokenizer, drafter_tokenizer, padded
    gc.collect()
    assert [ref() for ref in tokenizers + tables] == [None] * 5


def test_statistics_are_per_thread(models, enabled):
    """Two threads on one enabled target: each reads its own call's statistics, even when the other thread's
    call finished later."""
    first_done, both_done = threading.Barrier(2), threading.Barrier(2)
    seen, errors = {}, []

    def run(name, max_new_tokens):
        try:
            if name == "second":
                first_done.wait()
            out = hetspec(enabled, models, max_new_tokens=max_new_tokens)
            if name == "first":
                first_done.wait()
            both_done.wait()
            stats = hf_hetspec.last_stats(enabled)
            seen[name] = (stats.new_tokens, out.shape[1] - prompt(models).shape[1])
        except Exception as err:  # surfaced below: an assertion in a thread would be lost
            errors.append(err)

    before = hf_hetspec.last_stats(enabled)
    threads = [threading.Thread(target=run, args=("first", 3)), threading.Thread(target=run, args=("second", 9))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert seen == {"first": (3, 3), "second": (9, 9)}
    assert hf_hetspec.last_stats(enabled) is before  # the main thread's own last call


def count_forwards(model) -> list:
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    return calls, handle


def test_a_drafter_on_the_meta_device_is_refused_before_any_work(models, enabled):
    drafter = copy.deepcopy(models[1]).to("meta")
    calls, handle = count_forwards(enabled)
    try:
        with pytest.raises(ValueError, match="assistant_model: parameter '.*' is on the meta device"):
            hetspec(enabled, (models[0], drafter, models[2], models[3]))
    finally:
        handle.remove()
    assert calls == []


def test_a_drafter_with_non_finite_weights_is_refused_before_any_work(models, enabled):
    drafter = copy.deepcopy(models[1])
    weight = drafter.lm_head.weight
    with torch.no_grad():
        weight[3, 5] = float("nan")
    broken = (models[0], drafter, models[2], models[3])
    calls, handle = count_forwards(enabled)
    try:
        with pytest.raises(ValueError, match="parameter 'lm_head.weight' holds NaN or infinite values"):
            hetspec(enabled, broken)
        assert calls == []
        with torch.no_grad():
            weight[3, 5] = 0.0
        assert torch.equal(hetspec(enabled, broken), plain(models))  # fixed in place: accepted
        with torch.no_grad():
            weight[0, 0] = float("inf")  # broken again after a successful check: noticed
        with pytest.raises(ValueError, match="lm_head.weight"):
            hetspec(enabled, broken)
    finally:
        handle.remove()


def test_weight_check_counts_only_true_non_finite_values():
    """The fast path sums each weight; a sum that overflows is checked value by value, not refused."""
    from hf_hetspec.checks import check_drafter_weights

    layer = torch.nn.Linear(100, 10).half()
    with torch.no_grad():
        layer.weight.fill_(60000.0)  # finite, but the float16 sum overflows
    assert not torch.isfinite(layer.weight.sum())
    check_drafter_weights(layer)
    with torch.no_grad():
        layer.weight[0, :2] = torch.tensor([float("inf"), float("-inf")])  # sums to NaN, not inf
    with pytest.raises(ValueError, match="'weight' holds NaN or infinite values"):
        check_drafter_weights(layer)
