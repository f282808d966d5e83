"""Drafts with and without sibling branches (``Schedule.sibling_min_joint``, hf_hetspec/tree.py), interleaved per
prompt against the target alone: SLEM's (or ``--algorithm`` TLI's or SLRS's argmax drafts), the default
schedule of the drafter runtime that runs, with only the sibling cut-off changed (0 = chains only).

    python benchmarks/sibling_drafts.py --tasks translation qa mt_bench math_reasoning rag summarization \\
        --prompts 2 --half tune --cut-offs 0 0.01 0.03 [--runner-ups 1 2] [--temperature 0] [--seeds 3] \\
        [--threads 1]

Prints one line per prompt (seconds of the target alone; per cut-off: speedup, greedy verdict against the target
alone (``compare_greedy``: identical, tie, different), target tokens per forward, tree rounds / forwards, sibling
nodes, rounds that left the chain; the 1-minute load average) and the geometric mean per cut-off (and per
``--runner-ups`` value, ``Schedule.sibling_runner_ups``). Measured
2026-12-02 (docs/results.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import statistics
import time

import torch

import hf_hetspec
from hf_hetspec.runtime import prepare_drafter
from hf_hetspec.schedule import choose_schedule
from hf_hetspec.testing import compare_greedy
from hf_hetspec.tools import zoo
from hf_hetspec.tools.tasks import DEFAULT_SPEC_BENCH, SPEC_BENCH_CATEGORIES, chat_ids, load_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(SPEC_BENCH_CATEGORIES))
    parser.add_argument("--prompts", type=int, default=2, help="per task")
    parser.add_argument("--half", default="tune")
    parser.add_argument("--cut-offs", type=float, nargs="+", default=[0.0, 0.03])
    parser.add_argument("--runner-ups", type=int, nargs="+", default=None,
                        help="Schedule.sibling_runner_ups values to run each cut-off with (runner-ups per draft "
                             "position; default: the call's default schedule's)")
    parser.add_argument("--algorithm", default="slem", choices=["slem", "tli", "slrs"],
                        help="the algorithm whose drafts carry the siblings (TLI, SLRS: beside their argmax drafts)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seeds", type=int, default=1,
                        help="sampled calls: run every variant with seeds 0 .. N-1 (its text changes with the seed)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, ttok = zoo.load("qwen2.5-coder-1.5b-instruct", dtype=torch.bfloat16)
    drafter, dtok = zoo.load("smollm2-135m-instruct", dtype=torch.bfloat16)
    runtime = prepare_drafter(drafter, "auto").runtime  # made once, before any timed call
    sample = args.temperature > 0
    base = choose_schedule(args.algorithm, drafter_runtime=runtime, sample=sample)
    runner_ups = args.runner_ups or [base.sibling_runner_ups]
    prompts, _ = load_prompts(args.tasks, {t: args.prompts for t in args.tasks}, DEFAULT_SPEC_BENCH, "local",
                              (False, "local files"), half=args.half)
    common = dict(max_new_tokens=args.max_new_tokens, do_sample=sample)
    if sample:
        common["temperature"] = args.temperature

    def seeded(seed):
        return torch.Generator().manual_seed(seed) if sample else None

    seeds = range(args.seeds if sample else 1)  # a sampled call's text, and so its speed, changes with the seed
    variants = [(c, r) for c in args.cut_offs for r in runner_ups]
    speedups = {v: [] for v in variants}
    for prompt in prompts:
        ids = chat_ids(ttok, [{"role": "user", "content": prompt.turns[0]}], prompt.chat)  # plain for completion
        kw = dict(attention_mask=torch.ones_like(ids), **common)
        hf_hetspec.disable(target)
        torch.manual_seed(0)
        start = time.perf_counter()
        want = target.generate(ids, **kw)
        alone = time.perf_counter() - start
        hf_hetspec.enable(target)
        line = f"{prompt.task:14s} {prompt.prompt_id:16s} alone {alone:5.1f}s"
        for seed, (cut_off, count) in itertools.product(seeds, variants):
            schedule = dataclasses.replace(base, sibling_min_joint=cut_off, sibling_runner_ups=count)
            start = time.perf_counter()
            out = target.generate(ids, assistant_model=drafter, tokenizer=ttok, assistant_tokenizer=dtok,
                                  hetspec_algorithm=args.algorithm, hetspec_schedule=schedule,
                                  hetspec_generator=seeded(seed), **kw)
            seconds = time.perf_counter() - start
            stats = hf_hetspec.last_stats(target)
            # sampled outputs differ by design: compare tokens/s there, greedy outputs token for token
            ratio = (stats.new_tokens / seconds) / ((want.shape[1] - ids.shape[1]) / alone)
            speedups[cut_off, count].append(ratio)
            verdict = "sampled" if sample else compare_greedy(target, ids, want, out).verdict
            label = f"{cut_off}" if len(runner_ups) == 1 else f"{cut_off}/{count}"
            label += f" seed {seed}" if len(seeds) > 1 else ""
            line += (f" | {label}: {ratio:4.2f}x {verdict} tpf {stats.mean_accepted_per_forward:.2f} "
                     f"tree {stats.tree_rounds}/{stats.target_forwards} nodes {stats.tree_nodes} "
                     f"left {stats.sibling_rounds}")
        print(line, f"load {os.getloadavg()[0]:.2f}", flush=True)
    for (cut_off, count), values in speedups.items():
        print(f"cut-off {cut_off}, runner-ups {count}: geomean {statistics.geometric_mean(values):.3f}x "
              f"over {len(values)} calls ({len(prompts)} prompts x {len(seeds)} seeds)")


if __name__ == "__main__":
    main()
