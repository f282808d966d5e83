"""The drafter's runtime (hf_hetspec.runtime): lossless with every runtime, the user's drafter untouched, the
copy cached per drafter, bad values refused, the cost ratio reported.

Losslessness is checked against the plain target: greedy output token for token, sampled output with the
chi-square harness. The harness's power against the one mistake a runtime invites -- verifying with the
distribution of the *original* drafter while drafting with the copy -- is shown with a copy whose logits are
exactly four times the original's (a "runtime" that sharpens the drafter): drafting and verifying with the
copy's ``q`` passes, verifying with the original's ``q`` is rejected.
"""

from __future__ import annotations

import copy
import gc

import pytest
import torch

import hf_hetspec
from hf_hetspec import runtime
from hf_hetspec.testing import check_lossless, exact_target_distribution, hetspec_sampler, sample_outcomes
from hf_hetspec.testing import toy
from hf_hetspec.tli import TLIProposer
from conftest import ForwardCounter

RUNTIMES = ("eager", "float32", "int8", "int8-static", "compiled")
ALGORITHMS = ("slem", "tli", "slrs")
T07 = dict(temperature=0.7, top_k=5)
ALPHA, REJECT = 1e-3, 1e-6


def _ids(pair, text):
    return pair.target_tokenizer(text, return_tensors="pt").input_ids


def _hetspec(pair, ids, drafter=None, **kwargs):
    hf_hetspec.enable(pair.target)
    try:  # the target is shared by the session: left enabled, it broke test_custom_generate after this file
        out = pair.target.generate(ids, assistant_model=drafter or pair.drafter, tokenizer=pair.target_tokenizer,
                                   assistant_tokenizer=pair.drafter_tokenizer, **kwargs)
    finally:
        hf_hetspec.disable(pair.target)
    return out, hf_hetspec.last_stats(pair.target)


def _plain(pair, ids, **kwargs):
    return type(pair.target).generate(pair.target, ids, **kwargs)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("drafter_runtime", RUNTIMES)
def test_greedy_output_equals_the_target_alone_with_every_runtime(toy_pair, drafter_runtime, algorithm):
    ids = _ids(toy_pair, "the cat sat")
    out, stats = _hetspec(toy_pair, ids, hetspec_algorithm=algorithm, hetspec_drafter=drafter_runtime,
                          max_new_tokens=24, do_sample=False)
    assert torch.equal(out, _plain(toy_pair, ids, max_new_tokens=24, do_sample=False))
    assert stats.drafter_runtime == drafter_runtime
    assert stats.accepted_tokens > 0


@pytest.mark.parametrize("drafter_name,drafter_runtime", [("gemma3", "int8"), ("smollm2", "int8-static")])
def test_int8_drafter_prunes_its_quantized_head_for_tli_and_stays_exact(real_pair, drafter_name, drafter_runtime):
    """Gemma-3's 262,144-row LM head, quantized, is restricted to the intersection's rows (PrunedHead on the
    int8 copy; SmolLM2's in hf_hetspec's own step): the pruned logits are the full head's rows, and greedy TLI
    equals the target alone."""
    pair = real_pair("qwen2.5-coder", drafter_name)
    ids = _ids(pair, "def add(a, b):")
    out, stats = _hetspec(pair, ids, hetspec_algorithm="tli", hetspec_drafter=drafter_runtime, max_new_tokens=12,
                          do_sample=False)
    assert torch.equal(out, _plain(pair, ids, max_new_tokens=12, do_sample=False))
    assert stats.drafter_runtime == drafter_runtime and 0 < stats.drafter_head_rows < len(pair.drafter_tokenizer)

    copy_ = runtime.prepare_drafter(pair.drafter, drafter_runtime).model
    rows = torch.arange(0, len(pair.drafter_tokenizer), 3)
    head = hf_hetspec.drafter.PrunedHead.build(copy_, rows, len(pair.drafter_tokenizer))
    assert head is not None
    feed = torch.tensor([[5, 17, 300]])
    with torch.no_grad():  # the head quantizes its input rows together: the last one alone, as in drafting
        full = copy_(input_ids=feed, logits_to_keep=1).logits[:, -1]
        cache = copy_.new_cache() if drafter_runtime == "int8-static" else hf_hetspec.drafter.DynamicCache()
        pruned = head(feed, cache)
    torch.testing.assert_close(pruned, full[:, rows], rtol=1e-4, atol=1e-4)


# SLEM hands verification no q (exact match): its greedy test says most; TLI's q and SLRS's psi run by default
@pytest.mark.parametrize("drafter_runtime", runtime.INT8_RUNTIMES + ("compiled",))
@pytest.mark.parametrize("algorithm", [pytest.param("slem", marks=pytest.mark.slow), "tli", "slrs"])
def test_sampling_with_the_fast_drafters_is_lossless(toy_pair, algorithm, drafter_runtime):
    ids = _ids(toy_pair, "the")
    expected = exact_target_distribution(toy_pair.target, ids, 2, **T07)
    sampler = hetspec_sampler(toy_pair.target, toy_pair.drafter, toy_pair.target_tokenizer,
                              toy_pair.drafter_tokenizer, ids, algorithm, 2, hetspec_drafter=drafter_runtime,
                              **T07)
    report = check_lossless(expected, sample_outcomes(sampler, 400, seed=0), ALPHA)
    print(report)
    assert report.num_bins >= 3 and report.passed, str(report)
    assert sampler.accepted_tokens > 0


def _sharpen_head(model, names=None):
    """A "runtime" whose copy's logits are exactly 4x the original's: the LM head (untied from the embedding,
    in the copy only) scaled by 4."""
    head = model.get_output_embeddings()
    head.weight = torch.nn.Parameter(head.weight.detach() * 4.0, requires_grad=False)


def _tli_report(pair, drafter, n=400):
    ids = _ids(pair, "the")
    setting = dict(temperature=1.0, top_k=5)
    expected = exact_target_distribution(pair.target, ids, 2, **setting)
    sampler = hetspec_sampler(pair.target, drafter, pair.target_tokenizer, pair.drafter_tokenizer, ids, "tli",
                              2, hetspec_drafter="int8", hetspec_draft_temperature=1.0, **setting)
    return check_lossless(expected, sample_outcomes(sampler, n, seed=0), ALPHA)


def test_q_comes_from_the_copy_and_the_harness_rejects_q_of_the_original(toy_pair, monkeypatch):
    monkeypatch.setattr(runtime, "_quantize_int8", _sharpen_head)
    drafter = copy.deepcopy(toy_pair.drafter)  # its own cache entry: no int8 copy made by another test
    report = _tli_report(toy_pair, drafter)
    print(report)
    assert report.passed, str(report)

    def select_but_verify_with_the_original(self, logits):
        """BROKEN: draft from the copy's q, hand verification the original drafter's q (logits / 4)."""
        column = torch.multinomial(self.drafter_distribution(logits), 1, generator=self.generator)
        return column, self.drafter_distribution(logits / 4.0)

    monkeypatch.setattr(TLIProposer, "select", select_but_verify_with_the_original)
    broken = _tli_report(toy_pair, drafter)
    print(broken)
    assert broken.p_value < REJECT, str(broken)


def test_the_users_drafter_is_never_changed_and_the_copy_is_cached(toy_pair):
    drafter = copy.deepcopy(toy_pair.drafter).to(torch.bfloat16)
    before = {k: v.clone() for k, v in drafter.state_dict().items()}
    config = drafter.generation_config.to_dict()
    ids = _ids(toy_pair, "the cat")
    _, first = _hetspec(toy_pair, ids, drafter=drafter, hetspec_drafter="int8", max_new_tokens=8,
                        do_sample=False)
    _, second = _hetspec(toy_pair, ids, drafter=drafter, hetspec_drafter="int8", max_new_tokens=8,
                         do_sample=False)
    after = drafter.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.dtype == torch.bfloat16 for p in drafter.parameters())
    assert drafter.generation_config.to_dict() == config
    assert first.drafter_prepare_s > 0 and second.drafter_prepare_s == 0.0
    assert 0 < first.drafter_memory_bytes == second.drafter_memory_bytes
    assert runtime.prepare_drafter(drafter, "int8").model is runtime.prepare_drafter(drafter, "int8").model

    with torch.no_grad():  # a changed drafter gets a new copy
        drafter.get_input_embeddings().weight.mul_(1.5)
    assert runtime.prepare_drafter(drafter, "int8").prepare_s > 0

    assert drafter in runtime._PREPARED
    del drafter
    gc.collect()
    assert not any(model.dtype == torch.bfloat16 for model in runtime._PREPARED)  # the cache let it go


def test_int8_copy_is_smaller_than_the_float32_copy(toy_pair):
    drafter = copy.deepcopy(toy_pair.drafter)
    float32 = runtime.prepare_drafter(drafter.to(torch.bfloat16), "float32")
    int8 = runtime.prepare_drafter(drafter, "int8")
    assert float32.model is not drafter and 0 < int8.memory_bytes < float32.memory_bytes
    assert runtime.prepare_drafter(float32.model, "float32").model is float32.model  # float32: no copy


def test_auto_keeps_tiny_drafters_eager_and_quantizes_large_ones_on_cpu(toy_pair, monkeypatch):
    assert runtime.resolve_runtime(toy_pair.drafter, "auto") == ("eager", "")
    monkeypatch.setattr(runtime, "AUTO_INT8_MIN_PARAMETERS", 1)
    assert runtime.resolve_runtime(toy_pair.drafter, "auto") == ("int8-static", "")
    monkeypatch.setattr(runtime, "_quantized_engine", lambda: None)
    resolved, note = runtime.resolve_runtime(toy_pair.drafter, "auto")
    assert resolved == "eager" and "int8" in note
    with pytest.raises(ValueError, match="hetspec_drafter='int8'.*'auto' or 'eager'"):
        runtime.resolve_runtime(toy_pair.drafter, "int8")


@pytest.mark.parametrize("loop", ["hetspec", "transformers"])
def test_auto_makes_no_drafter_copy_where_the_source_policy_never_drafts(toy_pair, monkeypatch, loop):
    """Where one verified token costs a whole target forward (``verify_cost`` 1.0: bf16 on a CPU without bf16
    instructions) no draft pays and the drafter never runs, so ``"auto"`` makes no int8 copy (7-11 s and 645 MiB
    for SmolLM2 on such a CPU): the drafter as loaded, with a note, and the target's output. With the default
    ``v`` the same call makes the copy, and a runtime the user names is made as asked."""
    import hf_hetspec.plan as plan
    from hf_hetspec.schedule import VERIFY_COSTS

    drafter = copy.deepcopy(toy_pair.drafter)  # a drafter no other test prepared
    monkeypatch.setattr(runtime, "AUTO_INT8_MIN_PARAMETERS", 1)  # "auto" picks int8-static for the toy drafter
    ids = _ids(toy_pair, "the cat sat")
    plain = _plain(toy_pair, ids, max_new_tokens=16, do_sample=False)
    call = dict(hetspec_algorithm="tli", hetspec_loop=loop, max_new_tokens=16, do_sample=False)

    out, stats = _hetspec(toy_pair, ids, drafter, **call)  # the default v: the int8-static copy runs
    assert torch.equal(out, plain) and stats.drafter_runtime == "int8-static" and stats.drafter_forwards > 0
    runtime._PREPARED.pop(drafter)

    monkeypatch.setattr(plan, "verify_cost",
                        lambda device, dtype, target_runtime="eager": VERIFY_COSTS["cpu-emulated-half"])
    out, stats = _hetspec(toy_pair, ids, drafter, **call)
    assert torch.equal(out, plain)
    assert stats.drafter_runtime == "eager" and stats.drafter_memory_bytes == 0 and stats.drafter_forwards == 0
    assert runtime.NO_DRAFTS_NOTE in stats.note and drafter not in runtime._PREPARED
    _, stats = _hetspec(toy_pair, ids, drafter, hetspec_drafter="int8-static", **call)
    assert stats.drafter_runtime == "int8-static"


@pytest.mark.parametrize("value", ["cuda-graphs", "INT8", 8, None])
def test_unknown_runtime_is_refused_before_any_work(toy_pair, value):
    counter = ForwardCounter(toy_pair.target, toy_pair.drafter)
    try:
        with pytest.raises(ValueError, match=r"hetspec_drafter=.*use one of auto, eager, float32, int8, int8-static, "
                                             r"compiled"):
            _hetspec(toy_pair, _ids(toy_pair, "the"), hetspec_drafter=value, max_new_tokens=4) if value else \
                runtime.prepare_drafter(toy_pair.drafter, value)
    finally:
        counter.close()
    assert counter.count == 0


def test_runtime_without_a_drafter_is_refused(toy_pair):
    hf_hetspec.enable(toy_pair.target)
    try:
        with pytest.raises(ValueError, match="hetspec_drafter.*without `assistant_model`"):
            toy_pair.target.generate(_ids(toy_pair, "the"), hetspec_drafter="int8", max_new_tokens=2)
    finally:
        hf_hetspec.disable(toy_pair.target)


def test_stats_report_the_drafter_step_and_the_cost_ratio(toy_pair):
    _, stats = _hetspec(toy_pair, _ids(toy_pair, "the cat"), hetspec_algorithm="slem",
                        hetspec_drafter="eager", max_new_tokens=16, do_sample=False)
    assert stats.drafter_step_s == pytest.approx(stats.drafter_s / stats.drafter_forwards)
    assert stats.target_step_s == pytest.approx(stats.target_s / stats.target_forwards)
    assert stats.cost_ratio > 0
    assert stats.cost_ratio == pytest.approx(stats.drafter_step_s / stats.target_step_s)
    record = stats.as_dict()
    assert {"drafter_runtime", "drafter_memory_bytes", "drafter_prepare_s", "cost_ratio"} <= record.keys()
    assert "eager drafter c=" in stats.summary()


def test_a_drafter_whose_int8_copy_does_not_run_stays_eager_under_auto(monkeypatch):
    """transformers' Mamba mixers read ``dt_proj.weight`` as a tensor, which an int8 layer does not have:
    'auto' falls back to the drafter as loaded (with a note), 'int8' is refused, nothing is retried."""
    from hf_hetspec.testing.architectures import tiny_model

    tokenizer = toy.byte_level_bpe_tokenizer()
    drafter = tiny_model("mamba", len(tokenizer) + 8, toy._special_ids(tokenizer), seed=1)
    monkeypatch.setattr(runtime, "AUTO_INT8_MIN_PARAMETERS", 1)
    prepared = runtime.prepare_drafter(drafter, "auto")
    assert prepared.model is drafter and prepared.runtime == "eager"
    assert "int8 drafter unavailable" in prepared.note
    assert runtime.prepare_drafter(drafter, "auto").prepare_s == 0.0  # the failed copy is not made again
    with pytest.raises(ValueError, match="hetspec_drafter='int8': this drafter does not run with int8"):
        runtime.prepare_drafter(drafter, "int8")


def test_the_compiled_copy_runs_a_compiled_step_and_is_made_once(toy_pair):
    prepared = runtime.prepare_drafter(toy_pair.drafter, "compiled")
    decoder = prepared.model.get_decoder()
    assert prepared.runtime == "compiled" and decoder.compiled_step is not None
    assert decoder.compiled_step is not decoder.fixed_step  # torch.compile's wrapper, not the plain method
    assert prepared.memory_bytes > prepared.model.cache_bytes() > 0
    assert runtime.prepare_drafter(toy_pair.drafter, "compiled").prepare_s == 0.0


def test_auto_on_cuda_picks_the_compiled_runtime_and_falls_back_to_eager_with_a_note(toy_pair, monkeypatch):
    """No GPU here: the drafter is made to look as if it were on CUDA (``model_device``)."""
    drafter = copy.deepcopy(toy_pair.drafter)
    monkeypatch.setattr(runtime, "model_device", lambda model: torch.device("cuda"))
    monkeypatch.setattr(runtime, "_has_triton", lambda: False)
    resolved, note = runtime.resolve_runtime(drafter, "auto")
    assert resolved == "eager" and "Triton" in note
    monkeypatch.setattr(runtime, "_has_triton", lambda: True)
    assert runtime.resolve_runtime(drafter, "auto") == ("compiled", "")

    def no_compiler(step, mode):
        assert mode == "reduce-overhead"  # CUDA graphs on CUDA
        raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found")

    monkeypatch.setattr(runtime.static_drafter, "warm_up_compiled", no_compiler)
    prepared = runtime.prepare_drafter(drafter, "auto")
    assert prepared.model is drafter and prepared.runtime == "eager"
    assert prepared.note.startswith("compiled drafter unavailable (torch.compile failed: RuntimeError")
    with pytest.raises(ValueError, match=r"hetspec_drafter='compiled': this drafter does not run as 'compiled' "
                                         r"\(torch.compile failed.*\); use hetspec_drafter='auto' or 'eager'"):
        runtime.prepare_drafter(drafter, "compiled")


def test_making_a_copy_says_so_on_one_status_line_before_and_after(toy_pair, capsys):
    drafter = copy.deepcopy(toy_pair.drafter)
    runtime.prepare_drafter(drafter, "int8")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("hf_hetspec: preparing the drafter's int8 copy (quantizing, once per drafter)")
    assert lines[1].startswith("hf_hetspec: the drafter's int8 copy: ready in ") and lines[1].endswith(" MiB")
    runtime.prepare_drafter(drafter, "int8")
    assert capsys.readouterr().err == ""  # cached: no pause, no line


@pytest.mark.parametrize("float_prefill", [True, False])
def test_the_int8_runtime_runs_long_feeds_in_float_and_one_token_steps_in_int8(float_prefill, monkeypatch):
    """transformers' forward over the ``"int8"`` copy: a prompt-sized feed gives the float model's hidden states
    (``FeedSizeLinear`` runs its float layer), a one-token step the int8 layers. With the rule off (every feed
    int8, as before), the prompt's hidden states are no longer the float model's: the check has power."""
    from hf_hetspec import static_drafter
    from hf_hetspec.testing.architectures import tiny_model

    ids = torch.arange(3, 3 + static_drafter.FLOAT_FEED_MIN + 2)[None] % 96
    if not float_prefill:
        monkeypatch.setattr(static_drafter, "FLOAT_FEED_MIN", 10**9)
    model = tiny_model("phi3", 96)  # fused qkv: a layout hf_hetspec's own step does not run
    prepared = runtime.prepare_drafter(model, "int8")
    assert prepared.runtime == "int8" and not isinstance(prepared.model, static_drafter.StaticCacheDrafter)
    with torch.no_grad():
        hidden = prepared.model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
        want = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
        step = prepared.model(input_ids=ids[:, -1:]).logits[0, -1]
        float_step = model(input_ids=ids[:, -1:]).logits[0, -1]
    assert not torch.equal(step, float_step)  # one token: int8 layers
    if float_prefill:
        torch.testing.assert_close(hidden, want, rtol=1e-4, atol=1e-4)
    else:
        assert not torch.allclose(hidden, want, rtol=1e-4, atol=1e-4)
