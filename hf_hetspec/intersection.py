"""Byte-exact vocabulary intersection between a target and a drafter tokenizer (TLI, Timor et al. 2025, §3.3).

Two tokens are *shared* when they contribute exactly the same bytes to the text
(:class:`~hf_hetspec.alignment.Vocabulary`): a byte-level ``Ġhello`` and a SentencePiece ``▁hello`` are the
same token, a SentencePiece byte-fallback ``<0xE4>`` equals a byte-level token for byte ``0xE4`` (bytes that
are not valid UTF-8 on their own are still compared as bytes). Special tokens are never shared by string:
they are paired explicitly, by role (EOS <-> EOS) and by identical content (``<|im_end|>`` in both).

When several ids of one tokenizer spell the same bytes (a SentencePiece vocabulary holds both ``A`` and its
byte-fallback ``<0xNN>``), the map sends each drafter id to the target id the target tokenizer itself
would produce for those bytes (the regular token, not the byte-fallback one); several drafter ids may map
to one target id, and the drafter's probability is then *added* (a push-forward, never first-wins).

Maps are built once per pair in ascending id order and cached on disk keyed by a hash of both byte tables.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import LogitsProcessor

from .alignment import BYTE_FALLBACK, Vocabulary

FORMAT_VERSION = 1


@dataclass(frozen=True)
class VocabularyIntersection:
    """Id maps between the shared tokens of two vocabularies.

    Attributes:
        drafter_to_target (``torch.LongTensor`` of shape ``(V_drafter,)``): target id of each drafter id,
            ``-1`` where the drafter token has no target counterpart.
        target_to_drafter (``torch.LongTensor`` of shape ``(V_target,)``): a drafter id spelling the same
            bytes (the lowest such id), ``-1`` where none.
        target_size, drafter_size: ``V_target`` and ``V_drafter`` (table sizes, padded rows included).
    """

    drafter_to_target: torch.Tensor
    target_to_drafter: torch.Tensor
    target_size: int
    drafter_size: int

    def __len__(self) -> int:
        """Number of target tokens that have a drafter counterpart."""
        return int((self.target_to_drafter >= 0).sum())

    @property
    def drafter_shared(self) -> int:
        """Number of drafter tokens that have a target counterpart."""
        return int((self.drafter_to_target >= 0).sum())

    def to(self, device) -> "VocabularyIntersection":
        """The same maps on ``device``."""
        return VocabularyIntersection(
            self.drafter_to_target.to(device), self.target_to_drafter.to(device), self.target_size, self.drafter_size
        )

    def push_forward(self, drafter_probs: torch.Tensor) -> torch.Tensor:
        """Drafter probabilities as probabilities over target ids (mass of unshared tokens is dropped).

        Args:
            drafter_probs (``torch.FloatTensor`` of shape ``(..., V_drafter)``).

        Returns:
            ``torch.FloatTensor`` of shape ``(..., V_target)``: ``out[t] = sum(p[d] for d with map(d) == t)``.
        """
        return push_forward(drafter_probs, self.drafter_to_target, self.target_size)

    def summary(self) -> str:
        """One line: sizes and shares."""
        return (
            f"{len(self)} shared tokens: {len(self) / self.target_size:.1%} of the target's {self.target_size}, "
            f"{self.drafter_shared / self.drafter_size:.1%} of the drafter's {self.drafter_size} ids"
        )


def push_forward(drafter_probs: torch.Tensor, drafter_to_target: torch.Tensor, target_size: int) -> torch.Tensor:
    """Image of a distribution over drafter ids under a map to target ids (one ``scatter_add``).

    Args:
        drafter_probs (``torch.FloatTensor`` of shape ``(..., V)``): ``V`` <= ``len(drafter_to_target)``
            (padded LM-head rows may already be cut off).
        drafter_to_target (``torch.LongTensor`` of shape ``(V_drafter,)``): target id per drafter id, ``-1``
            for ids that map nowhere (their probability must be 0, or it is dropped).
        target_size: ``V_target``.

    Returns:
        ``torch.FloatTensor`` of shape ``(..., V_target)`` with ``out[t] = sum(p[d] for map(d) == t)``.
    """
    n = drafter_probs.shape[-1]
    mapped = drafter_to_target[:n].to(drafter_probs.device)
    values = drafter_probs * (mapped >= 0)
    index = mapped.clamp_min(0).expand_as(values)
    out = drafter_probs.new_zeros(*drafter_probs.shape[:-1], target_size)
    return out.scatter_add_(-1, index, values)


class IntersectionLogitsProcessor(LogitsProcessor):
    """Restricts a drafter's logits to the drafter ids that have a target token: ``-inf`` for the others.

    TLI's restriction to the vocabulary intersection (Timor et al. 2025, Algorithm 4, with ``drafter_to_target``
    = :attr:`VocabularyIntersection.drafter_to_target`) and SLRS's to the ids its prefix map sends somewhere
    (:func:`prefix_map_for`); the softmax of the result is the drafter's distribution renormalized over them.
    transformers' own universal assisted generation does this with a generic suppress-tokens processor.

    Args:
        drafter_to_target (``torch.LongTensor`` of shape ``(V,)``): target id per column of the drafter's
            logits, ``-1`` for columns to remove.
    """

    def __init__(self, drafter_to_target: torch.Tensor):
        self.mask = torch.where(drafter_to_target >= 0, 0.0, float("-inf"))  # [V]

    def __call__(self, input_ids: torch.LongTensor | None, scores: torch.FloatTensor) -> torch.FloatTensor:
        """``scores`` (``(batch, V)``, any float dtype) as float32 with the unmapped columns at ``-inf``;
        ``input_ids`` is not read (the restriction does not depend on the context)."""
        return scores.float() + self.mask.to(scores.device)


def _canonical_ids(vocab: Vocabulary) -> dict[bytes, int]:
    """bytes -> the id the tokenizer uses for them: regular tokens before byte-fallback ones, then lowest id."""
    tokens = vocab.tokenizer.convert_ids_to_tokens(list(range(len(vocab.tokenizer))))
    best: dict[bytes, int] = {}
    fallback: dict[bytes, int] = {}
    for idx, data in enumerate(vocab.token_bytes):
        if not data or idx in vocab.special_ids:
            continue
        token = tokens[idx] if idx < len(tokens) else None
        table = fallback if (vocab.kind == "metaspace" and token and BYTE_FALLBACK.match(token)) else best
        table.setdefault(data, idx)
    for data, idx in fallback.items():
        best.setdefault(data, idx)
    return best


def special_token_pairs(target: Vocabulary, drafter: Vocabulary) -> list[tuple[int, int]]:
    """(drafter id, target id) for special tokens: same role (EOS/BOS/PAD) or same content."""
    pairs = {}
    t_tok, d_tok = target.tokenizer, drafter.tokenizer
    for role in ("eos_token_id", "bos_token_id", "pad_token_id"):
        d_id, t_id = getattr(d_tok, role, None), getattr(t_tok, role, None)
        if d_id is not None and t_id is not None:
            pairs.setdefault(d_id, t_id)
    by_content = {target.token_bytes[i]: i for i in sorted(target.special_ids)}
    for d_id in sorted(drafter.special_ids):
        t_id = by_content.get(drafter.token_bytes[d_id])
        if t_id is not None:
            pairs[d_id] = t_id  # the same literal control token beats a role guess
    return sorted(pairs.items())


def _build(target: Vocabulary, drafter: Vocabulary) -> VocabularyIntersection:
    canonical = _canonical_ids(target)
    d2t = torch.full((len(drafter),), -1, dtype=torch.long)
    t2d = torch.full((len(target),), -1, dtype=torch.long)
    for d_id, data in enumerate(drafter.token_bytes):
        if not data or d_id in drafter.special_ids:
            continue
        t_id = canonical.get(data)
        if t_id is not None:
            d2t[d_id] = t_id
    for d_id, t_id in special_token_pairs(target, drafter):
        if d_id < len(drafter) and t_id < len(target):
            d2t[d_id] = t_id
    shared = (d2t >= 0).nonzero().flatten()
    # lowest drafter id per target id: scatter in descending order so the lowest id is written last
    order = shared.flip(0)
    t2d[d2t[order]] = order
    return VocabularyIntersection(d2t, t2d, len(target), len(drafter))


def _build_prefix_map(target: Vocabulary, drafter: Vocabulary) -> torch.Tensor:
    """SLRS's map f: drafter id -> the longest target token whose bytes are a prefix of the drafter token's.

    Every drafter token with bytes has an image when the target spells every single byte (byte-level BPE,
    or byte fallback); special tokens map by role/content or to ``-1`` (never drafted).
    """
    canonical = _canonical_ids(target)
    longest = max((len(b) for b in canonical), default=0)
    f = torch.full((len(drafter),), -1, dtype=torch.long)
    for d_id, data in enumerate(drafter.token_bytes):
        if not data or d_id in drafter.special_ids:
            continue
        for size in range(min(len(data), longest), 0, -1):
            t_id = canonical.get(data[:size])
            if t_id is not None:
                f[d_id] = t_id
                break
    for d_id, t_id in special_token_pairs(target, drafter):
        if d_id < len(drafter) and t_id < len(target):
            f[d_id] = t_id
    return f


def prefix_map_for(target: Vocabulary, drafter: Vocabulary, use_cache: bool = True) -> torch.Tensor:
    """SLRS's longest-prefix map (``torch.LongTensor`` of shape ``(V_drafter,)``), disk-cached like the
    intersection."""
    build = lambda: {"drafter_to_target": _build_prefix_map(target, drafter)}  # noqa: E731
    tensors = _cached(f"prefix-{_key(target, drafter)}", build) if use_cache else build()
    return tensors["drafter_to_target"]


#: The environment variable naming hf_hetspec's cache folder (:func:`cache_root`).
HOME_ENV = "HF_HETSPEC_HOME"


def cache_root() -> Path:
    """hf_hetspec's cache folder (not created here): ``$HF_HETSPEC_HOME``, default ``~/.cache/hf_hetspec``; it
    holds the vocabulary maps, measured verify costs and the zoo's models."""
    home = os.environ.get(HOME_ENV)
    return Path(home).expanduser() if home else Path.home() / ".cache" / "hf_hetspec"


def cache_dir() -> Path:
    """``cache_root()/intersections`` (default ``~/.cache/hf_hetspec/intersections``)."""
    return cache_root() / "intersections"


def _key(target: Vocabulary, drafter: Vocabulary) -> str:
    return hashlib.sha256(f"v{FORMAT_VERSION}:{target.digest}:{drafter.digest}".encode()).hexdigest()[:32]


#: How many maps of each kind a process keeps in memory (the most recently used; a map of two real vocabularies
#: is a few MB, and a process rarely decodes with more than a few pairs).
MEMORY_PAIRS = 4
_MEMORY: "OrderedDict[str, dict[str, torch.Tensor]]" = OrderedDict()


def remembered(memory: OrderedDict, key, build, size: int = MEMORY_PAIRS):
    """``memory[key]``, built by ``build()`` when absent; ``memory`` keeps the ``size`` most recently used
    values, so a long-lived process that meets many vocabulary pairs does not grow without bound."""
    if key in memory:
        memory.move_to_end(key)
        return memory[key]
    memory[key] = value = build()
    while len(memory) > size:
        memory.popitem(last=False)
    return value


def _cached(name: str, build) -> dict[str, torch.Tensor]:
    """Tensors stored under ``cache_dir()/name.safetensors``, built by ``build()`` when absent or unreadable;
    kept in memory (:func:`remembered`), so a ``generate()`` call does not reread the file."""
    return remembered(_MEMORY, name, lambda: _read_or_build(name, build))


def _read_or_build(name: str, build) -> dict[str, torch.Tensor]:
    path = cache_dir() / f"{name}.safetensors"
    if path.is_file():
        try:
            return load_file(str(path))
        except Exception as err:  # a corrupt cache file: rebuild it, and say so
            warnings.warn(f"rebuilding {name}: cache file {path} is unreadable ({err})")
    tensors = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        save_file(tensors, str(tmp))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache only costs the rebuild next time
    return tensors


def intersection_for(target: Vocabulary, drafter: Vocabulary, use_cache: bool = True) -> VocabularyIntersection:
    """The intersection of two byte tables, from the disk cache when present (see the module docstring)."""
    if not use_cache:
        return _build(target, drafter)

    def build():
        result = _build(target, drafter)
        return {"drafter_to_target": result.drafter_to_target, "target_to_drafter": result.target_to_drafter}

    t = _cached(_key(target, drafter), build)
    return VocabularyIntersection(t["drafter_to_target"], t["target_to_drafter"], len(target), len(drafter))


def vocabulary_intersection(target_tokenizer, drafter_tokenizer) -> VocabularyIntersection:
    """Byte-exact vocabulary intersection of two fast tokenizers (public API; see the module docstring).

    Raises:
        ValueError: a tokenizer whose token bytes cannot be read (not a fast BPE/SentencePiece tokenizer).
    """
    return intersection_for(Vocabulary.from_tokenizer(target_tokenizer), Vocabulary.from_tokenizer(drafter_tokenizer))
