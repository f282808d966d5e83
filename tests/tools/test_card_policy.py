"""``hf_hetspec.tools.card_policy``: a pairing card never decides what code runs or which local files load.

Each attack is written into a card on disk and read through :func:`hf_hetspec.tools.pairing.load`; ``zoo.load``
is replaced by a recorder, so "refused before any model loads" is checked, not assumed."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from huggingface_hub import ModelCard, ModelCardData

from hf_hetspec.tools import card_policy, pairing, zoo
from hf_hetspec.tools.pairing import PairingError

VALID = {
    "format": 1, "target": "Qwen/Qwen2.5-Coder-1.5B-Instruct", "drafter": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "algorithm": "slem", "lookahead": None, "settings": {"hetspec_algorithm": "slem", "do_sample": False},
    "recommended": [
        {"temperature": 0.0, "algorithm": "slem", "lookahead": None, "speedup": 1.9,
         "settings": {"hetspec_algorithm": "slem", "do_sample": False}},
        {"temperature": 1.0, "algorithm": "slrs", "lookahead": 4, "speedup": 1.3,
         "settings": {"hetspec_algorithm": "slrs", "do_sample": True, "temperature": 1.0, "num_assistant_tokens": 4}},
    ],
    "speedups": [{"task": "code", "temperature": 0.0, "method": "hf_hetspec", "algorithm": "slem", "speedup": 1.9}],
}


def write(folder, metadata) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    data = ModelCardData(library_name="transformers", hf_hetspec=metadata)
    ModelCard(f"---\n{data.to_yaml()}\n---\n# a pairing\n").save(folder / "README.md")


@pytest.fixture
def loads(monkeypatch):
    """The names ``zoo.load`` was asked for; it loads nothing."""
    calls = []
    monkeypatch.setattr(zoo, "load", lambda name, **kwargs: calls.append(name) or (object(), object()))
    return calls


def with_settings(settings, where="settings") -> dict:
    metadata = copy.deepcopy(VALID)
    if where == "settings":
        metadata["settings"] = settings
    else:
        metadata["recommended"][1]["settings"] = settings
    return metadata


def test_a_valid_card_loads_its_hub_models(tmp_path, loads):
    write(tmp_path, VALID)
    p = pairing.load(tmp_path)
    assert loads == [VALID["target"], VALID["drafter"]]
    kwargs = p.generate_kwargs(temperature=1.0)
    assert kwargs["assistant_model"] is p.drafter and kwargs["tokenizer"] is p.target_tokenizer
    assert {k: v for k, v in kwargs.items() if k not in ("assistant_model", "tokenizer", "assistant_tokenizer")} == {
        "hetspec_algorithm": "slrs", "do_sample": True, "temperature": 1.0, "num_assistant_tokens": 4}


FORBIDDEN = {
    "assistant_model": None,  # null: the call would fall through to plain transformers
    "custom_generate": "./evil",
    "trust_remote_code": True,
    "tokenizer": "other/tokenizer",
    "assistant_tokenizer": "other/tokenizer",
    "generation_config": {"max_new_tokens": 5},
    "streamer": "x",
    "stopping_criteria": [],
    "logits_processor": [],
    "prefix_allowed_tokens_fn": "os.system",
    "max_new_tokens": 3,  # the caller's choice, not a measured setting
}


@pytest.mark.parametrize("where", ["settings", "recommended"])
@pytest.mark.parametrize("key", sorted(FORBIDDEN))
def test_settings_outside_the_allow_list_are_refused_before_any_model_loads(tmp_path, loads, key, where):
    write(tmp_path, with_settings({"hetspec_algorithm": "slem", key: FORBIDDEN[key]}, where))
    with pytest.raises(PairingError, match=f"may not set '{key}'"):
        pairing.load(tmp_path)
    assert loads == []


@pytest.mark.parametrize("key, value", [
    ("hetspec_algorithm", "beam"), ("do_sample", "yes"), ("do_sample", 1), ("temperature", "hot"),
    ("temperature", -1.0), ("temperature", float("nan")), ("temperature", True), ("num_assistant_tokens", 0),
    ("num_assistant_tokens", 2.5), ("top_p", 0.0), ("top_k", -1), ("hetspec_draft_temperature", [1]),
    ("hetspec_verification", "tree"), ("hetspec_verification", True),
])
def test_settings_of_the_wrong_type_are_refused(tmp_path, loads, key, value):
    write(tmp_path, with_settings({key: value}))
    with pytest.raises(PairingError, match=f"settings.{key} = "):
        pairing.load(tmp_path)
    assert loads == []


def _set(path, value):
    def change(metadata):
        node = metadata
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return change


@pytest.mark.parametrize("change, message", [
    (_set(["format"], 2), "newer than this hf_hetspec reads"),
    (_set(["format"], "1"), "not a pairing card format"),
    (lambda m: m.pop("format"), "not a pairing card format"),
    (_set(["target"], 5), "target = 5"),
    (lambda m: m.pop("drafter"), "drafter is missing"),
    (_set(["settings"], ["hetspec_algorithm"]), "must be a mapping"),
    (lambda m: m.pop("settings"), "settings is missing"),
    (_set(["lookahead"], "many"), "lookahead = 'many'"),
    (_set(["recommended"], "slem"), "recommended = 'slem'"),
    (_set(["recommended", 0], "slem"), r"recommended\[0\] must be a mapping"),
    (lambda m: m["recommended"][1].pop("temperature"), r"recommended\[1\].temperature is missing"),
    (_set(["recommended", 1, "algorithm"], "auto"), r"recommended\[1\].algorithm = 'auto'"),
    (_set(["speedups"], [["code"]]), "speedups = "),
    (_set(["speedups", 0, "speedup"], "fast"), r"speedups\[0\].speedup = 'fast'"),
])
def test_malformed_cards_raise_pairing_errors(tmp_path, loads, change, message):
    metadata = copy.deepcopy(VALID)
    change(metadata)
    write(tmp_path, metadata)
    with pytest.raises(PairingError, match=message):
        pairing.load(tmp_path)
    with pytest.raises(PairingError, match=message):
        pairing.read_card(tmp_path)
    assert loads == []


def test_unparsable_yaml_is_a_pairing_error(tmp_path):
    (tmp_path / "README.md").write_text("---\nhf_hetspec: [unclosed\n---\nbody\n")
    with pytest.raises(PairingError, match="not a readable model card"):
        pairing.read_card(tmp_path)
    (tmp_path / "README.md").write_text("---\n- a\n- b\n---\nbody\n")
    with pytest.raises(PairingError, match="not a readable model card"):
        pairing.read_card(tmp_path)


@pytest.fixture
def outside(tmp_path):
    """A folder next to the card's folder, holding a file a card must not reach."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.json").write_text('{"token": "hf_secret"}')
    return folder


@pytest.mark.parametrize("reference", ["../outside", "../../etc/passwd", "models/../../outside", "/etc",
                                       "~/.cache/huggingface", "..\\outside"])
def test_model_references_outside_the_card_folder_are_refused(tmp_path, loads, outside, reference):
    write(tmp_path / "card", dict(VALID, drafter=reference))
    with pytest.raises(PairingError, match="outside the card's folder"):
        pairing.load(tmp_path / "card")
    with pytest.raises(PairingError, match="outside the card's folder"):
        pairing.load(tmp_path / "card", load_models=False)
    assert loads == []


def test_symlinks_leaving_the_card_folder_are_refused(tmp_path, loads, outside):
    card = tmp_path / "card"
    write(card, dict(VALID, drafter="models/drafter"))
    (card / "models").mkdir()
    (card / "models" / "drafter").symlink_to(outside, target_is_directory=True)
    with pytest.raises(PairingError, match="symlink leaving the card's folder"):
        pairing.load(card)
    (card / "models" / "drafter").unlink()
    (card / "models" / "drafter").mkdir()
    (card / "models" / "drafter" / "config.json").symlink_to(outside / "secret.json")
    with pytest.raises(PairingError, match="config.json is a symlink leaving the card's folder"):
        pairing.load(card)
    assert loads == []
    (card / "models" / "drafter" / "config.json").unlink()
    (card / "models" / "shared.json").write_text("{}")
    (card / "models" / "drafter" / "config.json").symlink_to(card / "models" / "shared.json")
    pairing.load(card)  # a symlink that stays inside the folder is fine
    assert loads == [VALID["target"], str((card / "models" / "drafter").resolve())]


def test_a_symlink_loop_is_a_pairing_error(tmp_path, loads):
    card = tmp_path / "card"
    write(card, dict(VALID, drafter="models/drafter"))
    (card / "models" / "drafter").mkdir(parents=True)
    (card / "models" / "drafter" / "a").symlink_to(card / "models" / "drafter" / "b")
    (card / "models" / "drafter" / "b").symlink_to(card / "models" / "drafter" / "a")
    with pytest.raises(PairingError, match="cannot be resolved|symlink leaving"):
        pairing.load(card)
    assert loads == []


def test_a_hub_id_shadowed_by_a_local_folder_is_refused(tmp_path, loads, monkeypatch):
    write(tmp_path / "card", VALID)
    monkeypatch.chdir(tmp_path)
    os.makedirs("HuggingFaceTB/SmolLM2-135M-Instruct")  # transformers would load this instead of the Hub repo
    with pytest.raises(PairingError, match="would be loaded instead of the Hub repository"):
        pairing.load(tmp_path / "card")
    assert loads == []


def test_a_hub_card_names_hub_models_only(tmp_path, loads):
    (tmp_path / "models" / "drafter").mkdir(parents=True)
    assert card_policy.model_reference("models/drafter", None) == "models/drafter"  # a Hub id, not a folder
    assert card_policy.model_reference("models/drafter", tmp_path) == str((tmp_path / "models" / "drafter").resolve())
    with pytest.raises(PairingError, match="not a folder in the card's folder nor a valid Hub id"):
        card_policy.model_reference("a/b/c", None)
    with pytest.raises(PairingError, match="is not a folder"):
        (tmp_path / "weights.bin").write_bytes(b"")
        card_policy.model_reference("weights.bin", tmp_path)


def test_the_custom_generate_attack_runs_no_code(tmp_path, loads):
    """The attack of issue #15: ``assistant_model: null`` + ``custom_generate`` + ``trust_remote_code`` would
    make the README's ``generate(**p.generate_kwargs())`` import the card's ``generate.py``."""
    card = tmp_path / "card"
    marker = tmp_path / "ran"
    (card / "custom").mkdir(parents=True)
    (card / "custom" / "generate.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    write(card, with_settings({"hetspec_algorithm": "slem", "assistant_model": None,
                               "custom_generate": str(card / "custom"), "trust_remote_code": True}))
    with pytest.raises(PairingError, match="may not set 'assistant_model'"):
        pairing.load(card)
    assert loads == [] and not marker.exists()
    # a Pairing built or edited by hand is checked again when its keyword arguments are made, and the models
    # are set after the settings, so nothing can replace them
    p = pairing.Pairing(object(), "drafter", "tokenizer", "drafter tokenizer", {"hetspec_algorithm": "slem"},
                        ModelCard("---\n---\n"), {})
    assert p.generate_kwargs()["assistant_model"] == "drafter"
    p.settings["custom_generate"] = str(card / "custom")
    with pytest.raises(PairingError, match="may not set 'custom_generate'"):
        p.generate_kwargs()
    assert not marker.exists()


def test_check_settings_allows_exactly_the_documented_keys():
    assert set(card_policy.SETTINGS) == {"hetspec_algorithm", "hetspec_draft_temperature", "hetspec_verification",
                                         "num_assistant_tokens", "do_sample", "temperature", "top_k", "top_p"}
    ok = {"hetspec_algorithm": "auto", "hetspec_draft_temperature": 0, "hetspec_verification": "block",
          "num_assistant_tokens": 3, "do_sample": True, "temperature": 0.7, "top_k": 50, "top_p": 1}
    assert card_policy.check_settings(ok) == ok
    with pytest.raises(PairingError, match="may not set 'generator'"):
        card_policy.check_settings({"generator": torch.Generator()})


def test_a_model_folder_with_its_own_code_is_never_run(tmp_path, monkeypatch):
    """A card's model folder whose config points at its own Python files (``auto_map``): transformers is told
    ``trust_remote_code=False`` (left unset, it would ask on a terminal), so the files are never imported."""
    import json
    import sys

    from hf_hetspec.testing import toy

    card, marker = tmp_path / "card", tmp_path / "ran"
    folder = card / "models" / "evil"
    folder.mkdir(parents=True)
    toy.byte_level_bpe_tokenizer().save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({
        "model_type": "evil-model", "auto_map": {"AutoConfig": "configuration_evil.EvilConfig",
                                                 "AutoModelForCausalLM": "modeling_evil.EvilModel"}}))
    for name in ("configuration_evil.py", "modeling_evil.py"):
        (folder / name).write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    write(card, dict(VALID, target="models/evil"))
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)  # where transformers would prompt
    monkeypatch.setattr("builtins.input", lambda *args: "y")  # and a user who says yes
    with pytest.raises(Exception) as err:
        pairing.load(card)
    assert not marker.exists(), f"the card's code ran ({err.value!r})"
    assert "trust_remote_code" in str(err.value)
