"""How often windowed text conversion gives the tokens the tokenizer gives the whole text.

SLEM converts drafted text into target tokens, and every algorithm re-synchronises the drafter's context,
through a window of known tokens (:class:`~hf_hetspec.alignment.TextWindowConverter`). Where that
conversion differs from encoding the whole text, drafts are rejected although the drafter guessed the
text right (Timor et al. 2025, Section 3: SLEM's acceptance rests on the re-tokenization being the
target's own). :func:`conversion_agreement` measures it on sample texts, so a tokenizer family the
converter does not handle shows up as a low rate (``hf-hetspec analyze`` reports it for both tokenizers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .alignment import TextWindowConverter, Vocabulary

#: Tokens of new text converted at each boundary.
SPAN_TOKENS = 8
#: Boundaries measured per text (the first ones): each costs three encodes of the text up to it.
MAX_BOUNDARIES = 128


@dataclass(frozen=True)
class ConversionAgreement:
    """Agreement of windowed conversion with whole-text encoding for one tokenizer.

    Attributes:
        boundaries: token boundaries measured (where the shorter text ``head + span`` still has a token
            boundary after ``head``; elsewhere no context could be kept fixed).
        agreeing: boundaries where both directions equal the whole-text encoding: the fixed-context
            conversion (``continuation``, the target's side of SLEM) and the re-synchronisation that may
            replace window tokens (``resync``, the drafter's side).
        examples: up to three disagreements, ``"<window text> | <new text>: <got> != <whole>"``.
    """

    boundaries: int
    agreeing: int
    examples: tuple[str, ...] = field(default=())

    @property
    def rate(self) -> float:
        """``agreeing / boundaries`` (``nan`` when nothing was measured)."""
        return self.agreeing / self.boundaries if self.boundaries else float("nan")


def conversion_agreement(vocab: Vocabulary, texts: list[str], *, window: int = 4, span: int = SPAN_TOKENS,
                         max_boundaries: int = MAX_BOUNDARIES) -> ConversionAgreement:
    """Measure, at each token boundary of each text, whether converting the next ``span`` tokens' text
    after the tokens before the boundary gives what encoding the text up to there gives.

    Args:
        vocab: byte table of the tokenizer.
        texts: sample texts (list of str), encoded without special tokens.
        window: the converter's window (tokens), as in ``generate()``.
        span: tokens of new text per boundary.
        max_boundaries: boundaries measured per text, from its start.

    Returns:
        :class:`ConversionAgreement`.
    """
    converter = TextWindowConverter(vocab, window)
    lead = vocab.text_boundaries.start_lead
    boundaries = agreeing = 0
    examples: list[str] = []
    for text in texts:
        ids = vocab.encode(text)
        ends = [0]
        for tok in ids:
            ends.append(ends[-1] + len(vocab.token_bytes[tok]))
        data = vocab.ids_to_bytes(ids)
        for i in range(1, min(len(ids), max_boundaries + 1)):
            j = min(len(ids), i + span)
            try:
                new_text = data[ends[i]:ends[j]].decode("utf-8")
                head_text = data[:ends[j]].decode("utf-8")
            except UnicodeDecodeError:  # a boundary inside a character: no text to convert
                continue
            # the dummy prefix is spelled by the first token, not part of the text: the tokenizer adds it
            whole = vocab.encode(head_text[len(lead):] if lead and head_text.startswith(lead) else head_text)
            if whole[:i] != ids[:i]:
                continue
            cont = converter.continuation(ids[:i], new_text)
            n_keep, fresh = converter.resync(ids, i, new_text)
            boundaries += 1
            if cont == whole[i:] and ids[:n_keep] + fresh == whole:
                agreeing += 1
            elif len(examples) < 3:
                start = converter.window_start(ids[:i])
                examples.append(f"{data[ends[start]:ends[i]]!r} | {new_text!r}: "
                                f"{vocab.tokenizer.convert_ids_to_tokens(cont)} != "
                                f"{vocab.tokenizer.convert_ids_to_tokens(whole[i:])}")
    return ConversionAgreement(boundaries, agreeing, tuple(examples))
