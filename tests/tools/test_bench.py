"""``hf-hetspec bench`` on tiny models saved to a temporary folder; its formula, prompts and checks."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from conftest import SPEC_BENCH_ROWS, save_toy_models
from hf_hetspec.tools import analyze, bench, cli, reports, tasks, zoo

N_NEW = 6
RESULT_FIELDS = {
    "task", "temperature", "method", "label", "algorithm", "runs", "new_tokens", "seconds",
    "tokens_per_second", "tpot_ms", "ttft_ms", "speedup", "acceptance_rate", "alpha", "tokens_per_forward",
    "drafter_s", "target_s", "translation_s", "peak_memory_mb", "identical", "tie", "different",
    "mean_lookahead", "cost_ratio", "theoretical_speedup", "bound_ratio", "vs_transformers", "load_max",
    "contended_calls",
}
CONFIG_FIELDS = {
    "target", "drafter", "homogeneous_drafter", "dtype", "device", "max_new_tokens", "tasks",
    "prompts_per_task", "temperatures", "seeds", "algorithms", "lookahead", "chat_template", "command",
    "date", "hf_hetspec_version", "suite", "half", "half_rule", "prompt_ids", "special_tokens",
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Folders of a tiny byte-level target, a tiny sentencepiece drafter and a same-vocabulary drafter."""
    folders = save_toy_models(tmp_path_factory.mktemp("bench_models"), homogeneous=True)
    return {name: str(path) for name, path in folders.items()}


def bench_argv(models, spec_bench_file, *extra: str) -> list[str]:
    return ["bench", "--target", models["target"], "--drafter", models["drafter"], "--dtype", "float32",
            "--spec-bench", str(spec_bench_file), "--max-new-tokens", str(N_NEW), *extra]


@pytest.fixture(scope="module")
def full_run(models, spec_bench_file, tmp_path_factory):
    """One bench run with every method, greedy and two sampling seeds, two tasks (one multi-turn), a sweep:
    ``(exit code, out folder, bench.json, argv, what it printed on stderr)``."""
    out = tmp_path_factory.mktemp("bench_out")
    argv = bench_argv(models, spec_bench_file, "--homogeneous-drafter", models["homogeneous"],
                      "--source", "local", "--tasks", "summarization", "mt_bench", "--prompts", "1",
                      "--temperatures", "0", "1", "--seeds", "0", "1", "--algorithms", "slem", "tli",
                      "--lookahead-sweep", "1", "3", "--out", str(out))
    with contextlib.redirect_stderr(io.StringIO()) as err:
        code = cli.main(argv)
    return code, out, json.loads((out / "bench.json").read_text()) if code == 0 else None, argv, err.getvalue()


def test_bench_writes_the_documented_json_tables_and_plots(full_run):
    code, out, result, argv, _ = full_run
    assert code == 0
    assert set(result) == {"machine", "config", "results", "suite_summary", "lookahead_sweep", "left_out",
                           "records"}
    assert result["left_out"] == []
    config = result["config"]
    assert CONFIG_FIELDS <= set(config)
    assert config["command"] == "hf-hetspec " + " ".join(argv)
    assert config["tasks"] == ["summarization", "mt_bench"] and config["prompts_per_task"] == {
        "summarization": 1, "mt_bench": 1}
    assert config["chat_template"] is True and config["dtype"] == "float32"
    assert (config["suite"], config["half"]) == (None, "all")
    assert config["prompt_ids"] == {"summarization": ["spec-bench/4"], "mt_bench": ["spec-bench/1"]}
    assert config["data_sources"]["summarization"].startswith("Spec-Bench")
    assert all(set(row) == RESULT_FIELDS for row in result["results"])
    labels = {row["label"] for row in result["results"]}
    assert labels == {"target alone", "transformers UAG", "hf_hetspec slem", "hf_hetspec tli",
                      "homogeneous SD"}
    # 3 turns (1 + 2) x (greedy + 2 seeds) x (5 methods + 2 sweep lookaheads)
    assert len(result["records"]) == 3 * 3 * 7
    for name in ("bench.json", "bench.md", "speedup.png", "lookahead.png"):
        assert (out / name).stat().st_size > 0
        if name.endswith(".png"):
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (out / "bench.md").read_text()
    assert "| summarization | 0 | hf_hetspec slem |" in markdown and "Lookahead sweep" in markdown
    # the sampled transformers rows carry the footnote on its lossiness; a greedy-only report does not
    assert markdown.count(reports.TRANSFORMERS_SAMPLING_NOTE) == 1
    greedy_only = dict(result, results=[r for r in result["results"] if r["temperature"] == 0])
    assert reports.TRANSFORMERS_SAMPLING_NOTE not in reports.markdown_report(greedy_only)


def test_progress_shows_as_plain_lines_in_a_log(full_run):
    """Not a terminal (a log file, CI): one line per loading/warm-up phase and per finished call, numbered."""
    lines = full_run[4].splitlines()
    assert any(line.startswith("Loading ") and "done in" in line for line in lines)
    steps = [line for line in lines if line.startswith("[")]
    total = int(steps[0].split("/")[1].split(",")[0])
    assert len(steps) == total > 1 and steps[-1].startswith(f"[{total}/{total},")


def test_speedups_are_ratios_of_tokens_per_second_within_the_run(full_run):
    _, _, result, _, _ = full_run
    rows = result["results"]
    for row in rows:
        base = next(r for r in rows if (r["task"], r["temperature"], r["method"]) ==
                    (row["task"], row["temperature"], "target"))
        key = (row["task"], row["temperature"], row["label"])
        records = [r for r in result["records"]
                   if not r["sweep"] and (r["task"], r["temperature"], r["label"]) == key]
        turns = 2 if row["task"] == "mt_bench" else 1
        assert row["runs"] == len(records) == turns * (1 if row["temperature"] == 0 else 2)
        assert row["new_tokens"] == sum(r["new_tokens"] for r in records)
        assert row["seconds"] == pytest.approx(sum(r["seconds"] for r in records))
        assert row["tokens_per_second"] == pytest.approx(row["new_tokens"] / row["seconds"])
        assert row["speedup"] == pytest.approx(row["tokens_per_second"] / base["tokens_per_second"])
        assert row["peak_memory_mb"] == max((r["peak_memory_mb"] for r in records), default=None)
        if row["method"] == "target":
            assert row["speedup"] == 1.0
            assert row["acceptance_rate"] is None and row["theoretical_speedup"] is None
            assert row["tokens_per_forward"] == pytest.approx(1.0)
            continue
        assert 1.0 <= row["tokens_per_forward"] <= N_NEW
        assert (row["drafter_s"] is not None) == (row["method"] == "hf_hetspec")
        drafter = "homogeneous_drafter" if row["method"] == "homogeneous" else "drafter"
        steps = result["config"]["step_seconds"]
        assert "hetspec_drafter" not in steps  # tiny drafters run eager under --drafter-runtime auto
        assert row["cost_ratio"] == pytest.approx(steps[drafter] / steps["target"])
        assert row["mean_lookahead"] == pytest.approx(
            sum(r["drafter_forwards"] for r in records) / sum(r["target_forwards"] for r in records))
        if row["method"] == "hf_hetspec":  # counted by hf_hetspec itself, pruned drafter head (TLI) included
            assert all(r["drafter_forwards"] == r["stats"]["drafter_forwards"] > 0 for r in records)
        accepted = sum(r["accepted_tokens"] for r in records)
        examined = accepted + sum(r["rejections"] for r in records)
        assert row["alpha"] == pytest.approx(accepted / examined)
        assert row["alpha"] >= row["acceptance_rate"]
        if row["method"] == "hf_hetspec":
            assert all(r["rejections"] == r["stats"]["rejections"] for r in records)
        if row["acceptance_rate"] is not None:
            alpha, gamma, c = row["alpha"], row["mean_lookahead"], row["cost_ratio"]
            expected = analyze.expected_speedup(alpha, gamma, c)
            assert row["theoretical_speedup"] == pytest.approx(expected)
            assert row["bound_ratio"] == pytest.approx(row["speedup"] / expected)


def test_greedy_outputs_are_the_target_alone_output_and_sampled_ones_have_no_verdict(full_run, models):
    _, _, result, _, _ = full_run
    for row in result["results"]:
        if row["method"] == "target":
            continue
        if row["temperature"] == 0:
            assert (row["identical"], row["tie"], row["different"]) == (row["runs"], 0, 0), row["label"]
        else:
            assert row["identical"] is None
    # the plain target's own greedy text, computed here without the benchmark
    target, tokenizer = zoo.load(models["target"], dtype="float32")
    ids = tasks.chat_ids(tokenizer, [{"role": "user", "content": SPEC_BENCH_ROWS[3]["turns"][0]}], True)
    plain = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_NEW, do_sample=False)
    expected = tokenizer.decode(plain[0, ids.shape[1]:], skip_special_tokens=True)
    greedy = [r for r in result["records"] if r["task"] == "summarization" and r["temperature"] == 0]
    assert len(greedy) == 7 and {r["text"] for r in greedy} == {expected}


def test_second_turn_follows_the_target_alone_first_answer(full_run, models):
    _, _, result, _, _ = full_run
    tokenizer = zoo.load(models["target"], dtype="float32")[1]
    mt = [r for r in result["records"] if r["task"] == "mt_bench" and r["method"] == "target"]
    assert [(r["prompt_id"], r["turn"]) for r in mt if r["temperature"] == 0] == [
        ("spec-bench/1", 1), ("spec-bench/1", 2)]
    for first in (r for r in mt if r["turn"] == 1):
        second = next(r for r in mt if r["turn"] == 2 and (r["temperature"], r["seed"]) ==
                      (first["temperature"], first["seed"]))
        turns = SPEC_BENCH_ROWS[0]["turns"]
        messages = [{"role": "user", "content": turns[0]}, {"role": "assistant", "content": first["text"]},
                    {"role": "user", "content": turns[1]}]
        assert second["prompt_tokens"] == tasks.chat_ids(tokenizer, messages, True).shape[1]


def test_records_carry_ttft_and_the_sweep_uses_fixed_lookaheads(full_run):
    _, _, result, _, _ = full_run
    for record in result["records"]:
        assert record["new_tokens"] == N_NEW
        assert 0 < record["ttft_seconds"] <= record["seconds"]
        assert record["peak_memory_mb"] is None or record["peak_memory_mb"] > 0
        if record["sweep"]:
            assert record["algorithm"] == "slem"
            assert set(record["stats"]["lookaheads"]) == {record["lookahead"]}
    sweep = result["lookahead_sweep"]
    assert [(r["task"], r["temperature"], r["lookahead"]) for r in sweep] == [
        (task, t, k) for task in ("summarization", "mt_bench") for t in (0.0, 1.0) for k in (1, 3, "adaptive")
    ]
    main = {(r["task"], r["temperature"]): r for r in result["results"] if r["label"] == "hf_hetspec slem"}
    for row in sweep:
        assert row["algorithm"] == "slem"
        if row["lookahead"] != "adaptive":
            continue
        fixed = [r for r in sweep if (r["task"], r["temperature"]) == (row["task"], row["temperature"])][:2]
        best = max(fixed, key=lambda r: r["tokens_per_second"])
        adaptive = main[(row["task"], row["temperature"])]
        assert row["tokens_per_second"] == pytest.approx(adaptive["tokens_per_second"])
        assert row["best_fixed_lookahead"] == best["lookahead"]
        assert row["adaptive_vs_best"] == pytest.approx(row["tokens_per_second"] / best["tokens_per_second"])
        assert row["within_10_percent"] == (row["adaptive_vs_best"] >= 0.9)


def test_hetspec_rows_take_c_from_the_drafter_runtime_they_ran(full_run):
    """With a drafter copy (e.g. int8), hf_hetspec's c is that copy's step; transformers' is the drafter's."""
    _, _, result, _, _ = full_run
    steps = {"target": 1.0, "drafter": 0.2, "homogeneous_drafter": 0.3, "hetspec_drafter": 0.05}
    rows = bench.summarize_results(result["records"], steps)
    expected = {"hf_hetspec": 0.05, "transformers": 0.2, "homogeneous": 0.3, "target": None}
    assert all(row["cost_ratio"] == expected[row["method"]] for row in rows)
    runtime = {"runtime": "int8", "prepare_s": 4.0, "memory_mb": 240.0}
    config = dict(result["config"], drafter_runtime=runtime)
    assert "drafter ran int8" in reports.markdown_report(dict(result, config=config))


def test_transformers_loop_rows_are_interleaved_and_exact(models, spec_bench_file, tmp_path):
    """``--loops hetspec transformers``: each algorithm also runs inside transformers' ``_assisted_decoding``,
    as its own row, right after the same prompt's other methods; greedy outputs are the target alone's."""
    argv = bench_argv(models, spec_bench_file, "--source", "local", "--tasks", "summarization", "--prompts", "1",
                      "--temperatures", "0", "1", "--seeds", "0", "--algorithms", "slem", "tli",
                      "--loops", "hetspec", "transformers", "--no-transformers", "--out", str(tmp_path))
    with contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(argv) == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["config"]["loops"] == ["hetspec", "transformers"]
    order = ["target alone", "hf_hetspec slem", "hf_hetspec tli", "hf_hetspec slem (transformers loop)",
             "hf_hetspec tli (transformers loop)"]
    assert [r["label"] for r in result["records"]] == order * 2  # greedy, then seed 0: interleaved per call
    rows = [r for r in result["results"] if r["method"] == "hf_hetspec_transformers_loop"]
    assert sorted((r["label"], r["temperature"]) for r in rows) == sorted(
        (label, t) for label in order[3:] for t in (0.0, 1.0))
    for row in rows:
        assert row["tokens_per_forward"] >= 1 and row["cost_ratio"] is not None
        if row["temperature"] == 0:
            assert (row["identical"], row["different"]) == (1, 0), row["label"]
    greedy = {r["text"] for r in result["records"] if r["temperature"] == 0}
    assert len(greedy) == 1  # every method wrote the target alone's greedy text
    assert "hf_hetspec tli (transformers loop)" in (tmp_path / "bench.md").read_text()


def test_write_card_receives_the_json_and_the_plots(models, spec_bench_file, tmp_path, monkeypatch):
    from hf_hetspec.tools import pairing

    calls = []
    monkeypatch.setattr(pairing, "write_card", lambda *args: calls.append(args))  # raises once it is renamed
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    card = tmp_path / "card"
    argv = bench_argv(models, spec_bench_file, "--tasks", "summarization", "--prompts", "1",
                      "--temperatures", "0", "--algorithms", "slem", "--no-transformers",
                      "--write-card", str(card))
    assert cli.main(argv) == 0
    (result, out_dir, plots), = calls
    assert result == json.loads((card / "bench.json").read_text())
    assert out_dir == card and set(plots) == {"speedup"} and plots["speedup"].stat().st_size > 0
    assert result["config"]["data_sources"]["summarization"] == "local (Hub not used: HF_HUB_OFFLINE is set)"
    assert [r["label"] for r in result["results"]] == ["target alone", "hf_hetspec slem"]


def test_write_card_with_the_real_pairing_module(models, spec_bench_file, tmp_path):
    from hf_hetspec.tools import pairing

    card = tmp_path / "card"
    argv = bench_argv(models, spec_bench_file, "--tasks", "summarization", "--prompts", "1",
                      "--temperatures", "0", "--algorithms", "slem", "--no-transformers", "--source", "local",
                      "--write-card", str(card))
    assert cli.main(argv) == 0
    assert (card / "bench.json").is_file() and (card / "README.md").is_file()
    # the tokens vLLM's TLI stands in for tokens outside the intersection, recorded from the two tokenizers
    from transformers import AutoTokenizer

    from hf_hetspec.tools import pairing_vllm

    tokenizers = (AutoTokenizer.from_pretrained(models[k]) for k in ("target", "drafter"))
    expected = pairing_vllm.special_tokens(*tokenizers)
    assert pairing.read_card(card)[1]["special_tokens"] == expected


@pytest.mark.parametrize("extra, message", [
    (("--tasks", "poetry"), "--tasks"),
    (("--temperatures", "0", "-1"), "--temperatures"),
    (("--temperatures", "1", "1"), "each temperature once"),
    (("--prompts", "0"), "--prompts 0"),
    (("--max-new-tokens", "0"), "--max-new-tokens 0"),
    (("--lookahead-sweep", "0", "2"), "--lookahead-sweep"),
    (("--lookahead-sweep", "2", "--lookahead", "3"), "drop --lookahead"),
    (("--algorithms", "beam"), "--algorithms"),
    (("--spec-bench", "/no/such/question.jsonl", "--tasks", "rag"), "Spec-Bench"),
    (("--source", "hub"), "HF_HUB_OFFLINE"),
    (("--homogeneous-drafter", "no-such-model"), "--homogeneous-drafter"),
    (("--threads", "0"), "--threads 0"),
])
def test_bad_input_is_refused_before_loading_models(models, spec_bench_file, capsys, monkeypatch, extra,
                                                    message):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(cli, "load_model", lambda *a: pytest.fail("a model was loaded"))
    code = cli.main(bench_argv(models, spec_bench_file, "--tasks", "summarization", *extra))
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_same_vocabulary_drafter_is_required_for_homogeneous(models, spec_bench_file, capsys):
    code = cli.main(bench_argv(models, spec_bench_file, "--tasks", "summarization", "--source", "local",
                               "--homogeneous-drafter", models["drafter"]))
    assert code == 2 and "vocabulary differs" in capsys.readouterr().err


def test_quick_defaults_and_explicit_flags():
    def settings(*argv):
        return bench._settings(cli.build_parser().parse_args(["bench", *argv]))

    quick = settings("--quick")
    assert quick["tasks"] == ["code", "summarization"] and quick["counts"] == {"code": 2, "summarization": 1}
    assert (quick["max_new_tokens"], quick["temperatures"], quick["algorithms"]) == (64, [0.0], ["slem"])
    assert settings("--quick", "--prompts", "4", "--tasks", "qa")["counts"] == {"qa": 4}
    full = settings()
    assert full["tasks"] == list(tasks.TASKS) and full["temperatures"] == [0.0, 1.0]


def test_runner_counts_drafter_forwards_of_a_pruned_tli_head(real_pair):
    """TLI with a Gemma-3-vocabulary drafter computes only the intersection's rows of its LM head, running the
    drafter's decoder rather than its top module: the runner still reports every drafter forward (the γ
    column of the bench)."""
    from hf_hetspec.tools.runner import Runner

    pair = real_pair("qwen2.5-coder", "gemma3")
    runner = Runner(pair.target, pair.target_tokenizer, pair.drafter, pair.drafter_tokenizer, algorithm="tli",
                    max_new_tokens=12)
    run = runner.hetspec(pair.target_tokenizer(pair.prompts[0], return_tensors="pt").input_ids)
    assert run.stats.drafter_head_rows > 0
    assert run.drafter_forwards == run.stats.drafter_forwards > 0
