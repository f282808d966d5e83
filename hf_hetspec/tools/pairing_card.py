"""A pairing card written from a benchmark result (:func:`write_card`): a model card (``README.md`` made with
``huggingface_hub.ModelCard`` / ``ModelCardData``) whose YAML metadata holds, under the key ``hf_hetspec``,
the models, the recommended algorithm and settings per measured temperature (the best geometric-mean speedup
over the tasks), the measured speedups and the machine; its body the table, the plots, the command that
reproduces the numbers, the usage and the equivalent vLLM settings. The format: :mod:`hf_hetspec.tools.pairing`.
"""

from __future__ import annotations

import copy
import math
import shutil
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from .. import __version__
from . import zoo
from .card_policy import FORMAT, PairingError
from .pairing_vllm import serve_command, speculative_config, tli_notes
from .runner import METHOD_LABELS, method_label

CARD_KEY = "hf_hetspec"
CARD_FILE = "README.md"
TAGS = ["speculative-decoding", "assisted-generation", "heterogeneous-vocabularies", "hf_hetspec"]
_METHOD_ORDER = {name: i for i, name in enumerate(METHOD_LABELS)}
#: Captions of the plots ``hf-hetspec bench`` writes (keys of its ``plots`` dict); other keys are their own caption.
PLOT_CAPTIONS = {
    "speedup": "Speedup over the target alone per task and method",
    "lookahead": "Speedup vs lookahead per task (adaptive schedule dashed)",
}




# --------------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------------


def hub_id(name: str) -> str:
    """The Hub id of a zoo name (``hf_hetspec.tools.zoo.MODELS[name].hub_id``); any other name unchanged."""
    entry = zoo.MODELS.get(name)
    return entry.hub_id if entry is not None else name


def _card_reference(name: str, out_dir: Path) -> str:
    """A model folder inside the card's folder as a path relative to it (what :func:`load` accepts); any other
    name unchanged (a local folder elsewhere is written as given, and :func:`load` refuses it)."""
    path = Path(name).expanduser()
    if path.is_dir() and path.resolve().is_relative_to(Path(out_dir).expanduser().resolve()):
        return path.resolve().relative_to(Path(out_dir).expanduser().resolve()).as_posix()
    return name


def _geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def recommended_settings(result: dict) -> list[dict]:
    """Per measured temperature, the hf_hetspec algorithm with the best geometric-mean speedup over tasks.

    The lookahead is the benchmark's fixed one (``config.lookahead``). A benchmark run with the adaptive
    schedule keeps it (``None``) unless its lookahead sweep covers the recommended algorithm at that
    temperature and the adaptive schedule fell short of ``1 - 0.1`` of the best fixed lookahead on some task
    (the sweep's ``within_10_percent``); the recommendation is then the fixed lookahead with the best
    geometric-mean speedup over the swept tasks.

    Args:
        result: a ``hf-hetspec bench`` result (module docstring of :mod:`hf_hetspec.tools.pairing`).

    Returns:
        ``[{"temperature", "algorithm", "lookahead", "speedup", "settings"}]`` sorted by temperature;
        ``lookahead`` is an int or ``None`` (adaptive); ``settings`` are the ``generate()`` keyword
        arguments that select them.

    Raises:
        PairingError: no hf_hetspec row with a positive speedup.
    """
    fixed = result.get("config", {}).get("lookahead")
    speedups: dict[float, dict[str, list[float]]] = {}
    for row in result.get("results", []):
        if row.get("method") == "hf_hetspec" and row.get("speedup") and row.get("algorithm"):
            per_t = speedups.setdefault(float(row["temperature"]), {})
            per_t.setdefault(row["algorithm"], []).append(float(row["speedup"]))
    if not speedups:
        raise PairingError("result['results'] has no hf_hetspec row with a speedup; run `hf-hetspec bench` "
                           "with at least one hf_hetspec algorithm")
    out = []
    for temperature in sorted(speedups):
        by_algorithm = {a: _geometric_mean(v) for a, v in speedups[temperature].items()}
        algorithm = max(sorted(by_algorithm), key=by_algorithm.get)
        lookahead = fixed if fixed is not None else _swept_lookahead(result, temperature, algorithm)
        out.append({
            "temperature": temperature,
            "algorithm": algorithm,
            "lookahead": lookahead,
            "speedup": round(by_algorithm[algorithm], 4),
            "settings": generate_settings(algorithm, temperature, lookahead),
        })
    return out


def _swept_lookahead(result: dict, temperature: float, algorithm: str) -> int | None:
    """The best fixed lookahead of the sweep when the adaptive schedule missed it by more than 10% on a task."""
    rows = [r for r in result.get("lookahead_sweep") or []
            if float(r.get("temperature", -1)) == temperature and r.get("algorithm") == algorithm]
    adaptive = [r for r in rows if r.get("lookahead") == "adaptive"]
    if not adaptive or all(r.get("within_10_percent") for r in adaptive):
        return None
    by_k: dict[int, list[float]] = {}
    for r in rows:
        if isinstance(r.get("lookahead"), int) and r.get("speedup"):
            by_k.setdefault(r["lookahead"], []).append(float(r["speedup"]))
    if not by_k:
        return None
    means = {k: _geometric_mean(v) for k, v in by_k.items()}
    return max(sorted(means), key=means.get)


def _sweep_table(result: dict) -> str:
    rows = [r for r in result.get("lookahead_sweep") or [] if r.get("lookahead") == "adaptive"]
    if not rows:
        return ""
    lines = [("| task | temperature | algorithm | best fixed lookahead | adaptive / best fixed (tokens/s) "
              "| within 10% |"), "|---|---|---|---|---|---|"]
    for r in rows:
        within = {True: "yes", False: "no"}.get(r.get("within_10_percent"), "")
        lines.append(f"| {r.get('task')} | {_fmt(r.get('temperature'), 'g')} | {str(r.get('algorithm')).upper()} "
                     f"| {r.get('best_fixed_lookahead', '')} | {_fmt(r.get('adaptive_vs_best'), '.2f')} | {within} |")
    return ("Lookahead sweep: hf_hetspec's adaptive schedule against the best fixed lookahead.\n\n"
            + "\n".join(lines) + "\n")


def generate_settings(algorithm: str, temperature: float, lookahead: int | None) -> dict:
    """``generate()`` keyword arguments for an algorithm, a temperature (0: greedy) and a lookahead
    (``None``: the adaptive schedule)."""
    settings: dict = {"hetspec_algorithm": algorithm, "do_sample": temperature > 0}
    if temperature > 0:
        settings["temperature"] = temperature
    if lookahead is not None:
        settings["num_assistant_tokens"] = int(lookahead)
    return settings


def _hardware(machine: dict) -> str:
    if machine.get("gpu"):
        return str(machine["gpu"])
    parts = [str(machine.get("cpu") or "CPU")]
    if machine.get("cpu_count"):
        parts.append(f"{machine['cpu_count']} cores")
    if machine.get("torch_threads"):
        threads = machine["torch_threads"]
        parts.append(f"{threads} torch thread{'s' if threads != 1 else ''}")
    return ", ".join(parts)


def _round(value, digits: int = 4):
    """Floats rounded for the YAML metadata; ints, booleans, strings and ``None`` unchanged."""
    return round(value, digits) if isinstance(value, float) else value


def _speedup_rows(result: dict) -> list[dict]:
    keep = ("task", "temperature", "method", "algorithm", "speedup", "tokens_per_second", "acceptance_rate",
            "tokens_per_forward", "tpot_ms")
    rows = []
    for row in _sorted_rows(result):
        if row.get("method") == "target":
            continue
        rows.append({k: _round(row.get(k)) if k not in ("task", "method", "algorithm") else row.get(k)
                     for k in keep})
    return rows


def _sorted_rows(result: dict) -> list[dict]:
    return sorted(result.get("results", []), key=lambda r: (
        str(r.get("task")), float(r.get("temperature", 0)), _METHOD_ORDER.get(r.get("method"), 9),
        str(r.get("algorithm") or "")))


def _check_result(result: dict) -> None:
    if not isinstance(result, dict):
        raise PairingError(f"result must be the dict `hf-hetspec bench` writes, got {type(result).__name__}")
    for key in ("config", "results"):
        if key not in result:
            raise PairingError(f"result has no {key!r}: pass the dict `hf-hetspec bench --json` writes")
    for key in ("target", "drafter"):
        if not result["config"].get(key):
            raise PairingError(f"result['config'] has no {key!r}: the card needs both model names")


def _resolve_auto(result: dict) -> dict:
    """``result`` with each hf_hetspec row of algorithm ``auto`` given the algorithm its calls ran.

    Raises:
        PairingError: an ``auto`` row whose calls ran several algorithms, or whose records are absent.
    """
    def auto(entry: dict) -> tuple | None:
        """``(task, temperature)`` of an hf_hetspec row or record of ``auto``, else ``None``."""
        if entry.get("method") == "hf_hetspec" and entry.get("algorithm") == "auto":
            return entry.get("task"), float(entry.get("temperature", 0))
        return None

    ran: dict[tuple, set] = {}
    for record in result.get("records") or []:
        if key := auto(record):
            ran.setdefault(key, set()).add((record.get("stats") or {}).get("algorithm"))
    rows = []
    for row in result["results"]:
        if key := auto(row):
            algorithms = ran.get(key, set())
            if len(algorithms) != 1 or None in algorithms:
                raise PairingError(
                    f"results: hetspec_algorithm='auto' on {row.get('task')} at temperature {row.get('temperature')} "
                    f"ran {sorted(map(str, algorithms)) or 'no recorded call'}; a card needs the one algorithm that "
                    "ran (bench.json's records), or a run with --algorithms slem|tli|slrs")
            row = {**row, "algorithm": algorithms.pop()}
        rows.append(row)
    return {**result, "results": rows}


def _method_label(row: dict) -> str:
    return method_label(row.get("method"), (row.get("algorithm") or "").upper())


def _per_task(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{task} {n}" for task, n in value.items())
    return "?" if value is None else str(value)


def _fmt(value, spec: str, suffix: str = "") -> str:
    return "" if value is None else format(value, spec) + suffix


def _table(result: dict) -> str:
    header = ("| task | temperature | method | tokens/s | speedup | acceptance rate | tokens per target forward "
              "| TPOT (ms) | TTFT (ms) | expected speedup (Leviathan) | greedy output vs target alone |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in _sorted_rows(result):
        method = row.get("label") or _method_label(row)
        expected = None if row.get("method") == "target" else row.get("theoretical_speedup")
        verdict = ""
        if row.get("identical") is not None:
            verdict = f"{row['identical']} identical / {row.get('tie', 0)} tie / {row.get('different', 0)} different"
        lines.append(
            f"| {row.get('task')} | {_fmt(row.get('temperature'), 'g')} | {method} "
            f"| {_fmt(row.get('tokens_per_second'), '.2f')} | {_fmt(row.get('speedup'), '.2f', 'x')} "
            f"| {_fmt(row.get('acceptance_rate'), '.2f')} | {_fmt(row.get('tokens_per_forward'), '.2f')} "
            f"| {_fmt(row.get('tpot_ms'), '.1f')} | {_fmt(row.get('ttft_ms'), '.0f')} "
            f"| {_fmt(expected, '.2f', 'x')} | {verdict} |"
        )
    return "\n".join(lines)


def _vllm_section(target: str, drafter: str, lookahead: int | None, tokens: dict | None) -> str:
    k = speculative_config(drafter, lookahead)["num_speculative_tokens"]
    if lookahead is not None:
        lookahead_note = f"the benchmark above used a fixed lookahead of {k}"
    else:
        lookahead_note = f"hf_hetspec adapted it here, and {k} is where its adaptive schedule starts"
    notes = tli_notes(tokens)
    return f"""## Equivalent vLLM settings

vLLM's draft-model speculative decoding accepts a drafter with another vocabulary through
`use_heterogeneous_vocab` (added by [vllm-project/vllm#38174](https://github.com/vllm-project/vllm/pull/38174);
documented on `SpeculativeConfig` in `vllm/config/speculative.py`). It runs **TLI only**: at start-up it
intersects the two vocabularies and masks the drafter's logits to the shared tokens. SLEM and SLRS have no
vLLM counterpart (SLEM is proposed in [vllm-project/vllm#45018](https://github.com/vllm-project/vllm/pull/45018),
not merged when this card was written). Differences from hf_hetspec's TLI, from vLLM's source and docs:

- the intersection compares token *strings* after normalizing the leading space marker
  (`vllm/v1/spec_decode/vocab_mapping.py`), close to transformers' rule (`hf-hetspec analyze` prints both
  counts), not hf_hetspec's byte-exact rule;
- it requires `method="draft_model"` and supports greedy draft sampling only (the vLLM docs: probabilistic
  draft sampling is not yet supported with this option);
- the lookahead is fixed (`num_speculative_tokens`); {lookahead_note};
- each target token outside the shared vocabulary reaches the drafter as one stand-in id: the drafter's
  `unk_token_id`, else its `eos_token_id` with a warning; a tokenizer with neither is refused
  (`vocab_mapping.py`).

**With vLLM:** {"; ".join(notes)}.

Both models must be architectures vLLM supports. The numbers on this card were measured with hf_hetspec,
not vLLM.

```bash
{serve_command(target, drafter, lookahead)}
```
"""


def write_card(result: dict, out_dir: Path, plots: dict[str, Path] | None = None) -> Path:
    """Write the model card of a pairing measured by ``hf-hetspec bench``.

    Args:
        result: the benchmark result dict (``machine``, ``config``, ``results``; see ``hf-hetspec bench``).
        out_dir: folder to write ``README.md`` into (created if missing).
        plots: ``{caption: path of a PNG}``; each file is copied next to the card and embedded.

    Returns:
        The path of the written ``README.md``.

    Rows measured with ``hetspec_algorithm="auto"`` are recorded as the algorithm auto ran (each call's
    ``stats.algorithm`` in ``result["records"]``): a card recommends an algorithm, not a rule.

    Raises:
        PairingError: a result without ``config.target``/``config.drafter`` or without hf_hetspec speedups,
            a missing plot file, or ``auto`` rows whose records do not say which one algorithm ran.
    """
    _check_result(result)
    result = _resolve_auto(result)
    plots = dict(plots or {})
    for caption, path in plots.items():
        if not Path(path).is_file():
            raise PairingError(f"plots[{caption!r}]: {path} is not a file")
    config, machine = result["config"], result.get("machine", {})
    target, drafter = (_card_reference(hub_id(config[key]), out_dir) for key in ("target", "drafter"))
    recommended = recommended_settings(result)
    first = recommended[0]
    metadata = {
        "format": FORMAT,
        "target": target,
        "drafter": drafter,
        "algorithm": first["algorithm"],
        "lookahead": first["lookahead"],
        "settings": copy.deepcopy(first["settings"]),  # a copy: YAML would write an anchor for a shared dict
        "recommended": recommended,
        "speedups": _speedup_rows(result),
        "hardware": _hardware(machine),
        "device": config.get("device") or machine.get("device"),
        "dtype": config.get("dtype"),
        "torch": machine.get("torch"),
        "transformers": machine.get("transformers"),
        "hf_hetspec": config.get("hf_hetspec_version") or __version__,
        "date": config.get("date"),
        "command": config.get("command"),
        "tasks": config.get("tasks"),
        "lookahead_sweep": [{k: _round(v) if k not in ("task", "algorithm", "lookahead") else v
                             for k, v in r.items()} for r in result.get("lookahead_sweep") or []
                            if r.get("lookahead") == "adaptive"],
        "max_new_tokens": config.get("max_new_tokens"),
        "special_tokens": config.get("special_tokens"),
    }
    data = ModelCardData(
        base_model=target,
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=list(TAGS),
        **{CARD_KEY: metadata},
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = []
    for caption, path in plots.items():
        path = Path(path)
        destination = out_dir / path.name
        if path.resolve() != destination.resolve():
            shutil.copyfile(path, destination)
        figures.append(f"![{PLOT_CAPTIONS.get(caption, caption)}]({path.name})")

    short_target, short_drafter = target.split("/")[-1], drafter.split("/")[-1]
    best = "; ".join(
        f"{'greedy' if r['temperature'] == 0 else 'temperature ' + format(r['temperature'], 'g')}: "
        f"**{r['algorithm'].upper()}** ({r['speedup']:.2f}x geometric mean over tasks)"
        for r in recommended
    )
    settings_code = repr(first["settings"])
    lookahead = "adaptive (hf_hetspec's schedule)" if first["lookahead"] is None else first["lookahead"]
    body = f"""
# {short_target} drafted by {short_drafter} (hf_hetspec pairing)

Lossless speculative decoding of [{target}](https://huggingface.co/{target}) with the drafter
[{drafter}](https://huggingface.co/{drafter}), whose vocabulary differs from the target's, with hf_hetspec
(the algorithms of Timor et al., ICML 2025, [arXiv 2502.05202](https://arxiv.org/abs/2502.05202)).
The output is the target's own: token-identical under greedy decoding, the target's distribution under
sampling.

Recommended: {best}. Lookahead: {lookahead}.

## Measured

{metadata["date"] or "date not recorded"}; {metadata["hardware"]}; device {metadata["device"]}, {metadata["dtype"]};
torch {metadata["torch"]}, transformers {metadata["transformers"]}, hf_hetspec {metadata["hf_hetspec"]};
{config.get("max_new_tokens", "?")} new tokens; prompts per task: {_per_task(config.get("prompts_per_task"))};
seeds {config.get("seeds", "?")}. Speedup: tokens/s of a method over the target alone's in the same run.
Acceptance rate: accepted / drafted tokens. Expected speedup: Leviathan et al.'s formula from the measured
alpha (accepted / (accepted + rejections), over the drafted tokens verification reached), mean lookahead and
cost ratio.

{_table(result)}
{"".join(chr(10) + figure + chr(10) for figure in figures)}
{_sweep_table(result)}
Reproduce:

```bash
{metadata["command"] or "hf-hetspec bench  # command not recorded"}
```

## Use with hf_hetspec

```python
import hf_hetspec
from hf_hetspec.tools import pairing

p = pairing.load("{out_dir.name}")  # this card's folder, or its Hub repository id once pushed
hf_hetspec.enable(p.target)
ids = p.target_tokenizer.apply_chat_template(
    [{{"role": "user", "content": "Write a function that reverses a string."}}],
    add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
out = p.target.generate(ids, max_new_tokens=128, **p.generate_kwargs())
# the same by hand: assistant_model=p.drafter, tokenizer=p.target_tokenizer,
# assistant_tokenizer=p.drafter_tokenizer, **{settings_code}
print(p.target_tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
print(hf_hetspec.last_stats(p.target).summary())
```

`p.generate_kwargs(temperature=1.0)` gives the settings measured best for sampling at that temperature.

{_vllm_section(target, drafter, first["lookahead"], metadata["special_tokens"])}
## Models

This card holds no weights: the target and the drafter are loaded from their own repositories, under their
own licenses.
"""
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")
    path = out_dir / CARD_FILE
    card.save(path)
    return path
