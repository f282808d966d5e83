"""The drafter's own decoding step: a preallocated KV cache and one plain loop over the layers.

A small drafter's step on the CPU is not dominated by its matrix products. Measured on this project's 2-core
x86 CPU (one thread, SmolLM2-135M with int8 linear layers, 200-token context, ``torch.profiler``): the int8
products take 9.3 ms of a 30 ms step; growing transformers' ``DynamicCache`` by concatenation takes 2.2 ms;
the rest is the attention kernel, small element-wise ops and the Python of the generic model code (masks
built per call, keyword plumbing, per-layer cache dispatch). This module runs the same computation with:

* a KV cache allocated once per context (grown by doubling) in which a rollback only moves the write
  position (:class:`StaticKVCache`): the drafter's context is rolled back after every verification;
* the query, key and value projections fused into one linear layer, and the gate and up projections into
  another (4 products per layer instead of 7), built from the drafter's own weights; with int8 weights each
  output row keeps its own scale, so fusing changes no product;
* no attention mask for a one-token step (it attends to the cache's last ``window`` positions, or all of
  them), an explicit causal (and window) mask only for feeds of several tokens (the prompt, a re-tokenized
  tail).

It covers the decoder layouts of Llama, Mistral, Qwen2, Qwen3 and Gemma-3 (RMS norms, before each block or on
both sides of it; rotary positions, per layer kind where the model has several; grouped-query attention with
optional query/key norms and sliding windows; gated MLP), recognised from the model's modules, never from its
name, and accepted only after the step reproduced the model's own logits on a probe (:func:`build`). Other
drafters keep transformers' forward.

Lossless by construction (Leviathan et al. 2023, Theorem 1; Timor et al. 2025, Theorems 3.2-3.4): the drafting
algorithms read the logits this step produced, so SLEM's drafts, TLI's ``q`` and SLRS's ``psi`` are those of
the model that really ran; verification is exact for any drafter.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .compat import model_device, output_cache_kwargs

#: Positions allocated for a new cache (grown by doubling up to the drafter's maximum context).
INITIAL_POSITIONS = 512
#: Positions allocated for the compiled step's cache (:meth:`StaticCacheDecoder.compile_step`): its shapes are
#: compiled in, so it starts large (each doubling compiles the step again); one-token steps attend over all of
#: them under a mask (SmolLM2-135M: 94 MiB in bf16).
COMPILED_POSITIONS = 4096
#: Feeds of at least this many tokens (a prompt, a context rebuilt after truncation) run float projections
#: when the step keeps them (:meth:`StaticCacheDrafter.keep_float_prefill`); shorter ones (one-token steps,
#: re-tokenized tails of a few tokens) run the step's own, e.g. int8, projections.
FLOAT_FEED_MIN = 16
#: Per device type, the longest feed the compiled step runs as one-token steps, one after the other
#: (:meth:`StaticCacheDecoder.hidden_states`); longer feeds run the eager step. On a GPU a step replayed as one
#: CUDA graph costs what launching a few kernels costs, and an eager forward of the same drafter launches every
#: kernel from Python whatever its tokens: on an H200 (2026-12-04, SmolLM2-135M in bf16, torch 2.11) one replayed
#: step took 2.5 ms and an eager forward about 40 ms, so the drafter's catch-up on the tokens a round accepted
#: (a few tokens, once per round) cost a round as much as the target's verification. On a CPU a step's cost is
#: its weights' reading, paid again per token: feeds stay one forward there.
STEPPED_FEED_MAX: dict[str, int] = {"cuda": 16}

_LAYER_PARTS = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
_ATTENTION_PARTS = {"q_proj", "k_proj", "v_proj", "o_proj"}
_SANDWICH_PARTS = {"pre_feedforward_layernorm", "post_feedforward_layernorm"}
_OPTIONAL_ATTENTION_PARTS = {"q_norm", "k_norm"}
_MLP_PARTS = {"gate_proj", "up_proj", "down_proj", "act_fn"}


class StaticKVCache:
    """Keys and values of every layer in preallocated tensors ``(1, kv_heads, positions, head_dim)``.

    Only the first :meth:`get_seq_length` positions are valid. :meth:`crop` follows ``DynamicCache.crop``
    (a negative argument removes that many positions) and moves the write position only.

    Args:
        layers, kv_heads, head_dim: the drafter's attention shape.
        dtype, device: of the stored keys and values.
        capacity: the drafter's maximum context (``None``: unbounded).
        static_addresses: mark every allocation as a static input of compiled code
            (``torch._dynamo.mark_static_address``): CUDA graphs then write into it in place instead of copying it.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 capacity: int | None, static_addresses: bool = False):
        self.capacity = capacity
        self.static_addresses = static_addresses
        self.length = 0
        self._shape = (1, kv_heads, 0, head_dim)
        self._dtype, self._device = dtype, device
        self.keys = [self._empty(0) for _ in range(layers)]
        self.values = [self._empty(0) for _ in range(layers)]

    def _empty(self, positions: int) -> torch.Tensor:
        shape = list(self._shape)
        shape[2] = positions
        tensor = torch.zeros(shape, dtype=self._dtype, device=self._device)
        if self.static_addresses:
            torch._dynamo.mark_static_address(tensor)
        return tensor

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Positions held."""
        return self.length

    def crop(self, max_length: int) -> None:
        """Keep the first ``max_length`` positions (``max_length < 0``: drop the last ``-max_length``)."""
        if max_length < 0:
            max_length = self.length + max_length
        self.length = max(0, min(self.length, max_length))

    def reserve(self, positions: int) -> None:
        """Make room for ``positions`` positions in all (the stored ones are kept)."""
        allocated = self.keys[0].shape[2]
        if positions <= allocated:
            return
        grown = max(positions, 2 * allocated, INITIAL_POSITIONS)
        if self.capacity is not None:
            grown = max(positions, min(grown, self.capacity))
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                new = self._empty(grown)
                new[:, :, : self.length] = old[:, :, : self.length]
                store[i] = new


class _Layer(torch.nn.Module):
    """One decoder layer's weights in the step's layout (fused projections), its norms by role and its
    attention window (``None``: the whole context)."""

    def __init__(self, layer: torch.nn.Module, window: int | None, rotary_key: str | None):
        super().__init__()
        attention, mlp = layer.self_attn, layer.mlp
        sandwich = hasattr(layer, "pre_feedforward_layernorm")  # Gemma-3: norms on both sides of each block
        self.input_norm = layer.input_layernorm
        self.attention_out_norm = layer.post_attention_layernorm if sandwich else None
        self.mlp_in_norm = layer.pre_feedforward_layernorm if sandwich else layer.post_attention_layernorm
        self.mlp_out_norm = layer.post_feedforward_layernorm if sandwich else None
        self.q_norm = getattr(attention, "q_norm", None)
        self.k_norm = getattr(attention, "k_norm", None)
        self.head_dim = attention.head_dim
        self.q_size = attention.q_proj.out_features
        self.kv_size = attention.k_proj.out_features
        self.scaling = float(attention.scaling)
        self.window = window
        self.rotary_key = rotary_key
        self.step = torch.nn.ModuleDict({
            "qkv": _fused([attention.q_proj, attention.k_proj, attention.v_proj]),
            "o_proj": attention.o_proj,
            "gate_up": _fused([mlp.gate_proj, mlp.up_proj]),
            "down_proj": mlp.down_proj,
        })
        self.prefill: torch.nn.ModuleDict | None = None  # float copies for long feeds (keep_float_prefill)
        self.act_fn = mlp.act_fn


class StaticCacheDecoder(torch.nn.Module):
    """The decoder stack (embeddings, layers, final norm) run by the step; ``forward`` mirrors transformers'
    base models (``last_hidden_state``), for the pruned LM head of TLI (:class:`~hf_hetspec.drafter.PrunedHead`)."""

    def __init__(self, decoder: torch.nn.Module, capacity: int | None):
        super().__init__()
        first = decoder.layers[0].self_attn
        self._kv_shape = (len(decoder.layers), first.k_proj.out_features // first.head_dim, first.head_dim)
        self.capacity = capacity
        self.embed_tokens = decoder.embed_tokens
        self.rotary_emb = decoder.rotary_emb
        self.norm = decoder.norm
        config = decoder.config
        per_type = "layer_type" in inspect.signature(decoder.rotary_emb.forward).parameters
        types = list(getattr(config, "layer_types", None) or []) or ["full_attention"] * len(decoder.layers)
        self.layers = torch.nn.ModuleList(
            _Layer(layer, _window(layer.self_attn, config), kind if per_type else None)
            for layer, kind in zip(decoder.layers, types)
        )
        self.rotary_keys = sorted({layer.rotary_key for layer in self.layers}, key=str)
        self.compiled_step = None  # compile_step

    def forward(self, input_ids: torch.LongTensor, cache: StaticKVCache | None = None, use_cache: bool = True,
                **_) -> BaseModelOutputWithPast:
        """``last_hidden_state`` (``(1, m, hidden)``) of ``input_ids`` (``(1, m)``) after the ``cache``'s
        positions; the cache is extended by ``m`` positions (a temporary cache when ``None``)."""
        if cache is None:
            cache = self.temporary_cache()
        return BaseModelOutputWithPast(last_hidden_state=self.hidden_states(input_ids, cache))

    def new_cache(self) -> StaticKVCache:
        """An empty cache for a decoding. With a compiled step (:meth:`compile_step`) it is always the same
        cache, emptied: compiled code and CUDA graphs keep its addresses, so one decoding at a time uses a
        compiled drafter."""
        if self.compiled_step is not None:
            self._compiled_cache.length = 0
            return self._compiled_cache
        return self.temporary_cache()

    def temporary_cache(self) -> StaticKVCache:
        """A new empty cache of its own (keys and values in the embeddings' dtype, on their device), run by the
        eager step only: a forward without a cache (a check, a probe) never touches a decoding's cache."""
        embed = self.embed_tokens.weight
        return StaticKVCache(*self._kv_shape, dtype=embed.dtype, device=embed.device, capacity=self.capacity)

    def hidden_states(self, input_ids: torch.LongTensor, cache: StaticKVCache) -> torch.Tensor:
        """The final norm's output (``(1, m, hidden)``) for ``input_ids`` (``(1, m)``) after the cache's positions;
        the cache is extended by ``m`` positions. One-token steps run the compiled step when one was made
        (:meth:`compile_step`) in its own cache (:meth:`new_cache`), and so do feeds of up to
        :data:`STEPPED_FEED_MAX` tokens on its device, one token after the other; everything else runs this
        module's eager step."""
        start, m = cache.length, input_ids.shape[1]
        cache.reserve(start + m)
        stepped = 1 if input_ids.device.type not in STEPPED_FEED_MAX else STEPPED_FEED_MAX[input_ids.device.type]
        if m <= stepped and self.compiled_step is not None and cache is self._compiled_cache:
            hidden = torch.cat([self._compiled(input_ids[:, j:j + 1], start + j, cache) for j in range(m)], dim=1)
        else:
            hidden = self._eager_step(input_ids, start, cache.keys, cache.values)
        cache.length = start + m
        return hidden

    def _compiled(self, token: torch.LongTensor, position: int, cache: StaticKVCache) -> torch.Tensor:
        """The compiled step's hidden state (``(1, 1, hidden)``, a copy) of ``token`` (``(1, 1)``) at ``position``."""
        if token.device.type == "cuda":  # the previous replay's outputs are no longer read
            torch.compiler.cudagraph_mark_step_begin()
        # one stride for every one-token feed (a slice of a longer tensor would recompile the step)
        token = token.as_strided((1, 1), (1, 1))
        return self.compiled_step(token, torch.tensor([position], device=token.device), cache.keys,
                                  cache.values).clone()

    def compile_step(self, mode: str | None, compile: bool = True) -> None:
        """Run one-token steps through ``torch.compile`` (``mode``: e.g. ``"reduce-overhead"`` for CUDA graphs,
        ``None`` for inductor's default) from now on: :meth:`fixed_step`, whose shapes do not change while the
        cache keeps its allocation of :data:`COMPILED_POSITIONS` positions (a longer context doubles it, which
        compiles the step again). Compilation happens at the first one-token step. ``compile=False`` runs
        :meth:`fixed_step` as it is (to check it, or to debug without a compiler)."""
        embed = self.embed_tokens.weight
        self._compiled_cache = StaticKVCache(*self._kv_shape, dtype=embed.dtype, device=embed.device,
                                             capacity=self.capacity, static_addresses=True)
        positions = COMPILED_POSITIONS if self.capacity is None else min(COMPILED_POSITIONS, self.capacity)
        self._compiled_cache.reserve(positions)
        self.compiled_step = (torch.compile(self.fixed_step, mode=mode, fullgraph=True, dynamic=False) if compile
                              else self.fixed_step)

    def _embed(self, input_ids: torch.LongTensor, positions: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Token embeddings ``(1, m, hidden)`` and, per rotary kind, ``cos, sin`` of shape ``(1, 1, m, head_dim)``
        at ``positions`` (``(1, m)``)."""
        x = self.embed_tokens(input_ids)
        rotations = {}
        for key in self.rotary_keys:
            cos, sin = self.rotary_emb(x, positions) if key is None else self.rotary_emb(x, positions, key)
            rotations[key] = cos[:, None], sin[:, None]
        return x, rotations

    def _eager_step(self, input_ids: torch.LongTensor, start: int, keys: list, values: list) -> torch.Tensor:
        """:meth:`hidden_states` for any feed: the cache's valid positions as slices (of a window's positions
        for sliding-window layers), a causal (and window) mask only for feeds of several tokens."""
        m = input_ids.shape[1]
        end = start + m
        x, rotations = self._embed(input_ids, torch.arange(start, end, device=input_ids.device)[None])
        masks = {}
        for i, layer in enumerate(self.layers):
            proj = layer.prefill if m >= FLOAT_FEED_MIN and layer.prefill is not None else layer.step

            def attend(q, k, v, layer=layer, i=i):
                keys[i][:, :, start:end] = k
                values[i][:, :, start:end] = v
                # a one-token step attends to the window's last positions (all of them without a window); a
                # longer feed needs the causal (and window) mask over the positions from the window's first one
                first = 0 if layer.window is None else max(0, start - layer.window + 1)
                mask = None
                if m > 1:
                    if layer.window not in masks:
                        masks[layer.window] = _mask(start, end, first, layer.window, x.device)
                    mask = masks[layer.window]
                return F.scaled_dot_product_attention(q, keys[i][:, :, first:end], values[i][:, :, first:end],
                                                      attn_mask=mask, scale=layer.scaling, enable_gqa=True)

            x = _decoder_layer(layer, proj, x, rotations[layer.rotary_key], attend)
        return _norm(self.norm, x)

    def fixed_step(self, input_ids: torch.LongTensor, position: torch.LongTensor, keys: list,
                   values: list) -> torch.Tensor:
        """:meth:`hidden_states` of one token (``input_ids`` ``(1, 1)``) at ``position`` (``(1,)``, on the
        cache's device) with shapes that depend on the cache's allocation only, for ``torch.compile`` and CUDA
        graphs: the key and value are written with ``index_copy_`` and attention reads every allocated
        position under a mask computed from ``position`` (positions past it, rolled-back drafts included, and
        positions outside a sliding window are masked). Returns ``(1, 1, hidden)``."""
        x, rotations = self._embed(input_ids, position[None])
        span = torch.arange(keys[0].shape[2], device=position.device)
        masks = {}
        for i, layer in enumerate(self.layers):
            if layer.window not in masks:
                seen = span <= position
                if layer.window is not None:
                    seen = seen & (span > position - layer.window)
                masks[layer.window] = seen[None, None, None]

            def attend(q, k, v, layer=layer, i=i):
                keys[i].index_copy_(2, position, k)
                values[i].index_copy_(2, position, v)
                return F.scaled_dot_product_attention(q, keys[i], values[i], attn_mask=masks[layer.window],
                                                      scale=layer.scaling, enable_gqa=True)

            x = _decoder_layer(layer, layer.step, x, rotations[layer.rotary_key], attend)
        return _norm(self.norm, x)


def _decoder_layer(layer: _Layer, proj: torch.nn.ModuleDict, x: torch.Tensor, rotation: tuple, attend) -> torch.Tensor:
    """One decoder layer on ``x`` (``(1, m, hidden)``) with the projections ``proj``; ``attend(q, k, v)`` (rotated,
    ``(1, heads, m, head_dim)``) stores the new keys and values and returns the attention output."""
    m = x.shape[1]
    cos, sin = rotation
    h = _norm(layer.input_norm, x)
    q, k, v = proj["qkv"](h).split([layer.q_size, layer.kv_size, layer.kv_size], dim=-1)
    q = q.view(1, m, -1, layer.head_dim)
    k = k.view(1, m, -1, layer.head_dim)
    if layer.q_norm is not None:
        q, k = layer.q_norm(q), layer.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = v.view(1, m, -1, layer.head_dim).transpose(1, 2)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    out = proj["o_proj"](attend(q, k, v).transpose(1, 2).reshape(1, m, -1))
    x = x + (out if layer.attention_out_norm is None else _norm(layer.attention_out_norm, out))
    gate, up = proj["gate_up"](_norm(layer.mlp_in_norm, x)).chunk(2, dim=-1)
    out = proj["down_proj"](layer.act_fn(gate) * up)
    return x + (out if layer.mlp_out_norm is None else _norm(layer.mlp_out_norm, out))


class StaticCacheDrafter(torch.nn.Module):
    """A causal LM with :class:`StaticKVCache` and the fused step of this module; made by :func:`build`
    (``capacity``: the most positions its cache grows to, ``None`` for no bound).

    It offers what the drafting code uses of a transformers model: ``config``, ``get_input_embeddings``,
    ``get_output_embeddings``, ``get_decoder``, and ``forward(input_ids, cache, use_cache, logits_to_keep)``
    returning ``logits`` (``(1, m or logits_to_keep, V)``, float32) and the cache.
    """

    def __init__(self, model: PreTrainedModel, capacity: int | None):
        super().__init__()
        self.config = model.config
        self.model = StaticCacheDecoder(model.get_decoder(), capacity)
        self.lm_head = model.get_output_embeddings()

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.lm_head

    def get_decoder(self) -> StaticCacheDecoder:
        return self.model

    def new_cache(self) -> StaticKVCache:
        """An empty cache for this drafter."""
        return self.model.new_cache()

    def cache_bytes(self) -> int:
        """Bytes held by the compiled step's cache (0 without a compiled step)."""
        if self.model.compiled_step is None:
            return 0
        cache = self.model.new_cache()
        return sum(t.numel() * t.element_size() for t in cache.keys + cache.values)

    def keep_float_prefill(self) -> None:
        """Keep float copies of the projections for feeds of :data:`FLOAT_FEED_MIN` tokens or more, before the
        step's own projections are quantized (:meth:`step_linear_names`).

        Why: int8 dynamic quantization scales a feed's activations by one number for all its tokens, and small
        LMs put activations thousands of times larger than the rest on a few tokens (SmolLM2-135M: 2946
        against a typical 2 at layer 11's down projection, on the prompt's first tokens). Quantized together,
        the other tokens of a prompt lose their precision, and so does the KV cache every later draft reads.
        Measured on HumanEval/30-33 (chat prompts, then the canonical solutions one token at a time): the int8
        drafter's next-token argmax agreed with the float32 drafter's on 73% of positions after an int8
        prefill and on 90% after a float32 prefill (84% feeding the prompt one token at a time). One-token
        steps quantize one token's activations and keep the int8 speed.
        """
        for layer in self.model.layers:
            layer.prefill = torch.nn.ModuleDict({name: _copy_linear(linear) for name, linear in layer.step.items()})

    def step_linear_names(self) -> list[str]:
        """Qualified names of the linear layers one-token steps run (the fused projections and the LM head):
        the ones to quantize."""
        return [f"model.layers.{i}.step.{name}" for i, layer in enumerate(self.model.layers) for name in layer.step] + [
            "lm_head"]

    def forward(self, input_ids: torch.LongTensor, cache: StaticKVCache | None = None, use_cache: bool = True,
                logits_to_keep: int = 0, **_) -> CausalLMOutputWithPast:
        """Logits of ``input_ids`` (``(1, m)``) after the cache's positions (a temporary cache when ``None``)."""
        if cache is None:
            cache = self.model.temporary_cache()
        hidden = self.model.hidden_states(input_ids, cache)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.lm_head(hidden)
        return CausalLMOutputWithPast(logits=logits, **output_cache_kwargs(CausalLMOutputWithPast, cache))


def _norm(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)``; Llama's RMSNorm (``weight * x / rms(x)``, the one with ``variance_epsilon``) as one call."""
    if hasattr(norm, "variance_epsilon"):
        return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)
    return norm(x)


def _window(attention: torch.nn.Module, config) -> int | None:
    """The layer's attention window: its own ``sliding_window`` (``None`` for a full-attention layer), else the
    config's (Mistral applies it to every layer)."""
    if hasattr(attention, "sliding_window"):
        return attention.sliding_window
    return getattr(config, "sliding_window", None)


def _mask(start: int, end: int, first: int, window: int | None, device: torch.device) -> torch.Tensor:
    """``(m, end - first)`` boolean: query ``start + i`` sees key ``first + j`` when it is not later and, with a
    window, fewer than ``window`` positions earlier."""
    queries = torch.arange(start, end, device=device)[:, None]
    keys = torch.arange(first, end, device=device)[None]
    seen = keys <= queries
    return seen if window is None else seen & (keys > queries - window)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class FeedSizeLinear(torch.nn.Module):
    """A linear layer that runs ``prefill`` (float) for feeds of :data:`FLOAT_FEED_MIN` tokens or more and
    ``step`` (quantized by the int8 runtime) for shorter ones: the float-prefill rule of
    :meth:`StaticCacheDrafter.keep_float_prefill` for drafters that transformers' forward runs (the ``"int8"``
    runtime). It has no ``weight``: a model that reads a linear layer's weight directly does not run with int8
    layers either way (:func:`hf_hetspec.runtime.prepare_drafter` falls back)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.prefill = _copy_linear(linear)
        self.step = linear
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        return (self.prefill if rows >= FLOAT_FEED_MIN else self.step)(x)


def split_feed_sizes(model: PreTrainedModel) -> list[str]:
    """Wrap every ``nn.Linear`` of ``model`` except its LM head in :class:`FeedSizeLinear`, in place; returns the
    qualified names of the layers to quantize: each wrapper's ``step`` and the LM head (which sees one position
    per drafting step)."""
    head = model.get_output_embeddings()
    names = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            qualified = f"{name}.{child_name}" if name else child_name
            if child is head:
                names.append(qualified)
            elif type(child) is torch.nn.Linear:
                setattr(module, child_name, FeedSizeLinear(child))
                names.append(f"{qualified}.step")
    return names


def _copy_linear(linear: torch.nn.Linear) -> torch.nn.Linear:
    return _fused([linear])


def _fused(linears: list[torch.nn.Linear]) -> torch.nn.Linear:
    """One linear layer whose output is the concatenation of ``linears``' outputs (same input)."""
    weight = torch.cat([linear.weight for linear in linears])
    biases = [linear.bias for linear in linears]
    # no random initialization of weights copied over at once (0.9 s of SmolLM2-135M's 6 s preparation)
    fused = torch.nn.utils.skip_init(torch.nn.Linear, weight.shape[1], weight.shape[0], bias=biases[0] is not None,
                                     device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(weight)
        if biases[0] is not None:
            fused.bias.copy_(torch.cat(biases))
    return fused.requires_grad_(False)


def unsupported(model: PreTrainedModel) -> str:
    """Why the step cannot run ``model`` (its module layout is not one the step covers, or it caps its logits),
    or ``""`` when the layout fits; :func:`build` also checks the logits."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is None or decoder is model:
        return "no separate decoder stack"
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(decoder, name):
            return f"its decoder has no {name}"
    if not isinstance(model.get_output_embeddings(), torch.nn.Linear):
        return "its LM head is not a linear layer"
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    kinds = getattr(config, "layer_types", None) or []
    if any(kind not in ("full_attention", "sliding_attention") for kind in kinds):
        return "layers other than full or sliding-window attention"
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "attn_logit_softcapping", None):
        return "logit softcapping"
    for layer in decoder.layers:
        parts = {name for name, _ in layer.named_children()}
        if parts not in (_LAYER_PARTS, _LAYER_PARTS | _SANDWICH_PARTS):
            return f"decoder layer parts {sorted(parts)}"
        attention = {name for name, _ in layer.self_attn.named_children()}
        if not (_ATTENTION_PARTS <= attention <= _ATTENTION_PARTS | _OPTIONAL_ATTENTION_PARTS):
            return f"attention parts {sorted(attention)}"
        if {name for name, _ in layer.mlp.named_children()} | {"act_fn"} != _MLP_PARTS:
            return "not a gated MLP"
        linears = [getattr(layer.self_attn, n) for n in _ATTENTION_PARTS] + [layer.mlp.gate_proj,
                                                                            layer.mlp.up_proj, layer.mlp.down_proj]
        if not all(isinstance(linear, torch.nn.Linear) for linear in linears):
            return "projections other than linear layers"
    return ""


@torch.no_grad()
def build(model: PreTrainedModel, capacity: int | None) -> tuple[StaticCacheDrafter | None, str]:
    """The step for ``model`` (a float32 drafter copy in eval mode, whose weights the step shares; ``capacity``:
    its maximum context, ``hf_hetspec.drafter.max_positions``), after a
    check that it reproduces ``model``'s own logits: a 6-token prompt, two one-token steps, a rollback of two
    positions and a step again, each compared with ``model``'s forward over the whole sequence.

    Returns:
        ``(drafter, "")``, or ``(None, why)`` when the layout is not covered (:func:`unsupported`) or the logits
        differ (e.g. a variant scaling its embeddings or its logits).
    """
    why = unsupported(model)
    if why:
        return None, why
    drafter = StaticCacheDrafter(model, capacity).eval()
    device = model_device(model)
    ids = torch.arange(3, 12, device=device)[None] % model.get_input_embeddings().weight.shape[0]
    cache = drafter.new_cache()
    mine = [drafter(ids[:, :6], cache).logits[0, -1], drafter(ids[:, 6:7], cache).logits[0, -1],
            drafter(ids[:, 7:8], cache).logits[0, -1]]
    cache.crop(-2)
    mine.append(drafter(ids[:, 6:8], cache).logits[0, -1])
    reference = [model(input_ids=ids[:, :n], use_cache=False).logits[0, -1] for n in (6, 7, 8, 8)]
    if not _close(mine, reference):
        return None, "its logits differ from the model's own (a layout variant this step does not run)"
    return drafter, ""


@torch.no_grad()
def warm_up_compiled(drafter: StaticCacheDrafter, mode: str | None) -> str:
    """Compile ``drafter``'s one-token step (:meth:`StaticCacheDecoder.compile_step` with ``mode``) and run it
    until compiled (and, with CUDA graphs, recorded): a 6-token prompt, three one-token steps, a rollback of two
    positions and a step again, each compared with the eager step's logits.

    Returns:
        ``""``, or why the compiled step's logits differ.

    Raises:
        whatever ``torch.compile`` raises when it cannot compile (no C++ compiler, no Triton, ...).
    """
    device = model_device(drafter)
    ids = torch.arange(3, 12, device=device)[None] % drafter.get_input_embeddings().weight.shape[0]
    cache = drafter.new_cache()
    want = [drafter(ids[:, : n], cache).logits[0, -1].clone() for n in (6,)]
    want += [drafter(ids[:, n : n + 1], cache).logits[0, -1].clone() for n in (6, 7, 8)]
    drafter.model.compile_step(mode)
    cache = drafter.new_cache()
    got = [drafter(ids[:, :6], cache).logits[0, -1]] + [drafter(ids[:, n : n + 1], cache).logits[0, -1]
                                                        for n in (6, 7, 8)]
    cache.crop(-2)
    got.append(drafter(ids[:, 7:8], cache).logits[0, -1])
    if not _close(got, want + [want[2]]):
        drafter.model.compiled_step = None
        return "the compiled step's logits differ from the eager step's"
    return ""


def _close(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    """Whether each pair of logit vectors agrees to rounding (relative to the largest logit: 1e-3 in float32,
    3e-2 in half precision, whose rounding alone reaches 4e-3 per operation)."""
    for a, b in zip(got, want):
        tol = 1e-3 if b.dtype == torch.float32 else 3e-2
        scale = float(b.abs().max())
        if a.shape != b.shape or not torch.allclose(a.float(), b.float(), rtol=tol, atol=tol * scale):
            return False
    return True
