"""A pairing's vLLM equivalent: the ``--speculative-config`` of vLLM's TLI and whether vLLM can use the pair.

Serving many users is vLLM's job (docs/api.md, "From hf_hetspec to vLLM"). vLLM's draft-model speculative
decoding accepts a drafter with another vocabulary through ``use_heterogeneous_vocab`` (vllm-project/vllm#38174):
TLI only, greedy drafts only. Its ``VocabMapping`` (``vllm/v1/spec_decode/vocab_mapping.py``) stands one id in
for every token outside the two vocabularies' intersection, per tokenizer: the ``unk_token_id``, else the
``eos_token_id`` with a warning, and it refuses a tokenizer with neither. Which id that is matters for the
drafter: every target token outside the intersection reaches the drafter's context as that id. The target's
stand-in is used only for drafted tokens outside the intersection, which vLLM masks out of the drafter's logits.

This module records those tokens from a pair's tokenizers (:func:`special_tokens`, stored in a card's
metadata under ``special_tokens``) and says what they mean (:func:`tli_notes`); :func:`speculative_config` and
:func:`serve_command` are the vLLM settings a card prints (``hf-hetspec pairing show``).
"""

from __future__ import annotations

import json

from ..plan import DEFAULT_LOOKAHEAD

ROLES = ("target", "drafter")


def speculative_config(drafter: str, lookahead: int | None) -> dict:
    """vLLM's ``speculative_config`` for TLI with ``drafter`` (a Hub id): ``num_speculative_tokens`` is the
    card's fixed lookahead, else where hf_hetspec's adaptive schedule starts (:data:`DEFAULT_LOOKAHEAD`)."""
    k = lookahead if lookahead is not None else DEFAULT_LOOKAHEAD
    return {"method": "draft_model", "model": drafter, "num_speculative_tokens": k,
            "use_heterogeneous_vocab": True}


def serve_command(target: str, drafter: str, lookahead: int | None) -> str:
    """The ``vllm serve`` line of a pairing (Hub ids of both models)."""
    return f"vllm serve {target} --speculative-config '{json.dumps(speculative_config(drafter, lookahead))}'"


def special_tokens(target_tokenizer, drafter_tokenizer) -> dict:
    """The tokens vLLM's TLI stands in for tokens outside the intersection: per role (``"target"``,
    ``"drafter"``) ``unk_token``, ``unk_token_id``, ``eos_token``, ``eos_token_id`` (``None`` when absent)."""
    return {
        role: {name: getattr(tokenizer, name, None)
               for name in ("unk_token", "unk_token_id", "eos_token", "eos_token_id")}
        for role, tokenizer in zip(ROLES, (target_tokenizer, drafter_tokenizer))
    }


def _stand_in(tokens: dict) -> tuple[str, str] | None:
    """``(kind, "token (id N)")`` of the id vLLM uses for one tokenizer: its unk, else its EOS; ``None``:
    neither."""
    for kind in ("unk", "eos"):
        if tokens.get(f"{kind}_token_id") is not None:
            return kind, f"`{tokens.get(f'{kind}_token')}` (id {tokens[f'{kind}_token_id']})"
    return None


def tli_usable(tokens: dict | None) -> bool | None:
    """Whether vLLM's TLI starts with the pair: both tokenizers have an unk or an EOS token; ``None`` when the
    card did not record them."""
    if not tokens:
        return None
    return all(_stand_in(tokens.get(role) or {}) is not None for role in ROLES)


def tli_notes(tokens: dict | None) -> list[str]:
    """Sentences on vLLM's TLI with this pair, from :func:`special_tokens`' record (``None``: not recorded)."""
    if not tokens:
        return ["the card does not record the tokenizers' unk and EOS tokens (written before hf_hetspec recorded "
                "them): vLLM's TLI needs `unk_token_id` or `eos_token_id` in both tokenizers; check them"]
    usable = tli_usable(tokens)
    notes = [f"vLLM's TLI {'can' if usable else 'cannot'} use this pair"
             + ("" if usable else ": a tokenizer has neither an unk nor an EOS token, which vLLM refuses")]
    drafter = _stand_in(tokens.get("drafter") or {})
    if drafter is not None:
        kind, token = drafter
        notes.append(f"target tokens outside the shared vocabulary reach the drafter as its "
                     f"{'unk' if kind == 'unk' else 'EOS (it has no unk token; vLLM warns)'} token {token}")
    target = _stand_in(tokens.get("target") or {})
    if target is not None and target[0] == "eos":
        notes.append(f"the target has no unk token: vLLM falls back to its EOS {target[1]} with a warning, for "
                     "drafted tokens outside the intersection only, which its logit mask rules out")
    return notes
