"""hf_hetspec: lossless speculative decoding for Hugging Face transformers with a drafter whose vocabulary
differs from the target's (Timor et al., "Accelerating LLM Inference with Lossless Speculative Decoding
Algorithms for Heterogeneous Vocabularies", ICML 2025, arXiv 2502.05202).

Usage::

    import hf_hetspec
    hf_hetspec.enable(target)
    out = target.generate(input_ids, assistant_model=drafter, tokenizer=target_tokenizer,
                          assistant_tokenizer=drafter_tokenizer, hetspec_algorithm="slem",
                          max_new_tokens=128)
    print(hf_hetspec.last_stats(target).summary())

The same algorithms inside transformers' own assisted-generation loop (``_assisted_decoding``), as
``CandidateGenerator`` classes (:mod:`hf_hetspec.candidates`)::

    out = target.generate(input_ids, assistant_model=drafter, tokenizer=target_tokenizer,
                          assistant_tokenizer=drafter_tokenizer, hetspec_algorithm="tli",
                          hetspec_loop="transformers", max_new_tokens=128)

Chat prompts with each model's own template (the drafter's prompt only changes its proposals)::

    inputs = hf_hetspec.chat_inputs(messages, target_tokenizer, drafter_tokenizer)
    out = target.generate(**inputs, assistant_model=drafter, tokenizer=target_tokenizer,
                          assistant_tokenizer=drafter_tokenizer, max_new_tokens=128)
"""

from .candidates import (
    HetspecCandidateGenerator,
    SLEMCandidateGenerator,
    SLRSCandidateGenerator,
    TLICandidateGenerator,
)
from .chat import chat_inputs
from .checks import ALGORITHMS, IMPLEMENTED, LOOPS, VERIFICATIONS
from .integration import assisted_decoding_with, disable, enable, is_enabled, last_stats
from .intersection import IntersectionLogitsProcessor, VocabularyIntersection, vocabulary_intersection
from .plan import DecodingPlan
from .schedule import DraftStop, Schedule
from .stats import DecodingStats

__version__ = "0.1.0"

__all__ = [
    "ALGORITHMS",
    "IMPLEMENTED",
    "LOOPS",
    "VERIFICATIONS",
    "DecodingPlan",
    "DecodingStats",
    "DraftStop",
    "HetspecCandidateGenerator",
    "IntersectionLogitsProcessor",
    "SLEMCandidateGenerator",
    "SLRSCandidateGenerator",
    "Schedule",
    "TLICandidateGenerator",
    "VocabularyIntersection",
    "assisted_decoding_with",
    "chat_inputs",
    "disable",
    "enable",
    "is_enabled",
    "last_stats",
    "vocabulary_intersection",
]
