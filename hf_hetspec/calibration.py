"""The target's verification cost ``v`` and the drafter's cost ratio ``c`` measured on this machine, where a
table cannot know them.

``v`` (:data:`hf_hetspec.schedule.VERIFY_COSTS`) is the target forwards one more verified draft token adds. On a
GPU, or on a CPU with the dtype's own instructions, a forward of a few tokens reads the weights once and ``v`` is
small everywhere. A CPU target running its own layers (``hetspec_target="eager"``, or a float32 target whose
weights do not pack, :mod:`hf_hetspec.packed_target`) has no such constant: its cost per token depends on the
CPU, the BLAS library's path for it and the thread count. A float32 Qwen2.5-Coder-1.5B on an AVX2 AMD EPYC took
481 ms for one token and 1,229 ms for 16 at two threads (``v`` 0.10), but 368 ms for one and 1,102 / 1,386 ms
for 4 / 7 at one thread (0.67 / 0.46): with the table's 0.10 the schedule drafted long and hf_hetspec ran
0.53-0.75x the target alone (docs/results.md, 2026-12-04).

So for such a target :func:`measured_verify_cost` times forwards of 1 token and of each of :data:`PROBE_WIDTHS`
tokens after a :data:`PROBE_CONTEXT`-token prompt of the target, once per machine, and stores ``v`` under
``$HF_HETSPEC_HOME/verify_costs.json`` keyed by the CPU, the thread count, torch's version, the target's class,
parameter count and dtype. Every later call on that machine reads the stored value: the source policy stays a
function of the accepted tokens, and a seeded call reproducible (a process that cannot write the file keeps the
value in memory). Targets below :data:`MIN_MEASURED_PARAMETERS` keep the table's value: their forwards are
fixed overheads, and timing them would only add noise.

``c`` (:data:`hf_hetspec.schedule.COST_RATIOS`, drafter step / target step) is a table on a CPU, where both steps
read their weights and the table's figures were measured. On a GPU both models' eager forwards are bound by
launching their kernels from Python, not by their weights: on an H200 (2026-12-04, torch 2.11, bf16) an eager
SmolLM2-135M step took 42.5 ms and an eager Qwen2.5-Coder-1.5B step 41.8 ms (``c`` 1.02, not the table's 0.165),
while the compiled runtime's step, replayed as one CUDA graph, took 2.5 ms (0.060). With the table's 0.165 an
eager drafter drafted there and a call ran 0.6x the target alone. So for a target of
:data:`MIN_MEASURED_PARAMETERS` or more on any device but the CPU, :func:`measured_cost_ratio` times one-token
steps of the target and of the drafter as it runs (its runtime's copy) after a :data:`PROBE_CONTEXT`-token
prompt, once per machine, pair and runtime, stored beside ``v``.

Ranks of a process group (``torch.distributed`` initialized with more than one process: a tensor-parallel target)
keep the tables' values: each rank would time its own forwards, and ranks whose measured values differed would
choose different drafts and run forwards of different widths, which the collectives of a sharded forward cannot
survive. ``Schedule(cost_ratio=..., verify_cost=...)`` gives them measured figures.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import platform
import time
import warnings

import torch

from .compat import cache_kwargs, output_cache
from .drafter import model_device, rollback_cache
from .intersection import cache_root
from .status import status

#: Targets with fewer parameters keep the table's ``v`` (:func:`measured_verify_cost`).
MIN_MEASURED_PARAMETERS = 50_000_000

#: Widths (tokens) of the measured verification forwards. A BLAS library's cost is not linear in the tokens: MKL's
#: float32 forward above costs 0.67 of a forward per token at 4 tokens and 0.31 at 8, so ``v`` is the largest of
#: the widths' costs per token, the cost of the dearest draft length.
PROBE_WIDTHS = (2, 4, 8)

#: Tokens of the prompt the measured forwards follow.
PROBE_CONTEXT = 32

#: Timed forwards of each width (the prompt's forward warms the product up); the fastest counts.
REPEATS = 2

#: Timed one-token steps of each model for ``c`` (:func:`time_steps`); the fastest counts.
STEP_REPEATS = 5

#: File under :func:`hf_hetspec.intersection.cache_root` holding the measured values (``v`` and ``c``).
CACHE_FILE = "verify_costs.json"

_MEMORY: dict[str, float] = {}


def needs_measuring(target: torch.nn.Module, runtime: str) -> bool:
    """Whether ``target`` running ``runtime`` (``"eager"`` or ``"fp16-packed"``) gets a measured ``v``: its own
    layers on a CPU, with at least :data:`MIN_MEASURED_PARAMETERS` parameters, outside a process group of several
    ranks."""
    return runtime == "eager" and model_device(target).type == "cpu" and _large_and_alone(target)


def machine_key(target: torch.nn.Module) -> str:
    """What ``v`` depends on: the CPU (its name and vector width), torch's threads and version, the target's
    class, parameter count and dtype, and how it is measured (hashed, 32 hex digits)."""
    parts = [cpu_name(), torch.backends.cpu.get_cpu_capability(), str(torch.get_num_threads()), torch.__version__,
             type(target).__name__, str(_parameters(target)), str(target.dtype),
             str(PROBE_WIDTHS), str(PROBE_CONTEXT)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def measured_verify_cost(target: torch.nn.Module, measure=None) -> float | None:
    """``v`` of ``target`` on this machine, measured once and stored (module docstring); ``None`` when measuring
    fails (the caller keeps the table's value; a warning says why).

    Args:
        target: a causal LM on the CPU, running its own layers.
        measure: ``measure(target) -> {tokens: seconds}`` for 1 and each of :data:`PROBE_WIDTHS` (default
            :func:`time_forwards`); tests pass their own.

    Returns:
        the largest ``(seconds[w] / seconds[1] - 1) / (w - 1)`` over the widths ``w``, at least 0, rounded to
        two decimals.
    """
    def compute() -> tuple[float, str]:
        seconds = (measure or time_forwards)(target)
        v = round(max(0.0, *((seconds[w] / seconds[1] - 1.0) / (w - 1) for w in PROBE_WIDTHS)), 2)
        timings = ", ".join(f"{w}: {seconds[w] * 1e3:.0f}" for w in (1, *PROBE_WIDTHS))
        return v, f"the target's forwards (tokens: ms) {timings}: v = {v:g}"

    return _remembered(machine_key(target), compute, "the target's cost per verified token",
                       "the target's forwards", "the verify cost of its class (hf_hetspec.schedule.VERIFY_COSTS)")


def needs_measured_cost_ratio(target: torch.nn.Module) -> bool:
    """Whether a call with ``target`` gets a measured ``c`` (module docstring): a target on any device but the CPU,
    with at least :data:`MIN_MEASURED_PARAMETERS` parameters, outside a process group of several ranks."""
    return model_device(target).type != "cpu" and _large_and_alone(target)


def _large_and_alone(target: torch.nn.Module) -> bool:
    """At least :data:`MIN_MEASURED_PARAMETERS` parameters, and this process not one rank of several (module
    docstring: ranks keep the tables' values)."""
    distributed = torch.distributed
    if distributed.is_available() and distributed.is_initialized() and distributed.get_world_size() > 1:
        return False
    return _parameters(target) >= MIN_MEASURED_PARAMETERS


def _parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def pair_key(target: torch.nn.Module, drafter: torch.nn.Module, runtime: str) -> str:
    """What ``c`` depends on: the device (its name), torch's version, each model's class, parameter count and
    dtype, the drafter's runtime, and how it is measured (hashed, 32 hex digits)."""
    device = model_device(target)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    parts = ["c", name, torch.__version__, runtime, str(PROBE_CONTEXT), str(STEP_REPEATS)]
    for model in (target, drafter):
        first = next(model.parameters(), None)
        parts += [type(model).__name__, str(_parameters(model)), str(None if first is None else first.dtype)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def measured_cost_ratio(target: torch.nn.Module, drafter: torch.nn.Module, runtime: str,
                        measure=None) -> float | None:
    """``c`` of ``drafter`` (as it runs: the runtime's copy) against ``target`` on this device, measured once per
    machine, pair and runtime and stored (module docstring); ``None`` when timing fails (the caller keeps the
    table's value; a warning says why).

    Args:
        target: the target, on a device other than the CPU.
        drafter: the model that drafts (:attr:`hf_hetspec.runtime.PreparedDrafter.model`), on its device.
        runtime: its runtime (:data:`hf_hetspec.runtime.RUNTIMES`), part of the key.
        measure: ``measure(target, drafter) -> (target seconds, drafter seconds)`` of one one-token step each
            (default :func:`time_steps`); tests pass their own.

    Returns:
        drafter seconds / target seconds, rounded to three decimals.
    """
    def compute() -> tuple[float, str]:
        target_s, drafter_s = (measure or time_steps)(target, drafter)
        c = round(drafter_s / target_s, 3)
        return c, (f"one-token steps: target {target_s * 1e3:.1f} ms, drafter ({runtime}) {drafter_s * 1e3:.1f} "
                   f"ms: c = {c:g}")

    return _remembered(pair_key(target, drafter, runtime), compute,
                       "the drafter's cost per step against the target's", "the models' steps",
                       "the cost ratio of its runtime (hf_hetspec.schedule.COST_RATIOS)")


def _remembered(key: str, compute, what: str, timed: str, fallback: str) -> float | None:
    """The value stored under ``key`` (this process's memory, else :data:`CACHE_FILE`), else ``compute()``'s
    ``(value, line)``, announced and stored; ``None`` (with a warning naming ``timed`` and ``fallback``) when
    ``compute`` raises."""
    if key in _MEMORY:
        return _MEMORY[key]
    path = cache_root() / CACHE_FILE
    stored = _read(path)
    if key in stored:
        _MEMORY[key] = stored[key]
        return stored[key]
    status(f"measuring {what} on this machine (once) ...")
    try:
        value, line = compute()
    except Exception as err:  # an unusual forward: the table's value stands
        warnings.warn(f"hf_hetspec could not time {timed} ({type(err).__name__}: {err}); it counts {fallback}")
        return None
    status(f"{line} (stored in {path})")
    _MEMORY[key] = value
    stored[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(stored, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache: this process keeps the value, the next one measures again
    return value


def time_forwards(target: torch.nn.Module) -> dict[int, float]:
    """``{tokens: seconds}``: the fastest of :data:`REPEATS` forwards of 1 and of each of :data:`PROBE_WIDTHS`
    tokens after the same :data:`PROBE_CONTEXT`-token prompt (:func:`_fastest_feeds`)."""
    return _fastest_feeds(target, (1, *PROBE_WIDTHS), REPEATS)


def time_steps(target: torch.nn.Module, drafter: torch.nn.Module) -> tuple[float, float]:
    """``(target seconds, drafter seconds)``: the fastest of :data:`STEP_REPEATS` one-token steps of each model
    after the same :data:`PROBE_CONTEXT`-token prompt (:func:`_fastest_feeds`; the drafter in the cache its
    runtime keeps, e.g. the compiled step's)."""
    return _fastest_feeds(target, (1,), STEP_REPEATS)[1], _fastest_feeds(drafter, (1,), STEP_REPEATS)[1]


def _fastest_feeds(model: torch.nn.Module, widths: tuple[int, ...], repeats: int) -> dict[int, float]:
    """``{tokens: seconds}``: the fastest of ``repeats`` forwards of each width after :data:`PROBE_CONTEXT` fixed
    pseudo-random tokens (below the model's vocabulary size) in the model's cache -- its own where it keeps one
    (``new_cache``), else transformers' -- rolled back to the prompt after each; timed to the device's
    synchronization (:func:`synchronize`)."""
    device = model_device(model)
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = torch.randint(vocab, (1, PROBE_CONTEXT + max(widths)), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)
    cache = model.new_cache() if hasattr(model, "new_cache") else None
    seconds = {}
    with torch.inference_mode():
        prompt_kwargs = cache_kwargs(model, cache) if cache is not None else {}
        out = model(ids[:, :PROBE_CONTEXT], use_cache=True, **prompt_kwargs)
        cache = output_cache(out) if cache is None else cache
        for width in widths:
            best = math.inf
            for _ in range(repeats):
                synchronize(device)
                start = time.perf_counter()
                model(ids[:, PROBE_CONTEXT:PROBE_CONTEXT + width], use_cache=True, logits_to_keep=width,
                      **cache_kwargs(model, cache))
                synchronize(device)
                best = min(best, time.perf_counter() - start)
                rollback_cache(cache, PROBE_CONTEXT)
            seconds[width] = best
    return seconds


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a GPU's kernels run after the Python call returns); nothing on a CPU.
    Every timing of hf_hetspec and its tools ends with it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type != "cpu" and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize(device)


def _read(path) -> dict[str, float]:
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(stored, dict):
        return {}
    return {k: float(v) for k, v in stored.items() if isinstance(v, (int, float)) and math.isfinite(v) and v >= 0}


@functools.cache
def cpu_name() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``), else what :mod:`platform` tells; read once per process."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
