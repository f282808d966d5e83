"""Tune the default draft schedules (SLEM's joint-confidence threshold and cap; TLI's and SLRS's lookahead),
against the target alone.

The default schedule (``hf_hetspec.schedule.SLEM_DEFAULTS``, per drafter runtime) ends a draft
once the drafter's probability that the whole draft is accepted falls below the threshold, or at the cap
(``hf_hetspec.schedule.DraftStop``). Each candidate is passed per call as ``generate(hetspec_schedule=...)``.
 This script runs, interleaved per prompt, the target alone and SLEM under
each candidate schedule (or a fixed lookahead ``k``), greedy, and prints tokens/s and the speedup over the
target alone summed over the prompts. Tune on prompts the bench does not report (the bench reports
HumanEval/0-9), e.g.::

    python benchmarks/tune_schedule.py --first 20 --last 25 --schedules 0.2/32 0.35/12 0.5/12 k4 k6
    python benchmarks/tune_schedule.py --first 25 --last 30 --schedules 0.35/12 0.5/12 0.35/8 0.25/10 0.2/12

``J/M`` = threshold ``J`` with cap ``M`` (SLEM); ``kN`` = exactly ``N`` drafter tokens per draft; ``default`` =
the algorithm's default schedule; ``hN`` = the +2/-1 rule with floor ``N`` (TLI, SLRS); a ``+block`` suffix (``k4+block``) verifies with block verification instead
of token-level speculative sampling (TLI and SLRS sampling). ``--algorithm tli --temperature 1 --seeds 0 1`` tunes the sampled
token-level algorithms (each seed reseeds every call; methods stay interleaved per prompt and seed). The
results behind the defaults are in ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import sys

import torch

from hf_hetspec.schedule import DEFAULT_LOOKAHEAD, DraftStop, Schedule
from hf_hetspec.tools import zoo
from hf_hetspec.tools.prompts import code_prompts
from hf_hetspec.tools.runner import Runner
from hf_hetspec.tools.tasks import chat_ids


def parse_schedule(text: str) -> dict:
    """``"J/M"`` -> ``{"joint": J, "max": M}``; ``"kN"`` -> ``{"k": N}``; ``"default"`` -> ``{"default": True}``; with
``"+block"`` appended, ``"verification": "block"`` added.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    base, block = (text[: -len("+block")], True) if text.endswith("+block") else (text, False)
    extra = {"verification": "block"} if block else {}
    try:
        if base == "default":
            return {"default": True, **extra}
        if base.startswith("k"):
            return {"k": int(base[1:]), **extra}
        if base.startswith("h"):
            return {"floor": int(base[1:]), **extra}
        joint, cap = base.split("/")
        return {"joint": float(joint), "max": int(cap), **extra}
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: use J/M (e.g. 0.35/12) or kN (e.g. k4)") from err


def schedule_for(spec: dict, algorithm: str) -> Schedule | None:
    """The ``hetspec_schedule`` a parsed candidate stands for: ``J/M`` (SLEM) drafts of up to ``M`` tokens ended
    by the joint-confidence threshold ``J``; ``hN`` (TLI, SLRS) the +2/-1 rule from ``DEFAULT_LOOKAHEAD`` with
    floor ``N``. ``None`` (the algorithm's default schedule) for ``default``, ``kN`` (passed as
    ``num_assistant_tokens``) and a form that does not apply to ``algorithm``."""
    if "joint" in spec and algorithm == "slem":
        return Schedule(spec["max"], False, DraftStop(0.0, spec["joint"]))
    if "floor" in spec and algorithm != "slem":
        return Schedule(DEFAULT_LOOKAHEAD, True, DraftStop(), spec["floor"])
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--drafter", default="smollm2-135m-instruct")
    parser.add_argument("--first", type=int, default=20, help="first HumanEval problem (default 20)")
    parser.add_argument("--last", type=int, default=25, help="one past the last HumanEval problem (default 25)")
    parser.add_argument("--schedules", nargs="+", type=parse_schedule, required=True, metavar="J/M|kN")
    parser.add_argument("--algorithm", default="slem", choices=("slem", "tli", "slrs"))
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="sampling seeds (default 0)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    target, target_tok = zoo.load(args.target, dtype=args.dtype)
    drafter, drafter_tok = zoo.load(args.drafter, dtype=args.dtype)
    names = ["target"] + [("default" if "default" in s else f"k{s['k']}" if "k" in s else f"h{s['floor']}"
                           if "floor" in s else f"{s['joint']}/{s['max']}")
                          + ("+block" if "verification" in s else "") for s in args.schedules]
    totals = {name: [0, 0.0, 0, 0] for name in names}  # new tokens, seconds, target forwards, drafted tokens
    for prompt in code_prompts(args.last)[args.first:]:
        ids = chat_ids(target_tok, [{"role": "user", "content": prompt.message}], True)
        sampled = args.temperature > 0
        for seed, name, schedule in [(seed, n, s) for seed in (args.seeds if sampled else [0])
                                     for n, s in zip(names, [None] + args.schedules)]:
            runner = Runner(target, target_tok, drafter, drafter_tok, algorithm=args.algorithm,
                            max_new_tokens=args.max_new_tokens, lookahead=(schedule or {}).get("k"),
                            do_sample=sampled, temperature=args.temperature if sampled else None, seed=seed,
                            verification=(schedule or {}).get("verification", "token"),
                            schedule=schedule_for(schedule or {}, args.algorithm))
            run = runner.target_alone(ids) if schedule is None else runner.hetspec(ids)
            total = totals[name]
            total[0] += run.new_tokens
            total[1] += run.seconds
            total[2] += run.target_forwards or 0
            total[3] += run.drafted_tokens or 0
            print(f"{prompt.prompt_id} seed {seed} {name}: {run.new_tokens} tokens in {run.seconds:.1f} s, "
                  f"{run.target_forwards} target forwards, {run.drafted_tokens} drafted", flush=True)
    base = totals["target"][0] / totals["target"][1]
    print("\n| schedule | tokens/s | speedup | tokens/forward | drafted/forward |\n|---|---|---|---|---|")
    for name, (tokens, seconds, forwards, drafted) in totals.items():
        rate = tokens / seconds
        print(f"| {name} | {rate:.2f} | {rate / base:.2f}x | {tokens / max(forwards, 1):.2f} | "
              f"{drafted / max(forwards, 1):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
