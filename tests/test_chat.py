"""hf_hetspec.chat: each model's own chat template (test_hardening's class 9 runs the decoding matrix)."""

from __future__ import annotations

import hf_hetspec
from conftest import specials
from hf_hetspec.alignment import convert_prompt, vocabulary


def test_chat_inputs_falls_back_to_the_target_text(real_pair):
    """Gemma-3's tokenizer in ``../shared`` has no chat template (a base model): the drafter gets the target's
    rendered prompt, converted exactly as ``generate()`` converts it without ``assistant_input_ids``."""
    pair = real_pair("qwen2.5-coder", "gemma3")
    assert not pair.drafter_tokenizer.chat_template
    inputs = hf_hetspec.chat_inputs([{"role": "user", "content": "hi <eos>"}], pair.target_tokenizer,
                                    pair.drafter_tokenizer)
    converted = convert_prompt(vocabulary(pair.target_tokenizer), vocabulary(pair.drafter_tokenizer),
                               inputs["input_ids"][0].tolist())
    assert inputs["assistant_input_ids"][0].tolist() == converted
    drafter_vocab = vocabulary(pair.drafter_tokenizer)
    # only Gemma's own <bos> is special; ChatML markers and the typed "<eos>" are text for Gemma
    assert specials(drafter_vocab, converted) == [pair.drafter_tokenizer.bos_token_id]
    assert drafter_vocab.ids_to_bytes(converted[1:]) == vocabulary(pair.target_tokenizer).ids_to_bytes(
        inputs["input_ids"][0].tolist())
