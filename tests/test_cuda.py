"""hf_hetspec with the target and the drafter on a CUDA GPU; every test is skipped on a machine without one.

``benchmarks/gpu_check.sh`` runs this module on a lent GPU. What runs only there: the target's forwards and
verification on the GPU, the drafter's ``"compiled"`` runtime as it runs on CUDA (hf_hetspec's step under
``torch.compile`` with CUDA graphs, the default of ``hetspec_drafter="auto"`` on CUDA) and sampling with a
``torch.Generator`` on the GPU.

* Greedy: SLEM, TLI and SLRS, drafter eager and compiled, token-identical to the target alone (float32 toy pair:
  no rounding tie is allowed), with drafts accepted (the drafter's path ran, not only the target's).
* Sampling: each algorithm with the compiled drafter against the target's exact distribution of its first two
  tokens (chi-square, :mod:`hf_hetspec.testing`), and a verifier broken to accept every draft unchecked is
  rejected on the same device (the test has power there).
* The plan's measured ``c`` (:mod:`hf_hetspec.calibration`) timed on the device, the compiled drafter's cache
  then reused by a greedy call that is still the target's own.

``HF_HETSPEC_TEST_GPU=cpu`` runs the module on the CPU (to check the tests themselves where no GPU is).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

import hf_hetspec
import hf_hetspec.decoding
from conftest import accept_every_draft, hetspec_generate
from hf_hetspec.testing import check_lossless, exact_target_distribution, hetspec_sampler, sample_outcomes

DEVICE = os.environ.get("HF_HETSPEC_TEST_GPU", "cuda")
pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                reason="needs a CUDA device (benchmarks/gpu_check.sh runs it on a lent GPU)")

ALGORITHMS = ("slem", "tli", "slrs")
#: A short ambiguous prompt of the toy pair (tests/test_lossless.py: several outcomes, drafts often accepted).
SAMPLING_PROMPT = "the"
SAMPLING = dict(temperature=0.7, top_k=5)
ALPHA, REJECT = 1e-3, 1e-6


@pytest.fixture(scope="module")
def gpu_pair(toy_pair):
    """The float32 toy pair with both models on :data:`DEVICE` (copies: the session's pair stays on the CPU)."""
    pair = copy.copy(toy_pair)
    pair.target = copy.deepcopy(toy_pair.target).to(DEVICE)
    pair.drafter = copy.deepcopy(toy_pair.drafter).to(DEVICE)
    return pair


def _ids(pair, text):
    return pair.target_tokenizer(text, return_tensors="pt").input_ids.to(DEVICE)


@pytest.mark.parametrize("drafter_runtime", ["eager", "compiled"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_greedy_output_is_the_targets_own(gpu_pair, algorithm, drafter_runtime):
    for text in gpu_pair.prompts[:2]:
        ids = _ids(gpu_pair, text)
        hf_hetspec.disable(gpu_pair.target)
        reference = gpu_pair.target.generate(ids, do_sample=False, max_new_tokens=24)
        out = hetspec_generate(gpu_pair, ids, algorithm, do_sample=False, max_new_tokens=24,
                               hetspec_drafter=drafter_runtime)
        assert out.device.type == torch.device(DEVICE).type
        assert out.tolist() == reference.tolist(), text
        stats = hf_hetspec.last_stats(gpu_pair.target)
        assert stats.drafter_runtime == drafter_runtime and stats.accepted_tokens > 0, stats


def _report(pair, algorithm, n):
    ids = _ids(pair, SAMPLING_PROMPT)
    expected = exact_target_distribution(pair.target, ids, 2, **SAMPLING)
    sampler = hetspec_sampler(pair.target, pair.drafter, pair.target_tokenizer, pair.drafter_tokenizer, ids,
                              algorithm, 2, hetspec_drafter="compiled", **SAMPLING)
    report = check_lossless(expected, sample_outcomes(sampler, n, seed=0), ALPHA)
    print(report, f"acceptance {sampler.acceptance_rate:.2f}")
    return report, sampler


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_sampling_with_the_compiled_drafter_is_lossless(gpu_pair, algorithm):
    report, sampler = _report(gpu_pair, algorithm, n=400)
    assert sampler.device.type == torch.device(DEVICE).type
    assert report.num_bins >= 3 and report.passed, str(report)
    assert sampler.accepted_tokens > 0, "no draft was accepted: the acceptance path did not run"


def test_a_verifier_that_accepts_every_draft_is_rejected(gpu_pair, monkeypatch):
    monkeypatch.setattr(hf_hetspec.decoding, "supports_tree", lambda target, cache: False)
    monkeypatch.setattr(hf_hetspec.decoding, "verify_exact_match_sampling", accept_every_draft)
    report, _ = _report(gpu_pair, "slem", n=200)
    assert not report.passed and report.p_value < REJECT, str(report)


def test_c_measured_on_the_device_then_decoding_gives_the_targets_own(gpu_pair, tmp_path, monkeypatch):
    """The plan's measurement of ``c`` (hf_hetspec.calibration: one-token steps of both models, the compiled
    drafter in the one cache its decodings reuse), counted for the toy target as if it were large: the value is
    real, and the greedy call after it is still the target's own."""
    import hf_hetspec.plan
    from hf_hetspec import calibration

    monkeypatch.setenv("HF_HETSPEC_HOME", str(tmp_path))
    monkeypatch.setattr(calibration, "_MEMORY", {})
    monkeypatch.setattr(hf_hetspec.plan, "needs_measured_cost_ratio", lambda target: True)
    ids = _ids(gpu_pair, gpu_pair.prompts[0])
    hf_hetspec.disable(gpu_pair.target)
    reference = gpu_pair.target.generate(ids, do_sample=False, max_new_tokens=24)
    out = hetspec_generate(gpu_pair, ids, "slem", do_sample=False, max_new_tokens=24, hetspec_drafter="compiled")
    assert out.tolist() == reference.tolist()
    measured = list(calibration._MEMORY.values())
    assert len(measured) == 1 and 0 < measured[0] < 100, measured
