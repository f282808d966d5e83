"""Every ``generate()`` argument of a hf_hetspec call is honoured or refused (:func:`hf_hetspec.checks.check_generate_inputs`, issue 15.2).

Honoured: the output equals ``target.generate()`` without a drafter, for an input that changes that output
(asserted first, so that the comparison is not vacuous). Refused: the call raises an error naming the
argument before any forward of either model (a forward pre-hook counts them), and the argument is shown to
change plain ``generate()`` output (or to be refused by it) where it is an output-changing input.

The models are tiny and random (no training), so every input reaches their output; the drafter proposes
poorly, which costs speed only.
"""

from __future__ import annotations

import pytest
import torch
from transformers import (
    CLIPVisionConfig,
    DynamicCache,
    GenerationConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LogitsProcessorList,
)
from transformers.generation import (
    SynthIDTextWatermarkingConfig,
    UnbatchedClassifierFreeGuidanceLogitsProcessor,
    WatermarkingConfig,
)

import hf_hetspec
from hf_hetspec.compat import cache_argument
from hf_hetspec.testing import exact_target_distribution, verify_lossless
from hf_hetspec.testing.toy import tiny_causal_lm
from conftest import ForwardCounter

ALGORITHMS = ["slem", "tli", "slrs"]
PROMPT = "def add(a, b):"
_PROMPT = object()  # the pair's prompt ids


class _Pair:
    """A random tiny target (Qwen2, byte-level BPE) and drafter (Llama, sentencepiece)."""

    def __init__(self, target_tokenizer, drafter_tokenizer):
        self.target_tokenizer, self.drafter_tokenizer = target_tokenizer, drafter_tokenizer
        self.target = tiny_causal_lm(target_tokenizer, seed=1, arch="qwen2")
        self.drafter = tiny_causal_lm(drafter_tokenizer, seed=2)
        self.ids = target_tokenizer(PROMPT, return_tensors="pt").input_ids

    def plain(self, ids=None, **kwargs):
        """``target.generate`` without a drafter (the reference)."""
        return self.target.generate(self.ids if ids is None else ids, **kwargs)

    def hetspec(self, ids=_PROMPT, target=None, **kwargs):
        """hf_hetspec on ``target`` (default: this pair's); ``ids=None`` passes no prompt ids."""
        target = self.target if target is None else target
        prompt = () if ids is None else (self.ids if ids is _PROMPT else ids,)
        hf_hetspec.enable(target)
        try:
            return target.generate(*prompt, assistant_model=self.drafter,
                                   tokenizer=self.target_tokenizer, assistant_tokenizer=self.drafter_tokenizer,
                                   **kwargs)
        finally:
            hf_hetspec.disable(target)

    def assert_refused(self, error, words, target=None, **kwargs):
        """hf_hetspec raises ``error`` matching ``words`` and runs no forward of either model."""
        target = self.target if target is None else target
        counter = ForwardCounter(target, self.drafter)
        try:
            with pytest.raises(error, match=words):
                self.hetspec(target=target, **kwargs)
        finally:
            counter.close()
        assert counter.count == 0, "a model ran before the argument was refused"


@pytest.fixture(scope="module")
def pair(toy_bpe_tokenizer, toy_sp_tokenizer):
    return _Pair(toy_bpe_tokenizer, toy_sp_tokenizer)


GREEDY = dict(do_sample=False, max_new_tokens=8)


def _plain_differs_or_refuses(pair, ids=None, **kwargs) -> None:
    """The argument matters to plain ``generate()``: it changes the output or plain decoding refuses it."""
    try:
        out = pair.plain(ids, **GREEDY, **kwargs)
    except (ValueError, NotImplementedError):
        return
    assert out.tolist() != pair.plain(ids, **GREEDY).tolist(), f"{kwargs} does not change the output: vacuous test"


# ---------------------------------------------------------------------------------------------------
# Model inputs other than the ids, mask, positions and cache
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vision_target():
    """A tiny random Llava: four image tokens (id 500) stand for an 8x8 image's four patches."""
    text = LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                              image_size=8, patch_size=4, projection_dim=16)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlavaForConditionalGeneration(LlavaConfig(text_config=text, vision_config=vision,
                                                          image_token_id=500, vision_feature_layer=-1))
    return model.eval()


def test_images_and_other_model_inputs_are_refused(pair, vision_target):
    ids = torch.tensor([[1, 500, 500, 500, 500, 7, 8, 9]])
    images = [torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(s)) * 3 for s in (0, 1)]
    # the image matters: two images, two texts
    outs = [vision_target.generate(ids, pixel_values=im, max_new_tokens=8, do_sample=False, pad_token_id=0)
            for im in images]
    assert outs[0].tolist() != outs[1].tolist()
    pair.assert_refused(NotImplementedError, "pixel_values.*without `assistant_model`", target=vision_target, ids=ids,
                 pixel_values=images[0], **GREEDY)


@pytest.mark.parametrize("name, closest", [("hetspec_algoritm", "hetspec_algorithm"),
                                           ("assistant_input_id", "assistant_input_ids"), ("hetspec_speed", None)])
def test_a_misspelled_hf_hetspec_keyword_is_named_as_such(pair, name, closest):
    """Not taken for an image or audio input: the message says which hf_hetspec keyword was probably meant."""
    words = f"`{name}` is not a keyword.*" + (f"did you mean `{closest}`" if closest else "hf_hetspec's keywords are")
    pair.assert_refused(ValueError, words, **{name: "tli"}, **GREEDY)


@pytest.mark.parametrize("with_ids", [True, False], ids=["with-input_ids", "alone"])
def test_inputs_embeds_are_refused(pair, with_ids):
    embeds = pair.target.get_input_embeddings()(pair.ids).detach() * 1.7
    # the embeddings matter: plain decoding from them continues differently than from the ids
    from_embeds = pair.plain(inputs_embeds=embeds, **GREEDY)
    assert from_embeds.tolist() != pair.plain(**GREEDY)[:, pair.ids.shape[1]:].tolist()
    pair.assert_refused((ValueError, NotImplementedError), "inputs_embeds", ids=pair.ids if with_ids else None,
                 inputs_embeds=embeds, **GREEDY)


# ---------------------------------------------------------------------------------------------------
# A cache that already holds the prompt
# ---------------------------------------------------------------------------------------------------


def _prefilled(target, ids) -> DynamicCache:
    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        target(ids, use_cache=True, **{cache_argument(target): cache})
    return cache


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("uncached", [0, 1, 4], ids=["whole-prompt", "all-but-one", "part"])
def test_cache_holding_the_prompt_is_honoured(pair, algorithm, uncached):
    """Decoding on from a cache of the prompt's first ``n - uncached`` tokens gives the target's own output."""
    n = pair.ids.shape[1]
    ref = pair.plain(**GREEDY)
    cache = _prefilled(pair.target, pair.ids[:, : n - uncached])
    assert cache.get_seq_length() == n - uncached
    out = pair.hetspec(hetspec_algorithm=algorithm, **{cache_argument(pair.target): cache}, **GREEDY)
    assert out.tolist() == ref.tolist()


def test_cache_longer_than_the_prompt_is_refused(pair):
    cache = _prefilled(pair.target, torch.cat([pair.ids, pair.ids], dim=1))
    pair.assert_refused(ValueError, "cache.*holds 20 positions.*prompt has 10", **{cache_argument(pair.target): cache},
                 **GREEDY)


# ---------------------------------------------------------------------------------------------------
# Settings and processors
# ---------------------------------------------------------------------------------------------------


def test_classifier_free_guidance_is_refused(pair):
    negative = pair.target_tokenizer("bad", return_tensors="pt").input_ids
    _plain_differs_or_refuses(pair, guidance_scale=3.0, negative_prompt_ids=negative)
    pair.assert_refused(NotImplementedError, "guidance_scale=3.0.*unconditional", guidance_scale=3.0,
                 negative_prompt_ids=negative, **GREEDY)
    # the same processor passed by hand
    processor = UnbatchedClassifierFreeGuidanceLogitsProcessor(3.0, pair.target, negative)
    pair.assert_refused(NotImplementedError, "logits_processor.*UnbatchedClassifierFreeGuidance",
                 logits_processor=LogitsProcessorList([processor]), **GREEDY)


def test_synthid_watermark_is_refused_and_the_green_list_watermark_honoured(pair):
    synthid = SynthIDTextWatermarkingConfig(keys=[654, 400, 836, 123, 340, 443, 597, 160], ngram_len=3)
    _plain_differs_or_refuses(pair, watermarking_config=synthid)
    pair.assert_refused(NotImplementedError, "watermarking_config.*SynthID", watermarking_config=synthid, **GREEDY)
    green = WatermarkingConfig(bias=5.0)
    ref = pair.plain(watermarking_config=green, **GREEDY)
    assert ref.tolist() != pair.plain(**GREEDY).tolist()
    for algorithm in ALGORITHMS:
        out = pair.hetspec(hetspec_algorithm=algorithm, watermarking_config=green, **GREEDY)
        assert out.tolist() == ref.tolist()


OTHER_DECODING = [
    (dict(penalty_alpha=0.6, top_k=4), "penalty_alpha.*contrastive search"),
    (dict(dola_layers="high"), "dola_layers.*dola"),
    (dict(force_words_ids=[[5]]), "force_words_ids.*constrained beam search"),
    (dict(token_healing=True), "token_healing.*heal_tokens"),
]


@pytest.mark.parametrize("setting,words", OTHER_DECODING, ids=[w.split(".")[0] for _, w in OTHER_DECODING])
def test_other_decoding_methods_are_refused(pair, setting, words):
    # a trailing space: token healing replaces it (this prompt's output changes)
    ids = pair.target_tokenizer(PROMPT + " ", return_tensors="pt").input_ids
    _plain_differs_or_refuses(pair, ids, tokenizer=pair.target_tokenizer, **setting)
    pair.assert_refused((ValueError, NotImplementedError), words, ids=ids, **{**GREEDY, **setting})


CONFLICTS = [
    (dict(prompt_lookup_num_tokens=3), ValueError, "prompt_lookup_num_tokens=3.*another way of drafting"),
    (dict(assistant_early_exit=1), ValueError, "assistant_early_exit=1.*another way of drafting"),
    (dict(assistant_ensemble_weight=0.5), ValueError, "assistant_ensemble_weight=0.5.*no longer the target"),
    (dict(custom_generate=lambda *args, **kwargs: None), ValueError, "custom_generate"),
    (dict(synced_gpus=True), NotImplementedError, "synced_gpus"),
    (dict(prefill_chunk_size=2), NotImplementedError, "prefill_chunk_size=2"),
    (dict(cache_implementation="quantized"), ValueError, "cache_implementation='quantized'"),
    (dict(cache_implementation="paged"), ValueError, "cache_implementation='paged'"),
    (dict(logits_to_keep=0), NotImplementedError, "logits_to_keep"),
]


@pytest.mark.parametrize("setting,error,words", CONFLICTS,
                         ids=[k if callable(v) else f"{k}={v}" for s, _, _ in CONFLICTS for k, v in s.items()])
def test_options_of_other_decoding_loops_are_refused(pair, setting, error, words):
    pair.assert_refused(error, words, **{**GREEDY, **setting})


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_prefix_allowed_tokens_fn_is_honoured(pair, algorithm):
    def even_ids(batch_id, sequence):
        return list(range(0, 480, 2))

    ref = pair.plain(prefix_allowed_tokens_fn=even_ids, **GREEDY)
    assert ref.tolist() != pair.plain(**GREEDY).tolist()
    out = pair.hetspec(hetspec_algorithm=algorithm, prefix_allowed_tokens_fn=even_ids, **GREEDY)
    assert out.tolist() == ref.tolist()


def test_settings_plain_decoding_ignores_without_beams_are_ignored_too(pair):
    ignored = dict(length_penalty=2.0, early_stopping=True, low_memory=True,
                   negative_prompt_ids=torch.tensor([[5, 6]]), trust_remote_code=True, output_attentions=True)
    ref = pair.plain(**GREEDY)
    assert pair.plain(**GREEDY, **ignored).tolist() == ref.tolist()
    assert pair.hetspec(hetspec_algorithm="slem", **GREEDY, **ignored).tolist() == ref.tolist()


PROCESSOR_SETTINGS = [
    dict(no_repeat_ngram_size=1),
    dict(encoder_repetition_penalty=3.0),
    dict(sequence_bias={(70,): -20.0, (257,): 5.0}),
    dict(exponential_decay_length_penalty=(2, 3.0), eos_token_id=482),
    dict(min_new_tokens=8, eos_token_id=[265, 87]),
]


@pytest.mark.parametrize("setting", PROCESSOR_SETTINGS, ids=[next(iter(s)) for s in PROCESSOR_SETTINGS])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_processor_settings_are_honoured(pair, algorithm, setting):
    ref = pair.plain(**GREEDY, **setting)
    assert ref.tolist() != pair.plain(**GREEDY).tolist(), f"{setting} does not change the output: vacuous test"
    assert pair.hetspec(hetspec_algorithm=algorithm, **GREEDY, **setting).tolist() == ref.tolist()


@pytest.mark.parametrize("algorithm", ["slem", "tli"])
def test_sampling_warpers_beyond_top_k_and_top_p_are_lossless(toy_pair, algorithm):
    """min-p and typical sampling: the target's processors, so the sampled output has the target's distribution."""
    setting = dict(temperature=1.0, top_k=8, min_p=0.05, typical_p=0.9)
    ids = toy_pair.target_tokenizer("the", return_tensors="pt").input_ids
    # the warpers matter: the exact distribution differs from temperature 1 and top-k 8 alone
    expected = exact_target_distribution(toy_pair.target, ids, 2, **setting)
    assert expected != exact_target_distribution(toy_pair.target, ids, 2, temperature=1.0, top_k=8)
    report = verify_lossless(toy_pair.target, toy_pair.drafter, toy_pair.target_tokenizer,
                             toy_pair.drafter_tokenizer, ids, algorithm, n=400, seed=0, **setting)
    print(report)
    assert report.num_bins >= 3 and report.passed, str(report)
    assert report.acceptance_rate > 0


def test_settings_are_refused_wherever_they_come_from(pair):
    """The merged generation config decides: a passed ``GenerationConfig`` or the model's own defaults too."""
    pair.assert_refused(ValueError, "penalty_alpha",
                 generation_config=GenerationConfig(penalty_alpha=0.6, top_k=4, do_sample=False, max_new_tokens=8))
    saved = pair.target.generation_config.guidance_scale
    pair.target.generation_config.guidance_scale = 3.0
    try:
        pair.assert_refused(NotImplementedError, "guidance_scale=3.0", **GREEDY)
    finally:
        pair.target.generation_config.guidance_scale = saved
