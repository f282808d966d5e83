"""hf_hetspec's own drafter step (hf_hetspec.static_drafter): the logits of the model it was built from, through
prefills, one-token steps, rollbacks and cache growth; every other layout refused with a reason; the probe that
admits a layout rejects a step that computes something else.

The reference is always the model's own forward over the whole sequence without a cache.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from hf_hetspec import runtime, static_drafter
from hf_hetspec.drafter import max_positions
from hf_hetspec.testing.architectures import REFUSED_DRAFTERS, TINY_ARCHITECTURES, tiny_model

VOCAB = 96
#: The layouts the step runs; the tiny Mistral and Gemma-3 have 4-token sliding windows (Gemma-3 on 5 of 6
#: layer kinds, with their own rotary base), passed many times by the 38-token scripts below.
RUN = ("llama", "qwen2", "qwen3", "mistral", "gemma3")
OTHERS = tuple(n for n in TINY_ARCHITECTURES if n not in RUN and n not in REFUSED_DRAFTERS)


def _mistral_without_window():
    config = transformers.MistralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, sliding_window=None,
                                        vocab_size=VOCAB)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.MistralForCausalLM(config).eval().requires_grad_(False)


def _gemma3_mixed():
    """Gemma-3 with one sliding-window and one full-attention layer: two rotary bases in one step."""
    config = transformers.Gemma3TextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                           sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                                           vocab_size=VOCAB)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.Gemma3ForCausalLM(config).eval().requires_grad_(False)


def _models():
    yield from ((name, lambda name=name: tiny_model(name, VOCAB)) for name in RUN)
    yield "mistral-no-window", _mistral_without_window
    yield "gemma3-mixed", _gemma3_mixed


def _reference(model, ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]


@pytest.mark.parametrize("one_token", ["eager", "fixed", "stepped"])
@pytest.mark.parametrize("name,make", list(_models()), ids=[n for n, _ in _models()])
def test_logits_equal_the_models_own_through_steps_rollbacks_and_growth(name, make, one_token, monkeypatch):
    """``one_token="fixed"``: one-token steps run the compiled runtime's fixed-shape step (uncompiled here, the
    same Python ``torch.compile`` traces), which attends over the whole allocation under a mask: positions
    rolled back keep stale keys that the mask must hide. ``"stepped"``: every feed of the script runs as
    one-token fixed steps, one after the other (what a GPU does with feeds up to ``STEPPED_FEED_MAX``)."""
    monkeypatch.setattr(static_drafter, "INITIAL_POSITIONS", 8)  # the cache grows twice below
    monkeypatch.setattr(static_drafter, "COMPILED_POSITIONS", 8)
    model = make()
    step, why = static_drafter.build(model, max_positions(model))
    assert step is not None, why
    decoder, fixed_steps = step.get_decoder(), []
    if one_token != "eager":
        decoder.compile_step(None, compile=False)
        decoder.compiled_step = lambda *args: fixed_steps.append(1) or decoder.fixed_step(*args)
    if one_token == "stepped":
        monkeypatch.setattr(static_drafter, "STEPPED_FEED_MAX", {"cpu": 16})
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (40,), generator=generator).tolist()
    cache = step.new_cache()
    held: list[int] = []
    # (feed, then roll back this many): a prompt, single steps, a rollback and a re-fed tail, growth past 8 and 16
    script = [(5, 0), (1, 0), (1, 2), (3, 0), (1, 0), (9, 4), (6, 0), (1, 1), (1, 0), (12, 0)]
    for n_feed, n_back in script:
        feed = ids[len(held) : len(held) + n_feed]
        logits = step(torch.tensor([feed]), cache).logits[0, -1]
        held += feed
        torch.testing.assert_close(logits, _reference(model, held), rtol=1e-4, atol=1e-4)
        assert cache.get_seq_length() == len(held)
        if n_back:
            cache.crop(-n_back)
            del held[-n_back:]
    fed = [n for n, _ in script]
    assert len(fixed_steps) == {"eager": 0, "fixed": fed.count(1), "stepped": sum(fed)}[one_token]


@pytest.mark.parametrize("name", OTHERS)
def test_every_other_layout_is_refused_with_a_reason(name):
    model = tiny_model(name, VOCAB)
    step, why = static_drafter.build(model, max_positions(model))
    assert step is None and why, name


def test_the_probe_refuses_a_step_that_computes_something_else(monkeypatch):
    """The layout check alone would admit a variant (say, interleaved rotary positions) with the same modules:
    the logits probe is what refuses it. Here the step's rotation is made wrong on purpose."""
    model = tiny_model("llama", VOCAB)
    assert static_drafter.build(model, None)[0] is not None
    monkeypatch.setattr(static_drafter, "_rotate_half", lambda x: x.flip(-1))
    step, why = static_drafter.build(model, None)
    assert step is None and "logits differ" in why


def test_cache_crop_follows_dynamic_cache_and_growth_keeps_the_held_positions():
    cache = static_drafter.StaticKVCache(2, 1, 4, torch.float32, torch.device("cpu"), capacity=20)
    cache.reserve(3)
    cache.keys[0][:, :, :3] = torch.arange(12.0).view(1, 1, 3, 4)
    cache.length = 3
    cache.crop(-1)
    assert cache.get_seq_length() == 2
    cache.crop(5)  # longer than held: nothing changes, as DynamicCache
    assert cache.get_seq_length() == 2
    cache.reserve(19)
    assert cache.keys[0].shape[2] == 20  # capped at the capacity
    torch.testing.assert_close(cache.keys[0][0, 0, :2], torch.arange(8.0).view(2, 4))


def test_auto_uses_the_static_step_where_it_runs_and_int8_elsewhere(monkeypatch):
    monkeypatch.setattr(runtime, "AUTO_INT8_MIN_PARAMETERS", 1)
    llama = tiny_model("llama", VOCAB)
    prepared = runtime.prepare_drafter(llama, "auto")
    assert prepared.runtime == "int8-static" and isinstance(prepared.model, static_drafter.StaticCacheDrafter)
    gemma = tiny_model("gemma2", VOCAB)  # logit softcapping: not run by the step
    fallback = runtime.prepare_drafter(gemma, "auto")
    assert fallback.runtime == "int8" and not fallback.note
    with pytest.raises(ValueError, match=r"hetspec_drafter='int8-static': hf_hetspec's decoding step does not "
                                         r"run this drafter \(.*\); use hetspec_drafter='int8' or 'auto'"):
        runtime.prepare_drafter(gemma, "int8-static")
    assert runtime.prepare_drafter(gemma, "int8").model is fallback.model  # one int8 copy, not two


def test_long_feeds_run_float_projections_and_one_token_steps_the_int8_ones():
    """After keep_float_prefill and quantizing the step's own projections (what the int8-static runtime does),
    a prompt-sized feed gives the float model's hidden states (no activation quantization over the prompt; the
    LM head stays int8), while a one-token step runs the int8 projections (close to, not equal to, the float
    logits)."""
    model = tiny_model("llama", VOCAB)
    step, _ = static_drafter.build(runtime._eval_copy(model), None)
    step.keep_float_prefill()
    assert runtime._quantize_int8(step, step.step_linear_names()) == ""
    ids = torch.arange(3, 3 + static_drafter.FLOAT_FEED_MIN + 2)[None] % VOCAB
    cache = step.new_cache()
    hidden = step.get_decoder()(ids[:, :-1], cache).last_hidden_state
    want = model.get_decoder()(input_ids=ids[:, :-1], use_cache=False).last_hidden_state
    torch.testing.assert_close(hidden, want, rtol=1e-4, atol=1e-4)
    one = step(ids[:, -1:], cache).logits[0, -1]
    reference = _reference(model, ids[0].tolist())
    assert not torch.equal(one, reference)
    torch.testing.assert_close(one, reference, rtol=0.1, atol=0.1 * float(reference.abs().max()))


def test_a_forward_without_a_cache_leaves_the_compiled_steps_cache_alone():
    """The compiled step keeps one cache per drafter (fixed addresses). A forward without a cache -- the pruned
    head's one-time check runs one after the decoding's cache exists -- gets a temporary cache of its own."""
    model = tiny_model("llama", VOCAB)
    step, _ = static_drafter.build(model, None)
    step.get_decoder().compile_step(None, compile=False)
    cache = step.new_cache()
    step(torch.tensor([[5, 6, 7]]), cache)
    keys = cache.keys[0].clone()
    step(torch.tensor([[9, 9]]))
    step.get_decoder()(torch.tensor([[8]]))
    assert cache.get_seq_length() == 3 and torch.equal(cache.keys[0], keys)
    logits = step(torch.tensor([[8]]), cache).logits[0, -1]
    torch.testing.assert_close(logits, _reference(model, [5, 6, 7, 8]), rtol=1e-4, atol=1e-4)
