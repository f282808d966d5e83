"""Checks on the models before any work: the drafter's weights (not on the ``meta`` device, and finite), and
models with a history (changed in place by transformers, wrapped by PEFT).

A drafter on ``meta`` (built under ``init_empty_weights`` or offloaded by a ``device_map``) has no values, so
its first forward fails deep inside torch; a drafter with NaN or infinite weights yields a NaN draft
distribution ``q``, on which speculative sampling's ``min(1, p / q)`` and the residual ``max(0, p - q)`` are
undefined. Both are refused before any work with a message that names the parameter.

The finiteness check sums every floating-point weight once: a NaN or an infinity makes the sum non-finite,
and only a sum that overflows is checked element by element. For 135M weights that is 0.05-0.08 s on a busy
2-core CPU, against 1.9-2.5 s for ``torch.isfinite(weight).all()``. The result is remembered per drafter until
one of its parameters is replaced or changed in place (torch's per-tensor version counter), so repeated
``generate()`` calls do not pay for it again.

Models with a history (docs/hardening.md, "Models as users have them"): a target or drafter whose LM head
transformers' own universal assisted generation pruned in place is refused before any work
(:func:`check_not_changed_by_assisted_generation`); a PEFT ``PeftModel`` is accepted in either role, its
adapters living in the layers hf_hetspec runs (:func:`peft_base_model`), except prompt-learning adapters
(:func:`check_peft_adapters`); :func:`adapter_state` tells the drafter runtime's cache when adapters changed.
"""

from __future__ import annotations

import weakref

import torch

_CHECKED: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()


def _fingerprint(model: torch.nn.Module) -> tuple:
    """Identity, storage and in-place version of every parameter: changes when a weight is replaced or modified."""
    return tuple((name, id(p), p.data_ptr(), p._version) for name, p in model.named_parameters())


def _finite(weight: torch.Tensor) -> bool:
    """Whether every value of ``weight`` is finite: its sum first (one cheap pass), each value if that overflows."""
    with torch.no_grad():
        return bool(torch.isfinite(weight.sum())) or bool(torch.isfinite(weight).all())


def check_drafter_weights(drafter: torch.nn.Module) -> None:
    """Refuse a drafter whose weights are on the ``meta`` device or not finite.

    Args:
        drafter: the ``assistant_model`` of a ``generate()`` call (a ``torch.nn.Module``).

    Raises:
        ValueError: a parameter on the ``meta`` device (the message names it: load the weights, e.g.
            ``from_pretrained`` without ``device_map`` offloading), or a floating-point parameter holding NaN
            or an infinite value (named: reload or fix the checkpoint).
    """
    if not isinstance(drafter, torch.nn.Module):
        return  # not a model at all: the call's validation names that
    fingerprint = _fingerprint(drafter)
    if _CHECKED.get(drafter) == fingerprint:
        return
    for name, param in drafter.named_parameters():
        if param.is_meta:
            raise ValueError(
                f"assistant_model: parameter {name!r} is on the meta device (no values loaded, e.g. built under "
                "init_empty_weights or offloaded by device_map); load the drafter's weights onto a real device.")
    for name, param in drafter.named_parameters():
        # plain tensors only: quantized tensor subclasses hold integer codes, not floats to check
        if param.is_floating_point() and type(param.data) is torch.Tensor and not _finite(param):
            raise ValueError(
                f"assistant_model: parameter {name!r} holds NaN or infinite values, so the drafter's distribution "
                "q would be undefined; reload the drafter (or fix its checkpoint).")
    _CHECKED[drafter] = fingerprint


# --------------------------------------------------------------------------------------------------------
# models as users have them: changed in place by transformers' assisted generation, wrapped by PEFT
# --------------------------------------------------------------------------------------------------------

#: The layers transformers' universal assisted generation puts in place of a drafter's LM head and input
#: embedding (``AssistantToTargetTranslator`` in transformers/generation/candidate_generator.py, sampled calls
#: with ``assistant_model`` and two tokenizers): the head keeps only the rows of the tokens the drafter shares
#: with that call's target, so the drafter's own distribution ``q`` cannot be computed from it any more.
_ASSISTED_GENERATION_LAYERS = ("_PruneReindexingLMHead", "_MapInputEmbedding")


def check_not_changed_by_assisted_generation(model, role: str) -> None:
    """Refuse a ``role`` model (``"target"`` or ``"drafter"``) whose LM head or input embedding transformers'
    own universal assisted generation replaced in place (:data:`_ASSISTED_GENERATION_LAYERS`).

    Raises:
        ValueError: the message names the replaced layer, what replaced it and the fix (reload the model, or
            hand transformers a copy).
    """
    layers = (("LM head", model.get_output_embeddings()), ("input embedding", model.get_input_embeddings()))
    for where, layer in layers:
        name = type(layer).__name__
        if name in _ASSISTED_GENERATION_LAYERS and type(layer).__module__.startswith("transformers."):
            raise ValueError(
                f"{_argument(role)} was changed in place by transformers' own assisted generation: its "
                f"{where} is transformers' {name}, which a sampled generate(assistant_model=..., tokenizer=..., "
                "assistant_tokenizer=...) without hf_hetspec put there, keeping only the rows shared with that "
                "call's target; the original rows are gone. Reload the model (from_pretrained), and give "
                "transformers' assisted generation a copy (assistant_model=copy.deepcopy(drafter)).")


def _argument(role: str) -> str:
    """How a message names the ``role`` model."""
    return "the target (the model generate() is called on)" if role == "target" else "the drafter (`assistant_model`)"


def is_peft_model(model) -> bool:
    """Whether ``model`` is a PEFT ``PeftModel`` (duck-typed: ``peft`` is not a dependency of hf_hetspec)."""
    return getattr(model, "peft_config", None) is not None and callable(getattr(model, "get_base_model", None))


def peft_base_model(model):
    """The transformers model inside a PEFT ``PeftModel``, its layers holding the adapters (LoRA layers wrap
    the linear layers in place, so its forward is the adapted model's); any other ``model`` unchanged."""
    return model.get_base_model() if is_peft_model(model) else model


def check_peft_adapters(model, role: str) -> None:
    """Refuse a ``PeftModel`` ``role`` (``"target"`` or ``"drafter"``) whose active adapter is prompt learning
    (prefix / prompt / P-tuning): those add virtual tokens in ``PeftModel.forward`` rather than in the layers,
    and hf_hetspec runs the layers. Any other model passes.

    Raises:
        NotImplementedError: names the adapter type and what works instead.
    """
    if not is_peft_model(model):
        return
    config = model.active_peft_config
    if getattr(config, "is_prompt_learning", False):
        kind = getattr(config.peft_type, "value", config.peft_type)
        raise NotImplementedError(
            f"{_argument(role)} is a PeftModel with a prompt-learning adapter ({kind}), whose "
            "virtual tokens hf_hetspec does not feed; use an adapter that changes the layers (e.g. LoRA), or "
            "call generate() without `assistant_model`.")


def adapter_state(model: torch.nn.Module) -> tuple:
    """Which adapters each PEFT layer of ``model`` runs: ``(active, disabled, merged)`` per layer, in module order
    (empty for a model without adapters). Changes with ``set_adapter``, ``disable_adapter()`` and merging, which
    change what the model computes without changing any parameter."""
    return tuple((tuple(m.active_adapters), bool(m.disable_adapters), tuple(m.merged_adapters))
                 for m in model.modules() if hasattr(m, "merged_adapters") and hasattr(m, "active_adapters"))
