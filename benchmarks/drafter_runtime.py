"""Step cost of each drafter runtime (:mod:`hf_hetspec.runtime`), measured interleaved in one process.

For a zoo drafter loaded in bf16, times one-token drafter steps after a ``--context``-token prefill for each
runtime -- round-robin, one step of each runtime per round, so a load change on a shared machine hits all of
them alike -- and prints the median step, its ratio to eager bf16, the copy's memory and its preparation
time. ``--target`` also times the target's one-token step (in the dtype it was loaded in) and prints the cost
ratio ``c`` = drafter step / target step per runtime. When torchao is installed its int8 configurations
(``Int8DynamicActivationInt8WeightConfig``, ``Int8WeightOnlyConfig``) are measured for comparison with the
``int8`` runtime (PyTorch's dynamic quantization); they are not runtime choices.

    PYTHONPATH=. python benchmarks/drafter_runtime.py smollm2-135m-instruct \\
        --target qwen2.5-coder-1.5b-instruct --threads 1

``--two-threads RUNTIME`` also steps two drafter contexts of that runtime on two Python threads at once, against
the same steps in turn: whether the rows of a batch could draft in parallel on a second core.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import statistics
import time

import torch
from transformers import DynamicCache

from hf_hetspec.compat import cache_kwargs
from hf_hetspec.drafter import rollback_cache
from hf_hetspec.runtime import RUNTIMES, model_bytes, prepare_drafter


def _step_timer(model, context: torch.Tensor):
    """A function timing one one-token forward after ``context`` (the cache is rolled back after each)."""
    cache = model.new_cache() if hasattr(model, "new_cache") else DynamicCache()
    with torch.no_grad():
        model(input_ids=context, use_cache=True, **cache_kwargs(model, cache))
    n = context.shape[1]
    token = context[:, -1:]

    def step() -> float:
        with torch.no_grad():
            start = time.perf_counter()
            model(input_ids=token, use_cache=True, logits_to_keep=1, **cache_kwargs(model, cache))
            seconds = time.perf_counter() - start
        rollback_cache(cache, n)
        return seconds

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drafter", help="zoo name of the drafter")
    parser.add_argument("--target", default=None, help="zoo name of the target (bf16): prints c per runtime")
    parser.add_argument("--context", type=int, default=200, help="prefilled tokens (default 200)")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per runtime (default 40)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runtimes", nargs="+", default=None, metavar="RUNTIME",
                        help="only these runtimes beside eager bf16 (default: all, and torchao's int8 configurations)")
    parser.add_argument("--two-threads", metavar="RUNTIME", default=None,
                        choices=("eager-bf16", "float32", "int8", "int8-static"),
                        help="also time two drafter contexts of RUNTIME stepping on two Python threads at once "
                             "against the same steps in turn (can rows of a batch draft in parallel?); not "
                             "'compiled', whose contexts share one cache")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from hf_hetspec.tools import zoo

    drafter, _ = zoo.load(args.drafter, dtype=torch.bfloat16)
    context = torch.randint(100, 1000, (1, args.context))
    models, prepare = {"eager-bf16": drafter}, {"eager-bf16": 0.0}
    for runtime in RUNTIMES:
        if runtime in ("auto", "eager") or (args.runtimes and runtime not in args.runtimes):
            continue
        try:
            prepared = prepare_drafter(drafter, runtime)
        except ValueError as err:  # e.g. int8-static for a drafter outside its decoder family
            print(f"{runtime}: {err}")
            continue
        models[runtime], prepare[runtime] = prepared.model, prepared.prepare_s
    if importlib.util.find_spec("torchao") is not None and not args.runtimes:
        from torchao.quantization import (Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig,
                                          quantize_)

        for name, config in (("torchao-int8-dyn", Int8DynamicActivationInt8WeightConfig),
                             ("torchao-int8-wo", Int8WeightOnlyConfig)):
            start = time.perf_counter()
            models[name] = copy.deepcopy(models["float32"])
            quantize_(models[name], config())
            prepare[name] = time.perf_counter() - start
    if args.target:
        target, _ = zoo.load(args.target, dtype=torch.bfloat16)
        models["target-bf16"], prepare["target-bf16"] = target, 0.0

    timers = {name: _step_timer(model, context) for name, model in models.items()}
    for timer in timers.values():  # warm-up
        timer()
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.steps):
        for name, timer in timers.items():
            times[name].append(timer())

    eager = statistics.median(times["eager-bf16"])
    target_step = statistics.median(times["target-bf16"]) if args.target else None
    print(f"{args.drafter}, {args.context}-token context, {args.steps} steps each, {args.threads} thread(s), "
          "interleaved; medians")
    print(f"{'runtime':<18} {'step ms':>8} {'vs eager':>9} {'memory MiB':>11} {'prepare s':>10}"
          + (f" {'c':>6}" if target_step else ""))
    for name, samples in times.items():
        median = statistics.median(samples)
        memory = model_bytes(models[name]) / 2**20
        line = f"{name:<18} {1000 * median:8.1f} {eager / median:8.2f}x {memory:11.1f} {prepare[name]:10.2f}"
        if target_step:
            line += f" {median / target_step:6.3f}"
        print(line)
    if args.two_threads in models:
        _two_threads(models[args.two_threads], context, args.steps)
    elif args.two_threads:
        print(f"--two-threads {args.two_threads}: that runtime was not measured (see --runtimes)")


def _two_threads(model, context: torch.Tensor, steps: int, repeats: int = 3) -> None:
    """Print the wall time of ``steps`` one-token steps in each of two drafter contexts run in turn, and run on two
    Python threads at once (PyTorch's intra-op threads as set), ``repeats`` times each way, interleaved."""
    from concurrent.futures import ThreadPoolExecutor

    timers = [_step_timer(model, context), _step_timer(model, context)]

    def run(timer) -> None:
        for _ in range(steps):
            timer()

    print(f"two contexts, {steps} steps each: in turn / on two threads at once")
    with ThreadPoolExecutor(max_workers=2) as pool:
        for _ in range(repeats):
            start = time.perf_counter()
            for timer in timers:
                run(timer)
            in_turn = time.perf_counter() - start
            start = time.perf_counter()
            list(pool.map(run, timers))
            together = time.perf_counter() - start
            print(f"  {1000 * in_turn:.0f} ms / {1000 * together:.0f} ms ({together / in_turn:.2f})")


if __name__ == "__main__":
    main()
