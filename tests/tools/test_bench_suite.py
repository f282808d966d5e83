"""``hf-hetspec bench --suite``: the tuning/report halves, plain code completion, the load-average rule and the
suite summary (geometric mean over the Spec-Bench categories, slowest prompt)."""

from __future__ import annotations

import contextlib
import io
import json
import math
from dataclasses import dataclass, field

import pytest
import torch

from conftest import save_toy_models
from hf_hetspec.testing import toy
from hf_hetspec.tools import bench, cli, reports, tasks

FAKE_PROBLEMS = [(f"HumanEval/{i}", f"def f{i}(x):\n    \"\"\"Return x plus {i}.\"\"\"\n") for i in range(5)]


# --------------------------------------------------------------------------------------------------------
# Halves
# --------------------------------------------------------------------------------------------------------


def test_split_half_is_disjoint_complete_and_deterministic():
    items = list(range(7))
    tune, report = tasks.split_half(items, "tune"), tasks.split_half(items, "report")
    assert (tune, report) == ([0, 2, 4, 6], [1, 3, 5])
    assert sorted(tune + report) == items == tasks.split_half(items, "all")
    with pytest.raises(ValueError, match="half='train'"):
        tasks.split_half(items, "train")


def test_every_spec_bench_category_splits_into_two_disjoint_halves_of_the_shared_file():
    """The shared dev file (every category): the halves are disjoint, cover the category, come out the same on a
    second read, and MT-bench's eight categories each appear in both halves (not whole categories in one)."""
    if not tasks.DEFAULT_SPEC_BENCH.is_file():
        pytest.skip(f"{tasks.DEFAULT_SPEC_BENCH} is not here")
    rows = tasks.read_spec_bench(tasks.DEFAULT_SPEC_BENCH)
    category = {f"spec-bench/{r['question_id']}": r["category"] for r in rows}
    for task in tasks.SPEC_BENCH_CATEGORIES:
        ids = {half: [p.prompt_id for p in tasks.spec_bench_prompts(rows, task, 10**6, half)]
               for half in tasks.HALVES}
        assert ids["tune"] and ids["report"], task
        assert not set(ids["tune"]) & set(ids["report"]), task
        assert sorted(ids["tune"] + ids["report"]) == sorted(ids["all"]), task
        assert len(ids["tune"]) - len(ids["report"]) in (0, 1), task
        again = [p.prompt_id for p in tasks.spec_bench_prompts(tasks.read_spec_bench(tasks.DEFAULT_SPEC_BENCH),
                                                                task, 10**6, "report")]
        assert again == ids["report"], task
        if task == "mt_bench":
            for half in ("tune", "report"):
                assert {category[i] for i in ids[half]} == set(tasks.MT_BENCH_CATEGORIES), half
    # --prompts N takes the first N of the half
    first = tasks.spec_bench_prompts(rows, "qa", 3, "report")
    assert [p.prompt_id for p in first] == [p.prompt_id for p in tasks.spec_bench_prompts(rows, "qa", 10**6,
                                                                                           "report")[:3]]


def test_code_and_code_completion_take_the_same_humaneval_problems_per_half(monkeypatch):
    monkeypatch.setattr(tasks, "humaneval_problems", lambda: FAKE_PROBLEMS)
    for half, expected in (("tune", [0, 2, 4]), ("report", [1, 3]), ("all", [0, 1, 2, 3, 4])):
        for task in tasks.HUMANEVAL_TASKS:
            prompts = tasks.humaneval_prompts(10, task, half)
            assert [p.prompt_id for p in prompts] == [f"HumanEval/{i}" for i in expected]
    completion = tasks.humaneval_prompts(1, "code_completion", "report")[0]
    chat = tasks.humaneval_prompts(1, "code", "report")[0]
    assert completion.turns == (FAKE_PROBLEMS[1][1],) and completion.chat is False
    assert chat.turns == (tasks.code_message(FAKE_PROBLEMS[1][1]),) and chat.chat is True


# --------------------------------------------------------------------------------------------------------
# Records with a fake runner: encoding and load averages
# --------------------------------------------------------------------------------------------------------


@dataclass
class FakeRun:
    method: str
    prompt_tokens: int
    seconds: float = 1.0

    def record(self, tokenizer, label):
        return {"method": self.method, "label": label, "text": "ok", "prompt_tokens": self.prompt_tokens,
                "new_tokens": 10, "seconds": self.seconds, "tokens_per_second": 10 / self.seconds,
                "target_forwards": 10, "drafted_tokens": 0, "accepted_tokens": 0, "acceptance_rate": None,
                "rejections": 0, "tokens_per_forward": 1.0, "verdict": None, "verdict_detail": None,
                "ttft_seconds": 0.1, "tpot_seconds": None, "drafter_forwards": 0, "peak_memory_mb": None,
                "stats": None}


@dataclass
class FakeRunner:
    """Records the ids each method is called with; no model runs."""

    calls: list = field(default_factory=list)
    algorithm: str = "auto"
    lookahead: int | None = None

    def run(self, method, ids, max_new_tokens=None):
        self.calls.append((method, ids))
        return FakeRun(method, ids.shape[1])

    def compare(self, reference, run):
        pass


def test_code_completion_is_encoded_without_the_chat_template_that_other_tasks_use():
    tokenizer = toy.byte_level_bpe_tokenizer()
    assert tokenizer.chat_template
    text = FAKE_PROBLEMS[0][1]
    prompts = [tasks.humaneval_prompt("code", "HumanEval/0", text),
               tasks.humaneval_prompt("code_completion", "HumanEval/0", text)]
    runner = FakeRunner()
    specs = bench.method_specs(["auto"], transformers=True, homogeneous=False)
    bench.collect_records(prompts, {(0.0, 0): runner}, specs, [], tokenizer, True, load=lambda: 0.0, threads=1)
    by_task = [runner.calls[:3], runner.calls[3:]]
    plain = tokenizer(text, return_tensors="pt").input_ids
    templated = tokenizer.apply_chat_template([{"role": "user", "content": tasks.code_message(text)}],
                                              tokenize=False, add_generation_prompt=True)
    templated = tokenizer(templated, add_special_tokens=False, return_tensors="pt").input_ids
    assert [m for m, _ in by_task[1]] == ["target", "transformers", "hf_hetspec"]
    for _, ids in by_task[1]:  # every method of the completion prompt: the problem's text as is
        assert torch.equal(ids, plain)
    for _, ids in by_task[0]:
        assert torch.equal(ids, templated)


def test_a_baseline_failing_inside_transformers_leaves_the_run_with_its_earlier_calls_and_is_reported():
    """transformers' UAG raising on the second prompt (transformers 5.25 does, inside its drafter's generate()):
    the run goes on without it, its first-prompt record is dropped too (no half-measured column), and the report
    says why; the other methods keep every call."""
    from hf_hetspec.tools.runner import BaselineFailed

    class FailingBaseline(FakeRunner):
        def run(self, method, ids, max_new_tokens=None):
            if method == "transformers" and sum(m == "transformers" for m, _ in self.calls) == 1:
                self.calls.append((method, ids))
                raise BaselineFailed("transformers UAG failed inside transformers 9.9: RuntimeError: no token")
            return super().run(method, ids, max_new_tokens)

    tokenizer = toy.byte_level_bpe_tokenizer()
    prompts = [tasks.BenchPrompt("qa", f"spec-bench/{i}", (f"Where is {i}?",)) for i in range(3)]
    runner, left_out = FailingBaseline(), []
    specs = bench.method_specs(["auto"], transformers=True, homogeneous=False)
    records = bench.collect_records(prompts, {(0.0, 0): runner}, specs, [], tokenizer, True, load=lambda: 0.0,
                                    threads=1, left_out=left_out)
    assert [m for m, _ in runner.calls] == ["target", "transformers", "hf_hetspec"] + [
        "target", "transformers", "hf_hetspec"] + ["target", "hf_hetspec"]
    assert [(r["prompt_id"], r["method"]) for r in records] == [
        (f"spec-bench/{i}", m) for i in range(3) for m in ("target", "hf_hetspec")]
    assert left_out == ["transformers UAG failed inside transformers 9.9: RuntimeError: no token"]
    assert len(specs) == 3  # the caller's list is not changed
    rows = bench.summarize_results(records, {"target": 1.0, "drafter": 0.1})
    assert {r["method"] for r in rows} == {"target", "hf_hetspec"}
    assert all(r["vs_transformers"] is None for r in rows)
    result = {"config": _config(), "machine": _machine(), "results": rows,
              "suite_summary": bench.suite_summary(rows, records, "report"), "lookahead_sweep": [],
              "left_out": left_out, "records": records}
    assert ("Left out of this run: transformers UAG failed inside transformers 9.9: RuntimeError: no token"
            in reports.markdown_report(result))
    # a method that is not a baseline raising is not caught
    with pytest.raises(ValueError):
        class Broken(FakeRunner):
            def run(self, method, ids, max_new_tokens=None):
                raise ValueError("hf_hetspec refused")
        bench.collect_records(prompts, {(0.0, 0): Broken()}, specs, [], tokenizer, True, load=lambda: 0.0,
                              threads=1)


def test_contended_rule():
    assert bench.CONTENDED_MARGIN == 0.5
    assert not bench.contended(1.5, 1.5, threads=1)  # at the threshold: not yet
    assert bench.contended(1.51, None, threads=1) and bench.contended(0.0, 1.51, threads=1)
    assert not bench.contended(None, None, threads=1)
    assert not bench.contended(2.4, 2.5, threads=2) and bench.contended(2.6, 0.0, threads=2)


def test_records_carry_the_load_before_and_after_each_call_and_summaries_count_contended_calls():
    tokenizer = toy.byte_level_bpe_tokenizer()
    prompts = [tasks.BenchPrompt("qa", "spec-bench/1", ("Where is it?",)),
               tasks.BenchPrompt("rag", "spec-bench/2", ("Read this. Where is it?",))]
    loads = iter([0.2, 0.3,  0.4, 1.7,  0.9, 1.0,  1.2, 1.4])  # (before, after) per call, 4 calls
    specs = bench.method_specs(["auto"], transformers=False, homogeneous=False)
    records = bench.collect_records(prompts, {(0.0, 0): FakeRunner()}, specs, [], tokenizer, True,
                                    load=lambda: next(loads), threads=1)
    assert [(r["load_before"], r["load_after"], r["contended"]) for r in records] == [
        (0.2, 0.3, False), (0.4, 1.7, True), (0.9, 1.0, False), (1.2, 1.4, False)]
    rows = {(r["task"], r["method"]): r for r in bench.summarize_results(records, {"target": 1.0, "drafter": 0.1})}
    assert (rows[("qa", "hf_hetspec")]["load_max"], rows[("qa", "hf_hetspec")]["contended_calls"]) == (1.7, 1)
    assert (rows[("qa", "target")]["load_max"], rows[("qa", "target")]["contended_calls"]) == (0.3, 0)
    assert rows[("rag", "hf_hetspec")]["contended_calls"] == 0
    summary = bench.suite_summary(list(rows.values()), records, "report")
    assert (summary["calls"], summary["contended_calls"], summary["load_max"]) == (4, 1, 1.7)
    result = {"config": _config(), "machine": _machine(), "results": list(rows.values()),
              "suite_summary": summary, "lookahead_sweep": [], "records": records}
    report = reports.markdown_report(result)
    assert "WARNING: 1 of 4 calls ran while another job shared the machine" in report
    assert "headline figures need a quiet machine" in report
    contended_rows = [line for line in report.splitlines() if "contended 1/1" in line]
    assert len(contended_rows) == 1 and contended_rows[0].startswith("| qa | 0 | hf_hetspec auto |")
    quiet = dict(result, suite_summary=dict(summary, contended_calls=0))
    assert "WARNING" not in reports.markdown_report(quiet)


def test_a_reference_step_before_each_prompt_shows_a_slowdown_the_load_average_misses():
    """The reference step runs once per prompt (not per call or turn), lands in that prompt's records, and a
    prompt whose step is more than DRIFT_MARGIN slower than the run's fastest is counted and warned about, with the
    load average quiet throughout."""
    tokenizer = toy.byte_level_bpe_tokenizer()
    prompts = [tasks.BenchPrompt("qa", "spec-bench/1", ("Where is it?",)),
               tasks.BenchPrompt("mt_bench", "spec-bench/2", ("Say it.", "Again.")),
               tasks.BenchPrompt("rag", "spec-bench/3", ("Read this. Where is it?",))]
    steps = iter([0.200, 0.219, 0.221])  # seconds; the third is 10.5% over the fastest
    specs = bench.method_specs(["auto"], transformers=False, homogeneous=False)
    records = bench.collect_records(prompts, {(0.0, 0): FakeRunner()}, specs, [], tokenizer, True,
                                    load=lambda: 0.5, threads=1, reference_step=lambda: next(steps))
    assert [r["reference_step_s"] for r in records] == [0.200] * 2 + [0.219] * 4 + [0.221] * 2
    drift = bench.reference_drift(records)
    assert drift["prompts"] == 3 and drift["drifted_prompts"] == 1 and drift["margin"] == bench.DRIFT_MARGIN
    assert (round(drift["min_ms"]), round(drift["median_ms"]), round(drift["max_ms"])) == (200, 219, 221)
    rows = bench.summarize_results(records, {"target": 1.0, "drafter": 0.1})
    summary = bench.suite_summary(rows, records, "report")
    assert summary["contended_calls"] == 0 and summary["reference_step"] == drift
    result = {"config": _config(), "machine": _machine(), "results": rows, "suite_summary": summary,
              "lookahead_sweep": [], "records": records}
    report = reports.markdown_report(result)
    assert "median 219 ms, 200 to 221 ms over 3 prompts" in report
    assert "WARNING: the target's reference step" in report and "ran 1 of 3 prompts more than 10% slower" in report
    steady = [dict(r, reference_step_s=0.2) for r in records]
    assert bench.reference_drift(steady)["drifted_prompts"] == 0
    assert "WARNING" not in reports.markdown_report(dict(result, suite_summary=bench.suite_summary(
        rows, steady, "report")))
    assert bench.reference_drift([dict(r, reference_step_s=None) for r in records])["min_ms"] is None


def _config():
    return {"date": "2026-12-02", "dtype": "float32", "target": "t", "drafter": "d", "homogeneous_drafter": None,
            "max_new_tokens": 10, "chat_template": True, "command": "hf-hetspec bench --suite spec-bench",
            "suite": "spec-bench", "half": "report", "half_rule": tasks.HALVES["report"],
            "data_sources": {}, "cost_ratio_method": "c"}


def _machine():
    return {"cpu": "cpu", "cpu_count": 2, "torch_threads": 1, "torch": "2", "transformers": "4", "device": "cpu"}


# --------------------------------------------------------------------------------------------------------
# Geometric mean and the slowest prompt
# --------------------------------------------------------------------------------------------------------


def _record(task, prompt_id, method, seconds, turn=1, temperature=0.0, seed=0):
    run = FakeRun(method, 5, seconds).record(None, bench.method_label(method, "auto"))
    return {**run, "task": task, "prompt_id": prompt_id, "turn": turn, "temperature": temperature, "seed": seed,
            "algorithm": "auto" if method == "hf_hetspec" else None, "sweep": False, "lookahead": None,
            "load_before": 0.1, "load_after": 0.1, "contended": False}


def test_suite_summary_is_the_geometric_mean_over_categories_and_the_slowest_prompt():
    """Category speedups 1, 2, 4, 1, 2, 4 (geometric mean 2, arithmetic 2.33); transformers at 0.5x everywhere
    (hf_hetspec / transformers: geometric mean 4); HumanEval tasks stay out of the mean; mt_bench's two turns
    make one prompt (0.67x and 2x turns: one prompt at 1x)."""
    speedups = {"translation": 2, "summarization": 4, "qa": 1, "math_reasoning": 2, "rag": 4}
    records = []
    for task, speedup in speedups.items():
        records += [_record(task, f"{task}/1", "target", 1.0), _record(task, f"{task}/1", "transformers", 2.0),
                    _record(task, f"{task}/1", "hf_hetspec", 1 / speedup)]
    for turn, seconds in ((1, 1.5), (2, 0.5)):
        records += [_record("mt_bench", "mt/1", "target", 1.0, turn), _record("mt_bench", "mt/1", "transformers",
                                                                               2.0, turn),
                    _record("mt_bench", "mt/1", "hf_hetspec", seconds, turn)]
    for prompt_id, seconds in (("HumanEval/0", 0.01), ("HumanEval/1", 1 / 0.9)):
        records += [_record("code", prompt_id, "target", 1.0), _record("code", prompt_id, "transformers", 2.0),
                    _record("code", prompt_id, "hf_hetspec", seconds)]
    results = bench.summarize_results(records, {"target": 1.0, "drafter": 0.1})
    summary = bench.suite_summary(results, records, "tune")
    assert summary["categories"] == ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]
    mean = {r["label"]: r for r in summary["geomean"]}
    assert mean["hf_hetspec auto"]["speedup"] == pytest.approx(2.0)
    assert mean["hf_hetspec auto"]["vs_transformers"] == pytest.approx(4.0)
    assert mean["transformers UAG"]["speedup"] == pytest.approx(0.5)
    assert mean["transformers UAG"]["vs_transformers"] is None
    slowest = {r["label"]: r for r in summary["min_prompt_speedup"]}
    worst = slowest["hf_hetspec auto"]
    assert (worst["task"], worst["prompt_id"]) == ("code", "HumanEval/1")
    assert worst["speedup"] == pytest.approx(0.9)
    assert (worst["below_floor"], worst["prompts"]) == (1, 8)
    assert (slowest["transformers UAG"]["below_floor"], slowest["transformers UAG"]["speedup"]) == (8, 0.5)
    code = next(r for r in results if (r["task"], r["label"]) == ("code", "hf_hetspec auto"))
    assert code["vs_transformers"] == pytest.approx(code["speedup"] / 0.5)
    result = {"config": _config(), "machine": _machine(), "results": results, "suite_summary": summary,
              "lookahead_sweep": [], "records": records}
    report = reports.markdown_report(result)
    assert "| 0 | hf_hetspec auto | 2.00x | 4.00x | code HumanEval/1 | 0.90x | 1/8 |" in report
    assert "Summary (tune half)" in report and "Prompts: suite spec-bench; report half" in report
    assert bench.geometric_mean([1.0, 4.0]) == 2.0 and bench.geometric_mean([]) is None
    assert bench.geometric_mean([2.0, 0.0]) is None and math.isclose(bench.geometric_mean([8.0]), 8.0)


# --------------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------------


def _settings(*argv):
    return bench._settings(cli.build_parser().parse_args(["bench", *argv]))


def test_suite_defaults_and_overrides():
    suite = _settings("--suite", "spec-bench")
    assert suite["tasks"] == [*tasks.SPEC_BENCH_CATEGORIES, "code", "code_completion"]
    assert set(suite["counts"].values()) == {5} and suite["half"] == "report" and suite["source"] == "local"
    assert (suite["temperatures"], suite["seeds"], suite["max_new_tokens"]) == ([0.0, 1.0], [0], 64)
    assert suite["algorithms"] == ["auto"]
    tuned = _settings("--suite", "spec-bench", "--half", "tune", "--prompts", "20", "--algorithms", "slem",
                      "--tasks", "qa", "--source", "auto")
    assert (tuned["half"], tuned["counts"], tuned["algorithms"], tuned["source"]) == (
        "tune", {"qa": 20}, ["slem"], "auto")
    plain = _settings()
    assert (plain["half"], plain["source"]) == ("all", "auto")
    with pytest.raises(cli.CLIError, match="--quick"):
        _settings("--suite", "spec-bench", "--quick")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return {name: str(path) for name, path in save_toy_models(tmp_path_factory.mktemp("suite_models")).items()}


def test_suite_run_on_tiny_models(models, spec_bench_file, tmp_path, monkeypatch):
    """The preset end to end (two tasks, one prompt, 6 tokens): report half, the suite's methods and
    temperatures, code completion without the template and greedy-exact, the summary in bench.json and bench.md."""
    monkeypatch.setattr(tasks, "humaneval_problems", lambda: FAKE_PROBLEMS)
    argv = ["bench", "--suite", "spec-bench", "--target", models["target"], "--drafter", models["drafter"],
            "--dtype", "float32", "--spec-bench", str(spec_bench_file), "--tasks", "summarization",
            "code_completion", "--prompts", "1", "--max-new-tokens", "6", "--out", str(tmp_path)]
    with contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(argv) == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    config = result["config"]
    assert (config["suite"], config["half"], config["temperatures"], config["seeds"]) == (
        "spec-bench", "report", [0.0, 1.0], [0])
    assert config["prompt_ids"] == {"summarization": ["spec-bench/5"], "code_completion": ["HumanEval/1"]}
    assert config["data_sources"]["summarization"].startswith("Spec-Bench")
    assert {r["label"] for r in result["results"]} == {"target alone", "transformers UAG", "hf_hetspec auto"}
    records = result["records"]
    assert len(records) == 2 * 2 * 3
    assert all(isinstance(r["load_before"], float) and isinstance(r["contended"], bool) for r in records)
    tokenizer = toy.byte_level_bpe_tokenizer()
    completion = [r for r in records if r["task"] == "code_completion"]
    assert {r["prompt_tokens"] for r in completion} == {len(tokenizer(FAKE_PROBLEMS[1][1]).input_ids)}
    for row in result["results"]:
        if row["temperature"] == 0 and row["method"] != "target":
            assert (row["identical"], row["different"]) == (1, 0), row
    summary = result["suite_summary"]
    assert summary["half"] == "report" and summary["categories"] == ["summarization"]
    assert {(r["temperature"], r["label"]) for r in summary["geomean"]} == {
        (t, label) for t in (0.0, 1.0) for label in ("transformers UAG", "hf_hetspec auto")}
    markdown = (tmp_path / "bench.md").read_text()
    assert "Summary (report half)" in markdown and "report half: odd positions" in markdown


def test_on_a_gpu_each_prompt_is_decoded_once_untimed_before_its_timed_calls():
    """A GPU's first call on new shapes ran 2.3-4x slower per token (H200, docs/results.md 2026-12-04 evening):
    there the target alone decodes each turn's ids once before the timed calls; a CPU gets no warm-up."""
    tokenizer = toy.byte_level_bpe_tokenizer()
    prompts = [tasks.BenchPrompt("qa", f"spec-bench/{i}", (f"Where is {i}?",)) for i in range(2)]
    runner = FakeRunner()
    assert bench.prompt_warm_up(torch.device("cpu"), runner) is None
    warm_up = bench.prompt_warm_up(torch.device("cuda", 0), runner)
    specs = bench.method_specs(["auto"], transformers=False, homogeneous=False)
    records = bench.collect_records(prompts, {(0.0, 0): runner}, specs, [], tokenizer, True, load=lambda: 0.0,
                                    threads=1, warm_up=warm_up)
    assert [m for m, _ in runner.calls] == ["target", "target", "hf_hetspec"] * 2  # the first of each: untimed
    assert torch.equal(runner.calls[0][1], runner.calls[1][1])
    assert [r["method"] for r in records] == ["target", "hf_hetspec"] * 2
