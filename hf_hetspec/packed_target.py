"""The target's linear layers through packed fp16 copies of its bf16 (or fp16, or fp16-exact float32) weights, on a
CPU without bf16 instructions.

Why: a CPU without half-precision instructions (AVX2 only) computes a bf16 ``nn.Linear`` by converting as it
goes, and the cost grows with the tokens of a forward: a bf16 Qwen2.5-Coder-1.5B forward of 1 / 2 / 4 / 6 / 8
tokens took 439 / 780 / 1,471 / 2,179 / 2,785 ms, so verifying a draft cost a forward per token
(``verify_cost`` 1.0) and no draft could pay. PyTorch's fp16-weight linear (fbgemm's
``torch.ops.quantized.linear_dynamic_fp16``: fp16 weights widened to float32 in registers, float32 activations,
float32 sums) reads each weight once for up to six tokens: the same forwards took 343 / 395 / 433 / 517 / 830 ms
(2026-12-03, AVX2 AMD EPYC, one thread, after a 200-token prompt). So a verified token costs about 0.10 of a
forward, and even a step without a draft is faster than the bf16 layers' own.

Why it is exact. A bf16 number has 8 significant bits and an fp16 number 11, so a bf16 weight is an fp16 number
whenever its exponent is in fp16's range. Each output row ``n`` of a weight is multiplied by ``2**s_n`` so that
its largest magnitude lies in ``[2**14, 2**15)`` (no fp16 overflow, and no weight down to ``2**-28`` of that
largest falls below fp16's normal range); the layer's output is multiplied by ``2**-s_n`` (exact in float32).
A weight that would still lose a bit leaves its whole layer as it is. So every product ``w * x`` is the float32
number the bf16 layer forms, the sums run in float32 in another order, and the output is rounded to the target's
dtype as the layer rounds it: an output differs from the bf16 layer's only where a sum lies on a rounding
boundary of bf16, the same ties that a k-token forward has against a one-token forward. Measured on the forwards
above: largest logit difference 0.08-0.14 (one bf16 step at logits near 20), the same argmax.

A float32 target. Its weights are often bf16 or fp16 numbers upcast (a bf16 checkpoint loaded in float32, which
is generate()'s CPU default; the zoo's models, stored as fp16): then the same scaling holds them exactly, and the
packed layer forms the float32 layer's products and sums them in float32 in another order, with no rounding after
(the same ties as a k-token forward against a one-token one). Their own layers pay for a verified token too: MKL's
float32 product of 8960 x 1536 took 3.2 ms for one token row and 11.1-12.3 ms for 7-8 (AVX2 AMD EPYC, one thread,
2026-12-04), and a Qwen2.5-Coder-1.5B forward of ~7 tokens 1.2-1.4 s against 343-438 ms for one, so hf_hetspec ran
0.53-0.75x the target alone there. A float32 weight that is not such a number (a model trained or merged in
float32) leaves its layer as it is, and a target none of whose layers packs runs ``"eager"``.

The copy costs the memory of the layers' weights once more (2 bytes per weight) and some seconds to make, once
per target while its weights do not change (:func:`prepare_target`, cached like the drafter's copies).
``generate(hetspec_target=...)`` picks the runtime (:data:`TARGET_RUNTIMES`); the plan prepares it
(:func:`hf_hetspec.plan.make_plan`) and the call runs inside :meth:`PreparedTarget.running`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from .drafter import model_device
from .runtime import check_choice, weights_version
from .schedule import cpu_has_half_instructions
from .status import status

#: Weight dtypes whose ``nn.Linear`` layers may pack (each weight checked by :func:`pack_linear`).
PACKABLE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

#: Why a target none of whose layers packs runs ``"eager"``.
NOTHING_PACKED = "no weight of its layers is exactly an fp16 number times a power of two per row"

#: ``generate(hetspec_target=...)``: ``"auto"`` (``"fp16-packed"`` where it applies, :func:`resolve_target_runtime`),
#: ``"eager"`` (the target's layers as they are) or ``"fp16-packed"``.
TARGET_RUNTIMES = ("auto", "eager", "fp16-packed")

#: Largest row magnitude after scaling lies in ``[2**ROW_EXPONENT, 2**(ROW_EXPONENT + 1))``, below fp16's 65504.
ROW_EXPONENT = 14

#: ``"auto"`` packs only when the machine has this many times the copy's bytes available (Linux ``MemAvailable``).
MEMORY_MARGIN = 1.5

#: Token rows fbgemm's fp16 product computes per pass over a weight, by the CPU's vector width (torch's
#: ``get_cpu_capability()``): its AVX2 kernels hold 6 rows, its AVX-512 ones 14. A forward over more rows reads
#: every weight again: one Qwen2.5-Coder-1.5B MLP product (8960 x 1536, AVX2 AMD EPYC, one thread) took 1.67 /
#: 2.50 ms for 1 / 6 rows, 4.13 ms for 7, 5.02 ms for 12 and 6.23 ms for 13 (2026-12-03).
ROWS_PER_PASS = {"AVX2": 6, "AVX512": 14}


@dataclass(frozen=True)
class PackedLinear:
    """One ``nn.Linear`` as fbgemm's packed fp16 weight of its rows scaled by powers of two.

    Attributes:
        packed: ``torch.ops.quantized.linear_prepack_fp16`` of the scaled weight (bias scaled alike, fused).
        unscale (``torch.FloatTensor`` of shape ``(out_features,)``): ``2**-s_n`` per output row.
        out_features: rows of the weight.
    """

    packed: object
    unscale: torch.Tensor
    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's output for ``x`` of shape ``(..., in_features)`` (any dtype), in ``x``'s dtype."""
        flat = x.reshape(-1, x.shape[-1]).float()
        y = torch.ops.quantized.linear_dynamic_fp16(flat, self.packed)
        y.mul_(self.unscale)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def pack_linear(layer: torch.nn.Linear) -> PackedLinear | None:
    """``layer`` packed (module docstring), or ``None`` when one of its weights or biases is not exactly an fp16
    number times its row's power of two (then the layer keeps running as it is).

    Args:
        layer: an ``nn.Linear`` whose weight of shape ``(out_features, in_features)`` is bf16, fp16 or float32.
    """
    weight = layer.weight.detach()
    largest = weight.abs().amax(dim=1).float()
    if not bool(torch.isfinite(largest).all()):
        return None
    exponent = torch.where(largest > 0, ROW_EXPONENT - torch.floor(torch.log2(largest.clamp_min(1e-38))), 0.0)
    scale = torch.exp2(exponent)
    scaled = weight.float() * scale[:, None]  # exact (powers of two in float32's range); never the layer's own tensor
    if not torch.equal(scaled.half().float(), scaled):
        return None
    bias = None
    if layer.bias is not None:
        bias = layer.bias.detach().float() * scale  # added in float32 before the unscaling, as the layer adds it
    packed = torch.ops.quantized.linear_prepack_fp16(scaled, bias)
    return PackedLinear(packed, torch.exp2(-exponent), weight.shape[0])


@dataclass
class PreparedTarget:
    """The target as it runs in this call.

    Attributes:
        runtime: ``"eager"`` or ``"fp16-packed"`` (never ``"auto"``).
        layers: ``{module: PackedLinear}`` of the packed layers (empty for ``"eager"``).
        memory_bytes: bytes the packed copy holds (2 per weight).
        prepare_s: seconds spent packing in this call (0 when cached).
        note: why ``"auto"`` did not pack where it might have (empty otherwise).
        kept: layers left as they are (a weight not exact in fp16).
    """

    runtime: str
    layers: dict = field(default_factory=dict)
    memory_bytes: int = 0
    prepare_s: float = 0.0
    note: str = ""
    kept: int = 0

    @property
    def rows_per_pass(self) -> int | None:
        """Token rows one pass over the packed weights computes (:data:`ROWS_PER_PASS`); ``None`` when no layer
        is packed (the target's own layers have no such step)."""
        if not self.layers:
            return None
        return ROWS_PER_PASS.get(torch.backends.cpu.get_cpu_capability())

    @contextlib.contextmanager
    def running(self):
        """Within the block the packed layers compute through their copies (each module's ``forward``, then put
        back when the last block on the same copy ends: calls on one target share its cached ``layers``, so
        nested calls, or calls in two threads, never put the layers back under one another). A forward in another
        thread while a block runs sees the packed layers too (same results up to the ties above)."""
        if not self.layers:
            yield self
            return
        key = id(self.layers)
        with _LOCK:
            outer = _ACTIVE.get(key, 0)
            _ACTIVE[key] = outer + 1
            if outer == 0:
                for module, packed in self.layers.items():
                    module.forward = packed
        try:
            yield self
        finally:
            with _LOCK:
                _ACTIVE[key] -= 1
                if _ACTIVE[key] == 0:
                    del _ACTIVE[key]
                    for module in self.layers:
                        module.__dict__.pop("forward", None)


_LOCK = threading.Lock()
_ACTIVE: dict[int, int] = {}  # open running() blocks per id of a cached ``layers`` dict
_PREPARED: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, PreparedTarget]]" = weakref.WeakKeyDictionary()


def check_target_runtime(runtime) -> str:
    """``runtime`` checked (``generate(hetspec_target=...)``, :func:`hf_hetspec.runtime.check_choice`); returns it.

    Raises:
        ValueError: not one of :data:`TARGET_RUNTIMES`.
    """
    return check_choice("hetspec_target", runtime, TARGET_RUNTIMES)


def _linears(target: torch.nn.Module) -> list[torch.nn.Linear]:
    """The target's plain bf16/fp16/float32 ``nn.Linear`` layers on the CPU whose ``forward`` nothing replaced
    (accelerate's offload hooks, for one, wrap a module's ``forward``: such a layer keeps running as it is) and
    whose weight is a plain tensor (torchao's quantized weights are tensor subclasses: already quantized, they
    run as they are)."""
    return [m for m in target.modules()
            if type(m) is torch.nn.Linear and m.weight.dtype in PACKABLE_DTYPES
            and type(m.weight.detach()) is torch.Tensor
            and m.weight.device.type == "cpu" and "forward" not in m.__dict__]


def _unavailable(target: torch.nn.Module, linears: list[torch.nn.Linear]) -> str:
    """Why the target cannot run ``"fp16-packed"`` (empty when it can); ``linears``: its :func:`_linears`."""
    device, dtype = model_device(target), target.dtype
    if device.type != "cpu":
        return f"the target is on {device.type}, not the CPU"
    if dtype not in PACKABLE_DTYPES:
        return f"the target's weights are {str(dtype).removeprefix('torch.')}, not bf16, fp16 or float32"
    if ("fbgemm" not in torch.backends.quantized.supported_engines
            or torch.backends.cpu.get_cpu_capability() not in ROWS_PER_PASS):
        return "fbgemm's fp16 products need an x86 CPU with AVX2 and a PyTorch with fbgemm"
    if not linears:
        return "the target has no bf16, fp16 or float32 nn.Linear layers"
    return ""


def resolve_target_runtime(target: torch.nn.Module, runtime: str = "auto") -> tuple[str, str]:
    """The target runtime for ``runtime`` and a note when ``"auto"`` did not pack for a reason worth saying.

    ``"auto"`` packs a float32 target on any x86 CPU with fbgemm, and a bf16 or fp16 target on a CPU without the
    dtype's own instructions (:func:`hf_hetspec.schedule.cpu_has_half_instructions`; where they exist the target's
    layers read their weights once per forward already), each with :data:`MEMORY_MARGIN` times the copy's bytes
    available, unless the copy of the target's current weights is already made (it then holds that memory itself).
    Whether a float32 target's weights pack is found by :func:`prepare_target`.

    Raises:
        ValueError: an unknown runtime, or ``"fp16-packed"`` for a target that cannot run it (the reason).
    """
    check_target_runtime(runtime)
    if runtime == "eager":
        return "eager", ""
    linears = _linears(target)
    why = _unavailable(target, linears)
    if runtime == "fp16-packed":
        if why:
            raise ValueError(f"hetspec_target='fp16-packed': {why}; use hetspec_target='auto' or 'eager'.")
        return "fp16-packed", ""
    if why or (target.dtype != torch.float32 and cpu_has_half_instructions(target.dtype)):
        return "eager", ""
    cached = _PREPARED.get(target)
    if cached is not None and cached[0] == weights_version(target):
        return "fp16-packed", ""
    need = sum(m.weight.numel() for m in linears) * 2
    available = _available_memory()
    if available is not None and available < MEMORY_MARGIN * need:
        return "eager", (f"target's layers not packed: {need / 2**30:.1f} GiB needed, {available / 2**30:.1f} GiB "
                         "available")
    return "fp16-packed", ""


def prepare_target(target: torch.nn.Module, runtime: str = "auto") -> PreparedTarget:
    """The target in ``runtime`` (:func:`resolve_target_runtime`), the packed copy made once per target and
    cached while the target lives and its weights do not change (``load_state_dict``, training steps, PEFT
    adapters switched or merged make it again).

    A target none of whose layers packs (:func:`pack_linear`) runs ``"eager"`` with a note, remembered alike.

    Raises:
        ValueError: as :func:`resolve_target_runtime`, before any copy is made; ``"fp16-packed"`` for a target
            none of whose layers packs.
    """
    resolved, note = resolve_target_runtime(target, runtime)
    if resolved == "eager":
        return PreparedTarget("eager", note=note)
    version = weights_version(target)
    cached = _PREPARED.get(target)
    made = cached is None or cached[0] != version
    if made:
        cached = _PREPARED[target] = (version, _pack(target))
    prepared = cached[1]
    if not prepared.layers and runtime == "fp16-packed":
        raise ValueError(f"hetspec_target='fp16-packed': {NOTHING_PACKED}; use hetspec_target='auto' or 'eager'.")
    return dataclasses.replace(prepared, prepare_s=prepared.prepare_s if made else 0.0, note=note or prepared.note)


def _pack(target: torch.nn.Module) -> PreparedTarget:
    """The target's layers packed (:func:`pack_linear`, up to four threads, the largest layers first):
    ``"fp16-packed"``, or ``"eager"`` with a note where none packs (e.g. float32 weights trained in float32)."""
    status("packing the target's linear layers as fp16 (once per target) ...")
    start = time.perf_counter()
    linears = _linears(target)
    # largest first: fbgemm's packing costs ~30 ns per weight, so the LM head last (Qwen2.5-Coder-1.5B's 233M
    # weights, 7 s) left one thread packing it alone: 29 s in all against 22 s largest first (2 cores)
    order = sorted(linears, key=lambda m: m.weight.numel(), reverse=True)
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        packed = dict(zip(order, pool.map(pack_linear, order)))
    layers = {m: packed[m] for m in linears if packed[m] is not None}
    if not layers:
        return PreparedTarget("eager", note=f"target's layers not packed: {NOTHING_PACKED}")
    memory = sum(m.weight.numel() * 2 for m in layers)
    prepared = PreparedTarget("fp16-packed", layers, memory, time.perf_counter() - start,
                              kept=len(linears) - len(layers))
    status(f"the target's packed layers: {len(layers)} of {len(linears)} in {prepared.prepare_s:.1f} s, "
           f"{memory / 2**20:.0f} MiB")
    return prepared


def _available_memory() -> int | None:
    """Bytes of memory available (Linux ``MemAvailable``), or ``None`` where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
