"""The real pair: Qwen2.5-Coder-1.5B-Instruct target, SmolLM2-135M-Instruct and Gemma-3-270M drafters.

Slow (minutes on 2 CPU cores): run with ``pytest -m slow`` after ``hf-hetspec models --fetch``. Float32, so
greedy output must be token-for-token the target's own.
"""

import pytest

import hf_hetspec
from hf_hetspec.tools import zoo

pytestmark = pytest.mark.slow

TARGET = "qwen2.5-coder-1.5b-instruct"


def _require(name):
    if not zoo.is_ready(name):
        pytest.skip(f"{name} is not fetched (run: hf-hetspec models --fetch {name})")
    return zoo.load(name, dtype="float32")


@pytest.fixture(scope="module")
def target():
    return _require(TARGET)


def _chat_ids(tokenizer, text):
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    return ids


@pytest.mark.parametrize("drafter_name,algorithm", [("smollm2-135m-instruct", "slem"),
                                                     ("gemma-3-270m", "tli"),
                                                     ("smollm2-135m-instruct", "slrs")])
def test_real_pair_greedy_is_identical_to_the_target_alone(target, drafter_name, algorithm):
    model, tok = target
    drafter, dtok = _require(drafter_name)
    ids = _chat_ids(tok, "Complete the following Python function:\n```python\ndef is_palindrome(s: str) -> bool:\n"
                         '    """Return True if s reads the same backwards."""\n```')
    hf_hetspec.disable(model)
    ref = model.generate(ids, max_new_tokens=40, do_sample=False)
    hf_hetspec.enable(model)
    try:
        out = model.generate(ids, assistant_model=drafter, tokenizer=tok, assistant_tokenizer=dtok,
                             hetspec_algorithm=algorithm, max_new_tokens=40, do_sample=False)
    finally:
        hf_hetspec.disable(model)
    assert out.tolist() == ref.tolist()
    stats = hf_hetspec.last_stats(model)
    assert stats.accepted_tokens > 0
    assert stats.mean_accepted_per_forward > 1.0


def test_qwen_stops_on_endoftext_too(target):
    model, tok = target
    eos = model.generation_config.eos_token_id
    assert tok.convert_tokens_to_ids("<|im_end|>") in eos and tok.convert_tokens_to_ids("<|endoftext|>") in eos
