"""Progress a user can see wherever the output goes: rich's spinner and bar on a terminal, plain lines
otherwise (a log file, CI, ``| tee``), as ``pip`` and ``datasets`` do. rich draws nothing live on a console
that is not a terminal, so a long run would otherwise be silent until its end."""

from __future__ import annotations

import time
from contextlib import contextmanager


def _elapsed(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


@contextmanager
def status(console, message: str):
    """A spinner with ``message`` on a terminal; else one line now and one with the seconds taken at the end."""
    if console.is_terminal:
        with console.status(message):
            yield
        return
    began = time.perf_counter()
    console.print(message, markup=False)
    yield
    console.print(f"{message.rstrip('. ')}: done in {_elapsed(time.perf_counter() - began)}", markup=False)


class Steps:
    """``total`` steps of a run: a rich progress bar on a terminal, else one line per finished step.

    Usage::

        with Steps(console, total=9) as steps:
            for ...:
                steps.start("HumanEval/0: hf_hetspec")
                ...
                steps.done("48 tokens in 10.2 s")   # plain output: "[1/9, 0m10s] HumanEval/0: hf_hetspec: 48 tokens ..."
    """

    def __init__(self, console, total: int):
        self.console = console
        self.total = total
        self.finished = 0
        self.description = ""
        self._began = time.perf_counter()
        self._bar = None

    def __enter__(self) -> "Steps":
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            self._bar = Progress(*columns, console=self.console)
            self._bar.__enter__()
            self._task = self._bar.add_task("", total=self.total)
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def start(self, description: str) -> None:
        """The step now running (shown on the bar; printed with its result when done)."""
        self.description = description
        if self._bar is not None:
            self._bar.update(self._task, description=description)

    def done(self, detail: str = "") -> None:
        """The current step finished; ``detail`` (e.g. tokens and seconds) goes on its plain line."""
        self.finished += 1
        if self._bar is not None:
            self._bar.advance(self._task)
            return
        line = f"[{self.finished}/{self.total}, {_elapsed(time.perf_counter() - self._began)}] {self.description}"
        self.console.print(f"{line}: {detail}" if detail else line, markup=False)
