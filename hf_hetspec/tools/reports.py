"""Reports of ``hf-hetspec bench``: the Markdown tables, the plots and the files of ``--out``.

Input is the result dict that :func:`hf_hetspec.tools.bench.cmd_bench` builds, exactly what ``bench.json`` holds
(schema in :mod:`hf_hetspec.tools.bench`). :func:`markdown_report` gives the text printed at the end of a run and
written to ``bench.md``: a header line (date, machine, versions, models, dtype), the prompts' half, the
command, a warning when any call ran on a busy machine (:data:`CONTENDED_WARNING`), the results table (one row
per task, temperature and method; rows with contended calls marked), the suite summary (geometric mean over the
Spec-Bench categories and the slowest prompt per method) and, with ``--lookahead-sweep``, the lookahead table;
:func:`plot_speedup` and :func:`plot_lookahead` draw ``speedup.png`` and ``lookahead.png`` with matplotlib;
:func:`write_outputs` writes all of them into the ``--out`` folder.
"""

from __future__ import annotations

import json
from pathlib import Path

#: The adaptive lookahead should reach at least 1 - WITHIN of the best fixed lookahead's tokens/s.
WITHIN = 0.10
#: How the α column (and the bound built on it) is measured; printed under every bench table.
ALPHA_NOTE = (
    "α: Leviathan et al.'s acceptance rate, accepted / (accepted + rejections) over the drafted tokens that "
    "verification reached (a rejection ends a round; the acceptance column, accepted / drafted, also counts "
    "the tokens drafted after it)."
)
#: Printed at the top of a report when the target's reference step slowed during the run
#: (hf_hetspec.tools.bench.reference_drift).
DRIFT_WARNING = (
    "WARNING: the target's reference step (one token, timed before each prompt) ran {drifted} of {prompts} prompts "
    "more than {margin:.0%} slower than its fastest ({min_ms:.0f} to {max_ms:.0f} ms): the machine slowed during "
    "the run, which the load average may not show; speedups of those prompts lean on a slower target."
)
#: Printed at the top of a report when any call was contended (hf_hetspec.tools.bench.contended).
CONTENDED_WARNING = (
    "WARNING: {contended} of {calls} calls ran while another job shared the machine (1-minute load average "
    "before or after the call above torch threads + 0.5; max {load_max:.2f}; rows marked 'contended'): "
    "headline figures need a quiet machine."
)
#: Footnote of every report with a sampled transformers row.
TRANSFORMERS_SAMPLING_NOTE = (
    "transformers UAG at T > 0 is its universal speculative decoding, which is lossy for heterogeneous pairs "
    "whose drafter has tokens outside the intersection (both zoo drafters): it prunes the drafter's LM head in "
    "get_vocab() order and scatters the logits back in id order, so q is not the distribution the draft came "
    "from (tests/test_lossless.py::test_rejects_transformers_universal_assisted_sampling_qwen_target). Its "
    "speed and acceptance are shown, not endorsed."
)


def machine_summary(info: dict) -> str:
    """One line for a report's header: the GPU, or the CPU with its instructions, cores and torch threads (runs
    recorded before the instructions were recorded show without them)."""
    if info.get("gpu"):
        return info["gpu"]
    cpu = info["cpu"]
    if info.get("cpu_instructions"):
        bf16 = "bf16 instructions" if info.get("bf16_instructions") else "no bf16 instructions"
        cpu = f"{cpu} ({info['cpu_instructions']}, {bf16})"
    return f"{cpu}, {info['cpu_count']} cores, {info['torch_threads']} torch threads"


def _f(value, spec: str = ".2f", suffix: str = "") -> str:
    return "" if value is None else format(value, spec) + suffix


def markdown_report(result: dict) -> str:
    """The run as Markdown: a header line, the results table and, with a sweep, the lookahead table."""
    config, machine = result["config"], result["machine"]
    where = machine_summary(machine)
    homogeneous = config["homogeneous_drafter"]
    suite = result.get("suite_summary") or {}
    lines = [
        f"{config['date']}, {where}; torch {machine['torch']}, transformers {machine['transformers']}; "
        f"{config['dtype']}; target {config['target']}, drafter {config['drafter']}"
        + (f", homogeneous drafter {homogeneous}" if homogeneous else "")
        + f"; {config['max_new_tokens']} new tokens; chat template "
        + ("on." if config["chat_template"] else "off."),
        "",
        f"`{config['command']}`",
    ]
    if config.get("half"):
        suite_name = f"suite {config['suite']}; " if config.get("suite") else ""
        lines += ["", f"Prompts: {suite_name}{config['half_rule']} (--half {config['half']}); ids in bench.json "
                  "config.prompt_ids."]
    for failure in result.get("left_out") or []:  # runs recorded before methods could be left out have none
        lines += ["", f"Left out of this run: {failure}"]
    if suite.get("contended_calls"):
        lines += ["", CONTENDED_WARNING.format(contended=suite["contended_calls"], calls=suite["calls"],
                                               load_max=suite["load_max"])]
    step = suite.get("reference_step") or {}
    if step.get("prompts"):
        lines += ["", f"Reference step (the target's one-token forward before each prompt): median "
                  f"{step['median_ms']:.0f} ms, {step['min_ms']:.0f} to {step['max_ms']:.0f} ms over "
                  f"{step['prompts']} prompts."]
        if step["drifted_prompts"]:
            lines += ["", DRIFT_WARNING.format(drifted=step["drifted_prompts"], prompts=step["prompts"],
                                               margin=step["margin"], min_ms=step["min_ms"], max_ms=step["max_ms"])]
    lines += [
        "",
        "| task | T | method | tokens/s | speedup | vs UAG | TPOT ms | TTFT ms | acceptance | tokens/forward "
        "| drafter/target/translation s | peak MiB | identical/tie/different | γ | α | c | bound "
        "| achieved/bound | load max |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["results"]:
        split = ("" if r["drafter_s"] is None
                 else f"{r['drafter_s']:.1f}/{r['target_s']:.1f}/{r['translation_s']:.1f}")
        verdicts = "" if r["identical"] is None else f"{r['identical']}/{r['tie']}/{r['different']}"
        load = _f(r.get("load_max"))
        if r.get("contended_calls"):
            load += f" contended {r['contended_calls']}/{r['runs']}"
        lines.append(
            f"| {r['task']} | {r['temperature']:g} | {r['label']} | {r['tokens_per_second']:.2f} "
            f"| {_f(r['speedup'], '.2f', 'x')} | {_f(r.get('vs_transformers'), '.2f', 'x')} "
            f"| {_f(r['tpot_ms'], '.0f')} | {_f(r['ttft_ms'], '.0f')} "
            f"| {_f(r['acceptance_rate'])} | {_f(r['tokens_per_forward'])} | {split} "
            f"| {_f(r['peak_memory_mb'], '.0f')} | {verdicts} | {_f(r['mean_lookahead'], '.1f')} "
            f"| {_f(r.get('alpha'))} | {_f(r['cost_ratio'], '.3f')} | {_f(r['theoretical_speedup'], '.2f', 'x')} "
            f"| {_f(r['bound_ratio'])} | {load} |"
        )
    lines += _suite_lines(suite)
    sweep = result["lookahead_sweep"]
    if sweep:
        ks = [k for k in dict.fromkeys(r["lookahead"] for r in sweep) if k != "adaptive"]
        lines += [
            "",
            f"Lookahead sweep, hf_hetspec {sweep[0]['algorithm']} (speedup vs target alone; adaptive = "
            f"default schedule; within 10%: adaptive tokens/s >= {1 - WITHIN:.0%} of the best fixed "
            "lookahead's):",
            "",
            "| task | T | " + " | ".join(f"k={k}" for k in ks)
            + " | adaptive | best fixed k | adaptive/best | within 10% |",
            "|---|---|" + "---|" * (len(ks) + 4),
        ]
        for task, temperature in dict.fromkeys((r["task"], r["temperature"]) for r in sweep):
            rows = {r["lookahead"]: r for r in sweep if (r["task"], r["temperature"]) == (task, temperature)}
            adaptive = rows["adaptive"]
            lines.append(
                f"| {task} | {temperature:g} | " + " | ".join(_f(rows[k]["speedup"], ".2f", "x") for k in ks)
                + f" | {_f(adaptive['speedup'], '.2f', 'x')} | {adaptive['best_fixed_lookahead']} "
                f"| {_f(adaptive['adaptive_vs_best'])} | {'yes' if adaptive['within_10_percent'] else 'no'} |"
            )
    lines += ["", "Data: " + "; ".join(f"{t}: {s}" for t, s in config["data_sources"].items()) + ".",
              f"Cost ratio: {config['cost_ratio_method']}." + _runtime_note(config),
              ALPHA_NOTE]
    if any(r["method"] == "transformers" and r["temperature"] > 0 for r in result["results"]):
        lines += ["", TRANSFORMERS_SAMPLING_NOTE]
    return "\n".join(lines) + "\n"


def _suite_lines(suite: dict) -> list[str]:
    """The suite summary: geometric mean over the Spec-Bench categories and the slowest prompt, per method."""
    if not suite or not (suite["geomean"] or suite["min_prompt_speedup"]):
        return []
    geomean = {(r["temperature"], r["label"]): r for r in suite["geomean"]}
    slowest = {(r["temperature"], r["label"]): r for r in suite["min_prompt_speedup"]}
    n = len(suite["categories"])
    floor = suite["prompt_speedup_floor"]
    lines = ["", f"Summary ({suite['half']} half): geometric mean over the {n} Spec-Bench categories of the run "
             f"({', '.join(suite['categories']) or 'none'}) of the speedup over the target alone and, for hf_hetspec, "
             f"of its tokens/s over transformers UAG's; the slowest single prompt of all tasks (target: none below "
             f"{floor:g}x).", "",
             "| T | method | geomean speedup | geomean vs UAG | slowest prompt | its speedup "
             f"| prompts below {floor:g}x |",
             "|---|---|---|---|---|---|---|"]
    for key in dict.fromkeys([*geomean, *slowest]):
        mean, worst = geomean.get(key, {}), slowest.get(key)
        below = "" if worst is None else f"{worst['below_floor']}/{worst['prompts']}"
        where = "" if worst is None else f"{worst['task']} {worst['prompt_id']}" + (
            f" seed {worst['seed']}" if key[0] > 0 else "")
        lines.append(
            f"| {key[0]:g} | {key[1]} | {_f(mean.get('speedup'), '.2f', 'x')} "
            f"| {_f(mean.get('vs_transformers'), '.2f', 'x')} | {where} "
            f"| {_f(worst and worst['speedup'], '.2f', 'x')} "
            f"| {below} |"
        )
    return lines


def _runtime_note(config: dict) -> str:
    """hf_hetspec's drafter runtime and its one-off cost, outside the timed calls (older bench.json: none)."""
    runtime = config.get("drafter_runtime")
    if not runtime:
        return ""
    if not runtime["memory_mb"]:
        return f" hf_hetspec's drafter ran {runtime['runtime']}, as loaded."
    return (f" hf_hetspec's drafter ran {runtime['runtime']} (its c is that copy's step); the copy took "
            f"{runtime['prepare_s']:.1f} s to make and holds {runtime['memory_mb']:.0f} MiB, outside the timed "
            "calls.")


def _name(model: str) -> str:
    """A model's zoo name or Hub id as given, a folder by its last part."""
    return Path(model).name if Path(model).expanduser().is_dir() else model


def _pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panel_title(temperature: float) -> str:
    return "greedy" if temperature == 0 else f"temperature {temperature:g}"


def _save(plt, fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` (PNG, 120 dpi) and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_speedup(result: dict, path: Path) -> Path:
    """Bar chart of the speedup over the target alone per task and method, one panel per temperature."""
    plt = _pyplot()
    rows = [r for r in result["results"] if r["method"] != "target"]
    temperatures = list(dict.fromkeys(r["temperature"] for r in rows))
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    fig, axes = plt.subplots(1, len(temperatures), figsize=(max(6, 1.6 * len(tasks) * len(temperatures)), 4),
                             squeeze=False, sharey=True)
    width = 0.8 / max(1, len(labels))
    for ax, temperature in zip(axes[0], temperatures, strict=True):
        for i, label in enumerate(labels):
            speedup = {r["task"]: r["speedup"] or 0 for r in rows
                       if (r["temperature"], r["label"]) == (temperature, label)}
            offset = (i - (len(labels) - 1) / 2) * width
            ax.bar([x + offset for x in range(len(tasks))], [speedup.get(t, 0) for t in tasks], width,
                   label=label)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
        ax.set_xticks(range(len(tasks)), tasks, rotation=20)
        ax.set_title(_panel_title(temperature))
    axes[0][0].set_ylabel("speedup over the target alone (tokens/s ratio)")
    axes[0][-1].legend(fontsize="small")
    config = result["config"]
    fig.suptitle(f"{_name(config['target'])} + {_name(config['drafter'])}, {config['dtype']}, "
                 f"{result['machine']['device']}")
    return _save(plt, fig, path)


def plot_lookahead(result: dict, path: Path) -> Path:
    """Speedup vs fixed lookahead per task (lines), adaptive schedule dashed; one panel per temperature."""
    plt = _pyplot()
    sweep = result["lookahead_sweep"]
    temperatures = list(dict.fromkeys(r["temperature"] for r in sweep))
    fig, axes = plt.subplots(1, len(temperatures), figsize=(5.5 * len(temperatures), 4), squeeze=False,
                             sharey=True)
    for ax, temperature in zip(axes[0], temperatures, strict=True):
        for i, task in enumerate(dict.fromkeys(r["task"] for r in sweep)):
            rows = [r for r in sweep if (r["task"], r["temperature"]) == (task, temperature)]
            fixed = [r for r in rows if r["lookahead"] != "adaptive"]
            color = f"C{i}"
            ax.plot([r["lookahead"] for r in fixed], [r["speedup"] for r in fixed], marker="o", color=color,
                    label=task)
            adaptive = next(r for r in rows if r["lookahead"] == "adaptive")
            ax.axhline(adaptive["speedup"], color=color, linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ks = sorted({r["lookahead"] for r in sweep if r["lookahead"] != "adaptive"})
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.minorticks_off()
        ax.set_xlabel("fixed lookahead k (drafter tokens); dashed: adaptive")
        ax.set_title(_panel_title(temperature))
    axes[0][0].set_ylabel("speedup over the target alone")
    axes[0][-1].legend(fontsize="small")
    config = result["config"]
    pair = f"{_name(config['target'])} + {_name(config['drafter'])}"
    fig.suptitle(f"hf_hetspec {sweep[0]['algorithm']}: {pair}")
    return _save(plt, fig, path)


def write_outputs(result: dict, report: str, out_dir: Path) -> dict[str, Path]:
    """Write bench.json, bench.md, speedup.png and (with a sweep) lookahead.png in ``out_dir``.

    Returns:
        the plots, ``{"speedup": path, "lookahead": path}`` (``lookahead`` only with a sweep).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = json.dumps(result, indent=2, ensure_ascii=False) + "\n"
    (out_dir / "bench.json").write_text(payload, encoding="utf-8")
    (out_dir / "bench.md").write_text(report, encoding="utf-8")
    plots = {"speedup": plot_speedup(result, out_dir / "speedup.png")}
    if result["lookahead_sweep"]:
        plots["lookahead"] = plot_lookahead(result, out_dir / "lookahead.png")
    return plots
