"""Names that differ between the transformers 5.x releases hf_hetspec supports.

transformers 5.24 renamed the KV cache from ``past_key_values`` to ``cache``: in model ``forward`` arguments,
in ``generate()``'s model kwargs and in model outputs. The old name still works there but warns, and is due to
be removed in 5.40. hf_hetspec passes and reads whichever name the installed release and the model use, so it
runs without that warning on 5.23 and on 5.24+.

PyTorch 2.13 deprecates ``torch.ao.quantization`` and quantized tensors, and warns on every use; the int8
drafter (:mod:`hf_hetspec.runtime` says why it still uses them) silences exactly those warnings
(:func:`quiet_quantization_warnings`).

Also the one definition of where a model takes its inputs (:func:`model_device`), which every layer needs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import warnings
from typing import Any

_OLD, _NEW = "past_key_values", "cache"
_FORWARD_CACHE_NAME: dict[type, str] = {}


@contextlib.contextmanager
def quiet_quantization_warnings():
    """Silence the deprecation warnings of ``torch.ao.quantization`` and quantized tensors, no others."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.ao\.quantization is deprecated",
                                category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor, torch\.quantize_per_channel",
                                category=UserWarning)
        yield


def cache_argument(model: Any) -> str:
    """The name under which ``model.forward`` takes its KV cache: ``"cache"`` (transformers >= 5.24) or
    ``"past_key_values"``. Looked up once per model class."""
    cls = type(model)
    name = _FORWARD_CACHE_NAME.get(cls)
    if name is None:
        try:
            parameters = inspect.signature(cls.forward).parameters
        except (TypeError, ValueError):  # a forward without an inspectable signature: the long-standing name
            parameters = {}
        name = _NEW if _NEW in parameters else _OLD
        _FORWARD_CACHE_NAME[cls] = name
    return name


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` to pass to ``model(...)``, with the name ``model.forward`` takes."""
    return {cache_argument(model): cache}


def output_cache(output: Any) -> Any:
    """The KV cache returned in a model output (``output.cache`` or ``output.past_key_values``)."""
    if _has_field(output, _NEW):
        return getattr(output, _NEW)
    return getattr(output, _OLD, None)


def cache_from_kwargs(model_kwargs: dict[str, Any]) -> Any:
    """The KV cache in a keyword-argument dict (``generate()``'s model kwargs, a forward's kwargs) under either
    name, or ``None``."""
    cache = model_kwargs.get(_NEW)
    return cache if cache is not None else model_kwargs.get(_OLD)


def output_cache_kwargs(output_class: type, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` to build a ``GenerateDecoderOnlyOutput``-like ``output_class`` with its own field name."""
    return {_NEW if _has_field(output_class, _NEW) else _OLD: cache}


def _has_field(obj: Any, name: str) -> bool:
    return dataclasses.is_dataclass(obj) and any(f.name == name for f in dataclasses.fields(obj))


def model_device(model) -> "torch.device":
    """Device of ``model``'s input embeddings (the first shard of a model split with ``device_map``)."""
    return model.get_input_embeddings().weight.device
