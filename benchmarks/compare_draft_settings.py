"""Compare draft settings of TLI / SLRS (or SLEM) when sampling, interleaved per prompt and seed.

Each setting is a JSON object of ``generate()`` keyword arguments; ``{}`` under the name ``target`` runs the
target alone. One line per call (prompt, seed, setting, new tokens, target forwards, drafted, accepted,
seconds), then totals per setting: tokens/s, speedup over the target alone, acceptance rate, tokens per
target forward and drafted tokens per target forward. The log of
``benchmarks/results/schedule-tuning/tli-slrs-draft-temperature-humaneval-20-24.log`` came from::

    python benchmarks/compare_draft_settings.py --drafter smollm2-135m-instruct --prompts 20 25 --seeds 0 1 \\
        --settings '{"target": {}, "tli": {"hetspec_algorithm": "tli"},
                     "tli-t0.6": {"hetspec_algorithm": "tli", "hetspec_draft_temperature": 0.6},
                     "slrs": {"hetspec_algorithm": "slrs"},
                     "slrs-t0.6": {"hetspec_algorithm": "slrs", "hetspec_draft_temperature": 0.6},
                     "slrs-conf0.4": {"hetspec_algorithm": "slrs", "num_assistant_tokens": 20,
                                      "assistant_confidence_threshold": 0.4}}'

HumanEval/20-29 are the tuning prompts; the bench reports HumanEval/0-9. ``--tasks`` takes the prompts from the
evaluation suite instead (``hf-hetspec bench --suite spec-bench``'s tasks, ``--per-task`` prompts of each from
``--half``, default the tuning half; a prompt's first turn), printing per-task totals too. A setting's ``"schedule"`` (an object of
:class:`hf_hetspec.Schedule` fields) changes the default schedule of its algorithm and drafter runtime, e.g.
``{"hetspec_algorithm": "slem", "schedule": {"context_lookup": false, "back_off": false}}`` (``"stop"``: an object
of :class:`hf_hetspec.DraftStop` fields changed likewise). ``"drafter_chat_template": true`` hands the drafter the
conversation in its own chat template (``assistant_input_ids`` from :func:`hf_hetspec.chat_inputs`; plain
completion prompts keep the default). A setting with
``"hetspec_loop": "transformers"`` runs in transformers' loop, which takes no ``hetspec_generator``: it samples
with torch's global RNG, seeded per call. ``benchmarks/results/loops/slem-greedy-humaneval-0-5.log``::

    python benchmarks/compare_draft_settings.py --prompts 0 6 --temperature 0 --max-new-tokens 64 \
        --settings '{"target": {}, "hetspec": {"hetspec_algorithm": "slem"},
                     "transformers": {"hetspec_algorithm": "slem", "hetspec_loop": "transformers"}}'
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import dataclasses
import os

from hf_hetspec import chat_inputs, integration
from hf_hetspec.runtime import prepare_drafter
from hf_hetspec.schedule import choose_schedule
from hf_hetspec.tools import zoo
from hf_hetspec.tools.prompts import code_prompts
from hf_hetspec.tools.tasks import DEFAULT_SPEC_BENCH, chat_ids, load_prompts


def _prompts(args, tokenizer) -> list[tuple[str, str, torch.Tensor, list[dict] | None]]:
    """``(task, prompt id, target ids, chat messages)`` of the HumanEval range, or of ``--tasks`` from the suite's
    ``--half`` (messages ``None``: a plain completion prompt, sent without a chat template)."""
    if not args.tasks:
        first, end = args.prompts
        found = [("code", p.prompt_id, p.message, True) for p in code_prompts(end)[first:end]]
    else:
        prompts, _ = load_prompts(args.tasks, {task: args.per_task for task in args.tasks}, DEFAULT_SPEC_BENCH,
                                  "local", (False, "local"), args.half)
        found = [(p.task, p.prompt_id, p.turns[0], p.chat) for p in prompts]
    out = []
    for task, prompt_id, text, chat in found:
        messages = [{"role": "user", "content": text}]
        out.append((task, prompt_id, chat_ids(tokenizer, messages, chat), messages if chat else None))
    return out


def _kwargs(setting: dict, drafter, sample: bool) -> dict:
    """``generate()`` keywords of a setting: its ``"schedule"`` changes applied to the default schedule of its
    algorithm for the drafter runtime that runs (``hetspec_drafter``, default ``auto``) and the kind of call
    (``sample``)."""
    kwargs = dict(setting)
    changes = kwargs.pop("schedule", None)
    if changes is not None:
        runtime = prepare_drafter(drafter, kwargs.get("hetspec_drafter", "auto")).runtime
        default = choose_schedule(kwargs.get("hetspec_algorithm", "slem"), drafter_runtime=runtime, sample=sample)
        if isinstance(changes.get("stop"), dict):  # {"min_joint": 0.3}: changes to the default's DraftStop
            changes["stop"] = dataclasses.replace(default.stop, **changes["stop"])
        kwargs["hetspec_schedule"] = dataclasses.replace(default, **changes)
    return kwargs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--drafter", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, nargs=2, default=[20, 25], metavar=("FIRST", "END"),
                        help="HumanEval problems FIRST .. END-1")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--temperature", type=float, default=1.0, help="0: greedy decoding")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--settings", required=True, help="JSON: {name: generate() kwargs}; 'target' = alone")
    parser.add_argument("--tasks", nargs="+", default=None, help="suite tasks instead of the HumanEval range")
    parser.add_argument("--per-task", type=int, default=5, help="prompts per task with --tasks (default 5)")
    parser.add_argument("--half", default="tune", choices=("tune", "report", "all"), help="with --tasks")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                        help="the target's dtype (default bfloat16; float32 is `hf-hetspec generate`'s on a CPU)")
    parser.add_argument("--warmup", type=int, default=0, metavar="N",
                        help="first run every setting once for N new tokens on the first prompt, untimed (a "
                             "runtime's one-off preparation, e.g. the packed target's ~22 s, stays out of the "
                             "timed calls)")
    args = parser.parse_args()
    settings = json.loads(args.settings)
    torch.set_num_threads(args.threads)
    target, target_tok = zoo.load(args.target, dtype=getattr(torch, args.dtype))
    drafter, drafter_tok = zoo.load(args.drafter, dtype=torch.bfloat16)
    integration.enable(target)
    totals: dict[str, list[float]] = {}
    per_task: dict[tuple[str, str], list[float]] = {}
    settings = {name: _kwargs(setting, drafter, args.temperature > 0) for name, setting in settings.items()}
    prompts = _prompts(args, target_tok)
    if args.warmup:
        for name, kwargs in settings.items():
            if name != "target":
                target.generate(prompts[0][2], assistant_model=drafter, tokenizer=target_tok,
                                assistant_tokenizer=drafter_tok, max_new_tokens=args.warmup, do_sample=False,
                                **{k: v for k, v in kwargs.items() if k != "drafter_chat_template"})
    print(f"load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    for task, prompt_id, ids, messages in prompts:
        for seed in args.seeds:
            for name, kwargs in settings.items():
                torch.manual_seed(seed)
                start = time.perf_counter()
                common = dict(max_new_tokens=args.max_new_tokens, do_sample=args.temperature > 0)
                if args.temperature > 0:
                    common["temperature"] = args.temperature
                if name == "target":
                    out = type(target).generate(target, ids, **common)  # the plain transformers method
                    new = out.shape[1] - ids.shape[1]
                    forwards, drafted, accepted, rejections = new, 0, 0, 0
                else:
                    # transformers' loop samples with the global RNG (seeded above) and refuses a generator
                    randomness = ({} if kwargs.get("hetspec_loop") == "transformers"
                                  else {"hetspec_generator": torch.Generator().manual_seed(seed)})
                    kwargs = dict(kwargs)
                    if kwargs.pop("drafter_chat_template", False) and messages is not None:
                        # the drafter reads the conversation in its own chat template (hf_hetspec.chat_inputs)
                        kwargs["assistant_input_ids"] = chat_inputs(messages, target_tok, drafter_tok)[
                            "assistant_input_ids"]
                    out = target.generate(ids, assistant_model=drafter, tokenizer=target_tok,
                                          assistant_tokenizer=drafter_tok, **randomness, **common, **kwargs)
                    stats = integration.last_stats(target)
                    new = out.shape[1] - ids.shape[1]
                    forwards, drafted, accepted = stats.target_forwards, stats.drafted_tokens, stats.accepted_tokens
                    rejections = stats.rejections
                seconds = time.perf_counter() - start
                for row in (totals.setdefault(name, [0, 0, 0, 0, 0, 0.0]),
                            per_task.setdefault((task, name), [0, 0, 0, 0, 0, 0.0])):
                    for i, value in enumerate((new, forwards, drafted, accepted, rejections, seconds)):
                        row[i] += value
                print(prompt_id, seed, name, new, forwards, drafted, accepted, f"{seconds:.1f}s",
                      f"load {os.getloadavg()[0]:.2f}", flush=True)
    if args.tasks:
        for (task, name), (new, forwards, *_, seconds) in per_task.items():
            base = per_task.get((task, "target"))
            speedup = f" speedup {new / seconds / (base[0] / base[-1]):.2f}x" if base and name != "target" else ""
            print(f"{task:16s} {name:14s} tok/s {new / seconds:.2f}{speedup} tok/fwd {new / max(forwards, 1):.2f}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end", flush=True)
    base = totals["target"][0] / totals["target"][-1] if "target" in totals else None
    for name, (new, forwards, drafted, accepted, rejections, seconds) in totals.items():
        speed = new / seconds
        print(f"{name:14s} tok/s {speed:.2f}" + (f" speedup {speed / base:.2f}x" if base else "")
              + (f" acc {accepted / drafted:.2f} alpha {accepted / max(accepted + rejections, 1):.2f}"
                 if drafted else "")
              + f" tok/fwd {new / max(forwards, 1):.2f} drafted/fwd {drafted / max(forwards, 1):.1f}")


if __name__ == "__main__":
    main()
