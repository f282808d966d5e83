"""Shared pytest fixtures: toy tokenizers, correlated toy model pairs, and the real tokenizers in ../shared.

Fixtures (all expensive ones are session-scoped and built lazily, on first use):

* ``toy_bpe_tokenizer`` -- :func:`hf_hetspec.testing.toy.byte_level_bpe_tokenizer` (Qwen-style, 483 ids).
* ``toy_sp_tokenizer`` -- :func:`hf_hetspec.testing.toy.sentencepiece_bpe_tokenizer` (Gemma-style, 600 ids).
* ``toy_pair`` -- :class:`hf_hetspec.testing.toy.CorrelatedPair`: byte-level target (``Qwen2ForCausalLM``, logits
  padded to 512), sentencepiece drafter (``LlamaForCausalLM``, 600 logits). ~6 s CPU to build.
* ``toy_pair_reversed`` -- sentencepiece target (padded to 640), byte-level drafter (padded to 512).
* ``shared_tokenizers_dir`` -- ``<repo>/../shared/tokenizers``; skips the test when absent (fresh clone).
* ``real_tokenizer(name)`` / ``real_pair(target_name, drafter_name)`` -- cached factories for the real
  tokenizers (``"qwen2.5-coder"``, ``"smollm2"``, ``"gemma3"``) and correlated tiny pairs built on them
  (embedding sizes from each ``model_config.json``). Parametrize with names, e.g.::

      @pytest.mark.parametrize("names", [("qwen2.5-coder", "gemma3"), ("gemma3", "smollm2")])
      def test_something(real_pair, names):
          pair = real_pair(*names)

The suite runs in one pytest-xdist worker per core (``-n auto`` in setup.cfg; ``-n 0`` runs it
in one process). Torch runs with few threads (``HF_HETSPEC_TEST_THREADS``; by default the cores per worker, at
most 4, so 1 on a 2-core runner): the toy models are tiny, so more threads only add overhead, and on a shared
2-core runner oversubscribed threads make training 5-10x slower. Seeds are fixed per test.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # a fresh clone that is not pip-installed
    sys.path.insert(0, str(REPO_ROOT))

from hf_hetspec.testing import toy  # noqa: E402

#: Names of the real tokenizers under ``../shared/tokenizers``.
REAL_TOKENIZER_NAMES = ("qwen2.5-coder", "smollm2", "gemma3")
# Architecture of the tiny stand-in model for each real tokenizer (Gemma-3 gets a Llama body).
_REAL_ARCH = {"qwen2.5-coder": "qwen2", "smollm2": "llama", "gemma3": "llama"}


def _default_threads() -> int:
    env = os.environ.get("HF_HETSPEC_TEST_THREADS")
    if env:
        return max(1, int(env))
    cores = os.cpu_count() or 1
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # set in each pytest-xdist worker
    per_worker = cores // max(1, workers)
    return 1 if per_worker <= 2 else min(4, per_worker)


torch.set_num_threads(_default_threads())


@pytest.fixture(autouse=True)
def _fixed_seeds():
    """Seed Python's and torch's global RNGs before every test."""
    random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def toy_bpe_tokenizer():
    """Qwen-style byte-level BPE toy tokenizer (shared by the session: do not mutate)."""
    return toy.byte_level_bpe_tokenizer()


@pytest.fixture(scope="session")
def toy_sp_tokenizer():
    """Gemma-style sentencepiece BPE toy tokenizer with byte fallback (shared: do not mutate)."""
    return toy.sentencepiece_bpe_tokenizer()


@pytest.fixture(scope="session")
def toy_pair(toy_bpe_tokenizer, toy_sp_tokenizer) -> toy.CorrelatedPair:
    """Byte-level target (Qwen2, logits padded to a multiple of 64) + sentencepiece drafter (Llama)."""
    return toy.correlated_pair(toy_bpe_tokenizer, toy_sp_tokenizer, seed=0)


@pytest.fixture(scope="session")
def toy_pair_reversed(toy_bpe_tokenizer, toy_sp_tokenizer) -> toy.CorrelatedPair:
    """Sentencepiece target (Qwen2 body, padded) + byte-level drafter (Llama, padded to a multiple of 64)."""
    return toy.correlated_pair(
        toy_sp_tokenizer, toy_bpe_tokenizer, seed=1, drafter_kwargs={"pad_vocab_to": 64}
    )


@pytest.fixture(scope="session")
def shared_tokenizers_dir() -> Path:
    """``<repo>/../shared/tokenizers`` holding the real tokenizers; skips the test when it is absent."""
    path = REPO_ROOT.parent / "shared" / "tokenizers"
    if not path.is_dir():
        pytest.skip(f"real tokenizers not available: {path} does not exist (fresh clone without ../shared)")
    return path


@pytest.fixture(scope="session")
def real_tokenizer(shared_tokenizers_dir):
    """Factory ``real_tokenizer(name) -> tokenizer`` (cached; Gemma-3 takes ~3 s to load).

    Skips the test when ``name``'s folder is missing; raises ``KeyError`` for an unknown name.
    """
    from transformers import AutoTokenizer

    cache: dict[str, object] = {}

    def load(name: str):
        if name not in REAL_TOKENIZER_NAMES:
            raise KeyError(f"unknown real tokenizer {name!r}; expected one of {REAL_TOKENIZER_NAMES}")
        if name not in cache:
            path = shared_tokenizers_dir / name
            if not (path / "tokenizer.json").is_file():
                pytest.skip(f"real tokenizer {name!r} not available under {path}")
            cache[name] = AutoTokenizer.from_pretrained(str(path))
        return cache[name]

    return load


@pytest.fixture(scope="session")
def real_model_config(shared_tokenizers_dir):
    """Factory ``real_model_config(name) -> dict``: the real checkpoint's ``model_config.json``."""

    def load(name: str) -> dict:
        return json.loads((shared_tokenizers_dir / name / "model_config.json").read_text())

    return load


@pytest.fixture(scope="session")
def real_pair(real_tokenizer, real_model_config):
    """Factory ``real_pair(target_name, drafter_name) -> CorrelatedPair`` (cached per name pair, ~7 s CPU each).

    Each tiny model's embedding / LM head has the real checkpoint's ``vocab_size`` (e.g. 262,144 for
    Gemma-3, 151,936 for Qwen2.5-Coder); both memorized :data:`hf_hetspec.testing.toy.TOY_CORPUS`.
    """
    cache: dict[tuple[str, str], toy.CorrelatedPair] = {}

    def build(target_name: str, drafter_name: str) -> toy.CorrelatedPair:
        key = (target_name, drafter_name)
        if key not in cache:
            cache[key] = toy.correlated_pair(
                real_tokenizer(target_name),
                real_tokenizer(drafter_name),
                seed=0,
                target_kwargs={
                    "arch": _REAL_ARCH[target_name],
                    "vocab_size": real_model_config(target_name)["vocab_size"],
                },
                drafter_kwargs={
                    "arch": _REAL_ARCH[drafter_name],
                    "vocab_size": real_model_config(drafter_name)["vocab_size"],
                },
            )
        return cache[key]

    return build


def save_toy_models(root: Path, homogeneous: bool = False) -> dict[str, Path]:
    """``save_pretrained`` folders under ``root``: a tiny byte-level Qwen2 target (``"target"``), a tiny
    SentencePiece drafter (``"drafter"``) and, with ``homogeneous``, a same-vocabulary drafter (``"homogeneous"``)."""
    target_tokenizer, drafter_tokenizer = toy.byte_level_bpe_tokenizer(), toy.sentencepiece_bpe_tokenizer()
    models = [("target", target_tokenizer, toy.tiny_causal_lm(target_tokenizer, seed=0, arch="qwen2")),
              ("drafter", drafter_tokenizer, toy.tiny_causal_lm(drafter_tokenizer, seed=1))]
    if homogeneous:
        models.append(("homogeneous", target_tokenizer, toy.tiny_causal_lm(target_tokenizer, seed=2, arch="qwen2")))
    for name, tokenizer, model in models:
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return {name: root / name for name, _, _ in models}


def hetspec_generate(pair, ids, algorithm, **kwargs):
    """``pair.target.generate`` with hf_hetspec enabled for this one call and ``pair``'s drafter and tokenizers."""
    import hf_hetspec

    hf_hetspec.enable(pair.target)
    try:
        return pair.target.generate(ids, assistant_model=pair.drafter, tokenizer=pair.target_tokenizer,
                                    assistant_tokenizer=pair.drafter_tokenizer, hetspec_algorithm=algorithm,
                                    **kwargs)
    finally:
        hf_hetspec.disable(pair.target)


def accept_every_draft(draft_ids, target_probs, generator=None):
    """BROKEN exact-match verification (for ``hf_hetspec.decoding.verify_exact_match_sampling``): the target
    samples every position but every draft token is kept unchecked. The losslessness tests must reject it."""
    k = draft_ids.shape[0]
    samples = torch.multinomial(target_probs, 1, generator=generator).squeeze(1)
    return torch.cat([draft_ids, samples[k:]]), k


class ForwardCounter:
    """Counts forward calls of ``models`` (a pre-hook on each) until :meth:`close`: proves that a refused call
    ran no model."""

    def __init__(self, *models):
        self.count = 0
        self.handles = [m.register_forward_pre_hook(self._hook) for m in models]

    def _hook(self, module, args):
        self.count += 1

    def close(self):
        for h in self.handles:
            h.remove()


# ---------------------------------------------------------------------------------------------------
# Byte tables and random texts for the property tests of alignment and the drafter's context
# ---------------------------------------------------------------------------------------------------

#: Control-token strings of all five tokenizers, typed as text.
SPECIAL_STRINGS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<bos>", "<eos>", "<start_of_turn>",
                   "<end_of_turn>", "<pad>"]
#: The toy tokenizers and the real ones of ``../shared``.
TOKENIZER_NAMES = ["toy-bytelevel", "toy-sentencepiece", "qwen2.5-coder", "smollm2", "gemma3"]


def text_strategy():
    """Hypothesis texts: random characters mixed with special-token strings, emoji, CJK, combining marks and
    whitespace runs."""
    from hypothesis import strategies as st

    pieces = st.one_of(
        st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8),
        st.sampled_from(SPECIAL_STRINGS + ["🙂", "👍🏽", "数学", "e\u0301", "\u00e9", "  ", "\n\n", "\t", " <", "|>"]),
    )
    return st.lists(pieces, min_size=1, max_size=8).map("".join).filter(bool)


@pytest.fixture(scope="session")
def byte_tables(request):
    """The byte tables of the toy and (when ``../shared`` exists) the real tokenizers, by name."""
    from hf_hetspec.alignment import Vocabulary, vocabulary

    tables = {"toy-bytelevel": Vocabulary.from_tokenizer(toy.byte_level_bpe_tokenizer()),
              "toy-sentencepiece": Vocabulary.from_tokenizer(toy.sentencepiece_bpe_tokenizer())}
    try:
        load = request.getfixturevalue("real_tokenizer")
        for name in ("qwen2.5-coder", "smollm2", "gemma3"):
            tables[name] = vocabulary(load(name))
    except pytest.skip.Exception:
        pass
    return tables


def spells(vocab, text: str) -> bool:
    """The tokenizer spells ``text`` byte for byte (no normalization such as Qwen2's NFC changes it)."""
    return vocab.ids_to_bytes(vocab.encode(text)) == text.encode()


def specials(vocab, ids) -> list[int]:
    """The ids among ``ids`` that are special tokens of ``vocab``."""
    return [i for i in ids if i in vocab.special_ids]


# ---------------------------------------------------------------------------------------------------
# A small Spec-Bench file for the tools layer's tests
# ---------------------------------------------------------------------------------------------------

SPEC_BENCH_ROWS = [  # written for these tests, in Spec-Bench's question.jsonl format
    {"question_id": 1, "category": "writing", "turns": ["Write a note about the sea.", "Make it shorter."]},
    {"question_id": 2, "category": "roleplay", "turns": ["Be a lighthouse keeper.", "Say goodbye."]},
    {"question_id": 3, "category": "writing", "turns": ["Describe a storm.", "Add a title."]},
    {"question_id": 4, "category": "summarization", "turns": ["Summarize: The keeper lit the lamp at dusk."]},
    {"question_id": 5, "category": "summarization", "turns": ["Summarize: Ships passed the rocks safely."]},
    {"question_id": 6, "category": "rag", "turns": ["The lighthouse stands on a rock. Where is it?"]},
]


@pytest.fixture(scope="session")
def spec_bench_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec_bench") / "question.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in SPEC_BENCH_ROWS))
    return path


