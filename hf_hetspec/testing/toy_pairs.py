"""Correlated toy pairs: a target and a drafter with different tokenizers, trained for a few seconds to
memorize the same corpus (:mod:`hf_hetspec.testing.toy`)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .toy_corpus import TOY_PROMPTS, _corpus
from .toy_tokenizers import byte_level_bpe_tokenizer, sentencepiece_bpe_tokenizer
from .toy_models import _instantiate, _special_ids, tiny_causal_lm

# --------------------------------------------------------------------------------------------------------
# Correlated pairs
# --------------------------------------------------------------------------------------------------------


@dataclass
class CorrelatedPair:
    """A target / drafter pair with different tokenizers that memorized the same corpus.

    Attributes:
        target, drafter: the models (float32, eval mode, ``requires_grad`` off).
        target_tokenizer, drafter_tokenizer: their tokenizers.
        prompts: prompt strings (prefixes of corpus documents) on which their greedy continuations agree.
        corpus: the training documents.
        final_loss: ``{"target": ..., "drafter": ...}`` mean training cross-entropy (nats per token) over
            the last 10 % of steps.
        train_seconds: ``{"target": ..., "drafter": ...}`` wall time of building + training each model.
    """

    target: PreTrainedModel
    drafter: PreTrainedModel
    target_tokenizer: PreTrainedTokenizerBase
    drafter_tokenizer: PreTrainedTokenizerBase
    prompts: list[str]
    corpus: tuple[str, ...] = ()
    final_loss: dict[str, float] = field(default_factory=dict)
    train_seconds: dict[str, float] = field(default_factory=dict)


def _corpus_stream(tokenizer: PreTrainedTokenizerBase, corpus: Sequence[str]) -> tuple[list[int], list[int]]:
    """Token stream ``encode(doc) + [eos]`` over the documents (``encode`` adds ``<bos>`` where the tokenizer
    does), and the stream offset of each document."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no eos_token; correlated_pair needs one")
    stream: list[int] = []
    starts: list[int] = []
    for doc in corpus:
        starts.append(len(stream))
        stream.extend(tokenizer(doc, add_special_tokens=True)["input_ids"])
        stream.append(eos)
    return stream, starts


def train_memorizer(
    tokenizer: PreTrainedTokenizerBase,
    corpus: Sequence[str] | None = None,
    *,
    seed: int = 0,
    steps: int = 250,
    batch_size: int = 12,
    window: int = 48,
    lr: float = 5e-3,
    **model_kwargs,
) -> tuple[PreTrainedModel, float]:
    """Build :func:`tiny_causal_lm` for ``tokenizer`` and train it briefly to memorize ``corpus``.

    Training never touches the full vocabulary. A *compact* model is trained instead, with one embedding /
    LM-head row per token id that occurs in the corpus stream (plus the tokenizer's special ids) and one
    extra "any other token" row whose logit is offset by ``log(n_other)`` -- exactly the total probability
    of ``n_other`` tokens sharing that row -- so training also drives the probability of every unused token
    (padding rows included) towards zero. Windows of the stream are sampled at random, half of them
    starting at a document start (where inference prompts start); the loss is the next-token cross-entropy
    over the compact vocabulary (exactly the full-vocabulary loss of the resulting model, up to the small
    random part below). Afterwards the compact rows are scattered into a full-size :func:`tiny_causal_lm`
    (same seed): used ids get their trained rows, every other LM-head row becomes the trained "other" row
    plus its own small random initialization (so unused logits are low but not tied), other embedding rows
    keep their random initialization. A 262,144-token vocabulary thus costs only the full model's
    initialization (about 0.3 s).

    Args:
        tokenizer: the model's tokenizer (must have an eos token).
        corpus: documents, default :data:`TOY_CORPUS`.
        seed: seed for initialization and window sampling.
        steps, batch_size, window, lr: Adam steps, windows per step, window length (tokens), peak learning
            rate (5 % linear warm-up, cosine decay to 10 %; gradients clipped to norm 1).
        **model_kwargs: forwarded to :func:`tiny_causal_lm` (``hidden``, ``layers``, ``arch``,
            ``pad_vocab_to``, ...).

    Returns:
        ``(model, final_loss)``: the eval-mode model with gradients disabled, and the mean training
        cross-entropy (nats per token) of the last 10 % of steps.

    Raises:
        ValueError: the tokenizer has no eos token, or an invalid model argument.
    """
    docs = _corpus(corpus)
    full = tiny_causal_lm(tokenizer, seed, **model_kwargs)
    full_vocab = full.config.vocab_size
    stream, starts = _corpus_stream(tokenizer, docs)
    used_set = set(stream) | {i for i in _special_ids(tokenizer).values() if i is not None}
    used = torch.tensor(sorted(used_set), dtype=torch.long)
    remap = {int(t): i for i, t in enumerate(used)}
    n_other = full_vocab - len(used)
    compact_stream = torch.tensor([remap[t] for t in stream], dtype=torch.long)

    compact_ids = {k: (None if v is None else remap[v]) for k, v in _special_ids(tokenizer).items()}
    compact_vocab = len(used) + (1 if n_other else 0)
    compact_config = type(full.config)(
        **{**full.config.to_dict(), **compact_ids, "vocab_size": compact_vocab}
    )
    compact_config._attn_implementation = full.config._attn_implementation
    compact = _instantiate(compact_config, seed + 1).train()
    logit_offset = torch.zeros(compact_vocab)
    if n_other:
        logit_offset[-1] = math.log(n_other)

    gen = torch.Generator().manual_seed(seed)
    n = len(compact_stream)
    cyclic = torch.cat([compact_stream.repeat(1 + window // n), compact_stream[: window + 1]])
    starts_t = torch.tensor(starts, dtype=torch.long)
    opt = torch.optim.Adam(compact.parameters(), lr=lr)
    warmup = max(1, steps // 20)

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(step, steps) / steps))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    offsets = torch.arange(window + 1)
    n_doc = batch_size // 2
    losses: list[float] = []
    for _ in range(steps):
        doc_starts = starts_t[torch.randint(len(starts_t), (n_doc,), generator=gen)]
        rand_starts = torch.randint(n, (batch_size - n_doc,), generator=gen)
        batch = cyclic[torch.cat([doc_starts, rand_starts])[:, None] + offsets]  # (batch, window + 1)
        logits = compact(input_ids=batch[:, :-1], use_cache=False).logits + logit_offset  # (B, window, V)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, compact_vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(compact.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    compact.eval()

    with torch.no_grad():
        full_state = full.state_dict()
        unused = torch.ones(full_vocab, dtype=torch.bool)
        unused[used] = False
        head_names = {"lm_head.weight"}
        if full.config.tie_word_embeddings:
            head_names.add("model.embed_tokens.weight")
        for name, value in compact.state_dict().items():
            target = full_state[name]
            if value.shape == target.shape:
                target.copy_(value)
                continue
            # embedding / LM head, shape (vocab, hidden): scatter the trained rows
            target[used] = value[: len(used)]
            if name in head_names and n_other:
                target[unused] += value[-1]
    full.requires_grad_(False)
    tail = max(1, steps // 10)
    return full, sum(losses[-tail:]) / tail


def correlated_pair(
    target_tokenizer: PreTrainedTokenizerBase | None = None,
    drafter_tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    corpus: Sequence[str] | None = None,
    prompts: Sequence[str] | None = None,
    seed: int = 0,
    steps: int = 250,
    target_kwargs: dict | None = None,
    drafter_kwargs: dict | None = None,
) -> CorrelatedPair:
    """A tiny target and a tiny drafter with different tokenizers whose greedy continuations agree.

    Random tiny models practically never agree, so speculative decoding would reject every draft. Here both
    models are trained (:func:`train_memorizer`, a few seconds each on 2 CPU cores, independent of the
    vocabulary size) to memorize the same corpus; on prompts that are prefixes of corpus documents both then
    continue the document, i.e. produce the same *text* in their own tokenizations.

    Args:
        target_tokenizer: default :func:`byte_level_bpe_tokenizer`. Real tokenizers work too
            (``AutoTokenizer.from_pretrained`` of Qwen2.5, SmolLM2, Gemma-3; pass the checkpoint's
            ``vocab_size`` in ``target_kwargs`` to get its exact logit width).
        drafter_tokenizer: default :func:`sentencepiece_bpe_tokenizer`; real tokenizers work too.
        corpus: documents; default :data:`TOY_CORPUS`.
        prompts: default :data:`TOY_PROMPTS` (with a custom corpus: the first four words of each document).
        seed: target seed; the drafter uses ``seed + 1000``.
        steps: training steps per model.
        target_kwargs, drafter_kwargs: extra :func:`tiny_causal_lm` / :func:`train_memorizer` arguments
            (``hidden``, ``layers``, ``arch``, ``pad_vocab_to``, ``vocab_size``, ``lr``, ...), overriding the
            defaults: the target is a ``Qwen2ForCausalLM`` with its logits padded to a multiple of 64
            (``arch="qwen2", pad_vocab_to=64``), the drafter a ``LlamaForCausalLM`` (``arch="llama"``)
            with exactly ``len(drafter_tokenizer)`` logits; both hidden size 64, 2 layers.

    Returns:
        A :class:`CorrelatedPair`.

    Raises:
        ValueError: a tokenizer without eos token, or invalid model arguments.
    """
    docs = _corpus(corpus)
    if target_tokenizer is None:
        target_tokenizer = byte_level_bpe_tokenizer(corpus=None if corpus is None else docs)
    if drafter_tokenizer is None:
        drafter_tokenizer = sentencepiece_bpe_tokenizer(corpus=None if corpus is None else docs)
    if prompts is None:
        prompts = TOY_PROMPTS if corpus is None else tuple(_first_words(d, 4) for d in docs)
    t_kwargs = {"arch": "qwen2", "pad_vocab_to": 64, **(target_kwargs or {})}
    d_kwargs = {"arch": "llama", **(drafter_kwargs or {})}
    t0 = time.perf_counter()
    target, t_loss = train_memorizer(target_tokenizer, docs, seed=seed, steps=steps, **t_kwargs)
    t1 = time.perf_counter()
    drafter, d_loss = train_memorizer(drafter_tokenizer, docs, seed=seed + 1000, steps=steps, **d_kwargs)
    t2 = time.perf_counter()
    return CorrelatedPair(
        target=target,
        drafter=drafter,
        target_tokenizer=target_tokenizer,
        drafter_tokenizer=drafter_tokenizer,
        prompts=list(prompts),
        corpus=docs,
        final_loss={"target": t_loss, "drafter": d_loss},
        train_seconds={"target": t1 - t0, "drafter": t2 - t1},
    )


def _first_words(doc: str, k: int) -> str:
    """The prefix of ``doc`` ending just before the space after its ``k``-th word (all of ``doc`` if shorter).

    Cutting before a space keeps the prompt's tokenization a prefix of the document's tokenization for both
    byte-level (the space starts the next pre-token) and sentencepiece-style (``▁`` starts the next word)
    tokenizers.
    """
    count = 0
    for i, ch in enumerate(doc):
        if ch == " " and i > 0 and not doc[i - 1].isspace():
            count += 1
            if count == k:
                return doc[:i]
    return doc
