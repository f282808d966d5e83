"""hf_hetspec.drafter: the confidence stop, the drafter's context (sync, rollback, truncation) and its cache."""

from __future__ import annotations

import itertools
import unicodedata

import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig

import pytest
from conftest import TOKENIZER_NAMES, specials, spells, text_strategy
from hf_hetspec.alignment import Vocabulary
from hf_hetspec.drafter import DrafterContext, DraftStop, rollback_cache

TEXTS = text_strategy()


def test_draft_stop():
    """DraftStop ends a draft after a token below min_confidence or once the running product of the
    drafted tokens' probabilities falls below min_joint."""
    stop = DraftStop(min_joint=0.35)
    # running products 0.9, 0.72, 0.432, 0.3888, 0.2722: the fifth token ends the draft
    confidences = (0.9, 0.8, 0.6, 0.9, 0.7)
    joints = itertools.accumulate(confidences, lambda a, b: a * b)
    assert [stop.ends(p, j) for p, j in zip(confidences, joints)] == [False, False, False, False, True]
    per_token = DraftStop(min_confidence=0.5)
    assert [per_token.ends(p, 1.0) for p in (0.9, 0.9, 0.4)] == [False, False, True]
    assert not DraftStop().enabled and DraftStop(min_joint=0.1).enabled and DraftStop(min_confidence=0.1).enabled


@pytest.mark.parametrize("depth", [1, 3, 7])
def test_sliding_window_drafter_rolls_back_past_its_window(toy_sp_tokenizer, depth):
    """Gemma-3 drafters attend to a sliding window (512 tokens) in most layers; transformers' sliding-window
    cache layers keep only the window plus what was fed since their last crop, so a re-tokenization that
    replaces older tokens could not be rolled back (a shape error inside attention once the context passed
    the window, seen on Spec-Bench summarization prompts with Gemma-3-270M). After any rollback the drafter's
    next-token logits are those of a fresh forward over the same ids."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=len(toy_sp_tokenizer), hidden_size=32, intermediate_size=64,
                              num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                              sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    drafter = Gemma3ForCausalLM(config).eval()
    vocab = Vocabulary.from_tokenizer(toy_sp_tokenizer)
    prompt = toy_sp_tokenizer("def f(x):\n    return x\n" * 3).input_ids
    context = DrafterContext(drafter, vocab, prompt)
    assert len(context.ids) > 2 * config.sliding_window
    context.next_logits()  # prefill
    rollback_cache(context.cache, context.cache.get_seq_length() - 1)  # a crop
    rollback_cache(context.cache, context.cache.get_seq_length() - depth)  # deeper than fed since
    del context.ids[len(context.ids) - depth :]
    got = context.next_logits()
    with torch.no_grad():
        expected = drafter(torch.tensor([context.ids])).logits[:, -1]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


class _StubDrafter(torch.nn.Module):
    """Enough of a causal LM for :class:`DrafterContext` bookkeeping; it is never run."""

    def __init__(self, max_positions=None):
        super().__init__()
        self.config = LlamaConfig(vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                                  max_position_embeddings=max_positions or 10**9)
        self.embed = torch.nn.Embedding(1, 1)

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, past_key_values=None, use_cache=True):  # pragma: no cover - never called
        raise AssertionError("DrafterContext.sync/append_text never run the drafter")


_SHORT_PROMPTS = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=2)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.one_of(_SHORT_PROMPTS, TEXTS), chunks=st.lists(TEXTS, min_size=1, max_size=6), data=st.data())
def test_property_drafter_context_never_drifts(byte_tables, prompt, chunks, data):
    """Rounds of (a draft: the drafter's own tokens for a prefix of the next text plus random tokens, or SLRS's
    ``append_text``) then ``sync(accepted text)``: the synced context always spells prompt + accepted text,
    special tokens only where the prompt had them. With a small maximum context the context is the BOS plus
    the tail of that text, within the limit."""
    name = data.draw(st.sampled_from([n for n in TOKENIZER_NAMES if n in byte_tables]), label="tokenizer")
    capacity = data.draw(st.sampled_from([None, 40]), label="max_positions")
    vocab = byte_tables[name]
    accepted_text = "".join(chunks)
    assume(all(spells(vocab, t) for t in [prompt, accepted_text, *chunks]))
    assume(unicodedata.normalize("NFC", prompt + accepted_text) == prompt + accepted_text)
    prompt_ids = list(vocab.bos_prefix) + vocab.encode(prompt)
    ctx = DrafterContext(_StubDrafter(capacity), vocab, prompt_ids, window=3)
    expected = vocab.ids_to_bytes(prompt_ids)
    accepted = b""
    regular = [i for i in range(len(vocab.tokenizer)) if vocab.token_bytes[i] and i not in vocab.special_ids]
    for chunk in chunks:
        if data.draw(st.booleans(), label="slrs-append"):
            ctx.append_text(chunk[: data.draw(st.integers(0, len(chunk)), label="appended")])
        else:
            good = vocab.encode(chunk)[: data.draw(st.integers(0, 4), label="good")]
            noise = data.draw(st.lists(st.sampled_from(regular), max_size=3), label="noise")
            ctx.ids.extend(good + noise)
        accepted += chunk.encode()
        ctx.sync(accepted)
        synced = vocab.ids_to_bytes(ctx.ids[: ctx.n_synced])
        if ctx.truncated_tokens == 0:
            assert synced == expected + accepted
            assert specials(vocab, ctx.ids[: ctx.n_synced]) == specials(vocab, prompt_ids)
        else:
            sink = ctx.ids[: ctx.n_sink]
            assert sink == list(vocab.bos_prefix)
            assert (expected + accepted).endswith(vocab.ids_to_bytes(ctx.ids[ctx.n_sink : ctx.n_synced]))
            assert ctx.n_synced <= ctx.capacity - ctx.reserve
        assert ctx.ids == ctx.ids[: ctx.n_synced]  # nothing left of the draft after a sync


def test_rows_of_a_batch_keep_their_own_cache_where_the_drafter_step_is_compiled(toy_sp_tokenizer):
    """A compiled drafter step keeps one KV cache per drafter (its addresses are compiled in), which one decoding
    at a time reuses; the rows of a batch each get a cache of their own (batch_rows), so that one row's steps
    never overwrite another's keys: every row's logits stay those of the drafter over that row's ids."""
    from hf_hetspec import static_drafter
    from hf_hetspec.drafter import batch_rows
    from transformers import LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(toy_sp_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval().requires_grad_(False)
    step, why = static_drafter.build(model, None)
    assert step is not None, why
    step.model.compile_step(None, compile=False)  # the compiled step's one cache, without a compiler
    vocab = Vocabulary.from_tokenizer(toy_sp_tokenizer)
    prompts = [toy_sp_tokenizer("def f(x):\n    return x").input_ids, toy_sp_tokenizer("print('hello')").input_ids]
    outside = [DrafterContext(step, vocab, p) for p in prompts]
    assert outside[0].cache is outside[1].cache  # one decoding at a time: the compiled step's own cache
    with batch_rows():
        rows = [DrafterContext(step, vocab, p) for p in prompts]
    assert rows[0].cache is not rows[1].cache
    for turn in range(3):  # the rows step in turn, as a batch's proposers do
        for row in rows:
            got = row.next_logits()
            with torch.no_grad():
                expected = model(torch.tensor([row.ids])).logits[:, -1]
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
            row.append_id(3 + turn)
