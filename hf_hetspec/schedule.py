"""How long each draft is: one module, one value.

A call's draft schedule is a frozen :class:`Schedule` (the first lookahead, whether it adapts, its floor, and the
:class:`DraftStop` that ends a draft early from the drafter's confidence), decided once by
:func:`choose_schedule` from the user's settings and the defaults of the drafter runtime that really runs
(:data:`SLEM_DEFAULTS`, :data:`TOKEN_LEVEL_FLOORS`), or passed whole per call
(``generate(hetspec_schedule=Schedule(...))``, checked by :func:`hf_hetspec.checks.check_schedule`). While a
call decodes, :class:`AdaptiveLookahead` holds the lookahead as transformers' +2/-1 rule moves it.

None of this changes the output distribution: a schedule depends on the drafter alone, and speculative
sampling is exact for any draft length fixed before verification (Leviathan et al. 2023, Thm. 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Where transformers' +2/-1 schedule starts (token-level drafting, or an explicit schedule without a length).
DEFAULT_LOOKAHEAD = 5
#: The longest draft any adaptive schedule grows to (drafter tokens).
MAX_LOOKAHEAD = 16


@dataclass(frozen=True)
class DraftStop:
    """When to end a draft before the lookahead is used up, from the drafter's own confidence.

    The draft ends after a token whose drafter probability is below ``min_confidence`` (transformers'
    ``assistant_confidence_threshold`` rule), or once the product of the drafted tokens' probabilities -- the
    drafter's estimate that the whole draft is accepted -- falls below ``min_joint``. The second rule is a
    cost rule: drafting one more token costs about ``c + v`` target forwards (``c`` = drafter step time /
    target step time, ``v`` = what one more token adds to the verification forward) and adds at most that
    product in expected accepted tokens, so drafting is worth it while the product exceeds ``c + v``
    (Leviathan et al. 2023, Section 3.4, choose the draft length from the acceptance rate and the cost ratio;
    here per draft, from the drafter's confidence). The drafter's confidence overstates the target's
    agreement, so the tuned defaults (:data:`SLEM_DEFAULTS`, per drafter runtime) sit above ``c + v``.

    Both decisions depend on the drafter alone, so they never change the output distribution: the number
    of drafts is a stopping time of the drafter's randomness, and speculative sampling is exact for any
    draft length fixed before verification.

    Attributes:
        min_confidence: per-token cut-off in ``[0, 1)`` (0 disables it).
        min_joint: cut-off of the running product in ``[0, 1)`` (0 disables it).
    """

    min_confidence: float = 0.0
    min_joint: float = 0.0

    @property
    def enabled(self) -> bool:
        """Whether either cut-off is set (a disabled stop costs no host sync per drafted token)."""
        return self.min_confidence > 0.0 or self.min_joint > 0.0

    def ends(self, confidence: float, joint: float) -> bool:
        """Whether to end the draft after a token drafted with probability ``confidence``, ``joint`` being the
        product of the probabilities of the draft so far, that token's included."""
        return confidence < self.min_confidence or joint < self.min_joint


@dataclass(frozen=True)
class Schedule:
    """How long each draft is.

    Attributes:
        lookahead: drafter tokens per draft (the first draft's when ``adaptive``), >= 1.
        adaptive: transformers' heuristic: +2 after a fully accepted draft, -1 otherwise, in
            ``[min_lookahead, max(MAX_LOOKAHEAD, lookahead)]``.
        stop: ends a draft early from the drafter's confidence (:class:`DraftStop`).
        min_lookahead: the adaptive schedule's floor (transformers': 1).
        context_lookup: a round may draft the continuation of an n-gram of the target's own ids instead of
            asking the drafter (:mod:`hf_hetspec.sources`).
        back_off: a round may draft nothing when the drafter's running yield per cost falls below the
            target's own (:mod:`hf_hetspec.sources`).
        cost_ratio: ``c`` the source policy counts per drafter step (target forwards); ``None``: the
            runtime's :data:`COST_RATIOS` entry.
        verify_cost: ``v`` the source policy counts per verified draft token (target forwards); ``None``:
            :func:`verify_cost` of the target.
        sibling_min_joint: SLEM (greedy or sampled) also drafts, at each draft position, the drafter's runner-up
            after the chain's tokens before it, when the drafter's estimate that this branch is what the target
            writes reaches this value; the target verifies the chain and its siblings as one tree
            (:mod:`hf_hetspec.tree`). A sibling costs no drafter step, only its tokens in the verification
            (``v`` each), so it pays while its chance exceeds about ``v``. 0 disables. TLI and SLRS draft them
            beside argmax drafts by the same rule (their default schedule has 0: measured no faster).
        sibling_runner_ups: how many of the drafter's runner-ups per draft position (its 2nd, 3rd, ... choices)
            may become siblings, each by the ``sibling_min_joint`` rule (>= 1).
    """

    lookahead: int
    adaptive: bool
    stop: DraftStop = field(default_factory=DraftStop)
    min_lookahead: int = 1
    context_lookup: bool = False
    back_off: bool = False
    cost_ratio: float | None = None
    verify_cost: float | None = None
    sibling_min_joint: float = 0.0
    sibling_runner_ups: int = 1


#: ``v``: target forwards added to a verification by one more drafted token (a forward over ``k + 1`` tokens
#: costs about ``1 + v k`` single-token forwards), by how the target computes (:func:`verify_cost`). A memory-bound
#: forward reads the weights once for any short ``k``: 0.03 for a bf16 Qwen2.5-Coder-1.5B on a CPU with bf16
#: instructions (the tuning machine of :data:`SLEM_DEFAULTS`), and a GPU is no worse. A CPU without half-precision
#: instructions computes bf16/fp16 by conversion, and a forward's cost grows with its tokens: on an AVX2 AMD EPYC
#: (2026-12-02, two threads) one token took 242 ms and 16 tokens 2,711 ms (0.68 per token), and at one thread
#: ``hf-hetspec bench`` measured verification forwards of 6.4 tokens at 6.6 single-token steps (TPOT 388 ms
#: against 378 ms, benchmarks/results/suite-report-greedy-bf16): about 1 per token, so no draft pays there and
#: the source policy decodes alone (:class:`hf_hetspec.sources.SourcePolicy`). In float32: 481 ms and 1,229 ms
#: (0.10); but at one thread 368 ms for one token and 1,386 ms for 7 (0.46), so a CPU target running its own
#: layers gets ``v`` measured on the machine instead (:mod:`hf_hetspec.calibration`; these values stand for
#: targets too small to time). The same bf16 target with its layers packed as fp16
#: (:mod:`hf_hetspec.packed_target`): 343 ms for one token, 517 ms for 6 (0.10), 830 ms for 8; float32 packed,
#: 257 ms for one, 343 ms for 4 (0.11).
VERIFY_COSTS: dict[str, float] = {"native": 0.03, "cpu-emulated-half": 1.0, "cpu-float32": 0.10,
                                   "cpu-fp16-packed": 0.10}
VERIFY_COST = VERIFY_COSTS["native"]


def verify_cost(device, dtype, target_runtime: str = "eager") -> float:
    """``v`` for a target whose weights are ``dtype`` on ``device`` (:data:`VERIFY_COSTS`): on a CPU, float32, or
    bf16/fp16 with or without the CPU's own half-precision instructions (oneDNN's check), or with its layers packed
    as fp16 (``target_runtime`` ``"fp16-packed"``, :mod:`hf_hetspec.packed_target`); elsewhere ``native``.
    A property of the machine, the same on every rank and every run, so the source policy stays reproducible; the
    plan replaces it by :func:`hf_hetspec.calibration.measured_verify_cost` (stored per machine) for a large CPU
    target running its own layers."""
    import torch

    if getattr(device, "type", str(device)) != "cpu":
        return VERIFY_COSTS["native"]
    if target_runtime == "fp16-packed":
        return VERIFY_COSTS["cpu-fp16-packed"]
    if dtype in (torch.bfloat16, torch.float16):
        return VERIFY_COSTS["native" if cpu_has_half_instructions(dtype) else "cpu-emulated-half"]
    return VERIFY_COSTS["cpu-float32"]


def cpu_has_half_instructions(dtype) -> bool:
    """Whether this CPU computes ``dtype`` (``torch.bfloat16`` or ``torch.float16``) with instructions of its own
    (oneDNN's check: e.g. AVX-512 BF16 or AMX), rather than by conversion to float32; ``False`` on a torch build
    without oneDNN."""
    import torch

    check = (torch.ops.mkldnn._is_mkldnn_bf16_supported if dtype == torch.bfloat16
             else torch.ops.mkldnn._is_mkldnn_fp16_supported)
    try:
        return bool(check())
    except (AttributeError, RuntimeError):  # a torch build without oneDNN
        return False


#: ``c`` per drafter runtime: drafter step seconds / target step seconds, SmolLM2-135M drafter, bf16
#: Qwen2.5-Coder-1.5B target, one CPU thread (``hf-hetspec bench`` measures it as ``cost_ratio``: 0.165 eager,
#: 0.06-0.08 int8, 0.056 int8-static). A fixed table rather than the call's clock keeps the source policy
#: (:mod:`hf_hetspec.sources`) a function of the accepted tokens, so a seeded call is reproducible;
#: ``Schedule(cost_ratio=...)`` sets the figure measured on other hardware. Off the CPU a large target's call uses
#: ``c`` measured once on the device instead (:func:`hf_hetspec.calibration.measured_cost_ratio`; an H200: eager
#: 1.0-1.4, compiled 0.060-0.072).
COST_RATIOS: dict[str, float] = {"eager": 0.165, "float32": 0.165, "int8": 0.07, "int8-static": 0.056,
                                 "compiled": 0.056}


@dataclass(frozen=True)
class SlemDefault:
    """SLEM's default draft schedule: drafts of up to ``max_lookahead`` drafter tokens, each ended once the
    drafter's probability that all of it is accepted falls below ``min_joint`` (:class:`DraftStop`)."""

    min_joint: float
    max_lookahead: int


#: SLEM's default schedule per drafter runtime (:mod:`hf_hetspec.runtime`). Drafting one more token pays while
#: its chance of acceptance exceeds what it costs, about the drafter's step c plus what it adds to the
#: verification (0.03 target forwards), so a cheaper drafter step pays for longer drafts (Leviathan et al.
#: 2023, Section 3.4). The drafter's confidence overstates how often the target agrees, so the thresholds that
#: win sit above c + 0.03. Tuned with benchmarks/tune_schedule.py on HumanEval/20-29 (disjoint from the bench's
#: HumanEval/0-9), SmolLM2-135M drafter, Qwen2.5-Coder-1.5B bf16 target, CPU (benchmarks/README.md):
#:
#: * eager drafters (c = 0.165): 0.35/12 ran 2.29x and 2.18x the target alone on the two halves; 0.2/32 2.02x,
#:   0.5/32 2.18x, 0.5/12 2.22x;
#: * int8 runtimes (c = 0.06-0.08): 0.2/16 ran 2.75x on HumanEval/20-24 against 2.36x for 0.35/12, 2.71x for
#:   0.25/16 and 2.46x for 0.15/20.
#:
#: The compiled runtime (CUDA graphs on a GPU) gets the low-cost schedule by analogy: it exists to make the
#: drafter's step cheap, and no GPU was available to tune it.
SLEM_DEFAULTS: dict[str, SlemDefault] = {
    "eager": SlemDefault(0.35, 12),
    "float32": SlemDefault(0.35, 12),
    "int8": SlemDefault(0.2, 16),
    "int8-static": SlemDefault(0.2, 16),
    "compiled": SlemDefault(0.2, 16),
}
#: SLEM's default runner-ups per draft position that may become sibling branches (``Schedule.sibling_runner_ups``),
#: greedy and sampled calls. A sampled target spreads its choice over more tokens, so the drafter's 3rd choice is
#: worth verifying more often: at T=1, two runner-ups ran 1.52x the target alone against 1.42x for one (12
#: Spec-Bench prompts of the tuning half, interleaved; target tokens per forward higher on 8, equal on 4), while
#: greedy, on the same prompts, two ran 1.70x against 1.71x (tokens per forward up on 6, trees 60% larger;
#: docs/results.md, 2026-12-02 night).
SIBLING_RUNNER_UPS: dict[str, int] = {"greedy": 1, "sampled": 2}
#: TLI's and SLRS's default floor of the +2/-1 lookahead schedule per drafter runtime. Leviathan et al.'s
#: expected speedup ``(1 - a^(k+1)) / ((1 - a)(1 + k (c + 0.03)))`` at the acceptance rate a = 0.6 of sampled
#: code is best at k = 2 for an eager drafter (c = 0.2) and flat over k = 3-5 at c = 0.05, where k = 1 loses
#: 13%; transformers' rule drops to 1 after a few rejections. Tuned with benchmarks/tune_schedule.py on
#: HumanEval/20-26, T=1, int8-static SmolLM2 drafter (benchmarks/README.md): TLI ran 1.61x the target alone with
#: the rule from 1, 1.83x / 1.80x / 1.78x with fixed lookaheads 3 / 4 / 5.
TOKEN_LEVEL_FLOORS: dict[str, int] = {"eager": 1, "float32": 1, "int8": 3, "int8-static": 3, "compiled": 3}


def choose_schedule(algorithm: str, *, drafter_runtime: str = "eager", num_assistant_tokens: int | None = None,
                    num_assistant_tokens_schedule: str | None = None,
                    assistant_confidence_threshold: float | None = None,
                    verify_cost: float = VERIFY_COST, sample: bool = False) -> Schedule:
    """The draft-length schedule from the user's explicit settings, else the algorithm's default.

    ``num_assistant_tokens`` alone: drafts of exactly that many drafter tokens; a heuristic
    ``num_assistant_tokens_schedule``: transformers' +2/-1 rule; ``assistant_confidence_threshold``: a
    per-token cut-off on top. By default SLEM follows :data:`SLEM_DEFAULTS` for the ``drafter_runtime`` that
    runs (the prepared drafter's, after any fallback; never ``"auto"``); TLI and SLRS follow transformers'
    +2/-1 rule from ``DEFAULT_LOOKAHEAD`` down to :data:`TOKEN_LEVEL_FLOORS` of the runtime, each draft also
    ended by SLEM's joint cut-off of the runtime (:class:`DraftStop`, on the proposal probability of each drafted
    target token); both default
    schedules also draft from the context and back off (:mod:`hf_hetspec.sources`), which a schedule made
    from explicit settings does not (the user asked for drafts of a given length). Where verification is dear
    (``verify_cost``, :func:`verify_cost`, more than twice the tuning machine's cost per draft token), SLEM's
    joint cut-off rises to ``c + v`` and TLI/SLRS start from one token with a floor of one. SLEM's default
    also drafts sibling branches whose drafter-estimated chance is at least ``v`` (``Schedule.sibling_min_joint``,
    :mod:`hf_hetspec.tree`), none where verification is dear, from :data:`SIBLING_RUNNER_UPS` runner-ups per
    position (``sample``: the call samples). The joint cut-off alone (fixed cap, no +2/-1 rule) once measured
    slower for token-level drafts with an eager drafter and sampled drafts (SmolLM2, T=1: 1.06x vs 1.26x): a
    drafter token the target would tokenize differently is rejected however sure the drafter is, and the +2/-1
    rule learns that. Both together, with the int8-static drafter and argmax drafts, ran faster than the rule
    alone (2026-12-03, 14 Spec-Bench and code-completion prompts of the tuning half, interleaved; greedy TLI
    1.66x against 1.56x the target alone, SLRS 1.66x against 1.62x, with fewer drafted and more accepted tokens
    per target forward; T=1 TLI 1.54x against 1.35x (seed 0) and 1.48x against 1.40x (seed 1), SLRS 1.37x
    against 1.44x (seed 1), the sampled texts differing between settings;
    ``benchmarks/results/schedule-tuning/tli-slrs-joint-stop-*.log``).

    Raises:
        ValueError: ``assistant_confidence_threshold`` outside ``[0, 1)``.
    """
    threshold = assistant_confidence_threshold
    if threshold is not None and not (isinstance(threshold, (int, float)) and 0.0 <= threshold < 1.0):
        raise ValueError(
            f"assistant_confidence_threshold={threshold!r}: the drafter-confidence cut-off must be in [0, 1) "
            "(0 disables it)."
        )
    min_confidence = float(threshold or 0.0)
    if num_assistant_tokens is not None or num_assistant_tokens_schedule is not None:
        lookahead = num_assistant_tokens if num_assistant_tokens is not None else DEFAULT_LOOKAHEAD
        adaptive = num_assistant_tokens_schedule in ("heuristic", "heuristic_transient")
        return Schedule(lookahead, adaptive, DraftStop(min_confidence))
    # where verifying a token is dear (``verify_cost`` well above the tuning machine's), a draft token pays only
    # while the drafter's estimate that it is accepted exceeds c + v (DraftStop), and token-level drafts start
    # from and may fall to one token (Leviathan et al. 2023, Section 3.4)
    dear = verify_cost + COST_RATIOS[drafter_runtime] > 2 * (VERIFY_COST + COST_RATIOS[drafter_runtime])
    # every algorithm's default ends a draft at the runtime's joint cut-off; a user's threshold replaces it
    min_joint = SLEM_DEFAULTS[drafter_runtime].min_joint if threshold is None else 0.0
    if algorithm == "slem":
        default = SLEM_DEFAULTS[drafter_runtime]
        if dear and threshold is None:
            min_joint = max(min_joint, min(0.95, verify_cost + COST_RATIOS[drafter_runtime]))
        # a sibling branch costs only its tokens in the verification: worth it while its chance exceeds v
        siblings = 0.0 if dear else verify_cost
        return Schedule(default.max_lookahead, False, DraftStop(min_confidence, min_joint), context_lookup=True,
                        back_off=True, sibling_min_joint=siblings,
                        sibling_runner_ups=SIBLING_RUNNER_UPS["sampled" if sample else "greedy"])
    if dear:
        return Schedule(1, True, DraftStop(min_confidence), 1, context_lookup=True, back_off=True)
    # the +2/-1 rule bounds the draft, the joint cut-off ends it where the drafter turns unsure
    return Schedule(DEFAULT_LOOKAHEAD, True, DraftStop(min_confidence, min_joint), TOKEN_LEVEL_FLOORS[drafter_runtime],
                    context_lookup=True, back_off=True)


@dataclass
class AdaptiveLookahead:
    """The lookahead of one call as it moves: transformers' heuristic, +2 after a fully accepted draft, -1
    otherwise, within ``[floor, cap]``; fixed when the schedule does not adapt.

    Attributes:
        value: drafter tokens of the next draft.
        adaptive, floor, cap: from the :class:`Schedule` (``cap`` = ``max(MAX_LOOKAHEAD, lookahead)``).
    """

    value: int
    adaptive: bool
    floor: int
    cap: int

    @classmethod
    def start(cls, schedule: Schedule) -> "AdaptiveLookahead":
        """The state at the start of a call."""
        return cls(schedule.lookahead, schedule.adaptive, schedule.min_lookahead,
                   max(MAX_LOOKAHEAD, schedule.lookahead))

    def update(self, drafted: int, accepted: int) -> None:
        """After a verification that accepted ``accepted`` of ``drafted`` draft tokens (no change after an
        empty draft)."""
        if not self.adaptive or drafted == 0:
            return
        if accepted >= drafted:
            self.value = min(self.value + 2, self.cap)
        else:
            self.value = max(self.floor, self.value - 1)
