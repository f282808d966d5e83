"""Would drafting on the second core while the target verifies pay? The upper bound, measured.

Pipelined drafting (issue #14: the drafter starts the next draft from the longest draft prefix while the
target verifies the current one) can at best hide the drafting time behind the verification: a round would
cost ``max(verify, draft)`` instead of ``verify + draft``. This script measures whether two cores give that
overlap at all for the zoo pair, before any decoding loop is built around it: after a ``--context``-token
prefill of both models it times, interleaved per round,

* ``sequential``: one target forward over ``--draft + 1`` tokens, then ``--draft`` one-token drafter steps;
* ``overlapped``: the same drafter steps on a second Python thread while the main thread runs the target
  forward (PyTorch releases the GIL inside its kernels; one intra-op thread each, so two cores);

and prints the medians with the ideal ``max(target, drafter)``. A pipelined loop would also discard the
pre-drafted tokens whenever the draft is not accepted whole (and, in greedy SLEM, whenever the target's bonus
token differs from the drafter's guess), so the saving below is an upper bound::

    PYTHONPATH=. python benchmarks/overlap_drafting.py --draft 6
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch
from transformers import DynamicCache

from hf_hetspec.compat import cache_kwargs
from hf_hetspec.drafter import rollback_cache
from hf_hetspec.runtime import prepare_drafter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--drafter", default="smollm2-135m-instruct")
    parser.add_argument("--drafter-runtime", default="auto")
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--draft", type=int, default=6, help="drafter steps per round (default 6)")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)

    from hf_hetspec.tools import zoo

    target, _ = zoo.load(args.target, dtype=torch.bfloat16)
    drafter, _ = zoo.load(args.drafter, dtype=torch.bfloat16)
    prepared = prepare_drafter(drafter, args.drafter_runtime)
    model = prepared.model
    context = torch.randint(100, 1000, (1, args.context))
    target_cache = DynamicCache()
    drafter_cache = model.new_cache() if hasattr(model, "new_cache") else DynamicCache()
    with torch.no_grad():
        target(input_ids=context, use_cache=True, **cache_kwargs(target, target_cache))
        model(input_ids=context, use_cache=True, **cache_kwargs(model, drafter_cache))
    block = torch.randint(100, 1000, (1, args.draft + 1))
    token = context[:, -1:]

    def verify() -> None:
        with torch.no_grad():
            target(input_ids=block, use_cache=True, logits_to_keep=args.draft + 1,
                   **cache_kwargs(target, target_cache))
        rollback_cache(target_cache, args.context)

    def draft() -> None:
        with torch.no_grad():
            for _ in range(args.draft):
                model(input_ids=token, use_cache=True, logits_to_keep=1, **cache_kwargs(model, drafter_cache))
        rollback_cache(drafter_cache, args.context)

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def overlapped() -> None:
        worker = threading.Thread(target=draft)
        worker.start()
        verify()
        worker.join()

    for fn in (verify, draft, overlapped):  # warm-up
        fn()
    times: dict[str, list[float]] = {"target": [], "drafter": [], "sequential": [], "overlapped": []}
    for _ in range(args.rounds):
        times["target"].append(timed(verify))
        times["drafter"].append(timed(draft))
        times["sequential"].append(timed(lambda: (verify(), draft())))
        times["overlapped"].append(timed(overlapped))
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"{args.target} verifying {args.draft + 1} tokens, {args.drafter} ({prepared.runtime}) drafting "
          f"{args.draft}, {args.context}-token context, medians of {args.rounds} interleaved rounds, "
          f"one intra-op thread per model")
    for name, value in median.items():
        print(f"{name:<11} {1000 * value:8.1f} ms")
    ideal = max(median["target"], median["drafter"])
    print(f"ideal overlap {1000 * ideal:8.1f} ms; overlapped round = {median['overlapped'] / median['sequential']:.2f}"
          f" of the sequential one (ideal {ideal / median['sequential']:.2f})")


if __name__ == "__main__":
    main()
