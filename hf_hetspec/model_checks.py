"""Models as users have them, wrapped by PEFT (docs/hardening.md, "Models as users have them").

A PEFT ``PeftModel`` is accepted in either role, its adapters living in the layers hf_hetspec runs
(:func:`peft_base_model`); :func:`adapter_state` tells the drafter runtime's cache when adapters changed. The
refusals on the models (weights on ``meta`` or not finite, a model changed in place by transformers' assisted
generation, a prompt-learning adapter) are in :mod:`hf_hetspec.checks`; their old names here cannot be
re-exported, since :mod:`hf_hetspec.checks` imports this module.
"""

from __future__ import annotations

import torch

def is_peft_model(model) -> bool:
    """Whether ``model`` is a PEFT ``PeftModel`` (duck-typed: ``peft`` is not a dependency of hf_hetspec)."""
    return getattr(model, "peft_config", None) is not None and callable(getattr(model, "get_base_model", None))


def peft_base_model(model):
    """The transformers model inside a PEFT ``PeftModel``, its layers holding the adapters (LoRA layers wrap
    the linear layers in place, so its forward is the adapted model's); any other ``model`` unchanged."""
    return model.get_base_model() if is_peft_model(model) else model


def adapter_state(model: torch.nn.Module) -> tuple:
    """Which adapters each PEFT layer of ``model`` runs: ``(active, disabled, merged)`` per layer, in module order
    (empty for a model without adapters). Changes with ``set_adapter``, ``disable_adapter()`` and merging, which
    change what the model computes without changing any parameter."""
    return tuple((tuple(m.active_adapters), bool(m.disable_adapters), tuple(m.merged_adapters))
                 for m in model.modules() if hasattr(m, "merged_adapters") and hasattr(m, "active_adapters"))
