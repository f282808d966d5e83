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
from collections import defaultdict
from pathlib import Path

from hf_hetspec.tools.bench import aggregate, geometric_mean
from hf_hetspec.tools.tasks import SPEC_BENCH_CATEGORIES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bench_json")
    parser.add_argument("--prompts", type=int, default=None, help="only the first N prompts of each task")
    args = parser.parse_args()
    run = json.loads(Path(args.bench_json).read_text())
    kept = {task: ids[: args.prompts] for task, ids in run["config"]["prompt_ids"].items()}
    groups: dict = defaultdict(list)
    for record in run["records"]:
        if (not record.get("sweep") and record["method"] in ("target", "hf_hetspec")
                and record["prompt_id"] in kept.get(record["task"], ())):
            groups[(record["task"], record["temperature"], record["method"])].append(record)
    totals = {key: aggregate(records) for key, records in groups.items()}  # bench.json's own totals
    tasks = [*SPEC_BENCH_CATEGORIES, *sorted({task for task, _, _ in totals} - set(SPEC_BENCH_CATEGORIES))]
    print(f"{'task':<16} {'T':>3} {'speedup':>8} {'drafter free':>13} {'drafter share':>14} {'tokens/forward':>15}")
    for temperature in sorted({t for _, t, _ in totals}):
        measured, free = [], []
        for task in tasks:
            alone, ours = totals.get((task, temperature, "target")), totals.get((task, temperature, "hf_hetspec"))
            if not alone or not ours or not alone["seconds"] or not ours["seconds"]:
                continue
            speedup = ours["tokens_per_second"] / alone["tokens_per_second"]
            freed = ours["new_tokens"] / (ours["seconds"] - ours["drafter_s"]) / alone["tokens_per_second"]
            share = ours["drafter_s"] / ours["seconds"]
            print(f"{task:<16} {temperature:>3g} {speedup:>7.2f}x {freed:>12.2f}x {share:>13.0%} "
                  f"{ours['tokens_per_forward']:>15.2f}")
            if task in SPEC_BENCH_CATEGORIES:
                measured.append(speedup)
                free.append(freed)
        if len(measured) == len(SPEC_BENCH_CATEGORIES):
            print(f"{'Spec-Bench geomean':<20} {geometric_mean(measured):>6.2f}x {geometric_mean(free):>12.2f}x")


if __name__ == "__main__":
    main()
