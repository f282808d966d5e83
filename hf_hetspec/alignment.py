"""Tokens as bytes, vocabulary comparison and text conversion windows between two tokenizers.

Everything here works on *bytes*, the one representation both tokenizers agree on:

* a byte-level BPE token (GPT-2 / Qwen / SmolLM2 style, ``Ġ`` space marker) is mapped back through the
  byte <-> unicode table;
* a SentencePiece-style token (Llama / Gemma style) contributes its text with ``▁`` read as a space, and a
  byte-fallback token ``<0xNN>`` contributes the single byte ``NN``;
* an added token (special or not) contributes its content.

A :class:`Vocabulary` holds that table for one tokenizer; :class:`TextWindowConverter` re-tokenizes text
that continues an already fixed token sequence (Section 3 of Timor et al. 2025: SLEM decodes the drafter's
tokens to text and re-encodes the text for the target; doing that through a window of known context keeps
leading spaces, merges across the boundary and normalization identical to what the tokenizer would do to
the whole text).
"""

from __future__ import annotations

import hashlib
import json
import re
import weakref
from dataclasses import dataclass, field
from functools import cached_property

from transformers import PreTrainedTokenizerBase
from transformers.convert_slow_tokenizer import bytes_to_unicode

from .boundary import TextBoundaries, encode_after, probe_text_boundaries

#: A SentencePiece byte-fallback token, ``<0xNN>``: it spells the one byte ``NN``.
BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_UNICODE_TO_BYTE = {ch: b for b, ch in bytes_to_unicode().items()}
_SPACES = (b" ", b"\n", b"\t", b"\r")


def _decoder_kind(tokenizer: PreTrainedTokenizerBase) -> str:
    """Classify how a fast tokenizer turns token strings into text: ``"byte_level"`` or ``"metaspace"``.

    Raises:
        ValueError: the tokenizer is not a fast (``tokenizers``-backed) tokenizer, or its decoder is of a
            kind this module cannot read token bytes from.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(
            f"tokenizer {type(tokenizer).__name__} has no `backend_tokenizer`: hf_hetspec needs a fast "
            "tokenizer (load it with `AutoTokenizer.from_pretrained(..., use_fast=True)`)."
        )
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    text = json.dumps(decoder)
    if '"ByteLevel"' in text:
        return "byte_level"
    if '"ByteFallback"' in text or "\u2581" in text or '"Metaspace"' in text:
        return "metaspace"
    raise ValueError(
        f"cannot read token bytes from tokenizer {getattr(tokenizer, 'name_or_path', '')!r}: its decoder "
        f"{decoder.get('type')!r} is neither ByteLevel nor SentencePiece-style (Metaspace/ByteFallback)."
    )


@dataclass(frozen=True)
class Vocabulary:
    """The bytes each token id of one tokenizer contributes to the text.

    Attributes:
        tokenizer: the fast tokenizer this table was read from.
        token_bytes (list[bytes] of length V): bytes of token id ``i``; ``b""`` for ids with no token.
        special_ids (frozenset[int]): ids of special (control) tokens: BOS/EOS/PAD, chat-template markers.
            Their bytes are their content string, but they are never produced by encoding plain text
            unless the text contains that literal string.
    """

    tokenizer: PreTrainedTokenizerBase
    token_bytes: list[bytes]
    special_ids: frozenset[int]
    kind: str = field(default="byte_level")

    @classmethod
    def from_tokenizer(cls, tokenizer: PreTrainedTokenizerBase) -> "Vocabulary":
        """Read the byte table of a fast tokenizer (see the module docstring for the rules)."""
        kind = _decoder_kind(tokenizer)
        vocab = tokenizer.get_vocab()  # token string -> id, added tokens included
        size = max(vocab.values()) + 1
        table = [b""] * size
        added = {i: tok for i, tok in tokenizer.added_tokens_decoder.items()}
        for token, idx in vocab.items():
            if idx in added:
                table[idx] = added[idx].content.encode("utf-8")
            elif kind == "byte_level":
                try:
                    table[idx] = bytes(_UNICODE_TO_BYTE[ch] for ch in token)
                except KeyError:  # not a byte-level string: a plain added piece
                    table[idx] = token.encode("utf-8")
            else:
                m = BYTE_FALLBACK.match(token)
                table[idx] = bytes([int(m.group(1), 16)]) if m else token.replace("\u2581", " ").encode("utf-8")
        special = frozenset(i for i, tok in added.items() if tok.special)
        return cls(tokenizer=tokenizer, token_bytes=table, special_ids=special, kind=kind)

    def __len__(self) -> int:
        return len(self.token_bytes)

    def padded(self, size: int) -> "Vocabulary":
        """This table extended to ``size`` ids: rows of a padded embedding matrix have no token and spell
        nothing (``b""``). A model can still emit such an id; it then contributes no text. The same object
        for every call with the same ``size``, so its digest is computed once."""
        if size <= len(self.token_bytes):
            return self
        if size not in self._padded_tables:
            self._padded_tables[size] = Vocabulary(
                self.tokenizer, self.token_bytes + [b""] * (size - len(self.token_bytes)), self.special_ids, self.kind
            )
        return self._padded_tables[size]

    @cached_property
    def _padded_tables(self) -> dict[int, "Vocabulary"]:
        return {}

    def same_as(self, other: "Vocabulary") -> bool:
        """Whether both tables spell every id with the same bytes and mark the same ids special: the one test
        of "the same vocabulary" (never ``vocab_size``, which padded embeddings change)."""
        return self.fingerprint == other.fingerprint

    def ids_to_bytes(self, ids: list[int]) -> bytes:
        """Concatenated bytes of ``ids`` (list of token ids of this vocabulary)."""
        tb = self.token_bytes
        return b"".join(tb[i] for i in ids)

    def encode(self, text: str, parse_special: bool = False) -> list[int]:
        """Token ids of ``text`` as plain text, without BOS/EOS.

        Args:
            text: the text to encode.
            parse_special: ``False`` (default): a special-token string in ``text`` (``"<|endoftext|>"``,
                ``"<start_of_turn>"``) is ordinary text and encodes to ordinary tokens, as it must for text a
                model generated token by token or a user typed (fault class 11 of the hardening issue: such
                text turning into a control token on the other side). ``True``: such strings become the
                special tokens (``tokenizer.encode``'s default).

        The tokenizer's ``split_special_tokens`` switch on its ``tokenizers`` backend is restored afterwards,
        so a caller of ``tokenizer.backend_tokenizer`` sees the tokenizer unchanged.
        """
        if parse_special:
            return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=False)
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        before = getattr(backend, "encode_special_tokens", None)
        try:
            return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        finally:
            if before is not None and backend.encode_special_tokens != before:
                backend.encode_special_tokens = before

    @cached_property
    def digest(self) -> str:
        """sha256 of the id -> bytes table, the special ids and the EOS/BOS/PAD ids (disk-cache keys)."""
        h = hashlib.sha256(len(self.token_bytes).to_bytes(8, "little"))
        for data in self.token_bytes:
            h.update(len(data).to_bytes(2, "little"))
            h.update(data)
        h.update(repr(sorted(self.special_ids)).encode())
        for role in ("eos_token_id", "bos_token_id", "pad_token_id"):
            h.update(repr(getattr(self.tokenizer, role, None)).encode())
        return h.hexdigest()

    @cached_property
    def fingerprint(self) -> tuple:
        """Hashable identity of the id -> bytes map plus the special ids (used to compare vocabularies)."""
        return (tuple(self.token_bytes), tuple(sorted(self.special_ids)))

    @cached_property
    def text_boundaries(self) -> TextBoundaries:
        """How the tokenizer encodes the start of a text (dummy prefix, ``add_prefix_space``), probed once
        per table by :func:`~hf_hetspec.boundary.probe_text_boundaries`."""
        return probe_text_boundaries(self)

    @cached_property
    def bos_prefix(self) -> tuple[int, ...]:
        """The ids the tokenizer puts before any text when it adds special tokens (``(<bos>,)`` for Gemma,
        ``()`` for Qwen2.5 and SmolLM2); suffixes such as an appended EOS are never part of it."""
        tok = self.tokenizer
        plain = tok.encode("a", add_special_tokens=False)
        full = tok.encode("a", add_special_tokens=True)
        for i in range(len(full) - len(plain) + 1):
            if full[i : i + len(plain)] == plain:
                return tuple(full[:i])
        return ()


_VOCABS: "weakref.WeakKeyDictionary[PreTrainedTokenizerBase, Vocabulary]" = weakref.WeakKeyDictionary()


def vocabulary(tokenizer: PreTrainedTokenizerBase) -> Vocabulary:
    """The byte table of ``tokenizer``, read once per tokenizer object (:meth:`Vocabulary.from_tokenizer`).

    The cached table (and its padded copies) holds the tokenizer through a ``weakref.proxy``, so the cache
    never keeps a tokenizer or its table alive: both are freed when the caller drops the tokenizer. Keep the
    tokenizer while using the table. A tokenizer that cannot be weakly referenced gets a fresh, uncached table.
    """
    try:
        return _VOCABS[tokenizer]
    except KeyError:
        vocab = Vocabulary.from_tokenizer(weakref.proxy(tokenizer))
        _VOCABS[tokenizer] = vocab
        return vocab
    except TypeError:
        return Vocabulary.from_tokenizer(tokenizer)


def same_vocabulary(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase) -> bool:
    """True when two tokenizers spell every id with the same bytes and mark the same ids special
    (:meth:`Vocabulary.same_as`; never judged by ``vocab_size``: padded embedding matrices make it differ for
    identical tokenizers, and different tokenizers can share a size)."""
    return a is b or vocabulary(a).same_as(vocabulary(b))


def convert_prompt(source: Vocabulary, dest: Vocabulary, source_ids: list[int]) -> list[int]:
    """A prompt given in ``source`` token ids, in ``dest`` token ids (the default drafter prompt).

    * Runs of ordinary tokens become their text, encoded by ``dest`` as plain text
      (:meth:`Vocabulary.encode`): a special-token *string* typed in the prompt stays characters. A
      dummy-prefix space that the source tokenizer put before the text (Llama-2's ``▁``) is dropped, and
      ``dest`` puts its own where it would in the whole text
      (:func:`~hf_hetspec.boundary.encode_after`).
    * A special token becomes the ``dest`` special token with the same content where ``dest`` has one
      (ChatML's ``<|im_start|>`` / ``<|im_end|>`` between Qwen2.5 and SmolLM2); else the source's BOS (by
      role) is dropped (``dest`` gets its own prefix, below) and any other special token becomes its
      content as plain text, so the drafter still sees where a turn starts. For a drafter whose chat
      template differs (Gemma's ``<start_of_turn>``), pass the drafter-side prompt explicitly
      (``assistant_input_ids=``, :func:`hf_hetspec.chat_inputs`).
    * ``dest``'s own prefix (:attr:`Vocabulary.bos_prefix`, e.g. Gemma's ``<bos>``) comes first, once.
    * The result is never empty: a prompt that converts to nothing (only the source's BOS) becomes
      ``dest``'s BOS, else its EOS.

    Args:
        source, dest: byte tables of the two tokenizers.
        source_ids: the prompt (list of ``source`` ids, non-empty).

    Returns:
        list of ``dest`` ids.

    Raises:
        ValueError: the result would be empty and ``dest`` has neither a BOS nor an EOS token.
    """
    by_content: dict[bytes, int] = {}
    for d_id in sorted(dest.special_ids):
        by_content.setdefault(dest.token_bytes[d_id], d_id)
    source_bos = source.tokenizer.bos_token_id
    ids = list(dest.bos_prefix)
    run: list[int] = []
    # what the source tokenizer put before the run's text (its dummy prefix ▁): no part of the text
    lead = source.text_boundaries.start_lead

    def flush() -> None:
        if run:
            text = source.ids_to_bytes(run).decode("utf-8", errors="replace")
            text = text[len(lead):] if lead and text.startswith(lead) else text
            converted = encode_after(dest, ids, len(ids), text, spelled_lead=False)
            ids.extend(dest.encode(text) if converted is None else converted)
            run.clear()

    for s_id in source_ids:
        if s_id not in source.special_ids:
            run.append(s_id)
            continue
        d_id = by_content.get(source.token_bytes[s_id])
        if d_id is not None:
            flush()
            lead = source.text_boundaries.special_lead or ""
            if not (ids == list(dest.bos_prefix) == [d_id]):  # the prefix already is this BOS
                ids.append(d_id)
        elif s_id == source_bos:
            flush()
            lead = source.text_boundaries.start_lead
        else:
            run.append(s_id)  # its content, as text
    flush()
    if not ids:
        tok = dest.tokenizer
        fallback = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        if fallback is None:
            raise ValueError(
                "the prompt converts to no drafter token and the drafter tokenizer has neither a BOS nor an EOS "
                "token: pass the drafter's prompt as `assistant_input_ids=`."
            )
        ids = [fallback]
    return ids


def complete_utf8_prefix(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8 character.

    Only the tail is inspected: a byte-level token can end in the middle of a multi-byte character,
    whose remaining bytes arrive with the next token.
    """
    n = len(data)
    # walk back over at most 3 continuation bytes to the lead byte of the last character
    i = n - 1
    while i >= 0 and n - i <= 4 and (data[i] & 0xC0) == 0x80:
        i -= 1
    if i < 0:
        return 0
    lead = data[i]
    if lead < 0x80:
        need = 1
    elif lead >> 5 == 0b110:
        need = 2
    elif lead >> 4 == 0b1110:
        need = 3
    elif lead >> 3 == 0b11110:
        need = 4
    else:  # invalid lead byte: leave the text as it is; decoding will report it
        return n
    return n if n - i >= need else i


def valid_utf8_prefix(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that is valid, complete UTF-8."""
    try:
        data.decode("utf-8")
        return len(data)
    except UnicodeDecodeError as err:
        return err.start


def sanitize_utf8(data: bytes) -> bytes:
    """``data`` with every invalid byte sequence replaced by U+FFFD (as UTF-8 bytes).

    The text-level view of generated bytes: a tokenizer encodes text, so bytes that are not text (a model
    can emit a stray continuation byte) reach the other vocabulary as the replacement character.
    """
    try:
        data.decode("utf-8")
        return data
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace").encode("utf-8")


def common_prefix_length(a: bytes, b: bytes) -> int:
    """Number of leading bytes ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # invariant: a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class TextWindowConverter:
    """Re-tokenizes text that continues a fixed token sequence, through a window of known context.

    ``continuation(context_ids, new_bytes)`` returns token ids ``c`` such that the bytes of
    ``context_ids + c`` are the bytes of ``context_ids`` followed by ``new_bytes``, tokenized the way the
    tokenizer tokenizes the window text plus the new text. The window is the last ``window`` tokens of the
    context, extended backwards to the start of a word (by at most ``window`` more tokens) and until its
    bytes start on a character boundary, and cut after the last special token of the context. It is
    encoded as the tokenizer encodes it inside the whole text (:func:`~hf_hetspec.boundary.encode_after`:
    no dummy-prefix ``▁`` or ``add_prefix_space`` space before it, probed once per tokenizer), so the
    result is the whole-text encoding for every tokenizer family (issue #16). New
    text is always encoded as plain text
    (:meth:`Vocabulary.encode` with ``parse_special=False``): a literal ``"<|im_end|>"`` that a model
    generated or a user typed stays characters and never becomes a control token on the other side.

    Args:
        vocab: the byte table of the tokenizer to encode with.
        window: number of context tokens re-encoded together with the new text (>= 1).
    """

    def __init__(self, vocab: Vocabulary, window: int = 4):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.vocab = vocab
        self.window = window

    def window_start(self, context_ids: list[int], end: int | None = None, floor: int = 0) -> int:
        """Index where the window over ``context_ids[floor:end]`` starts (on a UTF-8 character boundary
        where possible, and always after the last special token before ``end``).

        A special token is never part of a window: the tokenizer never merges it with its neighbours, so
        the text after it tokenizes on its own, and re-encoding its content string as text would turn a
        real control token into plain characters.
        """
        end = len(context_ids) if end is None else end
        start = max(floor, end - self.window)
        special = self.vocab.special_ids
        for j in range(end - 1, start - 1, -1):
            if context_ids[j] in special:
                return j + 1
        tb = self.vocab.token_bytes
        # a window that starts inside a word is encoded as if the word started there: widen it to the
        # word's start (by at most `window` more tokens)
        limit = max(floor, start - self.window)
        while start > limit and not self._starts_word(context_ids, start):
            if context_ids[start - 1] in special:
                break
            start -= 1
        # a window that starts inside a character cannot be decoded to text; widen it
        while start > floor and tb[context_ids[start]][:1] and (tb[context_ids[start]][0] & 0xC0) == 0x80:
            if context_ids[start - 1] in special:
                break
            start -= 1
        return start

    def _starts_word(self, context_ids: list[int], j: int) -> bool:
        """Whether ``context_ids[j]`` starts with white space or follows a token that ends with it."""
        tb = self.vocab.token_bytes
        return tb[context_ids[j]][:1] in _SPACES or tb[context_ids[j - 1]][-1:] in _SPACES

    def _encode_after(self, context_ids: list[int], start: int, text: str, window: bool) -> list[int]:
        """``text`` encoded as the tokenizer encodes it after ``context_ids[:start]``
        (:func:`~hf_hetspec.boundary.encode_after`; plainly when no probed way fits). ``window``: ``text``
        starts with the bytes of context tokens (which spell the tokenizer's lead, if any)."""
        ids = encode_after(self.vocab, context_ids, start, text, spelled_lead=window)
        return self.vocab.encode(text) if ids is None else ids

    def continuation(self, context_ids: list[int], new_text: str) -> list[int]:
        """Token ids continuing ``context_ids`` with ``new_text``.

        Args:
            context_ids: token ids already fixed (list of ints of this vocabulary).
            new_text: text to append; must be valid text (complete UTF-8 characters).

        Returns:
            list of token ids whose bytes are ``new_text.encode()`` (when the tokenizer does not
            normalize the text) and that start exactly at the end of ``context_ids``.
        """
        if not new_text:
            return []
        start = self.window_start(context_ids)
        win_bytes = self.vocab.ids_to_bytes(context_ids[start:])
        try:
            win_text = win_bytes.decode("utf-8")
        except UnicodeDecodeError:
            start, win_text, win_bytes = len(context_ids), "", b""
        ids = self._encode_after(context_ids, start, win_text + new_text, bool(win_bytes))
        tb = self.vocab.token_bytes
        pos, target = 0, len(win_bytes)
        for i, tok in enumerate(ids):
            if pos >= target:
                break
            pos += len(tb[tok])
        else:
            i = len(ids)
        if pos == target and self.vocab.ids_to_bytes(ids[:i]) == win_bytes:
            return ids[i:]
        # A token of the encoding straddles the window boundary (the canonical tokenization would merge
        # across it, which the fixed context cannot do), or the window was not spelled back: encode the
        # new text on its own, as text that continues the context.
        return self._encode_after(context_ids, len(context_ids), new_text, False)

    def resync(self, context_ids: list[int], keep: int, new_text: str, floor: int = 0) -> tuple[int, list[int]]:
        """Re-tokenize ``context_ids[:keep]`` + ``new_text``, allowed to replace the last window tokens.

        Used for the drafter, whose context may be rewritten (its KV cache is cropped): the window tokens
        are re-encoded with the new text and only the prefix that still matches is kept.

        Returns:
            (n_keep, new_ids): keep ``context_ids[:n_keep]`` (``floor <= n_keep <= keep``) and append
            ``new_ids``.
        """
        if not new_text:
            return keep, []
        start = self.window_start(context_ids, keep, floor)
        win = context_ids[start:keep]
        win_bytes = self.vocab.ids_to_bytes(win)
        try:
            win_text = win_bytes.decode("utf-8")
        except UnicodeDecodeError:
            return keep, self._encode_after(context_ids, keep, new_text, False)
        ids = self._encode_after(context_ids, start, win_text + new_text, bool(win))
        if not self.vocab.ids_to_bytes(ids).startswith(win_bytes):  # the window was not spelled back
            return keep, self._encode_after(context_ids, keep, new_text, False)
        same = 0
        while same < len(win) and same < len(ids) and ids[same] == win[same]:
            same += 1
        return start + same, ids[same:]
