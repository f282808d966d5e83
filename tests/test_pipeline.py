"""transformers' ``pipeline("text-generation")`` on an enabled target: the same text as the target alone.

The assistant arguments reach ``generate()`` either as call keywords (then ``tokenizer=`` must be passed too: the
pipeline forwards its own tokenizer only for an assistant given to ``pipeline(...)``) or at construction.
"""

import pytest
from transformers import pipeline

import hf_hetspec
from conftest import ForwardCounter

GREEDY = dict(max_new_tokens=24, do_sample=False)


@pytest.fixture
def enabled(toy_pair):
    hf_hetspec.enable(toy_pair.target)
    yield toy_pair
    hf_hetspec.disable(toy_pair.target)


def _target_alone(pair, inputs):
    hf_hetspec.disable(pair.target)
    try:
        return pipeline("text-generation", model=pair.target, tokenizer=pair.target_tokenizer)(inputs, **GREEDY)
    finally:
        hf_hetspec.enable(pair.target)


@pytest.mark.parametrize("algorithm", ["slem", "tli"])
def test_assistant_as_call_keywords_gives_the_target_alones_text(enabled, algorithm):
    pair = enabled
    pipe = pipeline("text-generation", model=pair.target, tokenizer=pair.target_tokenizer)
    for text in pair.prompts[:2]:
        out = pipe(text, assistant_model=pair.drafter, tokenizer=pair.target_tokenizer,
                   assistant_tokenizer=pair.drafter_tokenizer, hetspec_algorithm=algorithm, **GREEDY)
        assert out == _target_alone(pair, text)
        stats = hf_hetspec.last_stats(pair.target)
        assert stats.algorithm == algorithm and stats.drafted_tokens > 0


def test_pipeline_text_equals_generate_text(enabled):
    pair = enabled
    text = pair.prompts[0]
    ids = pair.target_tokenizer(text, return_tensors="pt").input_ids
    out = pair.target.generate(ids, assistant_model=pair.drafter, tokenizer=pair.target_tokenizer,
                               assistant_tokenizer=pair.drafter_tokenizer, **GREEDY)
    pipe = pipeline("text-generation", model=pair.target, tokenizer=pair.target_tokenizer,
                    assistant_model=pair.drafter, assistant_tokenizer=pair.drafter_tokenizer)
    generated = pipe(text, return_full_text=False, **GREEDY)[0]["generated_text"]
    assert generated == pair.target_tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_chat_messages_with_the_assistant_given_to_the_pipeline(enabled):
    pair = enabled
    messages = [{"role": "user", "content": pair.prompts[1]}]
    pipe = pipeline("text-generation", model=pair.target, tokenizer=pair.target_tokenizer,
                    assistant_model=pair.drafter, assistant_tokenizer=pair.drafter_tokenizer)
    out = pipe(messages, hetspec_algorithm="slem", **GREEDY)
    assert out == _target_alone(pair, messages)
    assert out[0]["generated_text"][-1]["role"] == "assistant"
    assert hf_hetspec.last_stats(pair.target).accepted_tokens > 0


def test_unworkable_pipeline_calls_are_refused_before_any_model_runs(enabled):
    pair = enabled
    pipe = pipeline("text-generation", model=pair.target, tokenizer=pair.target_tokenizer)
    counter = ForwardCounter(pair.target, pair.drafter)
    try:
        with pytest.raises(ValueError, match="`tokenizer` is missing"):
            pipe(pair.prompts[0], assistant_model=pair.drafter, assistant_tokenizer=pair.drafter_tokenizer, **GREEDY)
        # batches run in hf_hetspec's own loop (tests/test_batched.py), not in transformers'
        with pytest.raises(ValueError, match="hetspec_loop='transformers' with a batch of 2 rows"):
            pipe(pair.prompts[0], assistant_model=pair.drafter, tokenizer=pair.target_tokenizer,
                 assistant_tokenizer=pair.drafter_tokenizer, num_return_sequences=2, do_sample=True,
                 max_new_tokens=8, hetspec_loop="transformers")
        assert counter.count == 0
    finally:
        counter.close()
