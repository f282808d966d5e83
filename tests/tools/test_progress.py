"""Progress lines and thread choice of the timed commands (``hf-hetspec demo``)."""

import io
import os

import pytest
import torch
from rich.console import Console

from hf_hetspec.tools import common
from hf_hetspec.tools.progress import Steps, status


def _plain_console():
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=False, width=200), buffer


def test_plain_lines_when_output_is_not_a_terminal():
    console, buffer = _plain_console()
    with status(console, "Loading models ..."):
        pass
    with Steps(console, total=2) as steps:
        steps.start("HumanEval/0: target alone")
        steps.done("48 tokens in 9.5 s")
        steps.start("HumanEval/0: hf_hetspec")
        steps.done()
    lines = buffer.getvalue().splitlines()
    assert lines[0] == "Loading models ..."
    assert lines[1].startswith("Loading models: done in ")
    assert lines[2].startswith("[1/2, 0s] HumanEval/0: target alone: 48 tokens in 9.5 s")
    assert lines[3] == "[2/2, 0s] HumanEval/0: hf_hetspec"


def test_a_terminal_gets_the_live_bar_and_no_step_lines():
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=100)
    with Steps(console, total=1) as steps:
        steps.start("HumanEval/0: target alone")
        steps.done("48 tokens")
    assert "[1/1," not in buffer.getvalue() and "1/1" in buffer.getvalue()


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("load, cores, given, threads, words", [
    (3.2, 2, None, 1, "using 1 torch thread"),      # a busy 2-core machine: one thread, not two stalling
    (1.5, 8, None, 6, "using 6 torch threads"),
    (3.2, 2, 2, 2, "timings will be noisy"),        # --threads wins
    (0.3, 2, None, None, ""),                       # idle: torch's default, nothing to say
])
def test_threads_follow_the_cores_other_jobs_leave_free(monkeypatch, restore_threads, load, cores, given, threads,
                                                        words):
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    before = torch.get_num_threads()
    note = common.choose_threads("cpu", given)
    assert torch.get_num_threads() == (before if threads is None else threads)
    assert (words in note) if words else note == ""
    if given is not None:
        assert "using" not in note
    threads_now = torch.get_num_threads()
    assert common.choose_threads("cuda", None) == ""  # a GPU run keeps its CPU threads whatever the load
    assert torch.get_num_threads() == threads_now


def test_bad_thread_count_is_refused():
    with pytest.raises(common.CLIError, match="--threads 0"):
        common.choose_threads("cpu", 0)
