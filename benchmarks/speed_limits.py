"""What speedup a measured drafter can reach on the machine it was measured on, and what it would need.

Reads ``bench.json`` files of ``hf-hetspec bench`` (runs made since the bench reports ``alpha``) and prints,
per assisted method: Leviathan et al.'s acceptance rate alpha, the mean lookahead gamma and the cost ratio c
as measured; the expected speedup of Leviathan et al. (2023, Theorem 3.8) at the measured gamma, and at the
best fixed lookahead with the target's extra cost of verifying more tokens added to each drafter step
(``c + v``, ``v`` = extra target time per verified token / one-token target forward, measured with
``--measure-verify-cost`` or given with ``--verify-cost``); the achieved speedup; and the alpha that the
formula needs for ``--speedup`` at ``c`` and at ``c + v`` (:func:`hf_hetspec.tools.analyze.required_alpha`).

    python benchmarks/speed_limits.py benchmarks/results/smollm2-code-alpha/bench.json --speedup 1.8 2.5 \\
        --verify-cost 0.035

``--measure-verify-cost MODEL`` times one-token and ``K``-token forwards of a zoo model (bf16, one thread) after
a ``--context``-token prefill (default 200), interleaved, and prints ``v`` for each ``K`` of ``--tokens`` (several
give the profile of the verification's cost, e.g. ``--tokens 2 4 6 8 12 16 24``); run it on an otherwise idle
machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from hf_hetspec.tools.analyze import MAX_LOOKAHEAD, expected_speedup, required_alpha


def measure_verify_cost(name: str, tokens: list[int], repeats: int = 7,
                        context: int = 200) -> dict[int, tuple[float, float]]:
    """``{k: (best, median seconds)}`` of ``k``-token forwards of zoo model ``name`` (bf16) after a ``context``-token
    prefill, for each ``k`` in ``tokens`` and for ``k = 1``; the counts are interleaved, one forward of each per
    repeat, so a load change hits all of them alike."""
    from transformers import DynamicCache

    from hf_hetspec.tools import zoo
    from hf_hetspec.compat import cache_kwargs
    from hf_hetspec.drafter import rollback_cache

    model, _ = zoo.load(name, dtype=torch.bfloat16)
    counts = sorted({1, *tokens})
    ids = torch.randint(100, 1000, (1, context + max(counts)))
    cache = DynamicCache(config=model.config)
    times: dict[int, list[float]] = {k: [] for k in counts}
    with torch.inference_mode():
        model(input_ids=ids[:, :context], use_cache=True, **cache_kwargs(model, cache))
        for _ in range(repeats):
            for k in counts:
                start = time.perf_counter()
                model(input_ids=ids[:, context : context + k], use_cache=True, logits_to_keep=k,
                      **cache_kwargs(model, cache))
                times[k].append(time.perf_counter() - start)
                rollback_cache(cache, context)
    return {k: (min(t), statistics.median(t)) for k, t in times.items()}


def rows(result: dict, verify_cost: float, speedups: list[float]) -> list[str]:
    out = []
    for r in result["results"]:
        alpha, gamma, c = r.get("alpha"), r.get("mean_lookahead"), r.get("cost_ratio")
        if r["method"] == "target" or None in (alpha, gamma, c):
            continue
        best_with_v = max(expected_speedup(alpha, k, c + verify_cost) for k in range(1, MAX_LOOKAHEAD + 1))
        needed = []
        for s in speedups:
            plain, with_v = required_alpha(s, c), required_alpha(s, c + verify_cost)
            needed.append(f"{_f(plain)} / {_f(with_v)}")
        out.append(f"| {r['task']} | {r['temperature']:g} | {r['label']} | {alpha:.2f} | {gamma:.1f} | {c:.3f} "
                   f"| {expected_speedup(alpha, gamma, c):.2f}x | {best_with_v:.2f}x | {r['speedup']:.2f}x | "
                   + " | ".join(needed) + " |")
    return out


def _f(x: float | None) -> str:
    return "unreachable" if x is None else f"{x:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench_json", nargs="*")
    parser.add_argument("--speedup", type=float, nargs="+", default=[1.8, 2.5])
    parser.add_argument("--verify-cost", type=float, default=0.0, help="v, see the module docstring")
    parser.add_argument("--measure-verify-cost", metavar="MODEL", help="zoo name of the target to time")
    parser.add_argument("--tokens", type=int, nargs="+", default=[12],
                        help="verified tokens per forward for --measure-verify-cost (several: a profile)")
    parser.add_argument("--context", type=int, default=200, help="prefilled tokens for --measure-verify-cost")
    parser.add_argument("--repeats", type=int, default=7, help="forwards of each count for --measure-verify-cost")
    args = parser.parse_args()
    if args.measure_verify_cost:
        torch.set_num_threads(1)
        measured = measure_verify_cost(args.measure_verify_cost, args.tokens, args.repeats, args.context)
        one = measured[1][0]
        print(f"{args.measure_verify_cost}, {args.context}-token context, best / median of {args.repeats}:")
        for k, (best, median) in measured.items():
            v = (best - one) / (k - 1) / one if k > 1 else 0.0
            print(f"  {k:3d} tokens {1000 * best:5.0f} / {1000 * median:5.0f} ms, {best / one:.2f} one-token "
                  f"forwards, v = {v:.3f} per extra verified token")
    if not args.bench_json:
        return
    needed = " | ".join(f"alpha for {s:g}x (c / c + v)" for s in args.speedup)
    print(f"v = {args.verify_cost:g}\n")
    print(f"| task | T | method | alpha | gamma | c | bound at gamma | best bound with v | achieved | {needed} |")
    print("|---" * (9 + len(args.speedup)) + "|")
    for path in args.bench_json:
        with open(path) as f:
            print("\n".join(rows(json.load(f), args.verify_cost, args.speedup)))


if __name__ == "__main__":
    main()
