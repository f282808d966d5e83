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

The recommended algorithm at a temperature is the hf_hetspec algorithm with the best geometric-mean
speedup over the benchmark's tasks at that temperature. The card's body holds the table, the plots, the
command that reproduces the numbers, how to use the pairing with hf_hetspec, and the equivalent vLLM
settings.

:func:`load` reads a card from a folder or a Hub repository (only ``README.md`` is downloaded; no code from
the Hub is executed; models load with :func:`hf_hetspec.tools.zoo.load`, which never trusts remote code). What a
card may set, and where its models may come from, is :mod:`hf_hetspec.tools.card_policy` (its threat model).
"""

from __future__ import annotations

import copy
import math
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from huggingface_hub import ModelCard, ModelCardData

from .. import __version__
from ..plan import DEFAULT_LOOKAHEAD
from . import zoo
from .card_policy import FORMAT, PairingError, check_metadata, check_settings, model_reference
from .common import CLIError, console
from .runner import METHOD_LABELS, method_label

CARD_KEY = "hf_hetspec"
CARD_FILE = "README.md"
TAGS = ["speculative-decoding", "assisted-generation", "heterogeneous-vocabularies", "hf_hetspec"]
_METHOD_ORDER = {name: i for i, name in enumerate(METHOD_LABELS)}
HUB_PROBE_SECONDS = 3.0
#: The largest card file :func:`read_card` reads (bytes); a written card is a few KB.
MAX_CARD_BYTES = 1 << 20
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


def _vllm_section(target: str, drafter: str, lookahead: int | None) -> str:
    import json

    k = lookahead if lookahead is not None else DEFAULT_LOOKAHEAD
    if lookahead is not None:
        lookahead_note = f"the benchmark above used a fixed lookahead of {k}"
    else:
        lookahead_note = f"hf_hetspec adapted it here, and {k} is where its adaptive schedule starts"
    config = {"method": "draft_model", "model": drafter, "num_speculative_tokens": k,
              "use_heterogeneous_vocab": True}
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
- the lookahead is fixed (`num_speculative_tokens`); {lookahead_note}.

Both models must be architectures vLLM supports. The numbers on this card were measured with hf_hetspec,
not vLLM.

```bash
vllm serve {target} --speculative-config '{json.dumps(config)}'
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

    Raises:
        PairingError: a result without ``config.target``/``config.drafter`` or without hf_hetspec speedups,
            or a missing plot file.
    """
    _check_result(result)
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

{_vllm_section(target, drafter, first["lookahead"])}
## Models

This card holds no weights: the target and the drafter are loaded from their own repositories, under their
own licenses.
"""
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")
    path = out_dir / CARD_FILE
    card.save(path)
    return path


# --------------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------------


@dataclass
class Pairing:
    """A pairing read from a model card.

    Attributes:
        target, drafter: the models (``None`` with ``load_models=False``).
        target_tokenizer, drafter_tokenizer: their tokenizers (``None`` with ``load_models=False``).
        settings: recommended ``generate()`` keyword arguments at the lowest measured temperature (greedy
            when measured), e.g. ``{"hetspec_algorithm": "slem", "do_sample": False}``.
        card: the ``huggingface_hub.ModelCard``.
        metadata: the card's ``hf_hetspec`` metadata (module docstring).
    """

    target: object
    drafter: object
    target_tokenizer: object
    drafter_tokenizer: object
    settings: dict
    card: ModelCard
    metadata: dict = field(default_factory=dict)

    def settings_for(self, temperature: float | None = None) -> dict:
        """Recommended ``generate()`` kwargs at ``temperature`` (the measured temperature nearest to it;
        ``None``: :attr:`settings`). A temperature the card did not measure keeps its algorithm and lookahead
        but samples at the temperature asked for."""
        if temperature is None:
            return dict(self.settings)
        entries = self.metadata.get("recommended") or []
        if not entries:
            return dict(self.settings)
        nearest = min(entries, key=lambda e: (abs(float(e["temperature"]) - temperature), e["temperature"]))
        return generate_settings(nearest["algorithm"], float(temperature), nearest.get("lookahead"))

    def generate_kwargs(self, temperature: float | None = None) -> dict:
        """:meth:`settings_for` plus ``assistant_model``, ``tokenizer`` and ``assistant_tokenizer``.

        The settings are checked against the allow-list again (:func:`hf_hetspec.tools.card_policy.check_settings`)
        and the models are set last, so nothing from the card can replace them or add other arguments.

        Raises:
            PairingError: the pairing was loaded with ``load_models=False``, or settings outside the allow-list.
        """
        if self.drafter is None or self.target_tokenizer is None:
            raise PairingError("this pairing was loaded with load_models=False; load it with load_models=True")
        settings = check_settings(self.settings_for(temperature))
        return {**settings, "assistant_model": self.drafter, "tokenizer": self.target_tokenizer,
                "assistant_tokenizer": self.drafter_tokenizer}


def _hub_offline() -> bool:
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return bool(constants.HF_HUB_OFFLINE) or env in ("1", "ON", "YES", "TRUE")


def _hub_reachable(timeout: float = HUB_PROBE_SECONDS) -> bool:
    """Whether a TCP connection to the Hub endpoint opens within ``timeout`` seconds (always ``True`` behind a
    proxy, which the probe cannot see through)."""
    from huggingface_hub import constants

    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def _card_file(path_or_repo_id: str | os.PathLike) -> tuple[Path, bool]:
    """The local ``README.md`` of a folder, a card file, or a Hub repository (downloaded: that file only), and
    whether it came from a local folder (its model references may then name folders inside it)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    name = os.fspath(path_or_repo_id)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / CARD_FILE).is_file():
            raise PairingError(f"{name}: the folder has no {CARD_FILE}; write one with hf_hetspec.tools.pairing.write_card "
                               "(or `hf-hetspec bench --write-card`)")
        return path / CARD_FILE, True
    if path.is_file():
        return path, True
    if name.startswith(("/", ".", "~")) or name.count("/") != 1 or not all(name.split("/")):
        raise PairingError(f"{name!r} is neither a folder nor a Hub repository id (owner/name)")
    try:
        return Path(hf_hub_download(name, CARD_FILE, local_files_only=True)), False
    except (LocalEntryNotFoundError, EntryNotFoundError, FileNotFoundError):
        pass
    except ValueError as err:  # huggingface_hub's HFValidationError: characters a repository id cannot hold
        raise PairingError(f"{name!r} is not a valid Hub repository id: {err}") from err
    if _hub_offline():
        raise PairingError(f"{name}: not in the Hugging Face cache and HF_HUB_OFFLINE is set; pass a local folder")
    if not _hub_reachable():
        raise PairingError(f"{name}: not in the Hugging Face cache and the Hub is unreachable from this machine; "
                           "pass a local folder (e.g. one from `hf-hetspec bench --write-card`)")
    try:
        return Path(hf_hub_download(name, CARD_FILE, etag_timeout=HUB_PROBE_SECONDS)), False
    except (RepositoryNotFoundError, EntryNotFoundError) as err:
        raise PairingError(f"{name}: no such repository or it has no {CARD_FILE} ({type(err).__name__})") from err
    except (HfHubHTTPError, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PairingError(f"{name}: the card could not be downloaded: {first}") from err


def read_card(path_or_repo_id: str | os.PathLike) -> tuple[ModelCard, dict]:
    """The model card and its ``hf_hetspec`` metadata, from a folder, a ``README.md`` or a Hub repository.

    Raises:
        PairingError: no card, or a card without valid ``hf_hetspec`` metadata (types, format version and the
            settings allow-list: :func:`hf_hetspec.tools.card_policy.check_metadata`).
    """
    card, metadata, _ = _read(path_or_repo_id)
    return card, metadata


def _read(path_or_repo_id: str | os.PathLike) -> tuple[ModelCard, dict, Path | None]:
    """:func:`read_card` plus the card's local folder (``None`` for a card from the Hub)."""
    path, local = _card_file(path_or_repo_id)
    import yaml

    _check_header(path)
    try:
        card = ModelCard.load(path)
    except (ValueError, yaml.YAMLError) as err:  # YAML that does not parse, or not a mapping
        raise PairingError(f"{path}: not a readable model card ({type(err).__name__}: {err})") from err
    metadata = card.data.to_dict().get(CARD_KEY)
    if metadata is None:
        raise PairingError(f"{path}: the card has no {CARD_KEY!r} metadata; it is not an hf_hetspec pairing card")
    check_metadata(metadata, f"{path}: {CARD_KEY}")
    return card, metadata, path.parent if local else None


def _check_header(path: Path) -> None:
    """Refuse a card that could make its reader hang before ``huggingface_hub`` parses it: a file over
    :data:`MAX_CARD_BYTES`, or a YAML header with aliases. A header of 1 KB nesting aliases ten times per level
    ("billion laughs") stands for 10^9 items once expanded (``card.data.to_dict()`` copies every one); a
    pairing card never needs an alias. The header is scanned as YAML events, which never expands anything.

    Raises:
        PairingError: the file is too large, is not UTF-8 text, or its header holds an alias or an anchor.
    """
    import yaml

    size = path.stat().st_size
    if size > MAX_CARD_BYTES:
        raise PairingError(f"{path}: {size} bytes; a pairing card has at most {MAX_CARD_BYTES} (refused unread)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise PairingError(f"{path}: not a readable model card (not UTF-8 text: {err})") from err
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        return  # no header: ModelCard.load reads no metadata, and _read says so
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), len(lines))
    try:
        for event in yaml.parse("\n".join(lines[1:end]), Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                raise PairingError(f"{path}: the card's YAML header uses anchors or aliases (&name / *name), "
                                   "which a pairing card never needs; write the values out")
    except yaml.YAMLError as err:
        raise PairingError(f"{path}: not a readable model card ({type(err).__name__}: {err})") from err


def load(path_or_repo_id: str | os.PathLike, *, load_models: bool = True, dtype=None, device=None) -> Pairing:
    """Read a pairing card and load its models.

    Args:
        path_or_repo_id: a folder holding ``README.md``, the card file itself, or a Hub repository id. From
            the Hub only ``README.md`` is downloaded (cache first; no code is executed).
        load_models: also load the target and the drafter with :func:`hf_hetspec.tools.zoo.load` (Hub ids of zoo
            models fall back to the offline zoo copies).
        dtype, device: passed to :func:`hf_hetspec.tools.zoo.load` (default float32 on CPU).

    Returns:
        :class:`Pairing`.

    Raises:
        PairingError: no card, a malformed card, settings outside the allow-list, a model reference outside
            the card's folder (:mod:`hf_hetspec.tools.card_policy`), or an unreachable Hub; all before any
            model loads.
        hf_hetspec.tools.zoo.ZooError: a model that cannot be loaded.
    """
    card, metadata, folder = _read(path_or_repo_id)
    references = [model_reference(metadata[key], folder) for key in ("target", "drafter")]
    target = drafter = target_tok = drafter_tok = None
    if load_models:
        target, target_tok = zoo.load(references[0], dtype=dtype, device=device)
        drafter, drafter_tok = zoo.load(references[1], dtype=dtype, device=device)
    return Pairing(target, drafter, target_tok, drafter_tok, dict(metadata["settings"]), card, metadata)


# --------------------------------------------------------------------------------------------------------
# Publishing
# --------------------------------------------------------------------------------------------------------


def push(folder: str | os.PathLike, repo_id: str, *, token: str | None = None, private: bool = False,
         with_custom_generate: bool = False) -> str:
    """Publish a pairing folder (its ``README.md`` and plots) as a Hub model repository.

    Uses ``huggingface_hub.HfApi``: ``create_repo(exist_ok=True)`` then ``upload_folder``. The card is read
    and checked before any network call.

    Args:
        folder: a folder written by :func:`write_card`.
        repo_id: ``owner/name`` on the Hub.
        token: a Hub token; default: the logged-in one (``hf auth login``) or ``$HF_TOKEN``.
        private: create the repository as private.
        with_custom_generate: also upload hf_hetspec's ``custom_generate/`` folder
            (:data:`hf_hetspec.custom_generate.FOLDER`), tag the card ``custom_generate`` and add its usage, so
            the published pairing runs with plain transformers: ``generate(..., custom_generate=repo_id,
            trust_remote_code=True, ...)``. The card's settings are unchanged (they never select it).

    Returns:
        The URL of the upload's commit.

    Raises:
        PairingError: not a pairing folder, or a malformed ``repo_id``.
    """
    from huggingface_hub import HfApi

    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise PairingError(f"{folder}: not a folder; pass the folder written by write_card")
    read_card(folder)
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise PairingError(f"repo_id {repo_id!r}: use owner/name, e.g. my-user/qwen2.5-coder-smollm2-pairing")
    api = HfApi(token=token)
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    if not with_custom_generate:
        info = api.upload_folder(repo_id=repo_id, folder_path=folder, repo_type="model",
                                 commit_message="hf_hetspec pairing card")
        return str(getattr(info, "commit_url", info))
    with tempfile.TemporaryDirectory() as staging:  # one commit: the card and the folder together
        _stage_with_custom_generate(folder, Path(staging), repo_id)
        info = api.upload_folder(repo_id=repo_id, folder_path=Path(staging), repo_type="model",
                                 commit_message="hf_hetspec pairing card with its custom_generate folder")
    return str(getattr(info, "commit_url", info))


def _stage_with_custom_generate(folder: Path, staging: Path, repo_id: str) -> None:
    """Copy the card folder and ``custom_generate/`` into ``staging``; tag the card and add the usage."""
    from ..custom_generate import FOLDER

    shutil.copytree(folder, staging, dirs_exist_ok=True)
    shutil.copytree(Path(FOLDER) / "custom_generate", staging / "custom_generate", dirs_exist_ok=True)
    card = ModelCard.load(staging / CARD_FILE)
    tags = list(card.data.tags or [])
    if "custom_generate" not in tags:  # the tag transformers' docs use to list decoding-method repositories
        card.data.tags = tags + ["custom_generate"]
    card.text += f"""
## Use with plain transformers (`custom_generate`)

This repository also holds hf_hetspec's `custom_generate/` folder: with `pip install hf_hetspec`, a model that
was never enabled runs the pairing through transformers' own `custom_generate` channel (same outputs,
statistics in `hf_hetspec.last_stats(target)`):

```python
out = target.generate(ids, custom_generate="{repo_id}", trust_remote_code=True, assistant_model=drafter,
                      tokenizer=target_tokenizer, assistant_tokenizer=drafter_tokenizer, max_new_tokens=128)
```
"""
    card.save(staging / CARD_FILE)


# --------------------------------------------------------------------------------------------------------
# hf-hetspec pairing {show,push}
# --------------------------------------------------------------------------------------------------------


def cmd_show(args) -> int:
    """``hf-hetspec pairing show``: the card's models, recommended settings and measured speedups."""
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
    """Register ``hf-hetspec pairing {show,push}`` on the CLI's subparsers ``sub``."""
    parser = sub.add_parser("pairing", help="show or publish a drafter pairing model card",
                            description="Drafter pairings are model cards (README.md with hf_hetspec metadata) "
                            "written by `hf-hetspec bench --write-card`.")
    actions = parser.add_subparsers(dest="pairing_command", required=True, metavar="{show,push}")
    show = actions.add_parser("show", help="print a card's models, recommended settings and speedups")
    show.add_argument("card", metavar="PATH_OR_REPO", help="folder, README.md, or Hub repository id")
    show.add_argument("--json", action="store_true", help="print the card's hf_hetspec metadata as JSON")
    show.set_defaults(func=cmd_show)
    pub = actions.add_parser("push", help="publish a card folder as a Hub model repository")
    pub.add_argument("folder", metavar="FOLDER")
    pub.add_argument("repo_id", metavar="REPO_ID", help="owner/name")
    pub.add_argument("--private", action="store_true", help="create the repository as private")
    pub.add_argument("--token", default=None, help="Hub token (default: the logged-in one or $HF_TOKEN)")
    pub.add_argument("--with-custom-generate", action="store_true",
                     help="also upload hf_hetspec's custom_generate/ folder, so the pairing runs with plain "
                     "transformers: generate(custom_generate=REPO_ID, trust_remote_code=True, ...)")
    pub.set_defaults(func=cmd_push)
