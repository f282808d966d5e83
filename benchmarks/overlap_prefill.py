"""Does prefilling the drafter on the second core pay? hf_hetspec with and without the overlapped prefill.

With a long prompt on a CPU with a free core, :func:`hf_hetspec.decoding.speculative_generate` lets the drafter
prefill its prompt on a second thread while the target prefills its own (``OVERLAP_PREFILL_MIN`` drafter
tokens or more). This script times, interleaved per prompt, the target alone and hf_hetspec with the overlap
(``on``) and without it (``off``: the threshold set out of reach), on Spec-Bench summarization prompts (long
ones; HumanEval's chat prompts stay below the threshold), greedy, and prints per-run seconds, time to the
first new token and the sums::

    PYTHONPATH=. python benchmarks/overlap_prefill.py --prompts 3
"""

from __future__ import annotations

import argparse

import torch

from hf_hetspec import decoding
from hf_hetspec.tools import zoo
from hf_hetspec.tools.runner import Runner
from hf_hetspec.tools.tasks import DEFAULT_SPEC_BENCH, chat_ids, read_spec_bench, spec_bench_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--drafter", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=3, help="summarization prompts (default 3)")
    parser.add_argument("--algorithm", default="slem")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    target, target_tok = zoo.load(args.target, dtype=torch.bfloat16)
    drafter, drafter_tok = zoo.load(args.drafter, dtype=torch.bfloat16)
    runner = Runner(target, target_tok, drafter, drafter_tok, algorithm=args.algorithm,
                    max_new_tokens=args.max_new_tokens)
    prompts = spec_bench_prompts(read_spec_bench(DEFAULT_SPEC_BENCH), "summarization", args.prompts)
    threshold = decoding.OVERLAP_PREFILL_MIN
    totals = {"target": [0, 0.0], "on": [0, 0.0], "off": [0, 0.0]}
    runner.hetspec(chat_ids(target_tok, [{"role": "user", "content": "Hello"}], True), 4)  # the copy, once
    for prompt in prompts:
        ids = chat_ids(target_tok, [{"role": "user", "content": prompt.turns[0]}], True)
        for name in totals:
            decoding.OVERLAP_PREFILL_MIN = threshold if name == "on" else 10**9
            run = runner.target_alone(ids) if name == "target" else runner.hetspec(ids)
            totals[name][0] += run.new_tokens
            totals[name][1] += run.seconds
            print(f"{prompt.prompt_id} ({ids.shape[1]} prompt tokens) {name}: {run.new_tokens} tokens in "
                  f"{run.seconds:.1f} s, first token after {run.ttft_seconds:.1f} s", flush=True)
    decoding.OVERLAP_PREFILL_MIN = threshold
    base = totals["target"][0] / totals["target"][1]
    for name, (tokens, seconds) in totals.items():
        print(f"{name}: {tokens / seconds:.2f} tokens/s, {tokens / seconds / base:.2f}x the target alone")


if __name__ == "__main__":
    main()
