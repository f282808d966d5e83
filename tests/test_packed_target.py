"""The target's layers packed as fp16 (hf_hetspec/packed_target.py): the same products as the bf16 layers, greedy
output the target's own up to bf16 ties, the target's distribution when sampling, and when ``"auto"`` packs."""

from __future__ import annotations

import copy

import pytest
import torch

import hf_hetspec
from hf_hetspec import packed_target
from hf_hetspec.packed_target import PackedLinear, pack_linear, prepare_target, resolve_target_runtime
from hf_hetspec.testing import check_lossless, exact_target_distribution, hetspec_sampler, sample_outcomes
from hf_hetspec.testing.greedy import compare_greedy

pytestmark = pytest.mark.skipif(
    "fbgemm" not in torch.backends.quantized.supported_engines
    or torch.backends.cpu.get_cpu_capability() not in packed_target.ROWS_PER_PASS,
    reason="fbgemm's fp16 products need an x86 CPU with AVX2",
)
NEW_TOKENS = 40
ALPHA, REJECT = 1e-3, 1e-6


@pytest.fixture(scope="module")
def bf16_target(toy_pair):
    """The toy target in bf16 (its own copy: packing and enabling it leave the session's target alone)."""
    return copy.deepcopy(toy_pair.target).to(torch.bfloat16)


@pytest.fixture(scope="module")
def float32_target(toy_pair):
    """The toy target in float32 with weights that are fp16 numbers (as a bf16 or fp16 checkpoint loaded in float32:
    generate()'s CPU default), its own copy."""
    return copy.deepcopy(toy_pair.target).half().float()


def _layer(weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.nn.Linear:
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer


MAGNITUDES = torch.logspace(-7, 3, 8)


def _wide_range_weight(generator: torch.Generator) -> torch.Tensor:
    """bf16 rows whose magnitudes span 1e-7 .. 1e3 (:data:`MAGNITUDES`), each row with weights 2**-20 of its
    largest: many are fp16 subnormals or zeros unless scaled."""
    rows = torch.randn(8, 96, generator=generator)
    rows[:, ::7] *= 2.0 ** -20
    return (rows * MAGNITUDES[:, None]).to(torch.bfloat16)


def _float32_error_bound(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """Bound of float32 summation error of ``x @ W.T + b`` with exact products: ``(K + 1) eps sum |w x|``."""
    magnitude = x.double().abs() @ layer.weight.double().abs().T
    if layer.bias is not None:
        magnitude = magnitude + layer.bias.double().abs()
    return (layer.weight.shape[1] + 1) * torch.finfo(torch.float32).eps * magnitude + 1e-300


def test_a_packed_layer_forms_the_float32_products_of_the_bf16_weights():
    """Every packed output is the exact product of the bf16 weights up to float32 summation error, for rows of
    any magnitude; packing without the row scales (fp16's own range) breaks that bound, so the check has power."""
    generator = torch.Generator().manual_seed(0)
    layer = _layer(_wide_range_weight(generator), (torch.randn(8, generator=generator) * MAGNITUDES).to(torch.bfloat16))
    packed = pack_linear(layer)
    assert packed is not None
    for tokens in (1, 3, 7):
        x = torch.randn(1, tokens, 96, generator=generator).to(torch.bfloat16)
        exact = x.double() @ layer.weight.double().T + layer.bias.double()
        flat = x.reshape(-1, 96).float()
        y = torch.ops.quantized.linear_dynamic_fp16(flat, packed.packed) * packed.unscale  # before rounding
        assert ((y.double() - exact.reshape(-1, 8)).abs() <= _float32_error_bound(layer, flat)).all()
        assert packed(x).dtype == torch.bfloat16 and packed(x).shape == (1, tokens, 8)

    unscaled = torch.ops.quantized.linear_prepack_fp16(layer.weight.float(), layer.bias.float())  # BROKEN
    flat = torch.randn(3, 96, generator=generator)
    error = (torch.ops.quantized.linear_dynamic_fp16(flat, unscaled).double()
             - (flat.double() @ layer.weight.double().T + layer.bias.double())).abs()
    assert (error > _float32_error_bound(layer, flat)).any()


def test_a_float32_layer_of_fp16_numbers_packs_exactly_and_keeps_its_own_weights():
    """A float32 weight that is an fp16 number times its row's power of two packs: the packed products are the
    float32 layer's up to float32 summation error, with no rounding after; the layer's own weight is untouched (it
    is the layer's tensor when already float32). A float32 weight of 24 significant bits does not pack."""
    generator = torch.Generator().manual_seed(1)
    weight = _wide_range_weight(generator).float()
    layer = torch.nn.Linear(96, 8, dtype=torch.float32)
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(torch.randn(8, generator=generator).half().float())
    before = layer.weight.detach().clone()
    packed = pack_linear(layer)
    assert packed is not None and torch.equal(layer.weight, before)
    x = torch.randn(2, 5, 96, generator=generator)
    exact = x.double() @ layer.weight.double().T + layer.bias.double()
    assert packed(x).dtype == torch.float32
    assert ((packed(x).double() - exact).abs() <= _float32_error_bound(layer, x.reshape(-1, 96)).reshape(2, 5, 8)).all()
    with torch.no_grad():
        layer.weight.add_(torch.randn(8, 96, generator=generator) * 1e-3)  # full float32 mantissas
    assert pack_linear(layer) is None


def test_a_layer_that_fp16_cannot_hold_keeps_running_as_it_is():
    one_row = torch.zeros(2, 16, dtype=torch.bfloat16)
    one_row[0, 0], one_row[0, 1], one_row[1, 0] = 1.0, 2.0 ** -40, 1.0  # 2**-40 of its row's largest
    assert pack_linear(_layer(one_row)) is None
    one_row[0, 1] = float("nan")
    assert pack_linear(_layer(one_row)) is None
    one_row[0, 1] = 2.0 ** -20
    assert pack_linear(_layer(one_row)) is not None


def _without_row_scales(self, x):
    """BROKEN ``PackedLinear.__call__``: the outputs stay multiplied by ``2**s_n``."""
    flat = x.reshape(-1, x.shape[-1]).float()
    return torch.ops.quantized.linear_dynamic_fp16(flat, self.packed).to(x.dtype).reshape(*x.shape[:-1], -1)


def _generate(target, pair, ids, **kwargs):
    hf_hetspec.enable(target)
    try:
        out = target.generate(ids, assistant_model=pair.drafter, tokenizer=pair.target_tokenizer,
                              assistant_tokenizer=pair.drafter_tokenizer, **kwargs)
    finally:
        hf_hetspec.disable(target)
    return out, hf_hetspec.last_stats(target)


@pytest.mark.parametrize("algorithm", ["slem", "tli", "slrs"])
def test_greedy_output_with_packed_layers_is_the_bf16_targets_own(toy_pair, bf16_target, algorithm, monkeypatch):
    """Greedy output through the packed layers is the bf16 target's own one token at a time (identical, or a
    bf16 tie); the packed layers did compute it (calls counted), drafts were accepted, and the module's
    ``forward`` is put back. A packed layer that forgets its row scales changes the output, so this can fail."""
    ids = toy_pair.target_tokenizer("the cat sat on the", return_tensors="pt").input_ids
    plain = type(bf16_target).generate(bf16_target, ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    calls = []
    original_call = PackedLinear.__call__

    def counted(self, x):
        calls.append(x.shape)
        return original_call(self, x)

    monkeypatch.setattr(PackedLinear, "__call__", counted)
    call = dict(max_new_tokens=NEW_TOKENS, do_sample=False, hetspec_algorithm=algorithm,
                hetspec_target="fp16-packed")
    out, stats = _generate(bf16_target, toy_pair, ids, **call)
    verdict = compare_greedy(bf16_target, ids, plain, out)
    assert verdict.verdict in ("identical", "tie"), str(verdict)
    assert stats.target_runtime == "fp16-packed" and stats.target_memory_bytes > 0 and stats.accepted_tokens > 0
    assert calls and any(shape[-2] > 1 for shape in calls)  # verification forwards of several tokens
    assert not any("forward" in module.__dict__ for module in bf16_target.modules())

    monkeypatch.setattr(PackedLinear, "__call__", _without_row_scales)
    broken, _ = _generate(bf16_target, toy_pair, ids, **call)
    assert compare_greedy(bf16_target, ids, plain, broken).verdict == "different"


@pytest.mark.parametrize("algorithm", ["slem", "slrs"])
def test_greedy_output_with_packed_float32_layers_is_the_float32_targets_own(toy_pair, float32_target, algorithm,
                                                                            monkeypatch):
    """A float32 target whose weights are fp16 numbers packs under ``"auto"`` (on any CPU with fbgemm, even one
    with bf16 instructions), and its greedy output is its own token for token (float32: no tie allowed); a packed
    layer that forgets its row scales changes it."""
    monkeypatch.setattr(packed_target, "cpu_has_half_instructions", lambda dtype: True)
    ids = toy_pair.target_tokenizer("the cat sat on the", return_tensors="pt").input_ids
    plain = type(float32_target).generate(float32_target, ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    call = dict(max_new_tokens=NEW_TOKENS, do_sample=False, hetspec_algorithm=algorithm)
    out, stats = _generate(float32_target, toy_pair, ids, **call)
    assert compare_greedy(float32_target, ids, plain, out).verdict == "identical"
    assert stats.target_runtime == "fp16-packed" and stats.accepted_tokens > 0

    monkeypatch.setattr(PackedLinear, "__call__", _without_row_scales)
    broken, _ = _generate(float32_target, toy_pair, ids, **call)
    assert compare_greedy(float32_target, ids, plain, broken).verdict == "different"


def test_a_float32_target_with_no_fp16_weights_runs_its_own_layers_and_says_why(toy_pair):
    """The toy target's float32 weights have full mantissas: ``"auto"`` runs it eager with a note (remembered: no
    second check), and ``"fp16-packed"`` is refused with the reason."""
    target = copy.deepcopy(toy_pair.target)
    assert resolve_target_runtime(target) == ("fp16-packed", "")  # the weights decide (prepare_target)
    prepared = prepare_target(target)
    assert prepared.runtime == "eager" and packed_target.NOTHING_PACKED in prepared.note and not prepared.layers
    again = prepare_target(target)
    assert again.runtime == "eager" and packed_target.NOTHING_PACKED in again.note
    with pytest.raises(ValueError, match="hetspec_target='fp16-packed': no weight of its layers is exactly an fp16"):
        prepare_target(target, "fp16-packed")
    with pytest.raises(ValueError, match="hetspec_target='fp16-packed': no weight of its layers is exactly an fp16"):
        prepare_target(copy.deepcopy(toy_pair.target), "fp16-packed")


@pytest.mark.parametrize("dtype, algorithm", [("bf16", "tli"), ("bf16", "slrs"), ("float32", "slem")])
def test_sampling_with_packed_layers_has_the_targets_distribution(toy_pair, dtype, algorithm, monkeypatch, request):
    """Two sampled tokens through the packed layers against the target's exact distribution (its own layers,
    bf16 or float32, temperature 0.7, top-k 5); the same harness rejects layers that forget their row scales."""
    target = request.getfixturevalue(f"{dtype}_target")
    ids = toy_pair.target_tokenizer("the", return_tensors="pt").input_ids
    setting = dict(temperature=0.7, top_k=5)
    expected = exact_target_distribution(target, ids, 2, **setting)

    def report(n=400):
        sampler = hetspec_sampler(target, toy_pair.drafter, toy_pair.target_tokenizer,
                                  toy_pair.drafter_tokenizer, ids, algorithm, 2, hetspec_target="fp16-packed",
                                  **setting)
        result = check_lossless(expected, sample_outcomes(sampler, n, seed=0), ALPHA)
        return result, sampler

    result, sampler = report()
    print(result)
    assert result.num_bins >= 3 and result.passed, str(result)
    assert sampler.accepted_tokens > 0

    monkeypatch.setattr(PackedLinear, "__call__", _without_row_scales)
    broken, _ = report()
    print(broken)
    assert broken.p_value < REJECT, str(broken)


def test_auto_packs_a_half_precision_target_only_on_a_cpu_without_its_instructions(toy_pair, bf16_target,
                                                                                    monkeypatch):
    target = copy.deepcopy(bf16_target)  # no packed copy of it yet (other tests pack bf16_target)
    monkeypatch.setattr(packed_target, "cpu_has_half_instructions", lambda dtype: False)
    assert resolve_target_runtime(target) == ("fp16-packed", "")
    assert resolve_target_runtime(target, "eager") == ("eager", "")
    monkeypatch.setattr(packed_target, "_available_memory", lambda: 1000)
    runtime, note = resolve_target_runtime(target)
    assert runtime == "eager" and "GiB needed" in note
    prepare_target(target, "fp16-packed")  # once made, the copy holds its memory: auto keeps using it
    assert resolve_target_runtime(target) == ("fp16-packed", "")
    monkeypatch.setattr(packed_target, "cpu_has_half_instructions", lambda dtype: True)
    monkeypatch.setattr(packed_target, "_available_memory", lambda: None)
    assert resolve_target_runtime(target) == ("eager", "")  # the CPU's own bf16 products read weights once


def test_an_impossible_or_unknown_target_runtime_is_refused_before_any_work(toy_pair):
    ids = toy_pair.target_tokenizer("the cat", return_tensors="pt").input_ids
    with pytest.raises(ValueError, match="hetspec_target='fp16-packed': no weight of its layers is exactly an fp16"):
        _generate(toy_pair.target, toy_pair, ids, max_new_tokens=4, hetspec_target="fp16-packed")
    with pytest.raises(ValueError, match="hetspec_target='fp16-packed': the target's weights are float64, not bf16, "
                                         "fp16 or float32.*'auto' or"):
        _generate(copy.deepcopy(toy_pair.target).double(), toy_pair, ids, max_new_tokens=4,
                  hetspec_target="fp16-packed")
    with pytest.raises(ValueError, match="hetspec_target='int4' is not known; use one of auto, eager, fp16-packed"):
        _generate(toy_pair.target, toy_pair, ids, max_new_tokens=4, hetspec_target="int4")


def test_the_packed_copy_is_made_once_per_target_and_again_when_its_weights_change(toy_pair):
    target = copy.deepcopy(toy_pair.target).to(torch.bfloat16)
    first = prepare_target(target, "fp16-packed")
    assert first.layers and first.kept == 0
    assert prepare_target(target, "fp16-packed").prepare_s == 0.0
    assert prepare_target(target, "fp16-packed").layers is first.layers
    with torch.no_grad():
        next(target.parameters()).add_(1.0)
    assert prepare_target(target, "fp16-packed").layers is not first.layers


def test_the_largest_layers_are_packed_first_and_each_layer_keeps_its_own_copy(toy_pair, monkeypatch):
    """Packing costs per weight, so the largest layer (here the LM head, last in module order) starts first and is
    not left packing alone at the end; the copies still go to their own layers."""
    target = copy.deepcopy(toy_pair.target).to(torch.bfloat16)
    started = []

    def recording(layer):
        started.append(layer)
        return pack_linear(layer)

    monkeypatch.setattr(packed_target, "pack_linear", recording)
    monkeypatch.setattr(packed_target.os, "cpu_count", lambda: 1)  # one worker: the order is the submission's
    prepared = prepare_target(target, "fp16-packed")
    sizes = [layer.weight.numel() for layer in started]
    assert sizes == sorted(sizes, reverse=True) and started[0] is target.get_output_embeddings()
    generator = torch.Generator().manual_seed(0)
    assert len(prepared.layers) == len(started)
    for module, packed in prepared.layers.items():
        x = torch.randn(3, module.in_features, generator=generator).to(module.weight.dtype)
        torch.testing.assert_close(packed(x).float(), module(x).float(), rtol=2e-2, atol=2e-2)


def test_a_layer_whose_forward_something_wrapped_is_not_packed(bf16_target):
    """accelerate's offload hooks, for one, replace a module's ``forward``: such a layer keeps it."""
    target = copy.deepcopy(bf16_target)
    wrapped = next(m for m in target.modules() if isinstance(m, torch.nn.Linear))
    original = wrapped.forward
    wrapped.forward = lambda x: original(x)
    prepared = prepare_target(target, "fp16-packed")
    assert wrapped not in prepared.layers and prepared.layers
    with prepared.running():
        assert all(module.forward is layer for module, layer in prepared.layers.items())
        assert wrapped.forward is not None and wrapped not in prepared.layers
    assert "forward" in wrapped.__dict__ and not any("forward" in m.__dict__ for m in prepared.layers)


def test_the_plan_counts_the_packed_targets_verify_cost_and_drafts(toy_pair, bf16_target, monkeypatch):
    """On a CPU without bf16 instructions the bf16 target's own layers cost a forward per verified token, so
    the plan would never draft; packed, a verified token costs :data:`VERIFY_COSTS` ``"cpu-fp16-packed"`` and
    the plan drafts (and makes the drafter's copy)."""
    from hf_hetspec import plan as planning
    from hf_hetspec.plan import HetspecArguments, make_plan
    from hf_hetspec.schedule import VERIFY_COSTS
    from hf_hetspec.sources import never_drafts

    monkeypatch.setattr(packed_target, "cpu_has_half_instructions", lambda dtype: False)
    monkeypatch.setattr(planning, "verify_cost", lambda device, dtype, target_runtime="eager": (
        VERIFY_COSTS["cpu-fp16-packed"] if target_runtime == "fp16-packed" else VERIFY_COSTS["cpu-emulated-half"]))
    ids = toy_pair.target_tokenizer("the", return_tensors="pt").input_ids
    kwargs = {"tokenizer": toy_pair.target_tokenizer, "assistant_tokenizer": toy_pair.drafter_tokenizer}
    call = {"inputs": ids, "assistant_model": toy_pair.drafter, "max_new_tokens": 4}
    packed = make_plan(bf16_target, call, dict(kwargs), HetspecArguments("slem"))
    assert packed.target.runtime == "fp16-packed" and packed.verify_cost == VERIFY_COSTS["cpu-fp16-packed"]
    assert not never_drafts(packed.schedule.back_off, packed.verify_cost)
    eager = make_plan(bf16_target, call, dict(kwargs), HetspecArguments("slem", target_runtime="eager"))
    assert eager.target.runtime == "eager" and never_drafts(eager.schedule.back_off, eager.verify_cost)


def test_calls_on_one_target_share_the_patch_until_the_last_one_ends(bf16_target):
    """Each call gets its own :class:`PreparedTarget` of the cached layers; one call ending (e.g. in another
    thread) must not put the layers back under a call still running."""
    first, second = prepare_target(bf16_target, "fp16-packed"), prepare_target(bf16_target, "fp16-packed")
    assert first is not second and first.layers is second.layers
    module, layer = next(iter(first.layers.items()))
    with first.running():
        with second.running():
            assert module.forward is layer
        assert module.forward is layer
    assert "forward" not in module.__dict__


def test_a_batch_on_packed_layers_keeps_each_round_within_one_pass(toy_pair, bf16_target, monkeypatch):
    """fbgemm's fp16 product reads every weight once per :data:`ROWS_PER_PASS` token rows, so a batched round on
    the packed layers feeds at most one pass: four rows on AVX2 (6 rows a pass) or AVX-512 (14) leave no room for
    drafts of :data:`hf_hetspec.batched.MIN_BATCH_DRAFT` tokens, and the batch decodes plainly, each row the bf16
    target's own. The target's own layers have no pass (``None``), and the token budget drafts there."""
    from hf_hetspec import batched
    from hf_hetspec.packed_target import ROWS_PER_PASS
    from test_batched import left_pad

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    prepared = prepare_target(bf16_target, "fp16-packed")
    assert prepared.rows_per_pass == ROWS_PER_PASS["AVX2"] == 6
    assert packed_target.PreparedTarget("eager").rows_per_pass is None
    assert batched.draft_cap(4, 0.10, 6) == 0 and batched.draft_cap(4, 0.10, None) > 0
    assert batched.draft_cap(2, 0.10, ROWS_PER_PASS["AVX512"]) == 6 and batched.draft_cap(1, 0.10, 6) is None

    texts = ["The lighthouse keeper climbed", "the", "Speculative decoding lets a small", "def add(a, b):"]
    ids, mask = left_pad(toy_pair.target_tokenizer, texts)
    fed = []
    forward = type(bf16_target).forward

    def counted(self, *args, **kwargs):
        if self is bf16_target:
            fed.append(tuple(kwargs["input_ids"].shape))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(bf16_target), "forward", counted)
    out, stats = _generate(bf16_target, toy_pair, ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                           hetspec_algorithm="slem", hetspec_target="fp16-packed")
    monkeypatch.setattr(type(bf16_target), "forward", forward)
    assert stats.drafted_tokens == 0 and all(rows * tokens <= 6 for rows, tokens in fed[1:])
    for row, text in enumerate(texts):
        alone = toy_pair.target_tokenizer(text, return_tensors="pt").input_ids
        plain = type(bf16_target).generate(bf16_target, alone, max_new_tokens=12, do_sample=False)
        got = torch.cat([alone, out[row : row + 1, ids.shape[1]:]], dim=1)[:, : plain.shape[1]]
        assert compare_greedy(bf16_target, alone, plain, got).verdict in ("identical", "tie")
