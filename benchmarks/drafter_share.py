"""What a free drafter would give: per task, the measured speedup of a suite run and the speedup had the drafter
cost nothing, from an ``hf-hetspec bench`` result (``bench.json``).

Every hf_hetspec call records its drafter seconds (``stats.drafter_s``: drafts, and the prefill of the
drafter's prompt, also where it ran beside the target's). Removing them from the call's seconds, with the
acceptance and everything else as measured, gives an upper bound on what a cheaper drafter step can buy
(Leviathan et al. 2023, Section 3.4: ``c`` -> 0); what is left above it is the target's forwards, which only a
higher acceptance rate shortens. The bound is loose where the drafter prefilled beside the target (prompts of
``hf_hetspec.decoding.OVERLAP_PREFILL_MIN`` drafter tokens or more: summarization, RAG), as those seconds were not
all on the call's critical path. Speedups are tokens/s over the target alone's on the same prompts and seeds;
the geometric mean is over the six Spec-Bench categories::

    python benchmarks/drafter_share.py benchmarks/results/suite-report-2026-12-03/bench.json
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict

CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bench_json")
    parser.add_argument("--prompts", type=int, default=None, help="only the first N prompts of each task")
    args = parser.parse_args()
    run = json.load(open(args.bench_json))
    kept = {task: ids[: args.prompts] for task, ids in run["config"]["prompt_ids"].items()}
    sums: dict = defaultdict(lambda: defaultdict(float))
    for record in run["records"]:
        if record.get("sweep") or record["prompt_id"] not in kept.get(record["task"], ()):
            continue
        total = sums[(record["task"], record["temperature"])]
        if record["method"] == "target":
            total["target_tokens"] += record["new_tokens"]
            total["target_s"] += record["seconds"]
        elif record["method"] == "hf_hetspec":
            total["tokens"] += record["new_tokens"]
            total["seconds"] += record["seconds"]
            total["drafter_s"] += record["stats"]["drafter_s"]
            total["forwards"] += record["stats"]["target_forwards"]
    print(f"{'task':<16} {'T':>3} {'speedup':>8} {'drafter free':>13} {'drafter share':>14} {'tokens/forward':>15}")
    for temperature in sorted({t for _, t in sums}):
        measured, free = [], []
        for task in (*CATEGORIES, *sorted({k for k, _ in sums} - set(CATEGORIES))):
            total = sums.get((task, temperature))
            if not total or not total["target_s"] or not total["seconds"]:
                continue
            alone = total["target_tokens"] / total["target_s"]
            speedup = total["tokens"] / total["seconds"] / alone
            freed = total["tokens"] / (total["seconds"] - total["drafter_s"]) / alone
            share = total["drafter_s"] / total["seconds"]
            print(f"{task:<16} {temperature:>3g} {speedup:>7.2f}x {freed:>12.2f}x {share:>13.0%} "
                  f"{total['tokens'] / total['forwards']:>15.2f}")
            if task in CATEGORIES:
                measured.append(speedup)
                free.append(freed)
        if len(measured) == len(CATEGORIES):
            mean = lambda values: math.exp(sum(map(math.log, values)) / len(values))  # noqa: E731
            print(f"{'Spec-Bench geomean':<20} {mean(measured):>6.2f}x {mean(free):>12.2f}x")


if __name__ == "__main__":
    main()
