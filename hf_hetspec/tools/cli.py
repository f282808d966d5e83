"""The ``hf-hetspec`` command line.

::

    hf-hetspec models [--fetch [NAME ...]] [--json]
    hf-hetspec generate --target T --drafter D [--algorithm A] [--compare] [--json] PROMPT
    hf-hetspec demo [--full] [--max-new-tokens N] [--dtype D] [--prompts N] [--json PATH]
    hf-hetspec verify --target T --drafter D --algorithm A [--temperature T --top-k K] PROMPT
    hf-hetspec bench [--quick] [--tasks ...] [--temperatures ...] [--out DIR] [--write-card DIR]
    hf-hetspec analyze TARGET DRAFTER [--json]
    hf-hetspec pairing show PATH_OR_REPO | push FOLDER REPO_ID

``bench``, ``analyze`` and ``pairing`` live in their own modules (:mod:`hf_hetspec.tools.bench`,
:mod:`hf_hetspec.tools.analyze`, :mod:`hf_hetspec.tools.pairing`) and register themselves in :func:`build_parser`.

``generate --compare`` and ``demo`` run three methods on the same prompt(s):

* ``target alone``: ``target.generate()`` without a drafter;
* ``transformers UAG``: transformers' built-in universal assisted generation with the same drafter
  (``assistant_model=`` + both tokenizers, hf_hetspec disabled);
* ``hf_hetspec <algorithm>``: this package.

How speeds, speedups and the counts of transformers' own path are measured: :mod:`hf_hetspec.tools.runner`.

Mistakes a user can fix (an unknown model, algorithm or flag, a missing package) print one line on stderr
and exit with code 2; a failed download exits with code 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import integration
from ..checks import ALGORITHMS
from ..stats import acceptance_rate
from ..testing import verify_lossless
from . import analyze, bench, pairing, zoo
from .common import (DEMO_DEFAULT, DEMO_DRAFTER, DEMO_FULL, DEMO_TARGET, DTYPES, WARMUP_MESSAGE, WARMUP_TOKENS,
                     CLIError, check_algorithm, check_model_argument, choose_threads, console,
                     default_device, fetch_model, load_model, prompt_ids, quiet_transformers, set_threads)
from .progress import Steps, status
from .prompts import MissingHumanEval, demo_prompts
from .reports import machine_summary
from .runner import METHODS, MethodError, MethodRun, Methods, Runner, machine_info, method_label, summarize
from .tasks import TaskError


class _Parser(argparse.ArgumentParser):
    """``ArgumentParser`` that raises :class:`CLIError` instead of exiting, so ``main()`` can return."""

    def error(self, message: str):
        raise CLIError(f"{message} (see {self.prog} --help)")


# --------------------------------------------------------------------------------------------------------
# Models and prompts
# --------------------------------------------------------------------------------------------------------


def _fmt(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def summary_table(rows: list[dict], algorithm: str, title: str):
    from rich.table import Table

    table = Table(title=title)
    table.add_column("method", no_wrap=True)
    for name in ("tokens", "seconds", "tokens/s", "speedup", "acceptance", "tokens/forward",
                 "identical/tie/different"):
        table.add_column(name, justify="right")
    for row in rows:
        verdicts = (
            "reference" if row["method"] == "target"
            else "—" if row["identical"] is None
            else f"{row['identical']}/{row['tie']}/{row['different']}"
        )
        table.add_row(
            method_label(row["method"], algorithm),
            str(row["new_tokens"]),
            f"{row['seconds']:.2f}",
            f"{row['tokens_per_second']:.2f}",
            _fmt(row["speedup"], ".2f") + ("x" if row["speedup"] is not None else ""),
            _fmt(row["acceptance_rate"], ".2f"),
            _fmt(row["tokens_per_forward"], ".2f"),
            verdicts,
        )
    return table


# --------------------------------------------------------------------------------------------------------
# hf-hetspec models
# --------------------------------------------------------------------------------------------------------


def cmd_models(args) -> int:
    if args.fetch is not None:
        unknown = [name for name in args.fetch if name not in zoo.MODELS]
        if unknown:
            raise CLIError(f"--fetch {unknown[0]!r} is not a zoo model; use one of {', '.join(zoo.MODELS)}")
        for name in args.fetch or list(zoo.MODELS):
            fetch_model(name)
    rows = zoo.status()
    if args.json:
        print(json.dumps([{**row._asdict(), "path": str(row.path)} for row in rows], indent=2))
        return 0
    from rich.table import Table

    table = Table(title=f"hf_hetspec model zoo ({zoo.cache_dir()})")
    for name in ("name", "Hub id", "source", "ready"):
        table.add_column(name)
    for row in rows:
        table.add_row(row.name, row.hub_id, row.source, "yes" if row.ready else "no")
    out = console()
    out.print(table)
    if not all(row.ready for row in rows):
        out.print("Fetch a model once with `hf-hetspec models --fetch NAME` (no NAME: all of them).")
    return 0


# --------------------------------------------------------------------------------------------------------
# hf-hetspec generate
# --------------------------------------------------------------------------------------------------------


def _check_decoding(args) -> None:
    if not args.do_sample:
        for flag, value in (("--temperature", args.temperature), ("--top-p", args.top_p)):
            if value is not None:
                raise CLIError(f"{flag} applies to sampling only; add --do-sample (or drop {flag})")
    if args.temperature is not None and args.temperature <= 0:
        raise CLIError(f"--temperature {args.temperature}: must be > 0 (greedy decoding: drop --do-sample)")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise CLIError(f"--top-p {args.top_p}: must be in (0, 1]")
    if args.max_new_tokens < 1:
        raise CLIError(f"--max-new-tokens {args.max_new_tokens}: must be at least 1")
    if args.lookahead is not None and args.lookahead < 1:
        raise CLIError(f"--lookahead {args.lookahead}: must be at least 1")


def cmd_generate(args) -> int:
    check_algorithm(args.algorithm)
    _check_decoding(args)
    set_threads(args.threads)
    device = args.device or default_device()
    err = console(stderr=True)
    with err.status(f"Loading {args.target} and {args.drafter} ..."):
        target, target_tok = load_model("--target", args.target, args.dtype, device)
        drafter, drafter_tok = load_model("--drafter", args.drafter, args.dtype, device)
        builtin_drafter = builtin_drafter_tok = None
        if args.compare and args.do_sample:
            builtin_drafter, builtin_drafter_tok = load_model("--drafter", args.drafter, args.dtype, device)
    ids = prompt_ids(target_tok, args.prompt, not args.no_chat_template)
    runner = Runner(
        target, target_tok, drafter, drafter_tok, algorithm=args.algorithm,
        max_new_tokens=args.max_new_tokens, do_sample=args.do_sample, temperature=args.temperature,
        top_p=args.top_p, seed=args.seed, lookahead=args.lookahead, builtin_drafter=builtin_drafter,
        builtin_drafter_tokenizer=builtin_drafter_tok,
    )

    runs: dict[str, MethodRun] = {}
    methods = Methods(list(METHODS) if args.compare else [])
    if args.compare:
        with err.status("Warming up the three methods ..."):
            for method in list(methods.names):
                methods.run(method, lambda: runner.run(method, ids, max_new_tokens=min(WARMUP_TOKENS,
                                                                                       args.max_new_tokens)))
            warm_up = bench.prompt_warm_up(device, runner)  # a GPU: the prompt's whole length once, untimed
            if warm_up is not None:
                warm_up(ids)
        for method in list(methods.names):
            with err.status(f"Generating with {method_label(method, args.algorithm)} ..."):
                run = methods.run(method, lambda: runner.run(method, ids))
            if run is not None:
                runs[method] = run
                if method != "target":
                    runner.compare(runs["target"], run)
    else:
        with err.status(f"Generating with hf_hetspec {args.algorithm} ..."):
            runs["hf_hetspec"] = runner.hetspec(ids)

    ours = runs["hf_hetspec"]
    algorithm = ours.stats.algorithm
    record = ours.record(target_tok, method_label("hf_hetspec", algorithm))
    if args.json:
        result = {
            "target": args.target,
            "drafter": args.drafter,
            "algorithm": ours.stats.algorithm,
            "requested_algorithm": args.algorithm,
            "dtype": str(next(target.parameters()).dtype).removeprefix("torch."),
            "device": device,
            "prompt": args.prompt,
            "chat_template": not args.no_chat_template and bool(target_tok.chat_template),
            "do_sample": args.do_sample,
            "text": record["text"],
            "prompt_tokens": ours.prompt_tokens,
            "new_tokens": ours.new_tokens,
            "seconds": ours.seconds,
            "tokens_per_second": ours.tokens_per_second,
            "stats": record["stats"],
        }
        if args.compare:
            rows = summarize({m: [r] for m, r in runs.items()})
            result["compare"] = {
                m: {**runs[m].record(target_tok, method_label(m, algorithm)), **_speed(rows, m)}
                for m in runs
            }
            result["left_out"] = methods.failures
        print(json.dumps(result, indent=2, ensure_ascii=False))
        return 0

    out = console()
    out.print(record["text"], markup=False)
    out.print()
    out.print(ours.stats.summary(), markup=False)
    if args.compare:
        rows = summarize({m: [r] for m, r in runs.items()})
        out.print(summary_table(rows, ours.stats.algorithm, "one prompt, wall-clock generate() time"))
        for method, run in runs.items():
            if run.comparison is not None:
                out.print(f"{method_label(method, algorithm)} vs target alone: {run.comparison}", markup=False)
    for failure in methods.failures:
        out.print(f"Left out of this run: {failure}", markup=False)
    return 0


def _speed(rows: list[dict], method: str) -> dict:
    row = next(r for r in rows if r["method"] == method)
    return {"speedup": row["speedup"]}


# --------------------------------------------------------------------------------------------------------
# hf-hetspec demo
# --------------------------------------------------------------------------------------------------------


def cmd_demo(args) -> int:
    size = DEMO_FULL if args.full else DEMO_DEFAULT
    n_prompts = args.prompts if args.prompts is not None else size[0]
    max_new_tokens = args.max_new_tokens if args.max_new_tokens is not None else size[1]
    if n_prompts < 1:
        raise CLIError(f"--prompts {n_prompts}: must be at least 1")
    if max_new_tokens < 1:
        raise CLIError(f"--max-new-tokens {max_new_tokens}: must be at least 1")
    try:
        prompts = demo_prompts(n_prompts)
    except MissingHumanEval as err:
        raise CLIError(f"demo: {err}") from err
    check_algorithm(args.algorithm)
    if args.json is not None and not Path(args.json).expanduser().resolve().parent.is_dir():
        raise CLIError(f"--json {args.json}: the folder does not exist")
    for flag, name in (("--target", args.target), ("--drafter", args.drafter)):
        check_model_argument(flag, name)
        if name in zoo.MODELS:
            fetch_model(name)

    device = args.device or default_device()
    threads_note = choose_threads(device, args.threads)  # before loading, which is busy itself
    out, err = console(), console(stderr=True)
    with status(err, f"Loading {args.target} and {args.drafter} ({args.dtype}) ..."):
        target, target_tok = load_model("--target", args.target, args.dtype, device)
        drafter, drafter_tok = load_model("--drafter", args.drafter, args.dtype, device)
    info = machine_info(device)
    dtype = str(next(target.parameters()).dtype).removeprefix("torch.")
    where = machine_summary(info)
    out.print(
        f"target {args.target}, drafter {args.drafter}, {dtype} on {device} ({where}); "
        f"torch {info['torch']}, transformers {info['transformers']}; greedy, {max_new_tokens} new tokens, "
        f"{len(prompts)} prompts",
        markup=False,
    )
    if threads_note:
        err.print(threads_note, markup=False)
    runner = Runner(
        target, target_tok, drafter, drafter_tok, algorithm=args.algorithm, max_new_tokens=max_new_tokens,
        lookahead=args.lookahead,
    )
    methods = Methods(list(METHODS))
    with status(err, "Warming up the three methods ..."):
        warm = prompt_ids(target_tok, WARMUP_MESSAGE, chat_template=True)
        for method in list(methods.names):
            methods.run(method, lambda: runner.run(method, warm, max_new_tokens=min(WARMUP_TOKENS, max_new_tokens)))

    runs: dict[str, list[MethodRun]] = {m: [] for m in methods.names}
    records = []
    warm_up = bench.prompt_warm_up(device, runner)  # a GPU: each prompt once, untimed
    with Steps(err, total=len(prompts) * len(methods.names)) as steps:
        for prompt in prompts:
            ids = prompt_ids(target_tok, prompt.message, chat_template=True)
            if warm_up is not None:
                warm_up(ids)
            by_method = {}
            for method in list(methods.names):
                steps.start(f"{prompt.prompt_id}: {method_label(method, '')}")
                run = methods.run(method, lambda: runner.run(method, ids))
                if run is None:  # left out of the whole run, earlier prompts' calls included
                    runs.pop(method)
                    records = [r for r in records if r["method"] != method]
                    steps.done("failed inside transformers")
                    continue
                by_method[method] = run
                steps.done(f"{run.new_tokens} tokens in {run.seconds:.1f} s")
            for method in methods.names:
                if method != "target":
                    runner.compare(by_method["target"], by_method[method])
            for method, run in by_method.items():
                runs[method].append(run)
                label = method_label(method, run.stats.algorithm if run.stats else args.algorithm)
                record = run.record(target_tok, label)
                records.append({"prompt_id": prompt.prompt_id, "kind": prompt.kind, **record})

    algorithm = runs["hf_hetspec"][0].stats.algorithm
    out.print(_per_prompt_table(prompts, runs, algorithm))
    rows = summarize(runs)
    out.print(summary_table(rows, algorithm, f"{len(prompts)} prompts, {max_new_tokens} new tokens, greedy"))
    for failure in methods.failures:
        out.print(f"Left out of this run: {failure}", markup=False)
    suspicious = [
        f"{r['prompt_id']} ({r['label']}): {r['verdict_detail']}"
        for r in records
        if r["verdict"] == "different"
    ]
    if suspicious:
        out.print("Outputs that differ from the target alone (not a rounding tie):", markup=False)
        for line in suspicious:
            out.print(f"  {line}", markup=False)
    if args.json is not None:
        payload = {
            "machine": info,
            "config": {
                "target": args.target, "drafter": args.drafter, "algorithm": algorithm, "dtype": dtype,
                "max_new_tokens": max_new_tokens, "prompts": len(prompts), "lookahead": args.lookahead,
                "do_sample": False,
            },
            "summary": rows,
            "left_out": methods.failures,
            "records": records,
        }
        Path(args.json).expanduser().write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
        out.print(f"Per-prompt records written to {args.json}", markup=False)
    return 0


def _per_prompt_table(prompts, runs: dict[str, list[MethodRun]], algorithm: str):
    from rich.table import Table

    table = Table(title="per prompt (tokens/s; verdict vs target alone)")
    table.add_column("prompt")
    table.add_column("tokens", justify="right")
    for method in runs:
        table.add_column(method_label(method, algorithm), justify="right")
    table.add_column("acceptance", justify="right")
    for i, prompt in enumerate(prompts):
        cells = []
        for method in runs:
            run = runs[method][i]
            verdict = "" if run.comparison is None else f" {run.comparison.verdict}"
            cells.append(f"{run.tokens_per_second:.2f}{verdict}")
        ours = runs["hf_hetspec"][i]
        acceptance = acceptance_rate(ours.accepted_tokens, ours.drafted_tokens)
        table.add_row(prompt.prompt_id, str(runs["target"][i].new_tokens), *cells, _fmt(acceptance, ".2f"))
    return table


# --------------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------------


def _add_model_options(parser, required: bool) -> None:
    kwargs = {"required": True} if required else {}
    parser.add_argument("--target", metavar="NAME_OR_PATH", default=None if required else DEMO_TARGET,
                        help="target model: zoo name, save_pretrained folder or Hub id"
                        + ("" if required else f" (default {DEMO_TARGET})"), **kwargs)
    parser.add_argument("--drafter", metavar="NAME_OR_PATH", default=None if required else DEMO_DRAFTER,
                        help="drafter model, any vocabulary"
                        + ("" if required else f" (default {DEMO_DRAFTER})"), **kwargs)
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="auto",
                        help="hf_hetspec algorithm (default auto: hf_hetspec chooses, SLEM for greedy "
                        "decoding; the output names the algorithm that ran)")
    parser.add_argument("--lookahead", type=int, default=None, metavar="K",
                        help="drafter tokens per draft for both assisted methods "
                        "(default: each method's own schedule)")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch CPU threads (default: torch's choice, one per core); on a machine shared "
                        "with other jobs, 1 avoids threads waiting on each other")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hf-hetspec",
        description="Lossless speculative decoding with a drafter of another vocabulary (SLEM/TLI/SLRS, "
        "Timor et al., ICML 2025) for Hugging Face transformers.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{models,generate,demo,verify,bench,analyze,pairing}")

    models = sub.add_parser("models", help="list the model zoo; fetch models")
    models.add_argument("--fetch", nargs="*", metavar="NAME", default=None,
                        help="download and convert these zoo models (no NAME: all of them)")
    models.add_argument("--json", action="store_true", help="print the list as JSON")
    models.set_defaults(func=cmd_models)

    gen = sub.add_parser("generate", help="generate with hf_hetspec; --compare against the alternatives")
    _add_model_options(gen, required=True)
    gen.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    gen.add_argument("--temperature", type=float, default=None,
                     help="sampling temperature (with --do-sample)")
    gen.add_argument("--top-p", type=float, default=None, help="nucleus sampling (with --do-sample)")
    gen.add_argument("--seed", type=int, default=0, help="seed of every sampled call (default 0)")
    gen.add_argument("--max-new-tokens", type=int, default=128, metavar="N", help="default 128")
    gen.add_argument("--dtype", choices=DTYPES, default=None,
                     help="compute dtype (default: float32 on CPU, bfloat16 on GPU; auto: as stored)")
    gen.add_argument("--no-chat-template", action="store_true",
                     help="encode PROMPT as raw text instead of a user message of the target's chat template")
    gen.add_argument("--compare", action="store_true",
                     help="also run the target alone and transformers' built-in assisted generation")
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    gen.add_argument("prompt", metavar="PROMPT")
    gen.set_defaults(func=cmd_generate)

    demo = sub.add_parser("demo", help="target alone vs transformers UAG vs hf_hetspec on HumanEval and text")
    _add_model_options(demo, required=False)
    demo.add_argument("--full", action="store_true",
                      help=f"the longer comparison: {DEMO_FULL[0]} prompts, {DEMO_FULL[1]} new tokens (default "
                      f"{DEMO_DEFAULT[0]} prompts, {DEMO_DEFAULT[1]} tokens: minutes on a 2-core CPU)")
    demo.add_argument("--quick", action="store_true", help=argparse.SUPPRESS)  # the default since it is quick
    demo.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                      help=f"default {DEMO_DEFAULT[1]} (--full: {DEMO_FULL[1]})")
    demo.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="default bfloat16")
    demo.add_argument("--prompts", type=int, default=None, metavar="N",
                      help="number of prompts, HumanEval and text interleaved "
                      f"(default {DEMO_DEFAULT[0]}, --full: {DEMO_FULL[0]})")
    demo.add_argument("--json", default=None, metavar="PATH", help="write the per-prompt records to PATH")
    demo.set_defaults(func=cmd_demo)

    ver = sub.add_parser("verify", help="exact losslessness test of an algorithm's sampling on one prompt")
    _add_model_options(ver, required=True)
    ver.add_argument("--dtype", choices=DTYPES, default="float32", help="default float32")
    ver.add_argument("--temperature", type=float, default=1.0)
    ver.add_argument("--top-k", type=int, default=5, help="limits the support to enumerate (default 5, <= 8)")
    ver.add_argument("--top-p", type=float, default=None)
    ver.add_argument("--num-tokens", type=int, default=2, help="outcome length in tokens (default 2)")
    ver.add_argument("--samples", type=int, default=1000, metavar="N", help="default 1000")
    ver.add_argument("--seed", type=int, default=0)
    ver.add_argument("--no-chat-template", action="store_true", help="use PROMPT as raw text")
    ver.add_argument("prompt", metavar="PROMPT")
    ver.set_defaults(func=cmd_verify)

    # commands with a module of their own
    bench.add_command(sub)
    analyze.add_command(sub)
    pairing.add_command(sub)
    return parser


def cmd_verify(args) -> int:
    """``hf-hetspec verify``: :func:`hf_hetspec.testing.verify_lossless` on real models; exit 1 when rejected."""
    check_algorithm(args.algorithm)
    if not 1 <= args.top_k <= 8:
        raise CLIError(f"--top-k {args.top_k}: the exact distribution is enumerated, use 1..8")
    if args.samples < 50 or args.num_tokens < 1:
        raise CLIError("--samples must be >= 50 and --num-tokens >= 1")
    set_threads(args.threads)
    device = args.device or default_device()
    target, target_tok = load_model("--target", args.target, args.dtype, device)
    drafter, drafter_tok = load_model("--drafter", args.drafter, args.dtype, device)
    ids = prompt_ids(target_tok, args.prompt, chat_template=not args.no_chat_template).to(device)
    settings = {"temperature": args.temperature, "top_k": args.top_k}
    if args.top_p is not None:
        settings["top_p"] = args.top_p
    integration.enable(target)
    try:
        report = verify_lossless(target, drafter, target_tok, drafter_tok, ids, args.algorithm,
                                 n=args.samples, seed=args.seed, num_tokens=args.num_tokens, **settings)
    except (NotImplementedError, ValueError) as err:
        raise CLIError(f"verify: {err}") from err
    finally:
        integration.disable(target)
    print(f"{args.algorithm} with {args.target} + {args.drafter}: {report}")
    return 0 if report.passed else 1


def main(argv: list[str] | None = None) -> int:
    """Run ``hf-hetspec`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded by `bench` as the exact command
        with quiet_transformers():
            return args.func(args)
    except CLIError as err:
        print(f"hf-hetspec: error: {err}", file=sys.stderr)
        return err.code
    except (MethodError, TaskError) as err:
        print(f"hf-hetspec: error: {err}", file=sys.stderr)
        return 2
    except SystemExit as exit_:  # --help
        return exit_.code if isinstance(exit_.code, int) else 0
    except KeyboardInterrupt:
        print("hf-hetspec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
