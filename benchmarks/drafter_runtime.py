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

On a GPU (``--device cuda``; every step is timed to a ``torch.cuda.synchronize()``), with the models given as
folders (``benchmarks/gpu_check.sh`` passes stand-ins of the zoo pair) and ``--verify-widths``, it also times the
target's forwards of 1, 2, 4, ... tokens (a verification of that many) and prints ``v``, the single-token
forwards one more verified token adds (:data:`hf_hetspec.schedule.VERIFY_COSTS`); ``--json`` writes every median::

    python benchmarks/drafter_runtime.py DRAFTER_DIR --target TARGET_DIR --device cuda \\
        --runtimes compiled --verify-widths 1 2 4 8 16 --json costs.json
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import statistics
import time

import torch
from transformers import DynamicCache

from hf_hetspec.calibration import synchronize
from hf_hetspec.compat import cache_kwargs
from hf_hetspec.drafter import rollback_cache
from hf_hetspec.runtime import RUNTIMES, model_bytes, prepare_drafter


def _step_timer(model, context: torch.Tensor, width: int = 1):
    """A function timing one forward of ``width`` tokens after ``context`` (the cache is rolled back after each),
    in seconds, to the device's synchronization; ``width`` > 1 keeps every position's logits, as a verification."""
    cache = model.new_cache() if hasattr(model, "new_cache") else DynamicCache()
    with torch.no_grad():
        model(input_ids=context, use_cache=True, **cache_kwargs(model, cache))
    n = context.shape[1]
    tokens = context[:, -width:]

    def step() -> float:
        with torch.no_grad():
            synchronize(context.device)
            start = time.perf_counter()
            model(input_ids=tokens, use_cache=True, logits_to_keep=width, **cache_kwargs(model, cache))
            synchronize(context.device)
            seconds = time.perf_counter() - start
        rollback_cache(cache, n)
        return seconds

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drafter", help="zoo name or folder of the drafter")
    parser.add_argument("--target", default=None,
                        help="zoo name or folder of the target (bf16): prints c per runtime")
    parser.add_argument("--device", default="cpu", help="where the models run (default cpu; e.g. cuda)")
    parser.add_argument("--verify-widths", nargs="+", type=int, default=None, metavar="K",
                        help="also time the target's forwards of K tokens (needs --target) and print v")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the medians (seconds) there")
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

    device = torch.device(args.device)
    drafter, _ = zoo.load(args.drafter, dtype=torch.bfloat16, device=device)
    context = torch.randint(100, 1000, (1, args.context), device=device)
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
    if importlib.util.find_spec("torchao") is not None and not args.runtimes and device.type == "cpu":
        from torchao.quantization import (Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig,
                                          quantize_)

        for name, config in (("torchao-int8-dyn", Int8DynamicActivationInt8WeightConfig),
                             ("torchao-int8-wo", Int8WeightOnlyConfig)):
            start = time.perf_counter()
            models[name] = copy.deepcopy(models["float32"])
            quantize_(models[name], config())
            prepare[name] = time.perf_counter() - start
    if args.target:
        target, _ = zoo.load(args.target, dtype=torch.bfloat16, device=device)
        models["target-bf16"], prepare["target-bf16"] = target, 0.0

    timers = {name: _step_timer(model, context) for name, model in models.items()}
    widths = [k for k in args.verify_widths or () if k > 1] if args.target else []
    for k in widths:
        timers[f"target-bf16-{k}"] = _step_timer(models["target-bf16"], context, width=k)
    for timer in timers.values():  # warm-up
        timer()
    times: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(args.steps):
        for name, timer in timers.items():
            times[name].append(timer())

    eager = statistics.median(times["eager-bf16"])
    target_step = statistics.median(times["target-bf16"]) if args.target else None
    print(f"{args.drafter}, {args.context}-token context, {args.steps} steps each, {args.threads} thread(s), "
          "interleaved; medians")
    print(f"{'runtime':<18} {'step ms':>8} {'vs eager':>9} {'memory MiB':>11} {'prepare s':>10}"
          + (f" {'c':>6}" if target_step else ""))
    for name in models:
        median = statistics.median(times[name])
        memory = model_bytes(models[name]) / 2**20
        line = f"{name:<18} {1000 * median:8.1f} {eager / median:8.2f}x {memory:11.1f} {prepare[name]:10.2f}"
        if target_step:
            line += f" {median / target_step:6.3f}"
        print(line)
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    if widths:
        print(f"target forwards of k tokens after the context (a verification of k): ms, and v = (t_k / t_1 - 1) "
              f"/ (k - 1)")
        for k in widths:
            t_k = medians[f"target-bf16-{k}"]
            print(f"  k={k:<3} {1000 * t_k:8.2f} ms  v {(t_k / target_step - 1) / (k - 1):.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "device_name": torch.cuda.get_device_name(device)
                       if device.type == "cuda" else None, "context": args.context, "steps": args.steps,
                       "median_seconds": medians, "prepare_seconds": prepare,
                       "torch": torch.__version__}, f, indent=1)
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
