"""Tiny, self-contained tokenizers and models for tests, examples and notebooks.

Nothing here touches the network: the tokenizers are trained in well under a second with the
``tokenizers`` library on a built-in corpus of a few KB, and the models are tiny random (or briefly
trained) ``transformers`` causal LMs.

* :func:`byte_level_bpe_tokenizer` -- a GPT-2 / Qwen-style byte-level BPE (``Ġ`` space marker, the Qwen
  regex split, ``<|endoftext|>`` / ``<|im_start|>`` / ``<|im_end|>`` appended after the regular vocabulary,
  ChatML chat template).
* :func:`sentencepiece_bpe_tokenizer` -- a Gemma-3 / Llama-style BPE (``▁`` space marker, byte fallback
  with all 256 ``<0xNN>`` tokens, ``<pad> <eos> <bos> <unk>`` at ids 0-3, a post-processor that prepends
  ``<bos>``, Gemma chat template).
* :func:`tiny_causal_lm` -- a random ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` sized for a tokenizer.
* :func:`correlated_pair` -- a target and a drafter with *different* tokenizers, both trained for a few
  seconds to memorize the same corpus, so their greedy continuations agree and speculative decoding
  actually accepts drafted tokens. Works for the toy tokenizers and for real ones (Qwen2.5, SmolLM2,
  Gemma-3: the expensive full-vocabulary rows are never trained, see :func:`train_memorizer`).
* :func:`measure_agreement` -- how far the two models' greedy continuations agree, compared as text.

One job per module: :mod:`~hf_hetspec.testing.toy_corpus`, :mod:`~hf_hetspec.testing.toy_tokenizers`,
:mod:`~hf_hetspec.testing.toy_models`, :mod:`~hf_hetspec.testing.toy_pairs` (training),
:mod:`~hf_hetspec.testing.toy_agreement` (the metric); this module re-exports them.

Example (about 5 s on two CPU cores)::

    pair = correlated_pair()              # byte-level Qwen2 target, sentencepiece Llama drafter
    report = measure_agreement(pair)      # greedy continuations of pair.prompts, compared as text
    print(report)                         # mean agreement 1.00, mean common prefix 45.0 chars ...
"""

from __future__ import annotations

from .toy_corpus import TOY_CORPUS, TOY_PROMPTS, _corpus  # noqa: F401
from .toy_tokenizers import (  # noqa: F401
    CHATML_TEMPLATE,
    GEMMA_TEMPLATE,
    _byte_level_bpe_tokenizer,
    _copy_tokenizer,
    _sentencepiece_bpe_tokenizer,
    byte_level_bpe_tokenizer,
    sentencepiece_bpe_tokenizer,
)
from .toy_models import (  # noqa: F401
    _special_ids,
    tiny_causal_lm,
)
from .toy_pairs import (  # noqa: F401
    CorrelatedPair,
    correlated_pair,
    train_memorizer,
)
from .toy_agreement import (  # noqa: F401
    AgreementReport,
    greedy_continuation,
    measure_agreement,
)

__all__ = [
    "TOY_CORPUS",
    "TOY_PROMPTS",
    "CHATML_TEMPLATE",
    "GEMMA_TEMPLATE",
    "byte_level_bpe_tokenizer",
    "sentencepiece_bpe_tokenizer",
    "tiny_causal_lm",
    "CorrelatedPair",
    "train_memorizer",
    "correlated_pair",
    "AgreementReport",
    "measure_agreement",
    "greedy_continuation",
]
