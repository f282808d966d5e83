"""Report formatting (hf_hetspec/tools/reports.py) not covered through the bench: the machine line."""

from __future__ import annotations

from hf_hetspec.tools.reports import machine_summary


def test_machine_summary_names_the_cpu_instructions_and_says_when_a_record_has_none():
    cpu = {"cpu": "AMD EPYC", "cpu_count": 2, "torch_threads": 1}
    assert machine_summary({**cpu, "cpu_instructions": "AVX2", "bf16_instructions": False}) == (
        "AMD EPYC (AVX2, no bf16 instructions), 2 cores, 1 torch threads")
    assert machine_summary({**cpu, "cpu_instructions": "AVX512", "bf16_instructions": True}) == (
        "AMD EPYC (AVX512, bf16 instructions), 2 cores, 1 torch threads")
    assert machine_summary(cpu) == "AMD EPYC, 2 cores, 1 torch threads"  # a run recorded before these keys
    assert machine_summary({**cpu, "gpu": "NVIDIA H200"}) == "NVIDIA H200"
