"""Running and timing the methods a benchmark compares, on one target/drafter pair.

* ``target``: ``target.generate()`` without a drafter;
* ``transformers``: transformers' built-in universal assisted generation with the same drafter
  (``assistant_model=`` + both tokenizers, hf_hetspec disabled);
* ``hf_hetspec``: this package (any ``hetspec_algorithm``);
* ``homogeneous``: transformers' standard assisted generation with a same-vocabulary drafter
  (``assistant_model=`` without tokenizers, hf_hetspec disabled).

Speeds are new tokens per wall-clock second of the whole ``generate()`` call; a speedup is the ratio of a
method's tokens/s to the target alone's, with tokens and seconds summed over the prompts of the run.
hf_hetspec's drafted/accepted tokens and target forwards come from its
:class:`~hf_hetspec.stats.DecodingStats`. For transformers' assisted paths they are counted with a forward
pre-hook on the target: it feeds the prompt plus the first draft in its first target forward and the last
accepted token plus a draft in every later one, so ``drafted = fed tokens - prompt tokens - (forwards - 1)``
and ``accepted = new tokens - forwards`` (tokens cut by ``max_new_tokens`` in the last block are not counted
as accepted). Rejections (forwards whose verification rejected a drafted token, for Leviathan et al.'s
``alpha``, :attr:`hf_hetspec.stats.DecodingStats.alpha`) are counted by the same hook from the target's KV
cache: a round that fed its draft on top of ``P`` cached positions and left ``P'`` cached for the next round
discarded ``P + fed - P'`` drafted tokens, so it rejected one when that is positive (the last round has no next
round to read and is not counted). Drafted tokens are in the target's vocabulary for all methods.

Every call also records, outside the timed region or at negligible cost inside it:

* time to first token (TTFT): wall seconds from the start of ``generate()`` to the streamer receiving the
  first new token(s) (:class:`FirstTokenTimer`; assisted methods deliver a whole accepted block at once);
* time per output token (TPOT): ``(seconds - TTFT) / (new_tokens - 1)``, the decoding phase after the first
  token;
* drafter forwards (the drafter's steps, its catch-up forwards included): hf_hetspec's own count, and a
  forward pre-hook on the drafter for transformers' methods;
* peak memory in MiB (:class:`PeakMemory`): on CUDA ``torch.cuda.max_memory_allocated`` after
  ``reset_peak_memory_stats``; on Linux CPUs the process's peak resident set size ``VmHWM`` after resetting it
  through ``/proc/self/clear_refs``; ``None`` where neither is available. Both include every model loaded in
  the process, so only differences between methods of one run are meaningful.
"""

from __future__ import annotations

import copy
import os
import platform
import re
import statistics
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch

from .. import integration
from ..calibration import cpu_name, synchronize
from ..compat import cache_from_kwargs, cache_kwargs, output_cache
from ..drafter import model_device
from ..schedule import cpu_has_half_instructions
from ..stats import DecodingStats, acceptance_rate, alpha
from ..testing.greedy import GreedyComparison, compare_greedy

METHODS = ("target", "transformers", "hf_hetspec")
#: hf_hetspec's algorithms run inside transformers' own ``_assisted_decoding`` (``hetspec_loop="transformers"``).
TRANSFORMERS_LOOP = "hf_hetspec_transformers_loop"
#: :data:`METHODS` plus transformers' same-vocabulary assisted generation and hf_hetspec in transformers' loop.
ALL_METHODS = (*METHODS, "homogeneous", TRANSFORMERS_LOOP)
#: The methods that run hf_hetspec's candidate generation (its statistics, its drafter runtime).
HETSPEC_METHODS = ("hf_hetspec", TRANSFORMERS_LOOP)


class MethodError(RuntimeError):
    """hf_hetspec refused a call (``NotImplementedError``/``ValueError``): the message says why."""


class BaselineFailed(RuntimeError):
    """transformers' own assisted generation, a baseline the tools compare against, raised inside transformers
    (transformers 5.25's universal assisted generation crops its drafter's cache by a length in the target's
    tokens and then feeds the drafter no token): a fault of that transformers version, not of hf_hetspec, so
    the tools leave the method out of the run and say why (:class:`Methods`)."""


@dataclass
class Methods:
    """The methods still in a run: one that raises :class:`BaselineFailed` leaves it, with the reason.

    Attributes:
        names: the methods (names or specs), in order; the caller iterates over this list.
        failures: ``"<label> failed inside transformers <version>: <error>"`` per method left out.
    """

    names: list
    failures: list[str] = field(default_factory=list)

    def run(self, method, call):
        """``call()``, or ``None`` after removing ``method`` from :attr:`names` when it raised
        :class:`BaselineFailed`."""
        try:
            return call()
        except BaselineFailed as err:
            self.names.remove(method)
            self.failures.append(str(err))
            return None


def machine_info(device: str) -> dict:
    """CPU (or GPU), thread count and library versions, for the demo's header and JSON."""
    import transformers

    info = {
        "cpu": cpu_name(),
        # the model name alone does not tell machine classes apart (two "AMD EPYC" CPUs measured here differ
        # 4x in bf16 speed): the vector instructions PyTorch uses and whether bf16 has instructions of its own
        "cpu_instructions": torch.backends.cpu.get_cpu_capability(),
        "bf16_instructions": cpu_has_half_instructions(torch.bfloat16),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "torch": str(torch.__version__),  # a str subclass that YAML writers do not know
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


# --------------------------------------------------------------------------------------------------------
# The three methods
# --------------------------------------------------------------------------------------------------------


@dataclass
class MethodRun:
    """One ``generate()`` call of one method on one prompt.

    Attributes:
        method: one of :data:`ALL_METHODS`.
        output_ids (``torch.LongTensor`` of shape ``(1, n + new_tokens)``): prompt and generated ids.
        prompt_tokens, new_tokens: token counts (target vocabulary).
        seconds: wall-clock seconds of the ``generate()`` call.
        target_forwards, drafted_tokens, accepted_tokens, rejections: see the module docstring.
        comparison: greedy verdict against the target alone (``None`` for the target itself or sampling).
        stats: hf_hetspec's statistics of the call (``None`` for the other methods).
        ttft_seconds: seconds to the first new token (``None`` when no token was generated).
        drafter_forwards: forward calls of the drafter (``0`` for the target alone).
        peak_memory_mb: peak memory during the call in MiB, see the module docstring (``None``: unavailable).
    """

    method: str
    output_ids: torch.Tensor
    prompt_tokens: int
    new_tokens: int
    seconds: float
    target_forwards: int
    drafted_tokens: int
    accepted_tokens: int
    rejections: int = 0
    comparison: GreedyComparison | None = None
    stats: DecodingStats | None = None
    ttft_seconds: float | None = None
    drafter_forwards: int = 0
    peak_memory_mb: float | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tpot_seconds(self) -> float | None:
        """Seconds per output token after the first: ``(seconds - ttft) / (new_tokens - 1)``."""
        if self.ttft_seconds is None or self.new_tokens < 2:
            return None
        return (self.seconds - self.ttft_seconds) / (self.new_tokens - 1)

    def record(self, tokenizer, label: str) -> dict:
        """JSON-serializable summary, with the generated text."""
        cmp = self.comparison
        return {
            "method": self.method,
            "label": label,
            "text": tokenizer.decode(self.output_ids[0, self.prompt_tokens :], skip_special_tokens=True),
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second,
            "target_forwards": self.target_forwards,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": acceptance_rate(self.accepted_tokens, self.drafted_tokens),
            "rejections": self.rejections,
            "tokens_per_forward": self.new_tokens / self.target_forwards if self.target_forwards else None,
            "verdict": None if cmp is None else cmp.verdict,
            "verdict_detail": None if cmp is None else str(cmp),
            "ttft_seconds": self.ttft_seconds,
            "tpot_seconds": self.tpot_seconds,
            "drafter_forwards": self.drafter_forwards,
            "peak_memory_mb": self.peak_memory_mb,
            "stats": None if self.stats is None else self.stats.as_dict(),
        }


@contextmanager
def count_forwards(target):
    """Count the forward calls of ``target`` (any module), the tokens fed to them and the rounds that discarded
    drafted tokens (see the module docstring) while the block runs.

    Yields:
        dict with ``forwards``, ``fed_tokens`` and ``rejections``, updated in place (``rejections`` counts
        every forward but the last; a forward without a KV cache counts none).
    """
    counts = {"forwards": 0, "fed_tokens": 0, "rejections": 0}
    previous = None  # (cached positions + fed tokens) of the last forward

    def hook(module, args, kwargs):
        nonlocal previous
        fed = kwargs.get("input_ids", args[0] if args else None)
        if fed is None:
            fed = kwargs["inputs_embeds"]
        cache = cache_from_kwargs(kwargs)
        cached = cache.get_seq_length() if cache is not None else None
        if previous is not None and cached is not None and previous > cached:
            counts["rejections"] += 1
        previous = None if cached is None else cached + fed.shape[1]
        counts["forwards"] += 1
        counts["fed_tokens"] += fed.shape[1]

    handle = target.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield counts
    finally:
        handle.remove()


class FirstTokenTimer:
    """A ``generate(streamer=...)`` streamer that notes when the first new token arrives.

    ``generate()`` (transformers' and hf_hetspec's alike) first puts the prompt, then the new tokens; the
    second ``put`` is the first new token (or accepted block). Tokens reach the streamer on the CPU, so on a
    GPU the time stamp follows the device's work.

    Attributes:
        first_token_at: ``time.perf_counter()`` value of the second ``put`` (``None`` until then).
    """

    def __init__(self):
        self._puts = 0
        self.first_token_at: float | None = None

    def put(self, value) -> None:
        self._puts += 1
        if self._puts == 2:
            self.first_token_at = time.perf_counter()

    def end(self) -> None:
        pass


class PeakMemory:
    """Peak memory of a ``with`` block in MiB (``mb`` after the block; ``None`` when it cannot be measured).

    CUDA: ``torch.cuda.max_memory_allocated`` after ``torch.cuda.reset_peak_memory_stats`` (tensors only).
    CPU on Linux: the peak resident set size ``VmHWM`` of ``/proc/self/status``, reset to the current size by
    writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0; the whole process: Python, every loaded model).
    """

    _HWM = re.compile(r"VmHWM:\s+(\d+)\s+kB")

    def __init__(self, device: torch.device):
        self.device = device
        self.mb: float | None = None
        self._cpu_ok = False

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
                self._cpu_ok = True
            except OSError:
                self._cpu_ok = False
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            self.mb = torch.cuda.max_memory_allocated(self.device) / 2**20
        elif self._cpu_ok:
            try:
                with open("/proc/self/status") as f:
                    match = self._HWM.search(f.read())
                self.mb = int(match.group(1)) / 1024 if match else None
            except OSError:
                self.mb = None
        return False


@torch.no_grad()
def step_seconds(model, input_ids: torch.Tensor, repeats: int = 5) -> float:
    """Wall seconds of one single-token decoding forward of ``model`` (median of ``repeats`` timed forwards).

    The prompt is prefilled into a KV cache first (untimed), then the model decodes greedily one token per
    forward; a first untimed step absorbs one-time set-up. This is the per-step cost ``c`` relates in
    Leviathan et al. (2023), Sec. 3.4 (drafter step time / target step time).

    Args:
        model: a causal LM.
        input_ids (``torch.LongTensor`` of shape ``(1, n)``): a prompt in ``model``'s vocabulary.
        repeats: timed forwards, >= 1.

    Raises:
        ValueError: ``repeats < 1`` or an empty prompt.
    """
    if repeats < 1 or input_ids.shape[-1] == 0:
        raise ValueError(
            f"step_seconds needs repeats >= 1 and a non-empty prompt; got {repeats}, {tuple(input_ids.shape)}"
        )
    device = model_device(model)
    out = model(input_ids=input_ids.to(device), use_cache=True, logits_to_keep=1)
    cache = output_cache(out)
    token = out.logits[:, -1:].argmax(-1)  # [1, 1]
    times = []
    for _ in range(repeats + 1):
        synchronize(device)
        start = time.perf_counter()
        out = model(input_ids=token, use_cache=True, **cache_kwargs(model, cache))
        synchronize(device)
        times.append(time.perf_counter() - start)
        token = out.logits[:, -1:].argmax(-1)
    return statistics.median(times[1:])


@dataclass
class Runner:
    """Runs the methods (:data:`ALL_METHODS`) with one target, drafter and decoding setup.

    Args:
        target, target_tokenizer, drafter, drafter_tokenizer: the models and their tokenizers.
        algorithm: hf_hetspec's ``hetspec_algorithm``.
        max_new_tokens: tokens to generate per call.
        do_sample, temperature, top_p: the decoding; greedy when ``do_sample`` is false.
        seed: reseeds torch (and hf_hetspec's generator) before every sampled call.
        lookahead: ``num_assistant_tokens`` for both assisted methods (``None``: each method's default).
        builtin_drafter, builtin_drafter_tokenizer: drafter (and tokenizer) of transformers' built-in path.
            Greedy: the same objects (the drafter's generation config is restored after each call).
            Sampling: a separately loaded copy, because transformers prunes the LM head of the first drafter
            it sees with a tokenizer pair in place, and caches that translation per tokenizer object; when
            none is given, a deep copy of ``drafter`` and its tokenizer, made at the first sampled call.
        homogeneous_drafter: a drafter with the target's vocabulary for ``"homogeneous"`` (``None``: not run).
        drafter_runtime: hf_hetspec's ``hetspec_drafter`` (:mod:`hf_hetspec.runtime`); transformers' methods
            always run the drafter as loaded.
        verification: hf_hetspec's ``hetspec_verification`` (``"block"``: TLI and SLRS sampling only).
        schedule: hf_hetspec's ``hetspec_schedule`` (a :class:`hf_hetspec.Schedule`; ``None``: the default for
            the algorithm and the drafter runtime).
    """

    target: object
    target_tokenizer: object
    drafter: object
    drafter_tokenizer: object
    algorithm: str = "auto"
    max_new_tokens: int = 128
    do_sample: bool = False
    temperature: float | None = None
    top_p: float | None = None
    seed: int = 0
    lookahead: int | None = None
    builtin_drafter: object = None
    builtin_drafter_tokenizer: object = None
    homogeneous_drafter: object = None
    drafter_runtime: str = "auto"
    verification: str = "token"
    schedule: object = None
    device: torch.device = field(init=False)

    def __post_init__(self):
        if self.builtin_drafter is None:
            self.builtin_drafter = self.drafter
        if self.builtin_drafter_tokenizer is None:
            self.builtin_drafter_tokenizer = self.drafter_tokenizer
        self.device = model_device(self.target)

    def _decoding(self, max_new_tokens: int | None) -> dict:
        kwargs = {"max_new_tokens": max_new_tokens or self.max_new_tokens, "do_sample": self.do_sample}
        if self.do_sample:
            if self.temperature is not None:
                kwargs["temperature"] = self.temperature
            if self.top_p is not None:
                kwargs["top_p"] = self.top_p
        return kwargs

    def _assisted(self, max_new_tokens: int | None) -> dict:
        kwargs = self._decoding(max_new_tokens)
        if self.lookahead is not None:
            kwargs["num_assistant_tokens"] = self.lookahead
        return kwargs

    def _timed(self, call, drafter=None) -> tuple[torch.Tensor, dict]:
        """Run ``call(streamer)``; returns its output and ``seconds``, ``ttft_seconds``, ``peak_memory_mb``
        and ``drafter_forwards`` (forwards of ``drafter`` during the call)."""
        if self.do_sample:
            torch.manual_seed(self.seed)
        timer = FirstTokenTimer()
        counts = {"forwards": 0}
        with PeakMemory(self.device) as memory:
            with count_forwards(drafter) if drafter is not None else nullcontext(counts) as counts:
                synchronize(self.device)
                start = time.perf_counter()
                out = call(timer)
                synchronize(self.device)
                seconds = time.perf_counter() - start
        ttft = None if timer.first_token_at is None else timer.first_token_at - start
        return out, {"seconds": seconds, "ttft_seconds": ttft, "peak_memory_mb": memory.mb,
                     "drafter_forwards": counts["forwards"]}

    def target_alone(self, ids: torch.Tensor, max_new_tokens: int | None = None) -> MethodRun:
        ids = ids.to(self.device)
        mask = torch.ones_like(ids)
        with count_forwards(self.target) as counts:
            out, timing = self._timed(
                lambda streamer: self.target.generate(
                    ids, attention_mask=mask, streamer=streamer, **self._decoding(max_new_tokens)
                )
            )
        n = ids.shape[1]
        return MethodRun("target", out, n, out.shape[1] - n, target_forwards=counts["forwards"],
                         drafted_tokens=0, accepted_tokens=0, **timing)

    def _transformers_assisted(self, method: str, ids: torch.Tensor, max_new_tokens: int | None,
                               drafter, tokenizers: dict) -> MethodRun:
        """transformers' assisted generation with ``drafter`` (``tokenizers``: both, universal path only)."""
        ids = ids.to(self.device)
        mask = torch.ones_like(ids)
        integration.disable(self.target)
        saved = copy.deepcopy(drafter.generation_config), copy.deepcopy(self.target.generation_config)
        try:
            with count_forwards(self.target) as counts:
                out, timing = self._timed(
                    lambda streamer: self.target.generate(
                        ids,
                        attention_mask=mask,
                        assistant_model=drafter,
                        streamer=streamer,
                        **tokenizers,
                        **self._assisted(max_new_tokens),
                    ),
                    drafter=drafter,
                )
        except Exception as err:  # any fault inside transformers' own method: hf_hetspec is disabled here
            import transformers

            raise BaselineFailed(f"{method_label(method)} failed inside transformers {transformers.__version__}: "
                                 f"{type(err).__name__}: {err}") from err
        finally:
            # the heuristic lookahead schedule keeps its state in the drafter's generation config
            drafter.generation_config, self.target.generation_config = saved
        n = ids.shape[1]
        new = out.shape[1] - n
        forwards = counts["forwards"]
        drafted = counts["fed_tokens"] - n - max(forwards - 1, 0)
        return MethodRun(method, out, n, new, target_forwards=forwards, drafted_tokens=drafted,
                         accepted_tokens=max(new - forwards, 0), rejections=counts["rejections"], **timing)

    def transformers_assisted(self, ids: torch.Tensor, max_new_tokens: int | None = None) -> MethodRun:
        """transformers' universal assisted generation with the (built-in copy of the) drafter."""
        if self.do_sample and self.builtin_drafter is self.drafter:  # never prune hf_hetspec's drafter
            self.builtin_drafter = copy.deepcopy(self.drafter)
            self.builtin_drafter_tokenizer = copy.deepcopy(self.builtin_drafter_tokenizer)
        tokenizers = {"tokenizer": self.target_tokenizer,
                      "assistant_tokenizer": self.builtin_drafter_tokenizer}
        return self._transformers_assisted("transformers", ids, max_new_tokens, self.builtin_drafter,
                                           tokenizers)

    def homogeneous(self, ids: torch.Tensor, max_new_tokens: int | None = None) -> MethodRun:
        """transformers' standard assisted generation with :attr:`homogeneous_drafter` (same vocabulary).

        Raises:
            ValueError: the runner has no ``homogeneous_drafter``.
        """
        if self.homogeneous_drafter is None:
            raise ValueError("homogeneous speculative decoding needs Runner(homogeneous_drafter=...)")
        return self._transformers_assisted("homogeneous", ids, max_new_tokens, self.homogeneous_drafter, {})

    def hetspec(self, ids: torch.Tensor, max_new_tokens: int | None = None, loop: str = "hetspec") -> MethodRun:
        """hf_hetspec with :attr:`algorithm`, in its own loop or (``loop="transformers"``) in transformers'
        ``_assisted_decoding``, which samples with torch's global RNG (seeded by :meth:`_timed`)."""
        ids = ids.to(self.device)
        mask = torch.ones_like(ids)
        randomness = {}
        if self.do_sample and loop == "hetspec":
            randomness["hetspec_generator"] = torch.Generator(self.device).manual_seed(self.seed)
        integration.enable(self.target)
        try:
            out, timing = self._timed(
                lambda streamer: self.target.generate(
                    ids,
                    attention_mask=mask,
                    assistant_model=self.drafter,
                    tokenizer=self.target_tokenizer,
                    assistant_tokenizer=self.drafter_tokenizer,
                    hetspec_algorithm=self.algorithm,
                    hetspec_drafter=self.drafter_runtime,
                    hetspec_verification=self.verification,
                    hetspec_schedule=self.schedule,
                    hetspec_loop=loop,
                    streamer=streamer,
                    **randomness,
                    **self._assisted(max_new_tokens),
                ),
            )
        except (NotImplementedError, ValueError) as err:
            raise MethodError(f"hf_hetspec: {err}") from err
        finally:
            integration.disable(self.target)
        stats = integration.last_stats(self.target)
        # hf_hetspec's own count, not a hook on the drafter module: a pruned head (TLI) runs only its decoder
        timing["drafter_forwards"] = stats.drafter_forwards
        n = ids.shape[1]
        return MethodRun(
            HETSPEC_METHODS[loop == "transformers"], out, n, out.shape[1] - n, target_forwards=stats.target_forwards,
            drafted_tokens=stats.drafted_tokens, accepted_tokens=stats.accepted_tokens,
            rejections=stats.rejections, stats=stats, **timing,
        )

    def run(self, method: str, ids: torch.Tensor, max_new_tokens: int | None = None) -> MethodRun:
        """Run ``method`` (one of :data:`ALL_METHODS`) on ``ids`` (shape ``(1, n)``)."""
        runners = {"target": self.target_alone, "transformers": self.transformers_assisted,
                   "hf_hetspec": self.hetspec, "homogeneous": self.homogeneous,
                   TRANSFORMERS_LOOP: lambda ids, n: self.hetspec(ids, n, loop="transformers")}
        return runners[method](ids, max_new_tokens)

    def compare(self, reference: MethodRun, run: MethodRun) -> None:
        """Set ``run.comparison`` (greedy only): its output against the target alone's."""
        if not self.do_sample:
            prompt = reference.output_ids[:, : reference.prompt_tokens]
            run.comparison = compare_greedy(self.target, prompt, reference.output_ids, run.output_ids)


#: Display names of the methods, in the order tables list them.
METHOD_LABELS = {
    "target": "target alone",
    "transformers": "transformers UAG",
    "homogeneous": "homogeneous SD",
    "hf_hetspec": "hf_hetspec",
    TRANSFORMERS_LOOP: "hf_hetspec (transformers loop)",
}


def method_label(method: str, algorithm: str | None = None) -> str:
    """Display name of a method; ``algorithm`` names hf_hetspec's (as given: ``slem`` or ``SLEM``)."""
    if method == "hf_hetspec" and algorithm:
        return f"hf_hetspec {algorithm}"
    if method == TRANSFORMERS_LOOP and algorithm:
        return f"hf_hetspec {algorithm} (transformers loop)"
    return METHOD_LABELS.get(method, str(method))


# --------------------------------------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------------------------------------


def summarize(runs: dict[str, list[MethodRun]]) -> list[dict]:
    """Per-method totals over a run: tokens/s (summed tokens / summed seconds), speedup vs the target alone,
    acceptance rate, Leviathan et al.'s alpha (accepted / (accepted + rejections)), tokens per target forward and
    verdict counts."""
    base = runs["target"]
    base_speed = sum(r.new_tokens for r in base) / max(sum(r.seconds for r in base), 1e-9)
    rows = []
    for method, method_runs in runs.items():
        tokens = sum(r.new_tokens for r in method_runs)
        seconds = sum(r.seconds for r in method_runs)
        forwards = sum(r.target_forwards for r in method_runs)
        drafted = sum(r.drafted_tokens for r in method_runs)
        accepted = sum(r.accepted_tokens for r in method_runs)
        rejections = sum(r.rejections for r in method_runs)
        verdicts = [r.comparison.verdict for r in method_runs if r.comparison is not None]
        speed = tokens / seconds if seconds > 0 else 0.0
        rows.append(
            {
                "method": method,
                "new_tokens": tokens,
                "seconds": seconds,
                "tokens_per_second": speed,
                "speedup": speed / base_speed if base_speed > 0 else None,
                "acceptance_rate": acceptance_rate(accepted, drafted),
                "alpha": alpha(accepted, rejections),
                "tokens_per_forward": tokens / forwards if forwards else None,
                "identical": verdicts.count("identical") if verdicts else None,
                "tie": verdicts.count("tie") if verdicts else None,
                "different": verdicts.count("different") if verdicts else None,
            }
        )
    return rows
