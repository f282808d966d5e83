"""Targets past one device (docs/api.md, "Running a target too large for one device"), kept working on CPU.

* **Split by ``device_map`` with disk offload** (accelerate): the toy target saved to disk and loaded again with its
  second decoder layer and its LM head on ``"disk"`` -- accelerate's hooks load their weights for every forward.
* **Tensor parallel** (transformers' ``tp_plan="auto"``): the same target sharded over two processes that talk
  over gloo (``torch.multiprocessing``, a file rendezvous in ``tmp_path``, a 60 s collective timeout so that
  ranks that disagree fail instead of waiting for each other).

In both, greedy output is token for token the target's own greedy output for SLEM, TLI and SLRS, in
hf_hetspec's loop and in transformers' assisted-generation loop (``hetspec_loop``), on a prompt whose drafts
are all accepted and on one whose drafts are rejected (the target's cache is rolled back). A seeded sampled
call gives the same tokens on both ranks of the tensor-parallel target: every rank drafts, verifies and
accepts the same tokens, as it must, since each target forward is a collective of both ranks (ranks that
disagreed would run forwards of different shapes; gloo aborts).

hf_hetspec has no code for either path: it feeds the target on the device of its input embeddings and leaves
the rest to accelerate's hooks and transformers' DTensor layers; these tests keep that true.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_hetspec
from hf_hetspec.checks import LOOPS

ALGORITHMS = ("slem", "tli", "slrs")
#: The first prompt continues a corpus document (every draft accepted); the toy pair's drafts after the second,
#: off the corpus, are rejected in every algorithm (5, 2 and 2 rejections).
PROMPTS = ("The lighthouse keeper climbed", "the cat sat")
NEW_TOKENS = 16
SAMPLING_SEED = 3
TP_WORLD_SIZE = 2


@pytest.fixture(scope="module")
def saved_pair(toy_pair, tmp_path_factory) -> Path:
    """The toy pair on disk: ``target/`` (Qwen2, 4 heads, 2 key-value heads: shards over 2 ranks) and
    ``drafter/``, each with its tokenizer."""
    folder = tmp_path_factory.mktemp("pair")
    toy_pair.target.save_pretrained(folder / "target")
    toy_pair.target_tokenizer.save_pretrained(folder / "target")
    toy_pair.drafter.save_pretrained(folder / "drafter")
    toy_pair.drafter_tokenizer.save_pretrained(folder / "drafter")
    return folder


def _hetspec(target, drafter, tokenizers, ids, algorithm, **kwargs) -> tuple[torch.Tensor, object]:
    """``target.generate`` with hf_hetspec enabled for this one call: its output and its ``last_stats``."""
    hf_hetspec.enable(target)
    try:
        out = target.generate(ids, assistant_model=drafter, tokenizer=tokenizers[0],
                              assistant_tokenizer=tokenizers[1], hetspec_algorithm=algorithm,
                              max_new_tokens=NEW_TOKENS, **kwargs)
        return out, hf_hetspec.last_stats(target)
    finally:
        hf_hetspec.disable(target)


def _greedy_runs(target, drafter, tokenizers) -> dict:
    """Per prompt: the target's greedy output alone (``"alone"``) and each algorithm's in each decoding loop
    (``"slem/hetspec"``, ..., ``"slrs/transformers"``), with its rejection count (lists, for JSON)."""
    runs = {}
    for prompt in PROMPTS:
        ids = tokenizers[0](prompt, return_tensors="pt").input_ids
        run = {"alone": target.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False).tolist()}
        for algorithm in ALGORITHMS:
            for loop in LOOPS:
                out, stats = _hetspec(target, drafter, tokenizers, ids, algorithm, do_sample=False,
                                      hetspec_loop=loop)
                run[f"{algorithm}/{loop}"] = {"tokens": out.tolist(), "rejections": stats.rejections}
        runs[prompt] = run
    return runs


def _sampled_runs(target, drafter, tokenizers) -> dict:
    """Per algorithm: the tokens of one sampled call on the second prompt with a fresh generator seeded
    :data:`SAMPLING_SEED`."""
    ids = tokenizers[0](PROMPTS[1], return_tensors="pt").input_ids
    runs = {}
    for algorithm in ALGORITHMS:
        generator = torch.Generator().manual_seed(SAMPLING_SEED)
        out, _ = _hetspec(target, drafter, tokenizers, ids, algorithm, do_sample=True, hetspec_generator=generator)
        runs[algorithm] = out.tolist()
    return runs


def _assert_greedy_identical(runs: dict, expected: dict[str, list], where: str) -> None:
    """Every algorithm's greedy output in every loop equals the plain target's ``expected[prompt]``; drafts
    were rejected in each."""
    keys = [f"{algorithm}/{loop}" for algorithm in ALGORITHMS for loop in LOOPS]
    for prompt, run in runs.items():
        assert run["alone"] == expected[prompt], f"{where}: the split target alone differs from the whole one"
        for key in keys:
            got = run[key]["tokens"]
            assert got == expected[prompt], f"{where}, {key}, {prompt!r}: {got} != {expected[prompt]}"
    for key in keys:
        assert sum(run[key]["rejections"] for run in runs.values()) > 0, (
            f"{where}, {key}: no draft was rejected, so the cache rollback went untested")


@pytest.fixture(scope="module")
def expected(toy_pair) -> dict[str, list]:
    """The whole target's greedy output per prompt (its own ``generate``, in memory, float32)."""
    out = {}
    for prompt in PROMPTS:
        ids = toy_pair.target_tokenizer(prompt, return_tensors="pt").input_ids
        out[prompt] = toy_pair.target.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False).tolist()
    return out


# --------------------------------------------------------------------------------------------------------
# device_map with layers and the LM head offloaded to disk
# --------------------------------------------------------------------------------------------------------

DISK_OFFLOAD_MAP = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.norm": "cpu",
    "lm_head": "disk",
}


def test_disk_offloaded_target_greedy_identical_and_sampling_unchanged(toy_pair, saved_pair, expected, tmp_path):
    pytest.importorskip("accelerate")
    target = AutoModelForCausalLM.from_pretrained(saved_pair / "target", dtype=torch.float32,
                                                  device_map=DISK_OFFLOAD_MAP, offload_folder=tmp_path).eval()
    assert target.hf_device_map == DISK_OFFLOAD_MAP
    # on "meta" between forwards: accelerate's hooks load them from disk (transformers reads a safetensors
    # checkpoint's offloaded weights in place, so `offload_folder` may stay empty)
    assert target.lm_head.weight.device.type == "meta"
    assert target.model.layers[1].mlp.down_proj.weight.device.type == "meta"
    tokenizers = (toy_pair.target_tokenizer, toy_pair.drafter_tokenizer)
    _assert_greedy_identical(_greedy_runs(target, toy_pair.drafter, tokenizers), expected, "disk offload")
    # the same weights and the same CPU arithmetic as the whole target: a seeded sampled call is unchanged
    assert _sampled_runs(target, toy_pair.drafter, tokenizers) == \
        _sampled_runs(toy_pair.target, toy_pair.drafter, tokenizers)


# --------------------------------------------------------------------------------------------------------
# tensor parallel over two gloo processes
# --------------------------------------------------------------------------------------------------------


def _tensor_parallel_kwargs() -> dict:
    """``from_pretrained`` keywords for transformers' automatic TP plan: ``distributed_config`` where this
    transformers has it (5.2x), else the older ``tp_plan`` argument."""
    try:
        from transformers import DistributedConfig

        return {"distributed_config": DistributedConfig(tp_plan="auto")}
    except (ImportError, TypeError):
        return {"tp_plan": "auto"}


def _tensor_parallel_rank(rank: int, folder: str, results: str) -> None:
    """One rank (spawned by ``torch.multiprocessing``): loads the target sharded, the drafter whole, runs the
    greedy and sampled calls and writes them to ``results/<rank>.json``."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(TP_WORLD_SIZE))
    torch.set_num_threads(1)  # two ranks on a 2-core runner
    torch.distributed.init_process_group("gloo", init_method=f"file://{results}/rendezvous", rank=rank,
                                         world_size=TP_WORLD_SIZE, timeout=timedelta(seconds=60))
    try:
        target = AutoModelForCausalLM.from_pretrained(f"{folder}/target", dtype=torch.float32,
                                                      **_tensor_parallel_kwargs()).eval()
        drafter = AutoModelForCausalLM.from_pretrained(f"{folder}/drafter", dtype=torch.float32).eval()
        tokenizers = (AutoTokenizer.from_pretrained(f"{folder}/target"),
                      AutoTokenizer.from_pretrained(f"{folder}/drafter"))
        weight = target.model.layers[0].self_attn.q_proj.weight
        result = {
            "sharded": type(weight).__name__ == "DTensor" and weight.to_local().shape[0] < weight.shape[0],
            "greedy": _greedy_runs(target, drafter, tokenizers),
            "sampled": _sampled_runs(target, drafter, tokenizers),
        }
        Path(results, f"{rank}.json").write_text(json.dumps(result))
    finally:
        torch.distributed.destroy_process_group()


def test_tensor_parallel_target_greedy_identical_and_sampling_same_on_every_rank(saved_pair, expected, tmp_path):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    torch.multiprocessing.spawn(_tensor_parallel_rank, args=(str(saved_pair), str(tmp_path)),
                                nprocs=TP_WORLD_SIZE, join=True)
    results = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(TP_WORLD_SIZE)]
    for rank, result in enumerate(results):
        assert result["sharded"], f"rank {rank}: the target's q_proj is not a DTensor shard"
        _assert_greedy_identical(result["greedy"], expected, f"tensor parallel, rank {rank}")
    assert results[0]["sampled"] == results[1]["sampled"], "the ranks sampled different tokens"
