"""hf_hetspec.tools.runner: timing helpers of the methods the command line compares."""

from __future__ import annotations

import torch

from hf_hetspec.testing import toy
from hf_hetspec.tools.runner import FirstTokenTimer, Runner


def test_first_token_timer_skips_the_prompt():
    timer = FirstTokenTimer()
    timer.put(torch.tensor([[1, 2, 3]]))
    assert timer.first_token_at is None
    timer.put(torch.tensor([4]))
    first = timer.first_token_at
    timer.put(torch.tensor([5]))
    assert first is not None and timer.first_token_at == first


def test_sampled_transformers_rows_prune_a_copy_of_the_drafter_made_once():
    """Without a separately loaded drafter for transformers' rows, transformers' sampled path (which replaces its
    drafter's LM head in place) gets a deep copy, made at its first call, and hf_hetspec's rows keep the drafter."""
    target_tokenizer, drafter_tokenizer = toy.byte_level_bpe_tokenizer(), toy.sentencepiece_bpe_tokenizer()
    target = toy.tiny_causal_lm(target_tokenizer, seed=0, arch="qwen2")
    drafter = toy.tiny_causal_lm(drafter_tokenizer, seed=1)
    head = drafter.get_output_embeddings()
    runner = Runner(target, target_tokenizer, drafter, drafter_tokenizer, max_new_tokens=4, do_sample=True)
    ids = target_tokenizer("the", return_tensors="pt").input_ids
    assert runner.transformers_assisted(ids).new_tokens == 4
    builtin = runner.builtin_drafter
    assert builtin is not drafter and type(builtin.get_output_embeddings()).__name__ == "_PruneReindexingLMHead"
    assert runner.hetspec(ids).new_tokens == 4
    assert runner.transformers_assisted(ids).new_tokens == 4 and runner.builtin_drafter is builtin
    assert drafter.get_output_embeddings() is head and head.weight.shape[0] == len(drafter_tokenizer)


def test_machine_info_records_the_cpu_instructions_that_set_its_speed_class(monkeypatch):
    """Two CPUs that both read "AMD EPYC" measured 4x apart in bf16 (AVX2 against AVX-512 BF16): the record says
    which vector instructions PyTorch uses and whether bf16 has its own, by the same check that sets ``v``."""
    from hf_hetspec.tools import runner

    info = runner.machine_info("cpu")
    assert info["cpu_instructions"] == torch.backends.cpu.get_cpu_capability()
    for native in (True, False):
        monkeypatch.setattr(runner, "cpu_has_half_instructions", lambda dtype, native=native: native)
        assert runner.machine_info("cpu")["bf16_instructions"] is native
