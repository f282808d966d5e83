"""``hf_hetspec.tools.pairing``: cards written from a benchmark result, read back (folder, Hub cache, offline Hub),
used to generate, and published through a recorded ``HfApi``. The numbers in these results are synthetic."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from huggingface_hub import ModelCard

import hf_hetspec
from conftest import save_toy_models
from hf_hetspec.tools import cli, pairing, pairing_load, pairing_vllm, zoo
from hf_hetspec.tools.pairing import PairingError

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16  # only copied, never decoded


def row(task, temperature, method, algorithm=None, speedup=1.0):
    return {
        "task": task, "temperature": temperature, "method": method, "label": None, "algorithm": algorithm,
        "runs": 2, "new_tokens": 100, "seconds": 10 / speedup, "tokens_per_second": 10 * speedup,
        "tpot_ms": 100 / speedup, "ttft_ms": 50.0, "speedup": speedup,
        "acceptance_rate": None if method == "target" else 0.5, "tokens_per_forward": 2.0,
        "drafter_s": 1.0, "target_s": 2.0, "translation_s": 0.1, "peak_memory_mb": 100.0,
        "identical": 2 if temperature == 0 and method != "target" else None, "tie": 0, "different": 0,
        "mean_lookahead": 4.0, "cost_ratio": 0.1, "theoretical_speedup": 1.8, "bound_ratio": 0.9,
    }


def bench_result(target="qwen2.5-coder-1.5b-instruct", drafter="smollm2-135m-instruct", lookahead=None,
                 speedups=None) -> dict:
    """A result in ``hf-hetspec bench``'s schema; ``speedups[(task, temperature, algorithm)]``."""
    speedups = speedups or {
        ("code", 0.0, "slem"): 1.9, ("code", 0.0, "tli"): 1.4, ("code", 0.0, "slrs"): 1.5,
        ("text", 0.0, "slem"): 1.5, ("text", 0.0, "tli"): 1.2, ("text", 0.0, "slrs"): 1.3,
        ("code", 1.0, "slem"): 1.1, ("code", 1.0, "tli"): 1.3, ("code", 1.0, "slrs"): 1.35,
        ("text", 1.0, "slem"): 1.0, ("text", 1.0, "tli"): 1.2, ("text", 1.0, "slrs"): 1.25,
    }
    results = []
    for task, temperature in sorted({(k[0], k[1]) for k in speedups}):
        results.append(row(task, temperature, "target"))
        results.append(row(task, temperature, "transformers", speedup=1.3))
        for (t, temp, algorithm), value in speedups.items():
            if (t, temp) == (task, temperature):
                results.append(row(task, temperature, "hf_hetspec", algorithm, value))
    return {
        "machine": {"cpu": "Test CPU", "cpu_count": 2, "torch_threads": 1, "device": "cpu", "torch": "2.13.0",
                    "transformers": "5.23.0", "python": "3.12.0"},
        "config": {"target": target, "drafter": drafter, "homogeneous_drafter": None, "dtype": "bfloat16",
                   "device": "cpu", "max_new_tokens": 64, "tasks": ["code", "text"], "prompts_per_task": {"code": 2, "text": 2},
                   "temperatures": [0.0, 1.0], "seeds": [0, 1], "algorithms": ["slem", "tli", "slrs"],
                   "lookahead": lookahead, "chat_template": True, "command": "hf-hetspec bench --quick --seed 7",
                   "date": "2026-11-30", "hf_hetspec_version": "0.1.0"},
        "results": results, "lookahead_sweep": [], "records": [],
    }


def test_card_metadata_body_and_plots(tmp_path):
    plot = tmp_path / "speedup.png"
    plot.write_bytes(PNG)
    path = pairing.write_card(bench_result(), tmp_path / "card", plots={"speedup per task": plot})
    assert path == tmp_path / "card" / "README.md"
    assert (tmp_path / "card" / "speedup.png").read_bytes() == PNG

    card = ModelCard.load(path)
    data = card.data.to_dict()
    assert data["base_model"] == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert data["library_name"] == "transformers" and "speculative-decoding" in data["tags"]
    meta = data["hf_hetspec"]
    assert (meta["target"], meta["drafter"]) == ("Qwen/Qwen2.5-Coder-1.5B-Instruct",
                                                 "HuggingFaceTB/SmolLM2-135M-Instruct")
    # greedy: SLEM (geometric mean sqrt(1.9 * 1.5)); sampling: SLRS (sqrt(1.35 * 1.25))
    assert [(r["temperature"], r["algorithm"]) for r in meta["recommended"]] == [(0.0, "slem"), (1.0, "slrs")]
    assert meta["recommended"][0]["speedup"] == pytest.approx((1.9 * 1.5) ** 0.5, abs=1e-4)
    assert meta["recommended"][1]["settings"] == {"hetspec_algorithm": "slrs", "do_sample": True, "temperature": 1.0}
    assert (meta["algorithm"], meta["lookahead"]) == ("slem", None)
    assert meta["settings"] == {"hetspec_algorithm": "slem", "do_sample": False}
    assert len(meta["speedups"]) == 16 and all(r["method"] != "target" for r in meta["speedups"])
    assert {(r["task"], r["temperature"], r["algorithm"], r["speedup"]) for r in meta["speedups"]} >= {
        ("code", 0.0, "slem", 1.9), ("text", 1.0, "slrs", 1.25)}
    assert (meta["hardware"], meta["dtype"], meta["transformers"], meta["date"]) == (
        "Test CPU, 2 cores, 1 torch thread", "bfloat16", "5.23.0", "2026-11-30")

    body = card.text
    assert "| code | 0 | hf_hetspec SLEM | 19.00 | 1.90x | 0.50 | 2.00 |" in body
    assert "![speedup per task](speedup.png)" in body
    assert "Lookahead sweep" not in body and meta["lookahead_sweep"] == []
    assert "hf-hetspec bench --quick --seed 7" in body and "prompts per task: code 2, text 2" in body
    vllm = json.loads(body.split("--speculative-config '")[1].split("'")[0])
    assert vllm == {"method": "draft_model", "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
                    "num_speculative_tokens": 5, "use_heterogeneous_vocab": True}
    assert "vllm serve Qwen/Qwen2.5-Coder-1.5B-Instruct" in body and "vllm-project/vllm/pull/38174" in body


def test_recommendation_is_the_geometric_mean_winner(tmp_path):
    # A: arithmetic mean 1.75, geometric 1.22; B: 1.3 on both tasks
    speedups = {("code", 0.0, "tli"): 3.0, ("text", 0.0, "tli"): 0.5,
                ("code", 0.0, "slem"): 1.3, ("text", 0.0, "slem"): 1.3}
    result = bench_result(lookahead=4, speedups=speedups)
    [entry] = pairing.recommended_settings(result)
    assert (entry["algorithm"], entry["lookahead"]) == ("slem", 4)
    assert entry["settings"] == {"hetspec_algorithm": "slem", "do_sample": False, "num_assistant_tokens": 4}
    body = ModelCard.load(pairing.write_card(result, tmp_path)).text
    assert '"num_speculative_tokens": 4' in body


def sweep_row(task, lookahead, speedup, within=None, best=None):
    row = {"task": task, "temperature": 0.0, "algorithm": "slem", "lookahead": lookahead,
           "tokens_per_second": 10 * speedup, "speedup": speedup, "acceptance_rate": 0.5, "tokens_per_forward": 2.0}
    if lookahead == "adaptive":
        row.update(best_fixed_lookahead=best, adaptive_vs_best=0.85 if not within else 0.95, within_10_percent=within)
    return row


def test_lookahead_from_the_sweep(tmp_path):
    result = bench_result()
    sweep = [sweep_row("code", 2, 1.6), sweep_row("code", 6, 2.1), sweep_row("code", "adaptive", 1.9, True, 6),
             sweep_row("text", 2, 1.7), sweep_row("text", 6, 1.4), sweep_row("text", "adaptive", 1.5, False, 2)]
    result["lookahead_sweep"] = sweep
    # adaptive missed the best fixed lookahead by > 10% on "text", so the fixed lookahead with the best
    # geometric mean over tasks wins: k=6 (sqrt(2.1 * 1.4) = 1.71) over k=2 (sqrt(1.6 * 1.7) = 1.65)
    greedy, sampling = pairing.recommended_settings(result)
    assert (greedy["algorithm"], greedy["lookahead"]) == ("slem", 6)
    assert greedy["settings"]["num_assistant_tokens"] == 6
    assert sampling["lookahead"] is None  # the sweep covers temperature 0 only
    body = ModelCard.load(pairing.write_card(result, tmp_path)).text
    assert "| text | 0 | SLEM | 2 | 0.85 | no |" in body and '"num_speculative_tokens": 6' in body
    result["lookahead_sweep"] = [dict(r, within_10_percent=True) if r["lookahead"] == "adaptive" else r
                                 for r in sweep]
    assert pairing.recommended_settings(result)[0]["lookahead"] is None


def test_write_card_refuses_bad_results(tmp_path):
    result = bench_result()
    del result["config"]["drafter"]
    with pytest.raises(PairingError, match="'drafter'"):
        pairing.write_card(result, tmp_path)
    result = bench_result()
    result["results"] = [r for r in result["results"] if r["method"] != "hf_hetspec"]
    with pytest.raises(PairingError, match="no hf_hetspec row"):
        pairing.write_card(result, tmp_path)
    with pytest.raises(PairingError, match="not a file"):
        pairing.write_card(bench_result(), tmp_path, plots={"x": tmp_path / "missing.png"})
    assert not (tmp_path / "README.md").exists()


def test_load_round_trip_without_models(tmp_path):
    folder = tmp_path / "card"
    pairing.write_card(bench_result(lookahead=3), folder)
    written = ModelCard.load(folder / "README.md").data.to_dict()["hf_hetspec"]
    loaded = pairing.load(folder, load_models=False)
    assert loaded.settings == written["settings"] == {"hetspec_algorithm": "slem", "do_sample": False,
                                                      "num_assistant_tokens": 3}
    assert loaded.settings_for(1.0) == written["recommended"][1]["settings"]
    assert loaded.settings_for(0.8) == {"hetspec_algorithm": "slrs", "do_sample": True, "temperature": 0.8,
                                        "num_assistant_tokens": 3}
    assert loaded.target is None and loaded.metadata["drafter"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(PairingError, match="load_models=False"):
        loaded.generate_kwargs()
    assert pairing.load(folder / "README.md", load_models=False).settings == loaded.settings


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairing_models")
    save_toy_models(root)
    return root


def test_loaded_pairing_generates_the_target_alone_output(tmp_path, model_folders):
    folder = tmp_path / "card"
    shutil.copytree(model_folders, folder / "models")  # a card may only name folders inside its own folder
    result = bench_result(target=str(folder / "models" / "target"), drafter=str(folder / "models" / "drafter"))
    pairing.write_card(result, folder)
    p = pairing.load(folder)
    assert p.metadata["target"] == "models/target"  # written relative to the card's folder
    ids = p.target_tokenizer("The lighthouse keeper", return_tensors="pt").input_ids
    reference = p.target.generate(ids, max_new_tokens=10, do_sample=False)
    hf_hetspec.enable(p.target)
    try:
        out = p.target.generate(ids, max_new_tokens=10, **p.generate_kwargs())
        assert hf_hetspec.last_stats(p.target).algorithm == "slem"
    finally:
        hf_hetspec.disable(p.target)
    assert torch.equal(out, reference)


def test_load_refuses_folders_that_are_not_pairings(tmp_path):
    with pytest.raises(PairingError, match="has no README.md"):
        pairing.load(tmp_path)
    ModelCard("---\nlicense: mit\n---\n# some model\n").save(tmp_path / "README.md")
    with pytest.raises(PairingError, match="not an hf_hetspec pairing card"):
        pairing.load(tmp_path)
    with pytest.raises(PairingError, match="neither a folder nor a Hub repository id"):
        pairing.load(str(tmp_path / "missing" / "deeper"))
    with pytest.raises(PairingError, match="not a valid Hub repository id"):
        pairing.load("some one/bad name")


def test_hub_path_reads_the_cache_and_fails_fast_offline(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    folder = tmp_path / "card"
    pairing.write_card(bench_result(), folder)
    calls = []

    def cached_only(repo_id, filename, local_files_only=False, **kwargs):
        calls.append((repo_id, filename, local_files_only))
        if repo_id == "someone/cached-pairing" and local_files_only:
            return str(folder / "README.md")
        raise LocalEntryNotFoundError("not cached")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", cached_only)
    assert pairing.load("someone/cached-pairing", load_models=False).settings["hetspec_algorithm"] == "slem"
    assert calls == [("someone/cached-pairing", "README.md", True)]

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PairingError, match="HF_HUB_OFFLINE"):
        pairing.load("someone/uncached-pairing")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(pairing_load, "_hub_reachable", lambda timeout=0: False)
    start = time.perf_counter()
    with pytest.raises(PairingError, match="unreachable"):
        pairing.load("someone/uncached-pairing")
    assert time.perf_counter() - start < 2
    assert all(local for _, _, local in calls)  # never a network download


class RecordingHfApi:
    """Stands in for ``huggingface_hub.HfApi``: records calls, touches no network."""

    calls: ClassVar[list] = []

    def __init__(self, token=None):
        self.calls.append(("init", {"token": token}))

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))

    def upload_folder(self, **kwargs):
        self.calls.append(("upload_folder", kwargs))
        return type("CommitInfo", (), {"commit_url": f"https://huggingface.co/{kwargs['repo_id']}/commit/abc"})()


def test_push_creates_the_repo_and_uploads_the_folder(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    RecordingHfApi.calls = []
    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingHfApi)
    folder = tmp_path / "card"
    pairing.write_card(bench_result(), folder)
    url = pairing.push(folder, "me/qwen-smollm2", token="hf_test", private=True)
    assert url == "https://huggingface.co/me/qwen-smollm2/commit/abc"
    assert RecordingHfApi.calls == [
        ("init", {"token": "hf_test"}),
        ("create_repo", {"repo_id": "me/qwen-smollm2", "repo_type": "model", "private": True, "exist_ok": True}),
        ("upload_folder", {"repo_id": "me/qwen-smollm2", "folder_path": folder, "repo_type": "model",
                           "commit_message": "hf_hetspec pairing card"}),
    ]

    RecordingHfApi.calls = []
    with pytest.raises(PairingError, match="has no README.md"):
        pairing.push(tmp_path, "me/x")
    with pytest.raises(PairingError, match="owner/name"):
        pairing.push(folder, "no-owner")
    assert RecordingHfApi.calls == []  # refused before any Hub call

    assert cli.main(["pairing", "push", str(folder), "me/qwen-smollm2"]) == 0
    assert "commit/abc" in capsys.readouterr().out
    assert RecordingHfApi.calls[1] == ("create_repo", {"repo_id": "me/qwen-smollm2", "repo_type": "model",
                                                       "private": False, "exist_ok": True})
    assert cli.main(["pairing", "push", str(tmp_path / "nothing"), "me/x"]) == 2


def test_cli_show(tmp_path, capsys):
    folder = tmp_path / "card"
    pairing.write_card(bench_result(), folder)
    assert cli.main(["pairing", "show", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "target Qwen/Qwen2.5-Coder-1.5B-Instruct, drafter HuggingFaceTB/SmolLM2-135M-Instruct" in out
    assert "temperature 0: slem (1.69x)" in out and "temperature 1: slrs (1.30x)" in out
    assert cli.main(["pairing", "show", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["recommended"][1]["algorithm"] == "slrs"
    assert cli.main(["pairing", "show", str(tmp_path)]) == 2
    assert "has no README.md" in capsys.readouterr().err
    assert zoo.MODELS["smollm2-135m-instruct"].hub_id == pairing.hub_id("smollm2-135m-instruct")


#: The repository's cards and the real tokenizers (``../shared/tokenizers``) of their target and drafter.
REPO_CARDS = {
    "qwen2.5-coder-1.5b-instruct__smollm2-135m-instruct": ("qwen2.5-coder", "smollm2"),
    "qwen2.5-coder-1.5b-instruct__gemma-3-270m": ("qwen2.5-coder", "gemma3"),
}


@pytest.mark.parametrize("name", sorted(REPO_CARDS))
def test_cli_show_prints_the_vllm_settings_of_a_repository_card(name, real_tokenizer, capsys):
    """``pairing show`` prints the card's ``vllm serve`` line and whether vLLM's TLI can use the pair, from the
    special tokens the card records, which are those of the real tokenizers (vLLM stands the drafter's
    ``unk_token_id`` in for target tokens outside the intersection; Qwen2.5-Coder has none: its EOS)."""
    folder = Path(__file__).resolve().parents[2] / "model_cards" / name
    _, metadata = pairing.read_card(folder)
    tokenizers = [real_tokenizer(n) for n in REPO_CARDS[name]]
    assert metadata["special_tokens"] == pairing_vllm.special_tokens(*tokenizers)
    assert tokenizers[0].unk_token_id is None and tokenizers[1].unk_token_id is not None
    assert cli.main(["pairing", "show", str(folder)]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "vllm serve" in line)
    assert line.strip().startswith(f"vllm serve {metadata['target']} --speculative-config '")
    config = json.loads(line.split("--speculative-config '")[1].rstrip("'"))
    assert config == {"method": "draft_model", "model": metadata["drafter"], "num_speculative_tokens": 5,
                      "use_heterogeneous_vocab": True}
    drafter = tokenizers[1]
    assert "vLLM's TLI can use this pair" in out
    assert f"reach the drafter as its unk token `{drafter.unk_token}` (id {drafter.unk_token_id})" in out
    assert "the target has no unk token: vLLM falls back to its EOS `<|im_end|>` (id 151645)" in out
    assert "TLI only, greedy drafts" in out
    body = ModelCard.load(folder / "README.md").text
    assert f"**With vLLM:** vLLM's TLI can use this pair; target tokens outside the shared vocabulary reach the " \
           f"drafter as its unk token `{drafter.unk_token}`" in body


def _tokens(unk=None, unk_id=None, eos=None, eos_id=None) -> dict:
    return {"unk_token": unk, "unk_token_id": unk_id, "eos_token": eos, "eos_token_id": eos_id}


def test_vllm_verdict_follows_the_unk_and_eos_tokens(tmp_path, capsys):
    """vLLM's ``VocabMapping`` uses a tokenizer's unk id, else its EOS id (with a warning), else refuses."""
    result = bench_result()
    result["config"]["special_tokens"] = {"target": _tokens(unk="<unk>", unk_id=0),
                                          "drafter": _tokens(eos="</s>", eos_id=2)}
    pairing.write_card(result, tmp_path / "eos")
    assert cli.main(["pairing", "show", str(tmp_path / "eos")]) == 0
    out = capsys.readouterr().out
    assert "vLLM's TLI can use this pair" in out
    assert "reach the drafter as its EOS (it has no unk token; vLLM warns) token `</s>` (id 2)" in out
    assert "the target has no unk token" not in out

    result["config"]["special_tokens"]["drafter"] = _tokens()
    pairing.write_card(result, tmp_path / "neither")
    assert cli.main(["pairing", "show", str(tmp_path / "neither")]) == 0
    out = capsys.readouterr().out
    assert "vLLM's TLI cannot use this pair: a tokenizer has neither an unk nor an EOS token" in out
    assert "cannot use this pair" in (tmp_path / "neither" / "README.md").read_text()

    pairing.write_card(bench_result(), tmp_path / "unrecorded")  # a card written before they were recorded
    assert cli.main(["pairing", "show", str(tmp_path / "unrecorded")]) == 0
    assert "the card does not record the tokenizers' unk and EOS tokens" in capsys.readouterr().out


def test_card_with_malformed_special_tokens_is_refused(tmp_path):
    result = bench_result()
    result["config"]["special_tokens"] = {"target": _tokens(unk_id="0"), "drafter": _tokens()}
    pairing.write_card(result, tmp_path)
    with pytest.raises(PairingError, match=r"special_tokens = .*must be a mapping of target and drafter"):
        pairing.read_card(tmp_path)


def test_push_with_custom_generate_uploads_the_folder_in_the_same_commit(tmp_path, monkeypatch):
    import huggingface_hub

    from hf_hetspec.custom_generate import FOLDER

    uploaded = {}

    class StagingHfApi(RecordingHfApi):
        def upload_folder(self, **kwargs):  # the staging folder is deleted after the call: read it now
            root = Path(kwargs["folder_path"])
            uploaded.update({p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()})
            return super().upload_folder(**kwargs)

    RecordingHfApi.calls = []
    monkeypatch.setattr(huggingface_hub, "HfApi", StagingHfApi)
    folder = tmp_path / "card"
    pairing.write_card(bench_result(), folder)
    before = (folder / "README.md").read_bytes()
    assert cli.main(["pairing", "push", str(folder), "me/qwen-smollm2", "--with-custom-generate"]) == 0
    assert [name for name, _ in RecordingHfApi.calls] == ["init", "create_repo", "upload_folder"]
    for name in ("generate.py", "requirements.txt"):
        assert uploaded[f"custom_generate/{name}"] == (Path(FOLDER) / "custom_generate" / name).read_bytes()
    assert b"hf_hetspec" in uploaded["custom_generate/requirements.txt"]
    card = huggingface_hub.ModelCard(uploaded["README.md"].decode())
    assert "custom_generate" in card.data.tags and 'custom_generate="me/qwen-smollm2"' in card.text
    # the card's settings never select custom_generate; the folder on disk is untouched
    settings = pairing.read_card(folder)[1]["settings"]
    assert "custom_generate" not in settings and "trust_remote_code" not in settings
    assert card.data.to_dict()["hf_hetspec"]["settings"] == settings
    assert (folder / "README.md").read_bytes() == before and not (folder / "custom_generate").exists()


def _laughs_header(levels: int = 9) -> str:
    """A YAML header of about 1 KB whose aliases expand to 10^levels items ("billion laughs")."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    lines.append(f"hf_hetspec: *a{levels - 1}")
    return "\n".join(lines)


@pytest.mark.parametrize("card", ["aliases", "oversized"])
def test_a_card_that_would_hang_its_reader_is_refused_within_a_second(tmp_path, monkeypatch, card):
    """Issue #25: a Hub card is untrusted input; reading one must not take minutes or gigabytes."""
    import signal

    folder = tmp_path / "card"
    folder.mkdir()
    if card == "aliases":
        (folder / "README.md").write_text(f"---\n{_laughs_header()}\n---\n# a card\n")
        match = "anchors or aliases"
    else:
        (folder / "README.md").write_text("---\nlicense: mit\n---\n" + "x" * (pairing.MAX_CARD_BYTES + 1))
        match = "at most"
    monkeypatch.setattr(zoo, "load", lambda *a, **k: pytest.fail("a model loaded from a refused card"))

    def too_slow(*_):
        raise TimeoutError("the card's reader ran for more than 2 s")

    previous = signal.signal(signal.SIGALRM, too_slow)
    try:
        for read in (pairing.read_card, pairing.load):
            signal.setitimer(signal.ITIMER_REAL, 2.0)
            began = time.perf_counter()
            with pytest.raises(PairingError, match=match):
                read(folder)
            assert time.perf_counter() - began < 1.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_drafters_by_task_names_the_faster_drafter_per_task(tmp_path, capsys):
    smollm2 = bench_result(speedups={("code", 0.0, "slem"): 2.0, ("code", 0.0, "tli"): 2.4,
                                     ("translation", 0.0, "slem"): 1.1})
    gemma = bench_result(drafter="gemma-3-270m", speedups={("code", 0.0, "slem"): 1.6,
                                                           ("translation", 0.0, "slem"): 1.5,
                                                           ("qa", 1.0, "slem"): 1.2})
    for name, result in (("smollm2", smollm2), ("gemma", gemma)):
        pairing.write_card(result, tmp_path / name)
    cards = [pairing.read_card(tmp_path / name)[1] for name in ("smollm2", "gemma")]
    rows = {(r["task"], r["temperature"]): r for r in pairing.drafters_by_task(cards)}
    smollm2_id, gemma_id = pairing.hub_id("smollm2-135m-instruct"), pairing.hub_id("gemma-3-270m")
    # the best of a card's algorithms (TLI's 2.4x, not SLEM's 2.0x), never transformers' 1.3x rows
    assert rows[("code", 0.0)]["speedups"] == {smollm2_id: 2.4, gemma_id: 1.6}
    assert rows[("code", 0.0)]["best"] == smollm2_id and rows[("code", 0.0)]["margin"] == pytest.approx(1.5)
    assert rows[("translation", 0.0)]["best"] == gemma_id
    assert rows[("qa", 1.0)] == {"task": "qa", "temperature": 1.0, "speedups": {smollm2_id: None, gemma_id: 1.2},
                                 "best": gemma_id, "margin": None}
    assert cli.main(["pairing", "compare", str(tmp_path / "smollm2"), str(tmp_path / "gemma")]) == 0
    out = capsys.readouterr().out
    assert "translation" in out and "2.40x" in out and "1.50x" in out
    assert cli.main(["pairing", "compare", str(tmp_path / "smollm2"), str(tmp_path / "gemma"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["task"] == "code"


def test_drafters_by_task_refuses_what_it_cannot_compare(tmp_path, capsys):
    other_target = pairing.read_card(pairing.write_card(bench_result(target="qwen2.5-coder-0.5b-instruct"),
                                                        tmp_path / "other"))[1]
    card = pairing.read_card(pairing.write_card(bench_result(), tmp_path / "card"))[1]
    with pytest.raises(PairingError, match="at least two"):
        pairing.drafters_by_task([card])
    with pytest.raises(PairingError, match="different targets"):
        pairing.drafters_by_task([card, other_target])
    with pytest.raises(PairingError, match="same drafter"):
        pairing.drafters_by_task([card, card])
    assert cli.main(["pairing", "compare", str(tmp_path / "card"), str(tmp_path / "other")]) == 2
    assert "different targets" in capsys.readouterr().err


def test_a_card_of_an_auto_run_records_the_algorithm_auto_ran(tmp_path):
    """`bench --suite` measures hetspec_algorithm="auto": its card names what auto ran (each call's
    stats.algorithm), which the card reader accepts, and refuses rows whose calls do not say."""
    result = bench_result(speedups={("code", 0.0, "auto"): 2.0, ("text", 0.0, "auto"): 1.5})
    result["records"] = [{"task": task, "temperature": 0.0, "method": "hf_hetspec", "algorithm": "auto",
                          "stats": {"algorithm": "slem"}} for task in ("code", "text")]
    _, metadata = pairing.read_card(pairing.write_card(result, tmp_path / "card"))
    assert metadata["recommended"][0]["algorithm"] == "slem"
    assert metadata["settings"] == {"hetspec_algorithm": "slem", "do_sample": False}
    assert {row["algorithm"] for row in metadata["speedups"] if row["method"] == "hf_hetspec"} == {"slem"}
    result["records"][1]["stats"]["algorithm"] = "tli"
    result["records"].append({**result["records"][1], "stats": {"algorithm": "slem"}})
    with pytest.raises(PairingError, match=r"'auto' on text at temperature 0.0 ran \['slem', 'tli'\]"):
        pairing.write_card(result, tmp_path / "mixed")
    result["records"] = []
    with pytest.raises(PairingError, match="no recorded call"):
        pairing.write_card(result, tmp_path / "none")
