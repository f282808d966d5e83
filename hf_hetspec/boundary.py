"""How one tokenizer encodes text that continues other text, probed once per tokenizer.

Text conversion (:class:`~hf_hetspec.alignment.TextWindowConverter`) re-encodes a window of known context
together with new text. A tokenizer treats the *start* of the text it is given specially, so a window
encoded on its own is not encoded as it is inside the whole text:

* SentencePiece vocabularies with a dummy prefix (Llama-2, Mistral v0.1-v0.3, Phi-3, TinyLlama: a
  ``Prepend("▁")`` normalizer, or ``Metaspace`` with ``prepend_scheme="always"``/``"first"``) put ``▁`` (a
  space) before it; byte-level ones with ``add_prefix_space=True`` put a space before it;
* after a special token some of them put it again (``Prepend``, ``"always"``) and some do not (``"first"``,
  Llama's ``legacy=False``).

Such a lead moves every byte offset of the window by its length, so the converted draft reads
``' climbed'`` -> ``['▁', '▁clim', 'bed']``. Rather than reading the kind from the model name, the
tokenizer is asked (:func:`probe_text_boundaries`): encode a short known text on its own, after a special
token, and after candidate *anchors* (a newline, ...) and compare the bytes. A window is then encoded
after an anchor whose tokens are dropped again -- inside a text, where no lead is added -- or, where the
window starts the text or follows a special token, with the lead the probe found taken off the window's
text first (the tokenizer puts it back). Callers still check the resulting byte offsets and fall back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

#: Known contexts tried before a window, best first: a newline ends a pre-token in every byte-level regex
#: and is a byte-fallback token in Llama-style vocabularies; a private-use character is byte fallback in
#: SentencePiece vocabularies; ``"."`` serves windows that start with a newline (``"\n\n"`` would merge).
ANCHORS = ("\n", "\ue000", ".")
#: Texts whose bytes every normalizer we know leaves alone; an anchor must keep each exactly as it is.
PROBE_TEXTS = ("the", " the", "x", "1")


class TokenTable(Protocol):
    """What this module reads of :class:`hf_hetspec.alignment.Vocabulary` (which imports this module)."""

    token_bytes: list[bytes]
    special_ids: frozenset[int]
    bos_prefix: tuple[int, ...]
    text_boundaries: "TextBoundaries"

    def encode(self, text: str, parse_special: bool = False) -> list[int]: ...

    def ids_to_bytes(self, ids: list[int]) -> bytes: ...


@dataclass(frozen=True)
class TextBoundaries:
    """What one tokenizer does where the text it encodes starts (from :func:`probe_text_boundaries`).

    Attributes:
        start_lead: text the tokenizer puts before a text that starts with a letter: ``" "`` for a dummy
            prefix ``▁`` or ``add_prefix_space``, ``""`` otherwise.
        special_lead: the same after a special token (``" "`` for ``Prepend``, ``""`` for Llama's
            ``legacy=False``); ``None`` when no special token could be probed.
        anchors (tuple of (str, tuple[int, ...])): anchors of :data:`ANCHORS` after which the tokenizer
            encodes text exactly as it is, with their own token ids; empty when none works.
    """

    start_lead: str
    special_lead: str | None
    anchors: tuple[tuple[str, tuple[int, ...]], ...]


def _lead(spelled: bytes, text: str) -> str:
    """What an encoding that spells ``spelled`` added before ``text`` (``""`` when it is not a prefix)."""
    tail = text.encode("utf-8")
    if not spelled.endswith(tail):
        return ""
    try:
        return spelled[: len(spelled) - len(tail)].decode("utf-8")
    except UnicodeDecodeError:
        return ""


def _after_special(vocab: TokenTable, special_id: int, text: str) -> list[int] | None:
    """``text`` encoded after the special token ``special_id`` (its content parsed as that token), or
    ``None`` when the tokenizer does not give that token back first. Only for known texts: it parses
    special-token strings in ``text`` too."""
    content = vocab.token_bytes[special_id].decode("utf-8", errors="replace")
    ids = vocab.encode(content + text, parse_special=True)
    return ids[1:] if ids[:1] == [special_id] else None


def probe_text_boundaries(vocab: TokenTable) -> TextBoundaries:
    """Probe how ``vocab``'s tokenizer encodes the start of a text (a few dozen short encodes, ~ms).

    Raises:
        nothing: a tokenizer that passes no probe gets an empty ``anchors`` (windows are then encoded as
        text starts, the behaviour before this probe existed).
    """
    start_lead = _lead(vocab.ids_to_bytes(vocab.encode("x")), "x")
    special_lead = None
    for special_id in sorted(vocab.special_ids):
        ids = _after_special(vocab, special_id, "x")
        if ids is not None:
            special_lead = _lead(vocab.ids_to_bytes(ids), "x")
            break
    anchors = []
    for anchor in ANCHORS:
        anchor_ids = tuple(vocab.encode(anchor))
        if all(_keeps(vocab, anchor, anchor_ids, text) for text in PROBE_TEXTS):
            anchors.append((anchor, anchor_ids))
    return TextBoundaries(start_lead, special_lead, tuple(anchors))


def _keeps(vocab: TokenTable, anchor: str, anchor_ids: tuple[int, ...], text: str) -> bool:
    """Whether ``text`` after ``anchor`` encodes to the anchor's own ids and then exactly ``text``'s bytes."""
    ids = _strip_anchor(anchor_ids, vocab.encode(anchor + text))
    return ids is not None and vocab.ids_to_bytes(ids) == text.encode("utf-8")


def _strip_anchor(anchor_ids: tuple[int, ...], ids: list[int]) -> list[int] | None:
    n = len(anchor_ids)
    return ids[n:] if tuple(ids[:n]) == anchor_ids else None


def encode_inside(vocab: TokenTable, text: str) -> list[int] | None:
    """Ids of ``text`` as the tokenizer encodes it inside a longer text, after a line break (no lead).

    Returns:
        list of ids, or ``None`` when every probed anchor merges with the start of ``text``.
    """
    for anchor, anchor_ids in vocab.text_boundaries.anchors:
        ids = _strip_anchor(anchor_ids, vocab.encode(anchor + text))
        if ids is not None:
            return ids
    return None


def encode_after(vocab: TokenTable, context_ids: list[int], start: int, text: str,
                 spelled_lead: bool = True) -> list[int] | None:
    """Ids of ``text`` as the tokenizer encodes it after ``context_ids[:start]``.

    ``text`` usually begins with the bytes of context tokens ``context_ids[start:]`` (a window) and the
    result then re-spells them; its bytes start exactly where ``context_ids[:start]`` ends (when the
    tokenizer does what the probe found: callers check the offsets).

    * ``context_ids[:start]`` is empty or the tokenizer's own BOS prefix: the text starts; its lead (the
      dummy-prefix space that the first token of the window already spells) is taken off and the tokenizer
      puts it back.
    * it ends with a special token: as above with the lead the tokenizer puts after a special token.
    * otherwise: after an anchor (:func:`encode_inside`).

    With ``spelled_lead=False`` ``text`` is plain text (a prompt's), not the bytes of context tokens: it is
    encoded as it stands, and the tokenizer puts its lead before it where it would in the whole text.

    Args:
        vocab: byte table of the tokenizer.
        context_ids: token ids (list of ints of this vocabulary); only ``context_ids[:start]`` is read.
        start: number of context tokens before ``text``.
        text: text to encode (complete UTF-8 characters).

    Returns:
        list of ids, or ``None`` when no probed way of encoding fits (callers encode ``text`` plainly).
    """
    probe = vocab.text_boundaries
    prefix = vocab.bos_prefix
    if start <= len(prefix) and tuple(context_ids[:start]) == prefix[:start]:
        lead = probe.start_lead
    elif context_ids[start - 1] in vocab.special_ids:
        lead = probe.special_lead
        if lead is None:
            return None
        if lead != probe.start_lead:
            # no lead after a special token but one at the start of a text (Metaspace "first")
            return encode_inside(vocab, text) if lead == "" else None
    else:
        return encode_inside(vocab, text)
    if spelled_lead and lead and text.startswith(lead):
        text = text[len(lead):]
    return vocab.encode(text)
