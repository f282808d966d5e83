"""Chat prompts for a target and a drafter whose chat templates differ.

A chat template is part of a vocabulary: Qwen2.5 and SmolLM2 mark turns with ChatML's ``<|im_start|>`` /
``<|im_end|>``, Gemma-3 with ``<start_of_turn>`` / ``<end_of_turn>``. Translating the target's rendered
prompt as text would hand a Gemma drafter ChatML markers as plain characters, so it never sees the
conversation structure it was trained on (fault class 9 of the hardening issue). :func:`chat_inputs`
applies each tokenizer's own template to the same messages; ``generate(assistant_input_ids=...)`` hands the
drafter's version to the drafter. The drafter's prompt only changes what it proposes: the output is the
target's, whatever the drafter sees.
"""

from __future__ import annotations

import torch

from .alignment import convert_prompt, vocabulary


def _template_ids(tokenizer, messages, **template_kwargs) -> dict[str, torch.Tensor]:
    out = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt",
        **template_kwargs,
    )
    ids = out["input_ids"]
    mask = out.get("attention_mask")
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids) if mask is None else mask}


def chat_inputs(
    messages: list[dict], tokenizer, assistant_tokenizer, **template_kwargs
) -> dict[str, torch.Tensor]:
    """The same conversation rendered by the target's and by the drafter's own chat template.

    Usage::

        inputs = hf_hetspec.chat_inputs(messages, target_tokenizer, drafter_tokenizer)
        out = target.generate(**inputs, assistant_model=drafter, tokenizer=target_tokenizer,
                              assistant_tokenizer=drafter_tokenizer, max_new_tokens=128)

    Args:
        messages: the conversation, ``[{"role": "user", "content": "..."}, ...]`` as for
            ``apply_chat_template``; a generation prompt for the assistant's turn is added on both sides.
        tokenizer: the target's tokenizer (must have a chat template).
        assistant_tokenizer: the drafter's tokenizer. Without a chat template (a base model such as
            Gemma-3-270m), the drafter's prompt is the target's rendered prompt converted as
            :func:`~hf_hetspec.alignment.convert_prompt` does it -- exactly what ``generate()`` uses when no
            ``assistant_input_ids`` is given: text re-encoded, special tokens matched by content, the
            drafter's own BOS first.
        **template_kwargs: passed to both ``apply_chat_template`` calls (``tools=``, ``documents=``,
            ``sanitize_control_tokens=True`` to keep control-token strings typed in messages as text, ...).

    Returns:
        ``{"input_ids": (1, n), "attention_mask": (1, n) of ones, "assistant_input_ids": (1, m)}``
        (``torch.LongTensor``), ready for ``target.generate(**inputs, ...)``.

    Raises:
        ValueError: the target tokenizer has no chat template (transformers' own error), or ``messages`` is
            empty.
    """
    if not messages:
        raise ValueError("`messages` is empty: pass at least one, e.g. [{'role': 'user', 'content': ...}].")
    target = _template_ids(tokenizer, messages, **template_kwargs)
    if getattr(assistant_tokenizer, "chat_template", None):
        drafter_ids = _template_ids(assistant_tokenizer, messages, **template_kwargs)["input_ids"]
    else:
        target_ids = target["input_ids"][0].tolist()
        converted = convert_prompt(vocabulary(tokenizer), vocabulary(assistant_tokenizer), target_ids)
        drafter_ids = torch.tensor([converted], dtype=torch.long)
    return {"input_ids": target["input_ids"], "attention_mask": target["attention_mask"],
            "assistant_input_ids": drafter_ids}
