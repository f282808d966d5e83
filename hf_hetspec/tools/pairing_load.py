"""Reading a pairing card: from a folder, a card file or a Hub repository (only ``README.md`` is downloaded),
checked before anything loads (:mod:`hf_hetspec.tools.card_policy`; a card that could hang its reader is
refused by :func:`_check_header`), and its models loaded with :func:`hf_hetspec.tools.zoo.load`.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from huggingface_hub import ModelCard

from . import zoo
from .pairing_card import CARD_FILE, CARD_KEY, generate_settings
from .card_policy import PairingError, check_metadata, check_settings, model_reference

HUB_PROBE_SECONDS = 3.0
#: The largest card file :func:`read_card` reads (bytes); a written card is a few KB.
MAX_CARD_BYTES = 1 << 20


# --------------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------------


@dataclass
class Pairing:
    """A pairing read from a model card.

    Attributes:
        target, drafter: the models (``None`` with ``load_models=False``).
        target_tokenizer, drafter_tokenizer: their tokenizers (``None`` with ``load_models=False``).
        settings: recommended ``generate()`` keyword arguments at the lowest measured temperature (greedy
            when measured), e.g. ``{"hetspec_algorithm": "slem", "do_sample": False}``.
        card: the ``huggingface_hub.ModelCard``.
        metadata: the card's ``hf_hetspec`` metadata (module docstring).
    """

    target: object
    drafter: object
    target_tokenizer: object
    drafter_tokenizer: object
    settings: dict
    card: ModelCard
    metadata: dict = field(default_factory=dict)

    def settings_for(self, temperature: float | None = None) -> dict:
        """Recommended ``generate()`` kwargs at ``temperature`` (the measured temperature nearest to it;
        ``None``: :attr:`settings`). A temperature the card did not measure keeps its algorithm and lookahead
        but samples at the temperature asked for."""
        if temperature is None:
            return dict(self.settings)
        entries = self.metadata.get("recommended") or []
        if not entries:
            return dict(self.settings)
        nearest = min(entries, key=lambda e: (abs(float(e["temperature"]) - temperature), e["temperature"]))
        return generate_settings(nearest["algorithm"], float(temperature), nearest.get("lookahead"))

    def generate_kwargs(self, temperature: float | None = None) -> dict:
        """:meth:`settings_for` plus ``assistant_model``, ``tokenizer`` and ``assistant_tokenizer``.

        The settings are checked against the allow-list again (:func:`hf_hetspec.tools.card_policy.check_settings`)
        and the models are set last, so nothing from the card can replace them or add other arguments.

        Raises:
            PairingError: the pairing was loaded with ``load_models=False``, or settings outside the allow-list.
        """
        if self.drafter is None or self.target_tokenizer is None:
            raise PairingError("this pairing was loaded with load_models=False; load it with load_models=True")
        settings = check_settings(self.settings_for(temperature))
        return {**settings, "assistant_model": self.drafter, "tokenizer": self.target_tokenizer,
                "assistant_tokenizer": self.drafter_tokenizer}


def _hub_offline() -> bool:
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return bool(constants.HF_HUB_OFFLINE) or env in ("1", "ON", "YES", "TRUE")


def _hub_reachable(timeout: float = HUB_PROBE_SECONDS) -> bool:
    """Whether a TCP connection to the Hub endpoint opens within ``timeout`` seconds (always ``True`` behind a
    proxy, which the probe cannot see through)."""
    from huggingface_hub import constants

    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def _card_file(path_or_repo_id: str | os.PathLike) -> tuple[Path, bool]:
    """The local ``README.md`` of a folder, a card file, or a Hub repository (downloaded: that file only), and
    whether it came from a local folder (its model references may then name folders inside it)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    name = os.fspath(path_or_repo_id)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / CARD_FILE).is_file():
            raise PairingError(f"{name}: the folder has no {CARD_FILE}; write one with hf_hetspec.tools.pairing.write_card "
                               "(or `hf-hetspec bench --write-card`)")
        return path / CARD_FILE, True
    if path.is_file():
        return path, True
    if name.startswith(("/", ".", "~")) or name.count("/") != 1 or not all(name.split("/")):
        raise PairingError(f"{name!r} is neither a folder nor a Hub repository id (owner/name)")
    try:
        return Path(hf_hub_download(name, CARD_FILE, local_files_only=True)), False
    except (LocalEntryNotFoundError, EntryNotFoundError, FileNotFoundError):
        pass
    except ValueError as err:  # huggingface_hub's HFValidationError: characters a repository id cannot hold
        raise PairingError(f"{name!r} is not a valid Hub repository id: {err}") from err
    if _hub_offline():
        raise PairingError(f"{name}: not in the Hugging Face cache and HF_HUB_OFFLINE is set; pass a local folder")
    if not _hub_reachable():
        raise PairingError(f"{name}: not in the Hugging Face cache and the Hub is unreachable from this machine; "
                           "pass a local folder (e.g. one from `hf-hetspec bench --write-card`)")
    try:
        return Path(hf_hub_download(name, CARD_FILE, etag_timeout=HUB_PROBE_SECONDS)), False
    except (RepositoryNotFoundError, EntryNotFoundError) as err:
        raise PairingError(f"{name}: no such repository or it has no {CARD_FILE} ({type(err).__name__})") from err
    except (HfHubHTTPError, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PairingError(f"{name}: the card could not be downloaded: {first}") from err


def read_card(path_or_repo_id: str | os.PathLike) -> tuple[ModelCard, dict]:
    """The model card and its ``hf_hetspec`` metadata, from a folder, a ``README.md`` or a Hub repository.

    Raises:
        PairingError: no card, or a card without valid ``hf_hetspec`` metadata (types, format version and the
            settings allow-list: :func:`hf_hetspec.tools.card_policy.check_metadata`).
    """
    card, metadata, _ = _read(path_or_repo_id)
    return card, metadata


def _read(path_or_repo_id: str | os.PathLike) -> tuple[ModelCard, dict, Path | None]:
    """:func:`read_card` plus the card's local folder (``None`` for a card from the Hub)."""
    path, local = _card_file(path_or_repo_id)
    import yaml

    _check_header(path)
    try:
        card = ModelCard.load(path)
    except (ValueError, yaml.YAMLError) as err:  # YAML that does not parse, or not a mapping
        raise PairingError(f"{path}: not a readable model card ({type(err).__name__}: {err})") from err
    metadata = card.data.to_dict().get(CARD_KEY)
    if metadata is None:
        raise PairingError(f"{path}: the card has no {CARD_KEY!r} metadata; it is not an hf_hetspec pairing card")
    check_metadata(metadata, f"{path}: {CARD_KEY}")
    return card, metadata, path.parent if local else None


def _check_header(path: Path) -> None:
    """Refuse a card that could make its reader hang before ``huggingface_hub`` parses it: a file over
    :data:`MAX_CARD_BYTES`, or a YAML header with aliases. A header of 1 KB nesting aliases ten times per level
    ("billion laughs") stands for 10^9 items once expanded (``card.data.to_dict()`` copies every one); a
    pairing card never needs an alias. The header is scanned as YAML events, which never expands anything.

    Raises:
        PairingError: the file is too large, is not UTF-8 text, or its header holds an alias or an anchor.
    """
    import yaml

    size = path.stat().st_size
    if size > MAX_CARD_BYTES:
        raise PairingError(f"{path}: {size} bytes; a pairing card has at most {MAX_CARD_BYTES} (refused unread)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise PairingError(f"{path}: not a readable model card (not UTF-8 text: {err})") from err
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        return  # no header: ModelCard.load reads no metadata, and _read says so
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), len(lines))
    try:
        for event in yaml.parse("\n".join(lines[1:end]), Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                raise PairingError(f"{path}: the card's YAML header uses anchors or aliases (&name / *name), "
                                   "which a pairing card never needs; write the values out")
    except yaml.YAMLError as err:
        raise PairingError(f"{path}: not a readable model card ({type(err).__name__}: {err})") from err


def load(path_or_repo_id: str | os.PathLike, *, load_models: bool = True, dtype=None, device=None) -> Pairing:
    """Read a pairing card and load its models.

    Args:
        path_or_repo_id: a folder holding ``README.md``, the card file itself, or a Hub repository id. From
            the Hub only ``README.md`` is downloaded (cache first; no code is executed).
        load_models: also load the target and the drafter with :func:`hf_hetspec.tools.zoo.load` (Hub ids of zoo
            models fall back to the offline zoo copies).
        dtype, device: passed to :func:`hf_hetspec.tools.zoo.load` (default float32 on CPU).

    Returns:
        :class:`Pairing`.

    Raises:
        PairingError: no card, a malformed card, settings outside the allow-list, a model reference outside
            the card's folder (:mod:`hf_hetspec.tools.card_policy`), or an unreachable Hub; all before any
            model loads.
        hf_hetspec.tools.zoo.ZooError: a model that cannot be loaded.
    """
    card, metadata, folder = _read(path_or_repo_id)
    references = [model_reference(metadata[key], folder) for key in ("target", "drafter")]
    target = drafter = target_tok = drafter_tok = None
    if load_models:
        target, target_tok = zoo.load(references[0], dtype=dtype, device=device)
        drafter, drafter_tok = zoo.load(references[1], dtype=dtype, device=device)
    return Pairing(target, drafter, target_tok, drafter_tok, dict(metadata["settings"]), card, metadata)
