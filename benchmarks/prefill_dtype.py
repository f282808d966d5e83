"""The int8 drafter runtimes' float prefill in float32 against bf16 (``hf_hetspec.runtime.prefill_dtype``), end to
end: hf_hetspec greedy SLEM on the tuning half's first prompt of every suite task, the two drafter copies
interleaved per prompt, against the target alone; plus the drafter's prefill seconds for 150 and 1000 tokens.

    python benchmarks/prefill_dtype.py --threads 1 [--prompts 1] [--max-new-tokens 64]

Prints one line per call (TTFT, seconds, drafter seconds, output identical to the target alone) and the
medians. Measured 2026-12-02 (docs/results.md).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch

import hf_hetspec
from hf_hetspec import runtime
from hf_hetspec.tools import zoo
from hf_hetspec.tools.runner import FirstTokenTimer
from hf_hetspec.tools.tasks import DEFAULT_SPEC_BENCH, HUMANEVAL_TASKS, SPEC_BENCH_CATEGORIES, chat_ids, load_prompts


def prepared(drafter, dtype):
    """A copy of ``drafter`` whose int8-static copy keeps its float projections in ``dtype``."""
    model = copy.deepcopy(drafter)
    saved = runtime.prefill_dtype
    runtime.prefill_dtype = lambda: dtype
    try:
        runtime.prepare_drafter(model, "int8-static")
    finally:
        runtime.prefill_dtype = saved
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=1, help="per task, tuning half")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, ttok = zoo.load("qwen2.5-coder-1.5b-instruct", dtype=torch.bfloat16)
    drafter, dtok = zoo.load("smollm2-135m-instruct", dtype=torch.bfloat16)
    copies = {"float32": prepared(drafter, None), "bf16": prepared(drafter, torch.bfloat16)}

    with torch.inference_mode():  # the drafter's prefill alone
        for name, model in copies.items():
            static = runtime.prepare_drafter(model, "int8-static").model
            for n in (150, 1000):
                ids = torch.randint(100, 40000, (1, n))
                times = []
                for _ in range(3):
                    cache = static.new_cache()
                    start = time.perf_counter()
                    static(ids, cache=cache)
                    times.append(time.perf_counter() - start)
                print(f"prefill {name} {n} tokens: {min(times) * 1000:.0f} ms", flush=True)

    tasks = [*SPEC_BENCH_CATEGORIES, *HUMANEVAL_TASKS]
    prompts, _ = load_prompts(tasks, {t: args.prompts for t in tasks}, DEFAULT_SPEC_BENCH, "local", (False, "local files"),
                              half="tune")
    hf_hetspec.enable(target)
    results = {name: [] for name in copies}
    for prompt in prompts:
        messages = [{"role": "user", "content": prompt.turns[0]}]
        ids = chat_ids(ttok, messages, prompt.chat)
        kw = dict(max_new_tokens=args.max_new_tokens, do_sample=False, attention_mask=torch.ones_like(ids))
        hf_hetspec.disable(target)
        start = time.perf_counter()
        want = target.generate(ids, **kw)
        alone = time.perf_counter() - start
        hf_hetspec.enable(target)
        for name, model in copies.items():
            timer = FirstTokenTimer()
            start = time.perf_counter()
            out = target.generate(ids, assistant_model=model, tokenizer=ttok, assistant_tokenizer=dtok,
                                  streamer=timer, **kw)
            seconds = time.perf_counter() - start
            stats = hf_hetspec.last_stats(target)
            results[name].append(alone / seconds * (out.shape[1] - ids.shape[1]) / (want.shape[1] - ids.shape[1]))
            print(f"{prompt.task} {prompt.prompt_id} {name}: speedup {results[name][-1]:.2f}x, TTFT "
                  f"{timer.first_token_at - start:.2f} s, {seconds:.2f} s (alone {alone:.2f} s), drafter "
                  f"{stats.drafter_s:.2f} s, identical {torch.equal(out, want)}, load {os.getloadavg()[0]:.2f}",
                  flush=True)
    for name, values in results.items():
        geomean = statistics.geometric_mean(values)
        print(f"{name}: geometric mean speedup {geomean:.3f}x over {len(values)} prompts")


if __name__ == "__main__":
    main()
