"""transformers' ``custom_generate`` channel: the shipped folder runs hf_hetspec on a never-enabled target.

Expected values come from the target alone (greedy) or its exact distribution (sampled); errors and statistics
are compared with an ``enable()``d call.
"""

import importlib.metadata
import shutil

import pytest

import hf_hetspec
from hf_hetspec.custom_generate import FOLDER
from hf_hetspec.testing import check_lossless, exact_target_distribution, sample_outcomes
from conftest import ForwardCounter

FOLDER_ARGS = dict(custom_generate=FOLDER, trust_remote_code=True)
T1 = dict(temperature=1.0, top_k=4)  # at most 16 outcomes: few bins, power at a small n


def _ids(pair, text):
    return pair.target_tokenizer(text, return_tensors="pt").input_ids


def _folder_generate(pair, ids, folder=FOLDER, **kwargs):
    return pair.target.generate(
        ids, custom_generate=str(folder), trust_remote_code=True, assistant_model=pair.drafter,
        tokenizer=pair.target_tokenizer, assistant_tokenizer=pair.drafter_tokenizer, **kwargs,
    )


@pytest.mark.parametrize("algorithm", ["slem", "tli", "slrs"])
def test_greedy_output_is_the_target_alones_and_the_model_stays_plain(toy_pair, algorithm):
    assert not hf_hetspec.is_enabled(toy_pair.target)
    for text in toy_pair.prompts[:3]:
        ids = _ids(toy_pair, text)
        reference = toy_pair.target.generate(ids, max_new_tokens=30, do_sample=False)
        out = _folder_generate(toy_pair, ids, max_new_tokens=30, do_sample=False, hetspec_algorithm=algorithm)
        assert out.tolist() == reference.tolist(), text
        stats = hf_hetspec.last_stats(toy_pair.target)
        assert stats.algorithm == algorithm and stats.drafted_tokens > 0
        assert stats.accepted_tokens > 0  # the drafts were really used
    assert not hf_hetspec.is_enabled(toy_pair.target)
    assert "generate" not in toy_pair.target.__dict__


def test_statistics_match_an_enabled_call(toy_pair):
    ids = _ids(toy_pair, toy_pair.prompts[0])
    kwargs = dict(max_new_tokens=30, do_sample=False, hetspec_algorithm="slem")
    _folder_generate(toy_pair, ids, **kwargs)
    via_folder = hf_hetspec.last_stats(toy_pair.target)
    hf_hetspec.enable(toy_pair.target)
    try:
        toy_pair.target.generate(ids, assistant_model=toy_pair.drafter, tokenizer=toy_pair.target_tokenizer,
                                 assistant_tokenizer=toy_pair.drafter_tokenizer, **kwargs)
    finally:
        hf_hetspec.disable(toy_pair.target)
    via_enable = hf_hetspec.last_stats(toy_pair.target)
    assert via_folder is not via_enable
    for name in ("algorithm", "drafted_tokens", "accepted_tokens", "target_forwards", "new_tokens"):
        assert getattr(via_folder, name) == getattr(via_enable, name), name


def test_folder_is_a_string_because_transformers_ignores_a_path():
    assert isinstance(FOLDER, str)


def test_without_a_drafter_it_is_plain_generate(toy_pair):
    ids = _ids(toy_pair, toy_pair.prompts[1])
    reference = toy_pair.target.generate(ids, max_new_tokens=12, do_sample=False)
    out = toy_pair.target.generate(ids, max_new_tokens=12, do_sample=False, **FOLDER_ARGS)
    assert out.tolist() == reference.tolist()


@pytest.mark.parametrize(
    "override, error, words",
    [
        (dict(hetspec_algorithm="fast"), ValueError, "hetspec_algorithm"),
        (dict(assistant_tokenizer=None), ValueError, "assistant_tokenizer"),
        (dict(num_beams=2), ValueError, "num_beams"),
        (dict(use_cache=False), ValueError, "use_cache"),
    ],
)
def test_refused_calls_raise_what_enable_raises(toy_pair, override, error, words):
    ids = _ids(toy_pair, toy_pair.prompts[0])
    kwargs = {**dict(assistant_model=toy_pair.drafter, tokenizer=toy_pair.target_tokenizer,
                     assistant_tokenizer=toy_pair.drafter_tokenizer, max_new_tokens=5), **override}
    with pytest.raises(error, match=words) as via_folder:
        toy_pair.target.generate(ids, **FOLDER_ARGS, **kwargs)
    hf_hetspec.enable(toy_pair.target)
    try:
        with pytest.raises(error, match=words) as via_enable:
            toy_pair.target.generate(ids, **kwargs)
    finally:
        hf_hetspec.disable(toy_pair.target)
    assert str(via_folder.value) == str(via_enable.value)


class _FolderSampler:
    """``sampler(generator) -> outcome`` for the harness: one sampled call through the folder."""

    def __init__(self, pair, ids, num_tokens, **setting):
        self.pair, self.ids, self.num_tokens, self.setting = pair, ids, num_tokens, setting
        self.device = pair.target.device
        self.accepted = 0

    def __call__(self, generator):
        out = _folder_generate(self.pair, self.ids, do_sample=True, max_new_tokens=self.num_tokens,
                               hetspec_algorithm="slem", hetspec_generator=generator, **self.setting)
        self.accepted += hf_hetspec.last_stats(self.pair.target).accepted_tokens
        return tuple(out[0, self.ids.shape[1]:].tolist())


def test_sampled_calls_have_the_target_distribution(toy_pair):
    ids = _ids(toy_pair, "the")
    expected = exact_target_distribution(toy_pair.target, ids, 2, **T1)
    sampler = _FolderSampler(toy_pair, ids, 2, **T1)
    report = check_lossless(expected, sample_outcomes(sampler, 250, seed=0), alpha=1e-3)
    print(report)
    assert report.num_bins >= 3 and report.passed, str(report)
    assert sampler.accepted > 0


def test_missing_hf_hetspec_is_reported_by_the_requirements_check(toy_pair, tmp_path, monkeypatch):
    """transformers checks ``requirements.txt`` before running ``generate.py``: it names the package."""
    real_version = importlib.metadata.version

    def version(name):
        if name == "hf_hetspec":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    with pytest.raises(ImportError, match=r"hf_hetspec.*installed: None"):
        _folder_generate(toy_pair, _ids(toy_pair, "the"), max_new_tokens=3)


def test_unimportable_hf_hetspec_gets_a_message_naming_the_fix(toy_pair, tmp_path, monkeypatch):
    """Installed metadata but no importable package (e.g. a broken install): generate.py says what to do."""
    folder = tmp_path / "hetspec_unimportable"  # a fresh name: transformers caches loaded modules by path
    shutil.copytree(FOLDER, folder)
    monkeypatch.setitem(__import__("sys").modules, "hf_hetspec.custom_generate", None)
    with pytest.raises(ImportError, match=r"pip install hf_hetspec"):
        _folder_generate(toy_pair, _ids(toy_pair, "the"), folder=folder, max_new_tokens=3)


def test_custom_generate_on_an_enabled_model_is_refused_not_dropped(toy_pair):
    """An enabled model decodes an assisted call itself: any custom_generate would be silently replaced."""
    ids = _ids(toy_pair, toy_pair.prompts[0])
    hf_hetspec.enable(toy_pair.target)
    counter = ForwardCounter(toy_pair.target, toy_pair.drafter)
    try:
        with pytest.raises(ValueError, match=r"custom_generate.*disable"):
            _folder_generate(toy_pair, ids, max_new_tokens=5)
        assert counter.count == 0
        # without a drafter the folder's plain path runs, as on any model
        reference = type(toy_pair.target).generate(toy_pair.target, ids, max_new_tokens=5, do_sample=False)
        out = toy_pair.target.generate(ids, max_new_tokens=5, do_sample=False, **FOLDER_ARGS)
        assert out.tolist() == reference.tolist()
    finally:
        counter.close()
        hf_hetspec.disable(toy_pair.target)
