"""Models as users have them (docs/hardening.md, "Models as users have them").

A user's model has a history: transformers' own assisted generation may have changed it in place, it may carry
PEFT (LoRA) adapters, it may be quantized by torchao or have a ``torch.compile``d forward, it may run another
attention implementation or dtype. Each case here is either honoured exactly -- greedy output token for token
equal to the same model alone, for SLEM, TLI and SLRS; one sampled call passing the chi-square test -- or refused
before any forward pass with a message that names what changed the model and the fix.

The modules touched: :mod:`hf_hetspec.checks` (the refusals; ``check_call`` accepts a ``PeftModel`` drafter),
:mod:`hf_hetspec.model_checks` (the PEFT helpers) and :mod:`hf_hetspec.runtime` (a PEFT drafter's copy merges its
adapters; an already quantized drafter is not quantized again; a compiled forward is not carried into a copy).
"""

from __future__ import annotations

import copy

import pytest
import torch

import hf_hetspec
from hf_hetspec.model_checks import adapter_state
from hf_hetspec.runtime import already_quantized, prepare_drafter
from hf_hetspec.testing import verify_lossless
from hf_hetspec.tools.checker import compare_greedy

from conftest import ForwardCounter

ALGORITHMS = ("slem", "tli", "slrs")
NEW_TOKENS = 10


def _ids(tokenizer, text: str) -> torch.Tensor:
    return tokenizer(text, return_tensors="pt").input_ids


def _alone(model, ids: torch.Tensor) -> torch.Tensor:
    """Greedy output of ``model`` alone (its own ``generate``: a ``PeftModel``'s runs its adapters)."""
    return model.generate(input_ids=ids, max_new_tokens=NEW_TOKENS, do_sample=False)


def _hetspec(target, drafter, tokenizers, ids, algorithm, **kwargs) -> torch.Tensor:
    """hf_hetspec's greedy output, enabled on ``target`` for this one call; ``tokenizers``: (target's, drafter's)."""
    hf_hetspec.enable(target)
    try:
        return target.generate(ids, assistant_model=drafter, tokenizer=tokenizers[0],
                               assistant_tokenizer=tokenizers[1], hetspec_algorithm=algorithm,
                               max_new_tokens=NEW_TOKENS, do_sample=False, **kwargs)
    finally:
        hf_hetspec.disable(target)


def _assert_identical(target, drafter, pair, algorithms=ALGORITHMS, **kwargs) -> torch.Tensor:
    """Greedy hf_hetspec output equals ``target`` alone for every algorithm; returns that output."""
    ids = _ids(pair.target_tokenizer, pair.prompts[0])
    expected = _alone(target, ids)
    tokenizers = (pair.target_tokenizer, pair.drafter_tokenizer)
    for algorithm in algorithms:
        out = _hetspec(target, drafter, tokenizers, ids, algorithm, **kwargs)
        assert torch.equal(out, expected), f"{algorithm}: {out.tolist()} != {expected.tolist()}"
    return expected


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits[0, -1]


# --------------------------------------------------------------------------------------------------------
# changed in place by transformers' own universal assisted generation
# --------------------------------------------------------------------------------------------------------


@pytest.fixture
def pruned_drafter(toy_pair):
    """A copy of the drafter after one sampled call of transformers' universal assisted generation."""
    drafter = copy.deepcopy(toy_pair.drafter)
    # fresh tokenizer objects: transformers caches its translator per tokenizer pair and prunes only the
    # drafter of the first call with that pair
    tokenizers = copy.deepcopy(toy_pair.target_tokenizer), copy.deepcopy(toy_pair.drafter_tokenizer)
    ids = _ids(toy_pair.target_tokenizer, "the")
    type(toy_pair.target).generate(toy_pair.target, ids, assistant_model=drafter, tokenizer=tokenizers[0],
                                   assistant_tokenizer=tokenizers[1], do_sample=True, max_new_tokens=2)
    assert type(drafter.get_output_embeddings()).__name__ == "_PruneReindexingLMHead"  # the state users reach
    return drafter


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_drafter_pruned_by_transformers_is_refused_before_any_work(toy_pair, pruned_drafter, algorithm):
    counter = ForwardCounter(toy_pair.target, pruned_drafter)
    ids = _ids(toy_pair.target_tokenizer, toy_pair.prompts[0])
    try:
        with pytest.raises(ValueError) as info:
            _hetspec(toy_pair.target, pruned_drafter, (toy_pair.target_tokenizer, toy_pair.drafter_tokenizer),
                     ids, algorithm)
    finally:
        counter.close()
    message = str(info.value)
    assert "drafter (`assistant_model`)" in message and "transformers' own assisted generation" in message
    assert "_PruneReindexingLMHead" in message and "original rows are gone" in message
    assert "Reload" in message and "copy.deepcopy(drafter)" in message
    assert counter.count == 0


def test_target_changed_by_transformers_is_refused_before_any_work(toy_pair, pruned_drafter):
    """The same model as a target (the pair's roles swapped) is refused too: its head rows are gone."""
    counter = ForwardCounter(toy_pair.target, pruned_drafter)
    ids = _ids(toy_pair.drafter_tokenizer, toy_pair.prompts[0])
    try:
        with pytest.raises(ValueError, match=r"the target .* changed in place by transformers' own assisted"):
            _hetspec(pruned_drafter, toy_pair.target, (toy_pair.drafter_tokenizer, toy_pair.target_tokenizer),
                     ids, "slem")
    finally:
        counter.close()
    assert counter.count == 0


# --------------------------------------------------------------------------------------------------------
# PEFT (LoRA) models
# --------------------------------------------------------------------------------------------------------


def _lora(model, *names: str, seed: int = 0, alpha: float = 6):
    """A ``PeftModel`` over a copy of ``model`` with LoRA adapters ``names`` (default: PEFT's ``"default"``) on
    the attention projections, the first active; their weights are random and nonzero (PEFT's default zero ``B``
    would change nothing), scaled by ``alpha / 4``: at 6 they change the toy target's greedy output from its second
    token on, at 1 its distribution after "the" (total variation 0.38) while the pair still agrees often."""
    names = names or ("default",)
    peft = pytest.importorskip("peft")

    def config():
        return peft.LoraConfig(r=4, lora_alpha=alpha, target_modules=["q_proj", "v_proj"], init_lora_weights=False)

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = peft.get_peft_model(copy.deepcopy(model), config(), adapter_name=names[0])
        for name in names[1:]:
            model.add_adapter(name, config())
    return model.eval()


@pytest.mark.parametrize("role", ["target", "drafter", "both"])
def test_lora_models_are_used_with_their_adapters(toy_pair, role):
    target = _lora(toy_pair.target) if role in ("target", "both") else toy_pair.target
    drafter = _lora(toy_pair.drafter, seed=1) if role in ("drafter", "both") else toy_pair.drafter
    expected = _assert_identical(target, drafter, toy_pair)
    if role == "target":  # the adapters matter: the output is not the base model's
        assert not torch.equal(expected, _alone(toy_pair.target, _ids(toy_pair.target_tokenizer, toy_pair.prompts[0])))


@pytest.mark.parametrize("runtime, algorithm", [("auto", "slem"), ("eager", "tli"), ("float32", "slrs"),
                                                ("int8", "slem"), ("int8-static", "tli"),
                                                # inductor compiles the step: ~30 s on this CPU
                                                pytest.param("compiled", "slrs", marks=pytest.mark.slow)])
def test_lora_drafter_in_every_runtime_drafts_with_its_adapters(toy_pair, runtime, algorithm):
    drafter = _lora(toy_pair.drafter, seed=1)
    _assert_identical(toy_pair.target, drafter, toy_pair, (algorithm,), hetspec_drafter=runtime)
    prepared = prepare_drafter(drafter, runtime)
    ids = _ids(toy_pair.drafter_tokenizer, toy_pair.prompts[0])
    adapted, base = _logits(drafter, ids), _logits(toy_pair.drafter, ids)
    ran = _logits(prepared.model, ids)
    # int8 weights move the logits a little; the adapters move them much more
    assert (ran - adapted).abs().max() < 0.1 * (adapted - base).abs().max(), runtime


def test_adapters_without_a_peft_model_are_not_lost_in_a_copy(toy_pair):
    """Adapters put into the model's layers without a ``PeftModel`` (PEFT's ``inject_adapter_in_model``, which
    transformers' own ``add_adapter`` / ``load_adapter`` call) have no ``merge_and_unload`` to carry them into a
    copy: a copying runtime is refused (``"auto"`` would fall back to eager), the drafter runs as it is."""
    peft = pytest.importorskip("peft")
    drafter = copy.deepcopy(toy_pair.drafter)
    peft.inject_adapter_in_model(peft.LoraConfig(r=4, lora_alpha=6, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False), drafter)
    assert adapter_state(drafter)
    with pytest.raises(ValueError, match=r"hetspec_drafter='int8': .*without a PeftModel.*'auto' or 'eager'"):
        prepare_drafter(drafter, "int8")
    _assert_identical(toy_pair.target, drafter, toy_pair, ("slrs",))


def test_lora_drafter_copy_is_rebuilt_when_adapters_or_weights_change(toy_pair):
    drafter = _lora(toy_pair.drafter, "first", "second", seed=1)
    ids = _ids(toy_pair.drafter_tokenizer, toy_pair.prompts[0])
    seen = [_logits(toy_pair.drafter, ids)]

    def check_copy_follows_the_drafter():
        """The int8 copy's logits are the drafter's as it is now (int8 rounding moves them ~0.1), and each state
        moved the drafter's logits by far more than that since the last (the check has power)."""
        prepared = prepare_drafter(drafter, "int8")
        now = _logits(drafter, ids)
        assert (_logits(prepared.model, ids) - now).abs().max() < 0.5
        assert (now - seen[-1]).abs().max() > 1.0
        seen.append(now)
        return prepared

    first = check_copy_follows_the_drafter()
    again = prepare_drafter(drafter, "int8")
    assert first.prepare_s > 0 and again.model is first.model and again.prepare_s == 0  # cached while unchanged
    drafter.set_adapter("second")
    switched = check_copy_follows_the_drafter()
    assert switched.model is not first.model
    with drafter.disable_adapter():
        assert check_copy_follows_the_drafter().model is not switched.model
    with torch.no_grad():
        next(p for n, p in drafter.named_parameters() if "lora_B.second" in n).mul_(3.0)
    assert check_copy_follows_the_drafter().model is not switched.model


def test_lora_target_switched_or_disabled_adapters_are_honoured(toy_pair):
    target = _lora(toy_pair.target, "first", "second")
    ids = _ids(toy_pair.target_tokenizer, toy_pair.prompts[0])
    tokenizers = (toy_pair.target_tokenizer, toy_pair.drafter_tokenizer)
    outputs = []
    for step in ("first", "second", "disabled"):
        if step == "second":
            target.set_adapter("second")
        if step == "disabled":
            with target.disable_adapter():
                expected, out = _alone(target, ids), _hetspec(target, toy_pair.drafter, tokenizers, ids, "slrs")
            assert torch.equal(expected, _alone(toy_pair.target, ids))
        else:
            expected, out = _alone(target, ids), _hetspec(target, toy_pair.drafter, tokenizers, ids, "slrs")
        assert adapter_state(target) and torch.equal(out, expected), step
        outputs.append(expected)
    assert len({tuple(o[0].tolist()) for o in outputs}) == 3  # each state changes the plain output


def test_lora_pair_sampling_is_lossless(toy_pair):
    """Against the exact distribution of the LoRA target, 0.38 in total variation from its base model's over the
    first two tokens (a sampler that ran the base model would fail), with the drafter's drafts accepted often."""
    report = verify_lossless(_lora(toy_pair.target, alpha=1), _lora(toy_pair.drafter, seed=1, alpha=1),
                             toy_pair.target_tokenizer, toy_pair.drafter_tokenizer,
                             _ids(toy_pair.target_tokenizer, "the"), "tli", n=400, seed=0, alpha=1e-3,
                             temperature=0.7, top_k=5)
    assert report.num_bins >= 3 and report.passed, str(report)
    assert report.acceptance_rate > 0


def test_a_drafter_that_is_no_model_is_still_refused(toy_pair):
    with pytest.raises(TypeError, match=r"PreTrainedModel \(or a PEFT PeftModel of one\), got Linear"):
        _hetspec(toy_pair.target, torch.nn.Linear(2, 2), (toy_pair.target_tokenizer, toy_pair.drafter_tokenizer),
                 _ids(toy_pair.target_tokenizer, "the"), "slem")


@pytest.mark.parametrize("role", ["target", "drafter"])
def test_prompt_learning_adapters_are_refused_before_any_work(toy_pair, role):
    peft = pytest.importorskip("peft")
    config = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2)
    wrapped = peft.get_peft_model(copy.deepcopy(toy_pair.target if role == "target" else toy_pair.drafter), config)
    target, drafter = (wrapped, toy_pair.drafter) if role == "target" else (toy_pair.target, wrapped)
    counter = ForwardCounter(target, drafter)
    try:
        with pytest.raises(NotImplementedError, match=rf"the {role} .*prompt-learning adapter \(PROMPT_TUNING\)"):
            _hetspec(target, drafter, (toy_pair.target_tokenizer, toy_pair.drafter_tokenizer),
                     _ids(toy_pair.target_tokenizer, "the"), "slem")
    finally:
        counter.close()
    assert counter.count == 0


# --------------------------------------------------------------------------------------------------------
# quantized (torchao through transformers' TorchAoConfig) and compiled models
# --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def quantized_pair(toy_pair, tmp_path_factory):
    """``(target, drafter)``: the toy pair saved and loaded with ``TorchAoConfig(Int8WeightOnlyConfig())``."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import AutoModelForCausalLM, TorchAoConfig

    models = []
    for name, model in (("target", toy_pair.target), ("drafter", toy_pair.drafter)):
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        models.append(AutoModelForCausalLM.from_pretrained(
            folder, quantization_config=TorchAoConfig(Int8WeightOnlyConfig())).eval())
    return tuple(models)


def test_torchao_quantized_models_are_used_as_they_are(toy_pair, quantized_pair):
    target, drafter = quantized_pair
    assert already_quantized(target) == already_quantized(drafter) == "transformers' TorchAoConfig"
    _assert_identical(target, drafter, toy_pair)
    hf_hetspec.enable(target)
    try:
        target.generate(_ids(toy_pair.target_tokenizer, "the"), assistant_model=drafter, max_new_tokens=2,
                        tokenizer=toy_pair.target_tokenizer, assistant_tokenizer=toy_pair.drafter_tokenizer)
        stats = hf_hetspec.last_stats(target)
    finally:
        hf_hetspec.disable(target)
    assert stats.drafter_runtime == "eager" and "already quantized (transformers' TorchAoConfig)" in stats.note


@pytest.mark.parametrize("runtime", ["float32", "int8", "int8-static", "compiled"])
def test_quantized_drafter_is_not_quantized_again(toy_pair, quantized_pair, runtime):
    target, drafter = toy_pair.target, quantized_pair[1]
    counter = ForwardCounter(target, drafter)
    try:
        with pytest.raises(ValueError, match=rf"hetspec_drafter='{runtime}': the drafter is already quantized "
                                             r"\(transformers' TorchAoConfig\).*'auto' or 'eager'"):
            _hetspec(target, drafter, (toy_pair.target_tokenizer, toy_pair.drafter_tokenizer),
                     _ids(toy_pair.target_tokenizer, "the"), "slem", hetspec_drafter=runtime)
    finally:
        counter.close()
    assert counter.count == 0


def test_already_quantized_names_tensor_subclasses_and_int8_layers(toy_pair):
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    assert already_quantized(toy_pair.drafter) == ""
    model = copy.deepcopy(toy_pair.drafter)
    quantize_(model, Int8WeightOnlyConfig())
    assert already_quantized(model).startswith("its parameter ")  # torchao 0.18: an Int8Tensor
    dynamic = torch.ao.quantization.quantize_dynamic(copy.deepcopy(toy_pair.drafter), {torch.nn.Linear},
                                                     dtype=torch.qint8)
    assert already_quantized(dynamic) == "it has dynamically quantized int8 linear layers"


@pytest.mark.parametrize("role", ["target", "drafter"])
def test_compiled_models_give_the_same_output(toy_pair, role):
    """A target compiled by ``model.compile()``, a drafter by ``model.forward = torch.compile(model.forward)``.
    Backend ``"eager"``: dynamo still captures every call (the part hf_hetspec's calls could break) without
    inductor's code generation, which takes tens of seconds per shape on a CPU; ``dynamic=True`` spares most
    recompilations for new lengths. Each role takes 5-10 s (dynamo's tracing), the most of any case here."""
    target, drafter = toy_pair.target, toy_pair.drafter
    if role == "target":
        target = copy.deepcopy(target)
        target.compile(backend="eager", dynamic=True)
    else:
        drafter = copy.deepcopy(drafter)
        drafter.forward = torch.compile(drafter.forward, backend="eager", dynamic=True)
    _assert_identical(target, drafter, toy_pair)


def test_a_compiled_drafter_copy_runs_its_own_weights(toy_pair):
    """The int8 copy of a drafter whose ``forward`` or ``__call__`` is compiled does not call the drafter's (the
    compiled function is bound to the drafter)."""
    for how in ("forward", "compile"):
        drafter = copy.deepcopy(toy_pair.drafter)
        if how == "forward":
            drafter.forward = torch.compile(drafter.forward, backend="eager")
        else:
            drafter.compile(backend="eager")
        prepared = prepare_drafter(drafter, "int8")
        assert "forward" not in vars(prepared.model) and prepared.model._compiled_call_impl is None
        ids = _ids(toy_pair.drafter_tokenizer, toy_pair.prompts[0])
        ran, plain = _logits(prepared.model, ids), _logits(toy_pair.drafter, ids)
        assert not torch.equal(ran, plain) and (ran - plain).abs().max() < 0.5  # int8 weights, the drafter's values


# --------------------------------------------------------------------------------------------------------
# attention implementations and dtypes
# --------------------------------------------------------------------------------------------------------


#: flex attention runs on the CPU, but transformers compiles it with inductor on first use: 138 s on this
#: project's 2-core CPU for a tiny Qwen2, over the default run's budget (measured 2026-12, torch 2.13)
FLEX = pytest.param("flex_attention", marks=pytest.mark.slow)


@pytest.mark.parametrize("implementation", ["eager", "sdpa", FLEX])
def test_attention_implementations(toy_pair, implementation):
    target, drafter = copy.deepcopy(toy_pair.target), copy.deepcopy(toy_pair.drafter)
    for model in (target, drafter):
        model.set_attn_implementation(implementation)
    _assert_identical(target, drafter, toy_pair)


@pytest.mark.parametrize("target_dtype, drafter_dtype",
                         [(torch.float16, torch.float32), (torch.float32, torch.float16)],
                         ids=["fp16-target", "fp16-drafter"])
def test_float16_targets_and_drafters(toy_pair, target_dtype, drafter_dtype):
    """bfloat16 both ways: ``test_hardening::test_mixed_dtypes``. A half-precision target verifies several tokens
    in one forward, whose rounding may differ from one token at a time: a swap of two tokens within that
    rounding is a tie (:func:`hf_hetspec.tools.checker.compare_greedy`), anything else a failure."""
    target = copy.deepcopy(toy_pair.target).to(target_dtype)
    drafter = copy.deepcopy(toy_pair.drafter).to(drafter_dtype)
    ids = _ids(toy_pair.target_tokenizer, toy_pair.prompts[0])
    expected = _alone(target, ids)
    for algorithm in ALGORITHMS:
        out = _hetspec(target, drafter, (toy_pair.target_tokenizer, toy_pair.drafter_tokenizer), ids, algorithm)
        verdict = compare_greedy(target, ids, expected, out)
        assert verdict.verdict == "identical" or (target_dtype != torch.float32 and verdict.verdict == "tie"), (
            algorithm, str(verdict))

