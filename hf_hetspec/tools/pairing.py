"""Drafter pairings as Hugging Face model cards: write one from a benchmark, load one, publish one.

A *pairing* is a target, a drafter of another vocabulary and the hf_hetspec settings measured to run them
fastest. It is published as a model card (``README.md`` made with ``huggingface_hub.ModelCard`` /
``ModelCardData``) whose YAML metadata carries, under the key ``hf_hetspec``, everything :func:`load` needs:

.. code-block:: yaml

    hf_hetspec:
      format: 1
      target: Qwen/Qwen2.5-Coder-1.5B-Instruct      # Hub ids (zoo names are translated)
      drafter: HuggingFaceTB/SmolLM2-135M-Instruct
      algorithm: slem                               # recommended at the lowest measured temperature
      lookahead: null                               # null: hf_hetspec's adaptive schedule
      settings: {hetspec_algorithm: slem, do_sample: false}
      recommended:                                  # one entry per measured temperature
      - {temperature: 0.0, algorithm: slem, lookahead: null, speedup: 1.92, settings: {...}}
      speedups: [{task: code, temperature: 0.0, method: hf_hetspec, algorithm: slem, speedup: 1.92, ...}]
      hardware: ..., device: cpu, dtype: bfloat16, torch: ..., transformers: 5.23.0, date: ..., command: ...
      special_tokens:                               # what vLLM's TLI needs (hf_hetspec.tools.pairing_vllm)
        target: {unk_token: null, unk_token_id: null, eos_token: <|im_end|>, eos_token_id: 151645}
        drafter: {unk_token: <|endoftext|>, unk_token_id: 0, eos_token: <|im_end|>, eos_token_id: 2}

The recommended algorithm at a temperature is the hf_hetspec algorithm with the best geometric-mean
speedup over the benchmark's tasks at that temperature. The card's body holds the table, the plots, the
command that reproduces the numbers, how to use the pairing with hf_hetspec, and the equivalent vLLM
settings with whether vLLM's TLI can use the pair (``hf-hetspec pairing show`` prints them too).

:func:`load` reads a card from a folder or a Hub repository (only ``README.md`` is downloaded; no code from
the Hub is executed; models load with :func:`hf_hetspec.tools.zoo.load`, which never trusts remote code). What a
card may set, and where its models may come from, is :mod:`hf_hetspec.tools.card_policy` (its threat model).

The parts: :mod:`~hf_hetspec.tools.pairing_card` writes a card, :mod:`~hf_hetspec.tools.pairing_load` reads
one, :mod:`~hf_hetspec.tools.pairing_push` publishes one, :mod:`~hf_hetspec.tools.pairing_vllm` gives its vLLM
settings; this module re-exports them and holds the
``hf-hetspec pairing {show,compare,push}`` commands; :func:`drafters_by_task` says, from several cards of one
target, which drafter measured fastest on each task (issue 26: which drafter for which task).
"""

from __future__ import annotations

from .card_policy import PairingError
from .common import CLIError, console
# the pairing's parts, re-exported here (their old import path): writing, reading, publishing
from .pairing_card import (  # noqa: F401
    CARD_FILE,
    CARD_KEY,
    PLOT_CAPTIONS,
    TAGS,
    generate_settings,
    hub_id,
    recommended_settings,
    write_card,
    _fmt,
    _method_label,
)
from .pairing_load import HUB_PROBE_SECONDS, MAX_CARD_BYTES, Pairing, load, read_card  # noqa: F401
from .pairing_push import push  # noqa: F401
from .pairing_vllm import serve_command, tli_notes


# --------------------------------------------------------------------------------------------------------
# hf-hetspec pairing {show,push}
# --------------------------------------------------------------------------------------------------------


def cmd_show(args) -> int:
    """``hf-hetspec pairing show``: the card's models, recommended settings, measured speedups, and its vLLM
    settings with whether vLLM's TLI can use the pair (:mod:`~hf_hetspec.tools.pairing_vllm`)."""
    import json

    try:
        _, metadata = read_card(args.card)
    except PairingError as err:
        raise CLIError(str(err)) from err
    if args.json:
        print(json.dumps(metadata, indent=2))
        return 0
    from rich.table import Table

    out = console()
    out.print(f"target {metadata['target']}, drafter {metadata['drafter']}", markup=False)
    out.print(f"measured {metadata.get('date')} on {metadata.get('hardware')} ({metadata.get('device')}, "
              f"{metadata.get('dtype')}; transformers {metadata.get('transformers')})", markup=False)
    for entry in metadata.get("recommended") or []:
        out.print(f"temperature {entry['temperature']:g}: {entry['algorithm']} ({entry['speedup']:.2f}x), "
                  f"generate(**{entry['settings']})", markup=False)
    table = Table(title="measured speedups over the target alone")
    for name in ("task", "temperature", "method", "speedup", "tokens/s", "acceptance"):
        table.add_column(name)
    for row in metadata.get("speedups") or []:
        table.add_row(str(row.get("task")), _fmt(row.get("temperature"), "g"), _method_label(row),
                      _fmt(row.get("speedup"), ".2f", "x"), _fmt(row.get("tokens_per_second"), ".2f"),
                      _fmt(row.get("acceptance_rate"), ".2f"))
    out.print(table)
    if metadata.get("command"):
        out.print(f"reproduce: {metadata['command']}", markup=False)
    out.print("serving many users: vLLM, TLI only, greedy drafts (SLEM and SLRS have no vLLM counterpart):",
              markup=False)
    out.print(f"  {serve_command(metadata['target'], metadata['drafter'], metadata.get('lookahead'))}",
              markup=False, soft_wrap=True)
    for note in tli_notes(metadata.get("special_tokens")):
        out.print(f"  {note}", markup=False)
    return 0


def drafters_by_task(cards: list[dict]) -> list[dict]:
    """Which drafter measured fastest for each task and temperature, from pairing cards of one target.

    Args:
        cards: the ``hf_hetspec`` metadata of each card (:func:`read_card`); every card's ``target`` must be
            the same model.

    Returns:
        One dict per ``(task, temperature)`` that any card measured, sorted by task then temperature:
        ``{"task", "temperature", "speedups": {drafter: best hf_hetspec speedup over the target alone, or
        None where that card did not measure the task}, "best": the drafter with the highest speedup,
        "margin": best / second best (None with one measured drafter)}``. A card's speedup is the best of its
        hf_hetspec rows for the task (one per algorithm measured); transformers' rows are not hf_hetspec's.
        Speedups come from each card's own run, each a ratio to the target alone measured in that run, so
        cards measured on different machines compare only as well as their machines do (``hardware``).

    Raises:
        PairingError: fewer than two cards, two cards of one drafter, or cards of different targets.
    """
    if len(cards) < 2:
        raise PairingError("compare needs at least two pairing cards of the same target")
    targets = {card["target"] for card in cards}
    if len(targets) > 1:
        raise PairingError(f"the cards are of different targets ({', '.join(sorted(targets))}); compare "
                           "drafters of one target")
    drafters = [card["drafter"] for card in cards]
    if len(set(drafters)) < len(drafters):
        raise PairingError(f"two cards of the same drafter ({', '.join(drafters)}): give one card per drafter")
    best: dict[tuple[str, float], dict[str, float]] = {}
    for card in cards:
        for row in card.get("speedups") or []:
            if row.get("method") != "hf_hetspec" or row.get("speedup") is None:
                continue
            key = (str(row["task"]), float(row.get("temperature") or 0.0))
            per_drafter = best.setdefault(key, {})
            per_drafter[card["drafter"]] = max(per_drafter.get(card["drafter"], 0.0), float(row["speedup"]))
    rows = []
    for (task, temperature), per_drafter in sorted(best.items()):
        ranked = sorted(per_drafter.items(), key=lambda item: -item[1])
        rows.append({"task": task, "temperature": temperature,
                     "speedups": {d: per_drafter.get(d) for d in drafters}, "best": ranked[0][0],
                     "margin": ranked[0][1] / ranked[1][1] if len(ranked) > 1 else None})
    return rows


def print_drafters_by_task(cards: list[dict], rows: list[dict], out) -> None:
    """Print ``rows``, :func:`drafters_by_task` of ``cards`` (metadata dicts), on the rich console ``out``."""
    from rich.table import Table

    drafters = [card["drafter"] for card in cards]
    out.print(f"target {cards[0]['target']}: hf_hetspec's speedup over the target alone per drafter", markup=False)
    for card in cards:
        out.print(f"  {card['drafter']}: measured {card.get('date')} on {card.get('hardware')}", markup=False)
    table = Table()
    for name in ("task", "temperature", *drafters, "best", "margin"):
        table.add_column(name)
    for row in rows:
        table.add_row(row["task"], _fmt(row["temperature"], "g"),
                      *(_fmt(row["speedups"][d], ".2f", "x") for d in drafters), row["best"],
                      _fmt(row["margin"], ".2f", "x"))
    out.print(table)


def cmd_compare(args) -> int:
    """``hf-hetspec pairing compare``: :func:`drafters_by_task` as a table (``--json``: as JSON)."""
    import json

    try:
        cards = [read_card(card)[1] for card in args.cards]
        rows = drafters_by_task(cards)
    except PairingError as err:
        raise CLIError(str(err)) from err
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_drafters_by_task(cards, rows, console())
    return 0


def cmd_push(args) -> int:
    """``hf-hetspec pairing push``: :func:`push`."""
    try:
        url = push(args.folder, args.repo_id, token=args.token, private=args.private,
                   with_custom_generate=args.with_custom_generate)
    except PairingError as err:
        raise CLIError(str(err)) from err
    except Exception as err:  # network and authorization errors of huggingface_hub: one line, exit 1
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CLIError(f"push to {args.repo_id} failed: {first}", code=1) from err
    print(f"pushed {args.folder} to {url}")
    return 0


def add_command(sub) -> None:
    """Register ``hf-hetspec pairing {show,compare,push}`` on the CLI's subparsers ``sub``."""
    parser = sub.add_parser("pairing", help="show or publish a drafter pairing model card",
                            description="Drafter pairings are model cards (README.md with hf_hetspec metadata) "
                            "written by `hf-hetspec bench --write-card`.")
    actions = parser.add_subparsers(dest="pairing_command", required=True, metavar="{show,compare,push}")
    show = actions.add_parser("show", help="print a card's models, recommended settings, speedups and vLLM "
                              "settings")
    show.add_argument("card", metavar="PATH_OR_REPO", help="folder, README.md, or Hub repository id")
    show.add_argument("--json", action="store_true", help="print the card's hf_hetspec metadata as JSON")
    show.set_defaults(func=cmd_show)
    compare = actions.add_parser("compare", help="which drafter measured fastest per task, from cards of one "
                                 "target")
    compare.add_argument("cards", metavar="PATH_OR_REPO", nargs="+",
                         help="two or more cards (folders, README.md files or Hub repository ids)")
    compare.add_argument("--json", action="store_true", help="print the rows as JSON")
    compare.set_defaults(func=cmd_compare)
    pub = actions.add_parser("push", help="publish a card folder as a Hub model repository")
    pub.add_argument("folder", metavar="FOLDER")
    pub.add_argument("repo_id", metavar="REPO_ID", help="owner/name")
    pub.add_argument("--private", action="store_true", help="create the repository as private")
    pub.add_argument("--token", default=None, help="Hub token (default: the logged-in one or $HF_TOKEN)")
    pub.add_argument("--with-custom-generate", action="store_true",
                     help="also upload hf_hetspec's custom_generate/ folder, so the pairing runs with plain "
                     "transformers: generate(custom_generate=REPO_ID, trust_remote_code=True, ...)")
    pub.set_defaults(func=cmd_push)
