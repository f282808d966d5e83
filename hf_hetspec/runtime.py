"""The drafter's runtime: how the drafter's forward passes are executed, chosen per call or per drafter.

Speculative decoding's speedup is capped by the cost ratio ``c`` = drafter step time / target step time
(Leviathan et al. 2023, Theorem 3.8): with acceptance rate ``alpha`` and lookahead ``gamma`` the expected
speedup is ``(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1))``. A small drafter's step is dominated by
reading its weights, so cheaper weights lower ``c`` directly. A runtime is a *copy* of the user's drafter
prepared once and cached while the drafter lives; the user's drafter is never changed:

* ``"eager"``: the drafter as loaded (no copy).
* ``"float32"``: a float32 copy (a bf16 drafter's matmuls are slower than float32 ones on most CPUs).
* ``"int8"`` (CPU only): a float32 copy whose ``nn.Linear`` layers, LM head included, hold int8 weights
  (one scale per output row) and quantize their activations to int8 on the fly (PyTorch's dynamic
  quantization, fbgemm/onednn kernels); embeddings and norms stay float32. Feeds of
  :data:`~hf_hetspec.static_drafter.FLOAT_FEED_MIN` tokens or more (a prompt) run float32 copies of the layers
  other than the head (:class:`~hf_hetspec.static_drafter.FeedSizeLinear`; why: its ``keep_float_prefill``).
* ``"int8-static"`` (CPU only): the same int8 weights run by hf_hetspec's own decoding step
  (:mod:`hf_hetspec.static_drafter`): a preallocated KV cache that a rollback only rewinds, fused projections,
  no per-call mask building. For the Llama / Mistral / Qwen2 / Qwen3 decoder family, checked against the
  model's own logits when the copy is made. Measured 1.3x cheaper than ``"int8"`` per step (SmolLM2-135M:
  25.5 ms against 34.3 ms, one thread, interleaved).
* ``"compiled"``: hf_hetspec's own step (same layouts as ``"int8-static"``) with the drafter's weights as they
  are (float32 on the CPU), its one-token step compiled by ``torch.compile`` over a KV cache of fixed size and
  fixed address (:meth:`~hf_hetspec.static_drafter.StaticCacheDecoder.fixed_step`); on CUDA with CUDA graphs
  (``mode="reduce-overhead"``, :data:`COMPILE_MODES`), which replay a whole step as one launch (an H200: 2.0-2.5 ms
  per SmolLM2-135M step against 42.5 ms eager), and run feeds of a few tokens as replayed steps too
  (:data:`~hf_hetspec.static_drafter.STEPPED_FEED_MAX`). Compiling takes
  tens of seconds, paid once per drafter and process when the copy is made (a status line says so; inductor
  keeps its compiled kernels on disk, so a later process mostly re-traces). Only one decoding at a time may
  use a compiled drafter (its cache is shared by the calls).
* ``"auto"`` (default): on CPU, for a drafter of at least :data:`AUTO_INT8_MIN_PARAMETERS` non-embedding
  weights when PyTorch has a quantized CPU engine, ``"int8-static"`` where the step runs the drafter, else
  ``"int8"``; otherwise ``"eager"`` (with a one-line note when int8 was wanted but is unavailable). On CUDA,
  ``"compiled"`` when PyTorch can compile for the GPU (Triton installed), else ``"eager"`` with a note; a
  drafter that the step does not run or that fails to compile falls back to ``"eager"`` with a note. On other
  devices ``"eager"``. On this project's CPU ``"compiled"`` measured slower than ``"int8-static"``
  (``benchmarks/drafter_runtime.py``): a float32 step reads four times the bytes of an int8 one.

Drafters with a history: a PEFT ``PeftModel`` runs eager as its transformers model (the adapters live in its
layers); its copies merge the active adapters into their weights, and are remade when adapters are switched,
disabled or merged (:func:`weights_version`). A drafter that is already quantized (:func:`already_quantized`)
is never copied or quantized again: ``"auto"`` uses it as it is, with a note; other runtimes but ``"eager"``
are refused. A ``torch.compile`` of the drafter's ``forward`` or ``__call__`` is not carried into a copy.

Why PyTorch's dynamic quantization and not torchao: measured on this project's 2-core x86 CPU (torch 2.13,
torchao 0.18, one thread, SmolLM2-135M, ``benchmarks/drafter_runtime.py``), torchao's
``Int8DynamicActivationInt8WeightConfig`` step took 3.1x and ``Int8WeightOnlyConfig`` 1.8x the eager bf16
step (its CPU path without ``torch.compile`` dequantizes), while ``torch.ao.quantization.quantize_dynamic``
took 0.43x. ``torch.ao.quantization`` is deprecated in favour of torchao; switch once torchao's eager CPU
kernels are as fast (the runtime keeps the choice in :func:`_quantize_int8` alone).

Why this is lossless by construction: the drafting algorithms read their logits from the model they are
handed, so SLEM's drafted text, TLI's ``q`` and SLRS's ``psi`` are computed from the logits the prepared
copy really produced. Verification is exact for any drafter (Leviathan et al. 2023, Theorem 1; Timor et al.
2025, Theorems 3.2-3.4): a runtime changes which drafts are proposed and how fast, never the output
distribution.
"""

from __future__ import annotations

import copy
import time
import weakref
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from . import static_drafter
from .compat import quiet_quantization_warnings
from .drafter import max_positions, model_device
from .model_checks import adapter_state, is_peft_model, peft_base_model
from .status import status

RUNTIMES = ("auto", "eager", "float32", "int8", "int8-static", "compiled")
#: Runtimes with int8 linear layers (CPU only).
INT8_RUNTIMES = ("int8", "int8-static")
#: ``torch.compile`` mode of the ``"compiled"`` runtime per device type (others: inductor's default).
COMPILE_MODES = {"cuda": "reduce-overhead"}

#: ``"auto"`` quantizes drafters whose linear layers other than the LM head hold at least this many weights
#: (SmolLM2-135M: 106M, Gemma-3-270M: 100M): below it a step is dominated by Python and kernel-launch overhead
#: rather than by reading weights (tiny test models, whose parameters are mostly embeddings).
AUTO_INT8_MIN_PARAMETERS = 20_000_000


@dataclass(frozen=True)
class PreparedDrafter:
    """A drafter ready for decoding.

    Attributes:
        model: the model the drafting algorithms run (the user's drafter for ``"eager"`` and for ``"float32"``
            with a float32 drafter, else a copy).
        runtime: the runtime in effect (never ``"auto"``).
        memory_bytes: bytes of parameters and buffers held by the copy (0 without a copy).
        prepare_s: seconds spent making the copy (paid once per drafter and runtime, then cached).
        note: why ``"auto"`` chose this runtime when it fell back (empty otherwise).
    """

    model: PreTrainedModel
    runtime: str
    memory_bytes: int
    prepare_s: float
    note: str = ""


#: Why ``"auto"`` made no copy of a drafter the call never runs (:func:`prepare_drafter`, ``drafts=False``).
NO_DRAFTS_NOTE = ("no drafter copy: a verified token costs this target a whole forward, so no draft pays and the "
                  "drafter does not run")

_PREPARED: "weakref.WeakKeyDictionary[PreTrainedModel, dict]" = weakref.WeakKeyDictionary()


def check_choice(keyword: str, value, choices: tuple[str, ...]) -> str:
    """``value`` of ``generate(keyword=...)`` checked against ``choices``; returns it.

    Raises:
        ValueError: not one of ``choices`` (the message names the keyword and lists them).
    """
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{keyword}={value!r} is not known; use one of {', '.join(choices)}.")
    return value


def check_runtime(runtime) -> str:
    """``runtime`` checked (``generate(hetspec_drafter=...)``, :func:`check_choice`); returns it.

    Raises:
        ValueError: not one of :data:`RUNTIMES`.
    """
    return check_choice("hetspec_drafter", runtime, RUNTIMES)


def resolve_runtime(drafter: PreTrainedModel, runtime: str = "auto") -> tuple[str, str]:
    """The runtime ``runtime`` stands for with this drafter, and a note when ``"auto"`` fell back to eager.

    Returns:
        ``(runtime, note)`` with ``runtime`` one of :data:`RUNTIMES` other than ``"auto"``. ``"auto"`` on CPU
        resolves to ``"int8-static"``; :func:`prepare_drafter` falls back to ``"int8"`` (no note) where the
        static step does not run the drafter. ``"auto"`` on CUDA resolves to ``"compiled"``; the copy may still
        fall back to ``"eager"`` (with a note) in :func:`prepare_drafter`.

    Raises:
        ValueError: ``runtime`` is not one of :data:`RUNTIMES`, or an int8 runtime is asked for a drafter
            that is not on the CPU, or with a PyTorch without a quantized CPU engine, or any runtime other than
            ``"eager"`` and ``"auto"`` for a drafter that is already quantized (:func:`already_quantized`;
            ``"auto"`` uses it as it is, with a note).
    """
    check_runtime(runtime)
    quantized = already_quantized(drafter)
    if quantized and runtime == "auto":
        return "eager", f"the drafter is already quantized ({quantized}): used as it is"
    if quantized and runtime != "eager":
        raise ValueError(f"hetspec_drafter={runtime!r}: the drafter is already quantized ({quantized}), and "
                         "hf_hetspec does not quantize or copy it a second time; use hetspec_drafter='auto' or "
                         "'eager' (the drafter as it is).")
    on_cpu = all(p.device.type == "cpu" for p in drafter.parameters())
    engine = _quantized_engine()
    if runtime in INT8_RUNTIMES and (not on_cpu or engine is None):
        where = "this PyTorch build has no quantized CPU engine" if on_cpu else (
            f"the drafter is on {model_device(drafter)}, and int8 dynamic quantization runs on the CPU only")
        raise ValueError(f"hetspec_drafter={runtime!r}: {where}; use hetspec_drafter='auto' or 'eager'.")
    if runtime != "auto":
        return runtime, ""
    device = model_device(drafter)
    if device.type == "cuda":
        if not _has_triton():
            return "eager", "compiled drafter unavailable (torch.compile needs Triton on CUDA): eager drafter"
        return "compiled", ""
    if not on_cpu or _decoder_linear_weights(drafter) < AUTO_INT8_MIN_PARAMETERS:
        return "eager", ""
    if engine is None:
        return "eager", "int8 drafter unavailable (no quantized CPU engine in this PyTorch): eager drafter"
    return "int8-static", ""


def prepare_drafter(drafter: PreTrainedModel, runtime: str = "auto", *, drafts: bool = True) -> PreparedDrafter:
    """The drafter in ``runtime``, made once per drafter and runtime and cached while the drafter lives.

    The copy is made again when the drafter's weights changed since (training steps, ``load_state_dict``).

    Args:
        drafter: the user's drafter; never modified.
        runtime: one of :data:`RUNTIMES` (module docstring).
        drafts: whether the call may run the drafter at all. ``False`` (the call's source policy never drafts,
            :func:`hf_hetspec.sources.never_drafts`) makes no copy for ``"auto"``: the drafter as loaded, as
            ``"eager"``, with :data:`NO_DRAFTS_NOTE`; a runtime the user named is made as asked.

    Returns:
        :class:`PreparedDrafter`; its ``prepare_s`` is 0 when the copy came from the cache.

    An int8 copy is checked with one forward pass: some architectures read a linear layer's ``weight`` tensor
    directly instead of calling the layer (transformers' Mamba, Mamba2 and Jamba mixers), which int8 layers
    do not support. ``"auto"`` then falls back to the drafter as loaded, with a note. Where the static step
    does not run the drafter (:func:`hf_hetspec.static_drafter.build`), ``"auto"`` uses ``"int8"``.

    A copy that takes time announces itself with two status lines (:func:`hf_hetspec.status.status`): before
    (what is made, e.g. compiling) and after (seconds and memory).

    Raises:
        ValueError: as :func:`resolve_runtime`, before any copy is made; an int8 runtime for a drafter whose
            int8 copy does not run, ``"int8-static"`` or ``"compiled"`` for a drafter the static step does not
            run, or ``"compiled"`` where ``torch.compile`` fails (after the copy is made, before any decoding).
    """
    resolved, note = resolve_runtime(drafter, runtime)
    if runtime == "auto" and not drafts and resolved != "eager":
        return PreparedDrafter(peft_base_model(drafter), "eager", 0, 0.0, NO_DRAFTS_NOTE)
    float32 = all(p.dtype == torch.float32 for p in drafter.parameters())
    if resolved == "eager" or (resolved == "float32" and float32):
        return PreparedDrafter(peft_base_model(drafter), resolved, 0, 0.0, note)
    per_drafter = _PREPARED.setdefault(drafter, {})
    version = weights_version(drafter)
    seconds = 0.0
    if getattr(per_drafter.get(resolved), "version", None) != version:
        status(f"preparing the drafter's {resolved} copy ({_WHY_IT_TAKES[resolved]}, once per drafter) ...")
        start = time.perf_counter()
        per_drafter[resolved] = made = _make_copy(drafter, resolved, version)
        seconds = time.perf_counter() - start
        if made.runtime != resolved and not made.problem:  # int8-static fell back: it is the "int8" copy too
            per_drafter[made.runtime] = made
        status(f"the drafter's {resolved} copy: " + (
            f"not used ({made.problem}), {seconds:.1f} s" if made.problem else
            f"ready in {seconds:.1f} s, {made.memory_bytes / 2**20:.0f} MiB"))
    made = per_drafter[resolved]
    if made.problem and runtime == "auto":
        what = "int8" if resolved in INT8_RUNTIMES else resolved
        note = f"{what} drafter unavailable ({made.problem}): eager drafter"
        return PreparedDrafter(peft_base_model(drafter), "eager", 0, seconds, note)
    if made.problem:
        what = "with int8 linear layers" if resolved in INT8_RUNTIMES else f"as {resolved!r}"
        raise ValueError(f"hetspec_drafter={runtime!r}: this drafter does not run {what} ({made.problem}); use "
                         f"hetspec_drafter='auto' or 'eager'.")
    if made.static_problem and runtime == "int8-static":
        raise ValueError(f"hetspec_drafter={runtime!r}: hf_hetspec's decoding step does not run this drafter "
                         f"({made.static_problem}); use hetspec_drafter='int8' or 'auto'.")
    return PreparedDrafter(made.model, made.runtime, made.memory_bytes, seconds, note)


@dataclass(frozen=True)
class _Copy:
    """A cached copy: the drafter's weights version it was made from, the model (``None`` when it does not run),
    the runtime it runs, why it does not run, why the static step was not used (``"int8-static"`` only), and
    its bytes (counted once: counting unpacks every int8 layer, 0.5 s for SmolLM2)."""

    version: tuple
    model: torch.nn.Module | None
    runtime: str
    problem: str = ""
    static_problem: str = ""
    memory_bytes: int = 0


#: What the status line says a copy's preparation does.
_WHY_IT_TAKES = {"float32": "copying", "int8": "quantizing", "int8-static": "quantizing",
                 "compiled": "compiling its step with torch.compile"}


def _make_copy(drafter: PreTrainedModel, runtime: str, version: tuple) -> _Copy:
    """The copy for ``runtime`` in ``("float32", "int8", "int8-static", "compiled")``; ``"int8-static"`` becomes
    ``"int8"`` where the static step does not run the drafter (:func:`hf_hetspec.static_drafter.build`)."""
    if adapter_state(drafter) and not is_peft_model(drafter):  # PEFT's merge needs its PeftModel
        return _Copy(version, None, runtime, problem="its PEFT adapters were put in without a PeftModel (e.g. "
                                                     "transformers' add_adapter), which a copy cannot merge")
    if runtime == "compiled":
        return _compiled_copy(drafter, version)
    model = _eval_copy(drafter)
    if runtime == "float32":
        return _Copy(version, model, runtime, memory_bytes=model_bytes(model))
    static, static_problem = None, ""
    if runtime == "int8-static":
        static, static_problem = static_drafter.build(model, max_positions(model))
    if static is not None:
        static.keep_float_prefill()
        model, names = static, static.step_linear_names()
    else:  # transformers' forward: the same float-prefill rule, layer by layer
        names = static_drafter.split_feed_sizes(model)
    problem = _quantize_int8(model, names)
    return _Copy(version, None if problem else model, "int8" if static_problem else runtime, problem, static_problem,
                 model_bytes(model))


def _compiled_copy(drafter: PreTrainedModel, version: tuple) -> _Copy:
    """The ``"compiled"`` copy: hf_hetspec's step over a copy of the drafter (float32 on the CPU, the drafter's
    dtype elsewhere), its one-token step compiled and run once per compiled shape before it is handed out, so
    that compiling (and recording CUDA graphs) is paid here; its logits checked against the eager step's."""
    device = model_device(drafter)
    model = _eval_copy(drafter, torch.float32 if device.type == "cpu" else None)
    static, why = static_drafter.build(model, max_positions(model))
    if static is None:
        return _Copy(version, None, "compiled", problem=f"hf_hetspec's step does not run it: {why}")
    try:
        mismatch = static_drafter.warm_up_compiled(static, COMPILE_MODES.get(device.type))
    except Exception as err:  # noqa: BLE001 -- dynamo, inductor and the C++ / Triton toolchains raise many types
        return _Copy(version, None, "compiled", problem=f"torch.compile failed: {_first_line(err)}")
    if mismatch:
        return _Copy(version, None, "compiled", problem=mismatch)
    return _Copy(version, static, "compiled", memory_bytes=model_bytes(static) + static.cache_bytes())


def _has_triton() -> bool:
    """Whether ``torch.compile`` can generate GPU kernels (Triton is installed)."""
    try:
        from torch.utils._triton import has_triton
    except ImportError:
        return False
    return has_triton()


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of ``model``'s parameters and buffers (a tied weight once), plus the packed int8 weights, scales
    and biases of dynamically quantized linear layers (which are neither)."""
    tensors = list(model.parameters()) + list(model.buffers())
    for module in model.modules():
        if hasattr(module, "_packed_params") and callable(getattr(module, "weight", None)):
            weight, bias = module._weight_bias()
            tensors += [weight, *([] if bias is None else [bias])]
            if weight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
                tensors += [weight.q_per_channel_scales(), weight.q_per_channel_zero_points()]
    seen, total = set(), 0
    for tensor in tensors:
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total


def _decoder_linear_weights(model: PreTrainedModel) -> int:
    """Weights of ``model``'s ``nn.Linear`` layers other than its LM head."""
    head = model.get_output_embeddings()
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head)


def weights_version(model: torch.nn.Module) -> tuple:
    """Changes when a parameter is replaced or modified in place, or PEFT adapters are switched, disabled or
    merged (the cached copy is then stale)."""
    return tuple((p.data_ptr(), p._version) for p in model.parameters()) + adapter_state(model)


def _eval_copy(drafter: PreTrainedModel, dtype: torch.dtype | None = torch.float32) -> PreTrainedModel:
    """An independent copy in eval mode in ``dtype`` (``None``: the drafter's), ties between weights (e.g.
    embedding and LM head) kept. A PEFT drafter's active adapters are merged into the copy's weights (PEFT's
    ``merge_and_unload``; disabled adapters are dropped with ``unload``), so that the copy computes what the
    drafter computes now with plain layers. A ``torch.compile`` of the drafter's ``forward`` or ``__call__``
    (``model.forward = torch.compile(model.forward)``, ``model.compile()``) is bound to the drafter itself and
    is not kept: the copy runs its own weights."""
    model = copy.deepcopy(drafter)
    if is_peft_model(model):
        disabled = any(state[1] for state in adapter_state(model))
        model = model.unload() if disabled else model.merge_and_unload()
    if hasattr(model.__dict__.get("forward"), "_torchdynamo_orig_callable"):
        del model.forward
    model._compiled_call_impl = None
    if dtype is not None:
        model.to(dtype)
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


def _quantize_int8(model: PreTrainedModel, names: list[str] | None = None) -> str:
    """Int8 weights (one scale per output row) and dynamically quantized int8 activations for every
    ``nn.Linear`` of ``model`` (only those named in ``names`` when given), in place (module docstring: why
    ``torch.ao.quantization``). Returns why the quantized model does not run (one forward pass over two
    tokens), or ``""`` when it does."""
    from torch.ao import quantization

    qconfig = quantization.per_channel_dynamic_qconfig
    spec = {torch.nn.Linear: qconfig} if names is None else {name: qconfig for name in names}
    with quiet_quantization_warnings():
        quantization.quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([[1, 2]]), use_cache=False)
    except (TypeError, AttributeError, RuntimeError) as err:  # a layer's weight read as a tensor
        return _first_line(err)
    return ""


def _first_line(err: Exception) -> str:
    """``"<type>: <first line of the message>"``, the line cut at 100 characters (for a one-line note)."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:100] if lines else ''}"


def already_quantized(model: torch.nn.Module) -> str:
    """What quantized ``model``'s weights before hf_hetspec saw it, in a few words (``""``: nothing did):
    transformers' ``quantization_config`` (torchao, bitsandbytes, ...), quantized tensor subclasses put in by
    another library (e.g. torchao's ``quantize_``), or PyTorch's dynamically quantized linear layers."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        return f"transformers' {type(quantizer.quantization_config).__name__}"
    for name, param in model.named_parameters():
        if type(param.data) is not torch.Tensor:
            return f"its parameter {name!r} is a {type(param.data).__name__}"
    if any(hasattr(module, "_packed_params") for module in model.modules()):
        return "it has dynamically quantized int8 linear layers"
    return ""


def _quantized_engine() -> str | None:
    """PyTorch's quantized CPU engine (``"x86"``, ``"fbgemm"``, ``"onednn"``, ``"qnnpack"``), or ``None``."""
    engines = [e for e in torch.backends.quantized.supported_engines if e != "none"]
    return torch.backends.quantized.engine if torch.backends.quantized.engine in engines else (
        engines[0] if engines else None)
