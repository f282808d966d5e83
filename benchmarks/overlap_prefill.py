"""Does prefilling the drafter on the second core pay, and from how many prompt tokens on? hf_hetspec with the
overlapped prefill from several thresholds.

With a free core on a CPU, :func:`hf_hetspec.decoding.speculative_generate` lets the drafter prefill its prompt on
a second thread while the target prefills its own, when the drafter has at least ``OVERLAP_PREFILL_MIN`` tokens to
prefill; the target's first forward is then split in two (one more pass over its weights). This script times,
interleaved per prompt (and seed), the target alone and hf_hetspec with each ``--thresholds`` value of
``OVERLAP_PREFILL_MIN`` (``0``: every prompt overlaps; a huge value: none does), and prints per run the seconds,
the time to the first new token and the prompt's length, then per threshold the geometric mean of the speedups and
how much later than the target alone's the first token came, on average::

    PYTHONPATH=. python benchmarks/overlap_prefill.py --tasks code code_completion math_reasoning qa \\
        --prompts 2 --half tune --thresholds 384 64

The second thread also makes the first draft (it depends on the prompt alone); ``--prefill-only`` adds, for each
threshold, a run whose second thread only prefills (the first draft made after the target's prefill, as before
2026-12-03). Measured 2026-12-03 (docs/results.md).
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch

from hf_hetspec import decoding
from hf_hetspec.runtime import prepare_drafter
from hf_hetspec.tools import zoo
from hf_hetspec.tools.runner import Runner
from hf_hetspec.tools.tasks import DEFAULT_SPEC_BENCH, chat_ids, load_prompts


def _prefill_only(proposer, ids):
    """The second thread's work before 2026-12-03: the drafter's prefill alone (the loop then drafts)."""
    proposer.prefill_drafter()
    return None


def _label(threshold: int, first_draft: bool) -> str:
    return f">={threshold}" + ("" if first_draft else " prefill only")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--drafter", default="smollm2-135m-instruct")
    parser.add_argument("--tasks", nargs="+", default=["summarization"])
    parser.add_argument("--prompts", type=int, default=3, help="per task")
    parser.add_argument("--half", default="tune", choices=["tune", "report", "all"])
    parser.add_argument("--thresholds", type=int, nargs="+", default=[decoding.OVERLAP_PREFILL_MIN, 10**9],
                        help="OVERLAP_PREFILL_MIN values to run (default: the current one and never)")
    parser.add_argument("--prefill-only", action="store_true",
                        help="also each threshold with the first draft made after the target's prefill")
    parser.add_argument("--algorithm", default="slem")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seeds", type=int, default=1, help="sampled calls: seeds 0 .. N-1")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    target, target_tok = zoo.load(args.target, dtype=torch.bfloat16)
    drafter, drafter_tok = zoo.load(args.drafter, dtype=torch.bfloat16)
    prepare_drafter(drafter, "auto")  # the int8 copy, made once before any timed call
    sample = args.temperature > 0
    prompts, _ = load_prompts(args.tasks, {t: args.prompts for t in args.tasks}, DEFAULT_SPEC_BENCH, "local",
                              (False, "local files"), half=args.half)
    default, beside = decoding.OVERLAP_PREFILL_MIN, decoding._prefill_and_draft
    variants = [(t, True) for t in args.thresholds] + [(t, False) for t in args.thresholds if args.prefill_only]
    speedups = {v: [] for v in variants}
    ttfts = {v: [] for v in variants}
    warm = Runner(target, target_tok, drafter, drafter_tok, algorithm=args.algorithm, max_new_tokens=8)
    warm.hetspec(chat_ids(target_tok, [{"role": "user", "content": "Hello"}], True))  # first-call costs, untimed
    for number, prompt in enumerate(prompts):
        ids = chat_ids(target_tok, [{"role": "user", "content": prompt.turns[0]}], prompt.chat)
        for seed in range(args.seeds if sample else 1):
            runner = Runner(target, target_tok, drafter, drafter_tok, algorithm=args.algorithm,
                            max_new_tokens=args.max_new_tokens, do_sample=sample,
                            temperature=args.temperature if sample else None, seed=seed)
            alone = runner.target_alone(ids)
            line = (f"{prompt.task:15s} {prompt.prompt_id:16s} seed {seed} ({ids.shape[1]:4d} prompt tokens) "
                    f"alone {alone.seconds:5.1f}s ttft {alone.ttft_seconds:.2f}")
            order = variants if number % 2 == 0 else variants[::-1]  # no variant always runs first
            for threshold, first_draft in order:
                decoding.OVERLAP_PREFILL_MIN = threshold
                if not first_draft:
                    decoding._prefill_and_draft = _prefill_only
                try:
                    run = runner.hetspec(ids)
                finally:
                    decoding.OVERLAP_PREFILL_MIN, decoding._prefill_and_draft = default, beside
                ratio = (run.new_tokens / run.seconds) / (alone.new_tokens / alone.seconds)
                speedups[(threshold, first_draft)].append(ratio)
                ttfts[(threshold, first_draft)].append(run.ttft_seconds - alone.ttft_seconds)
                line += f" | {_label(threshold, first_draft)}: {ratio:4.2f}x ttft {run.ttft_seconds:.2f}"
            print(line, f"load {os.getloadavg()[0]:.2f}", flush=True)
    for variant, values in speedups.items():
        print(f"OVERLAP_PREFILL_MIN {_label(*variant)}: geomean {statistics.geometric_mean(values):.3f}x over "
              f"{len(values)} calls; first token {statistics.mean(ttfts[variant]):+.3f} s after the target "
              "alone's on average")


if __name__ == "__main__":
    main()
