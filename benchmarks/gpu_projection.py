"""What a GPU's step costs would make of a CPU run's acceptance: a projection, not a measurement.

A lent GPU machine has no internet and no room for the zoo's weights, so ``gpu_check.sh`` times stand-ins of the
zoo pair (random weights: real step costs, no real acceptance). Acceptance is a property of the two models, not of
the hardware, so this script combines both: for each hf_hetspec call of a CPU ``bench.json`` of the real pair it
takes the call's target forwards ``F``, drafter forwards ``D``, new tokens ``N`` and accepted drafts ``A``, and for
the GPU the median step costs of ``drafter_runtime.py --json`` (``costs.json``): the target's one-token forward
``t1``, its verification forward ``tv`` (the median over the widths measured, 2-16 tokens: flat on a GPU), and the
drafter step ``td`` of ``--runtime``. The projected call takes ``F tv + (D + N - A) td`` (every forward a step, and
the tokens the drafter did not draft itself fed one step each, as the compiled runtime does on CUDA), the target
alone ``N t1``. Per-round work of hf_hetspec's own loop is left out: with no drafts its forwards took what the
target alone's did on the H200 (benchmarks/results/gpu-h200-standin-2026-12-04/run2, eager).

    python benchmarks/gpu_projection.py results/avx2-float32-packed-suite-greedy-1prompt/bench.json \\
        results/gpu-h200-standin-2026-12-04/run1/costs.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bench", help="a CPU bench.json of the real pair (hf_hetspec rows)")
    parser.add_argument("costs", help="costs.json of drafter_runtime.py --json on the GPU")
    parser.add_argument("--runtime", default="compiled", help="the drafter runtime's step in costs.json")
    args = parser.parse_args()
    with open(args.bench) as f:
        bench = json.load(f)
    with open(args.costs) as f:
        costs = json.load(f)
    steps = costs["median_seconds"]
    t1, td = steps["target-bf16"], steps[args.runtime]
    tv = statistics.median(v for k, v in steps.items() if k.startswith("target-bf16-"))
    print(f"GPU ({costs.get('device_name')}): target one token {t1 * 1e3:.1f} ms, verification {tv * 1e3:.1f} ms, "
          f"drafter ({args.runtime}) {td * 1e3:.2f} ms; acceptance from {args.bench}")
    per_task: dict[tuple, list[float]] = defaultdict(list)
    for record in bench["records"]:
        if record["method"] != "hf_hetspec" or not record["new_tokens"]:
            continue
        n, f, d, a = (record[k] for k in ("new_tokens", "target_forwards", "drafter_forwards", "accepted_tokens"))
        projected = f * tv + (d + n - a) * td
        per_task[(record["task"], record["temperature"])].append(n * t1 / projected)
    print(f"{'task':<18} {'T':>3} {'calls':>5} {'projected speedup (geomean)':>28}")
    for (task, temperature), speedups in per_task.items():
        geomean = math.exp(statistics.fmean(math.log(s) for s in speedups))
        print(f"{task:<18} {temperature:>3g} {len(speedups):>5} {geomean:>27.2f}x")


if __name__ == "__main__":
    main()
