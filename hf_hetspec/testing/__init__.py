"""hf_hetspec's test helpers: the statistical proof of losslessness (:mod:`hf_hetspec.testing.lossless`: exact
target distributions, samplers and a chi-square check), the greedy identity check against the target alone
(:mod:`hf_hetspec.testing.greedy`), toy pairs (:mod:`hf_hetspec.testing.toy`) and model families
(:mod:`hf_hetspec.testing.families`, :mod:`hf_hetspec.testing.architectures`)::

    from hf_hetspec.testing import verify_lossless

    report = verify_lossless(target, drafter, target_tokenizer, drafter_tokenizer, prompt_ids, "slem",
                             n=2000, seed=0, temperature=0.7, top_k=5)
    assert report.passed

This package imports the library and never the command-line tools; the library never imports it.
"""

from . import lossless
from .greedy import GreedyComparison, compare_greedy
from .lossless import *  # noqa: F403 -- its __all__
from .lossless import HetSpecSampler, Outcome, TargetSampler, TransformersSampler, _bin_groups  # noqa: F401

__all__ = ["GreedyComparison", "compare_greedy", *lossless.__all__]
