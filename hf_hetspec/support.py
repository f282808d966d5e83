"""Which models hf_hetspec can use as target or drafter: those whose cache a crop rolls back exactly.

Speculative decoding feeds a draft through a model's cache and then drops the rejected positions
(:func:`hf_hetspec.drafter.rollback_cache`). That is exact only when every layer of the cache keeps one
entry per position and a crop removes the last entries: attention key/value layers. A recurrent or
linear-attention layer (Mamba, Mamba2, the mamba layers of Jamba, Bamba, Zamba, Falcon-H1, Granite
hybrids, the linear-attention layers of Qwen3-Next, LFM2's convolutions) folds every position into one
state; transformers 5.x crops only its convolution window, not the recurrent state, and a multi-token
forward over such a cache restarts the scan from a zero state. Verifying a draft through it would give
output that differs from the target alone, so such *targets* are refused before any work. A *drafter* with
such layers is rolled back from per-position state snapshots instead (:mod:`hf_hetspec.recurrent`): its
state only affects speed, and stepping it one token at a time costs drafter forwards, which are cheap.

The decision reads the cache transformers builds for the model (``DynamicCache(config=...)``, the cache
``generate()`` prepares), layer by layer, and the config's ``is_encoder_decoder``; it never looks at model
names, so a new architecture is judged by its cache layers, and an unknown layer type is refused. The refusal
itself is :func:`hf_hetspec.checks.check_model_supported`.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin, DummyLayer, LinearAttentionCacheLayerMixin

from .recurrent import is_state_layer

ROLES = ("target", "drafter")


@dataclass(frozen=True)
class Support:
    """Whether a model can be a target or drafter, and if not, why.

    Attributes:
        supported: every layer of its cache is rolled back exactly (by a crop; a drafter's state layers from
            snapshots).
        reason: empty when supported; else one sentence naming what cannot be rolled back.
    """

    supported: bool
    reason: str = ""


def layer_support(layer, role: str = "target") -> Support:
    """Whether one cache layer (a fresh, empty one) of a ``role`` model can be rolled back exactly.

    Exact: attention key/value layers (``CacheLayerMixin``: full, sliding-window, chunked, indexed) that
    report ``is_croppable`` and layers that hold nothing (``DummyLayer``: MoE/MLP-only layers, layers that
    reuse another layer's keys). Not exact: any layer with a recurrent, linear-attention or convolution state
    (``LinearAttentionCacheLayerMixin``, also when it holds attention keys too), a layer reporting
    ``is_croppable`` False (quantized layers), and any other type (unknown: its crop cannot be vouched for).
    A drafter may also have layers of recurrent/convolution state only (:func:`hf_hetspec.recurrent.is_state_layer`),
    rolled back from snapshots.
    """
    name = type(layer).__name__
    if role == "drafter" and is_state_layer(layer):
        return Support(True)
    if isinstance(layer, LinearAttentionCacheLayerMixin):
        return Support(False, f"its cache has {name} layers, whose recurrent/linear-attention state a crop cannot "
                              "roll back to an earlier position")
    if isinstance(layer, DummyLayer):
        return Support(True)
    if not isinstance(layer, CacheLayerMixin):
        return Support(False, f"its cache has {name} layers, an unknown type whose crop is not known to be exact")
    if layer.is_croppable is not True:
        return Support(False, f"its cache has {name} layers, which report that a crop cannot roll them back")
    return Support(True)


def cache_support(cache, role: str = "target") -> Support:
    """:func:`layer_support` over every layer of ``cache`` (a transformers ``Cache``); the first failing layer
    gives the reason."""
    for layer in cache.layers:
        verdict = layer_support(layer, role)
        if not verdict.supported:
            return verdict
    return Support(True)


def model_support(model, role: str = "target") -> Support:
    """Whether ``model`` (a transformers ``PreTrainedModel``) can be the ``role`` (``"target"`` or ``"drafter"``).

    Refused: encoder-decoder models (``config.is_encoder_decoder``: hf_hetspec drafts and verifies one
    decoder-only sequence), models that keep a cache of their own instead of transformers' ``DynamicCache``
    (``_supports_default_dynamic_cache()`` False, e.g. RWKV's state), and models whose ``DynamicCache`` has a
    layer that a crop cannot roll back exactly (:func:`layer_support`).
    """
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        return Support(False, "it is an encoder-decoder model; hf_hetspec drafts and verifies one decoder-only "
                              "sequence")
    uses_dynamic_cache = getattr(type(model), "_supports_default_dynamic_cache", None)
    if uses_dynamic_cache is not None and not uses_dynamic_cache():
        return Support(False, "it keeps a cache of its own instead of transformers' DynamicCache, which hf_hetspec "
                              "cannot roll back")
    text_config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return cache_support(DynamicCache(config=text_config), role)
