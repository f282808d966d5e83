"""What a pairing card may say: an allow-list of typed ``generate()`` settings and model references that stay
inside the card's folder.

Threat model. A pairing card is data someone else wrote (a Hub repository, a downloaded folder). Reading it
and loading its models must never let it decide what code runs or which local files are read:

* its ``settings`` reach ``generate()``, so they are limited to :data:`SETTINGS` -- the hf_hetspec keywords and
  the sampling knobs a card is measured with, each a plain number, boolean or known name. A card can never
  set ``assistant_model``, the tokenizers, ``custom_generate``, ``trust_remote_code``, ``generation_config``,
  streamers, stopping criteria, processors or any other object;
* its ``target`` and ``drafter`` name a Hub repository or a folder *inside* the card's folder (a card read
  from the Hub: Hub ids only). Absolute paths, ``~``, ``..`` and symlinks that leave the folder are refused,
  and so is a Hub id that a folder of the same name in the working directory would shadow (transformers
  loads a local folder before the Hub);
* every other field is checked for its type, so a malformed card raises :class:`PairingError`, never a raw
  ``TypeError`` from deep inside the reader.

Models load with ``trust_remote_code`` left off (:func:`hf_hetspec.tools.zoo.load`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from ..checks import ALGORITHMS, IMPLEMENTED, VERIFICATIONS

FORMAT = 1


class PairingError(ValueError):
    """A card that cannot be written, read or published: the message names the problem and the fix."""


def _real(low: float, high: float = math.inf, low_open: bool = False):
    def check(value) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        return (value > low if low_open else value >= low) and value <= high
    return check


def _integer(low: int):
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= low


#: The ``generate()`` keywords a card may set: name -> (check, what the value must be).
SETTINGS = {
    "hetspec_algorithm": (lambda v: v in ALGORITHMS, f"one of {', '.join(ALGORITHMS)}"),
    "hetspec_draft_temperature": (_real(0), "a real number >= 0"),
    "hetspec_verification": (lambda v: v in VERIFICATIONS, f"one of {', '.join(VERIFICATIONS)}"),
    "num_assistant_tokens": (_integer(1), "an integer >= 1"),
    "do_sample": (lambda v: isinstance(v, bool), "true or false"),
    "temperature": (_real(0), "a real number >= 0"),
    "top_k": (_integer(0), "an integer >= 0"),
    "top_p": (_real(0, 1, low_open=True), "a real number in (0, 1]"),
}


def check_settings(settings, where: str = "settings") -> dict:
    """A copy of a card's ``generate()`` settings after checking each against :data:`SETTINGS`.

    Args:
        settings: the card's mapping of ``generate()`` keyword -> value.
        where: the field's name in messages, e.g. ``"recommended[1].settings"``.

    Raises:
        PairingError: not a mapping, a key outside the allow-list (named, e.g. ``assistant_model``), or a
            value of the wrong type or range.
    """
    if not isinstance(settings, dict):
        raise PairingError(f"{where} must be a mapping of generate() settings, got {type(settings).__name__}")
    for key, value in settings.items():
        if key not in SETTINGS:
            raise PairingError(f"{where}.{key}: a pairing card may not set {key!r}; it may set only "
                               f"{', '.join(SETTINGS)} (pass anything else to generate() yourself)")
        check, expected = SETTINGS[key]
        if not check(value):
            raise PairingError(f"{where}.{key} = {value!r}: must be {expected}")
    return dict(settings)


def _field(metadata: dict, key: str, check, expected: str, where: str, required: bool = False):
    if key not in metadata or metadata[key] is None:
        if required:
            raise PairingError(f"{where}.{key} is missing from the card's metadata")
        return
    if not check(metadata[key]):
        raise PairingError(f"{where}.{key} = {metadata[key]!r}: must be {expected}")


def _lookahead(value) -> bool:
    return value is None or _integer(1)(value)


def _number(value) -> bool:
    return value is None or _real(-math.inf)(value)


def check_metadata(metadata, where: str = "hf_hetspec") -> dict:
    """Check the types of a card's ``hf_hetspec`` metadata (the schema in :mod:`hf_hetspec.tools.pairing`).

    Args:
        metadata: the parsed YAML under the card's ``hf_hetspec`` key.
        where: prefix of field names in messages (the card's path and key).

    Returns:
        ``metadata`` unchanged.

    Raises:
        PairingError: no mapping, an unknown ``format``, a missing ``target``/``drafter``/``settings``, a
            field of the wrong type, or settings outside the allow-list (:func:`check_settings`).
    """
    if not isinstance(metadata, dict):
        raise PairingError(f"{where}: the card has no hf_hetspec metadata mapping; it is not an hf_hetspec "
                           "pairing card")
    fmt = metadata.get("format")
    if isinstance(fmt, bool) or not isinstance(fmt, int) or fmt < 1:
        raise PairingError(f"{where}.format = {fmt!r}: not a pairing card format (this hf_hetspec reads {FORMAT})")
    if fmt > FORMAT:
        raise PairingError(f"{where}: card format {fmt} is newer than this hf_hetspec reads ({FORMAT}); "
                           "upgrade hf_hetspec")
    for key in ("target", "drafter"):
        _field(metadata, key, lambda v: isinstance(v, str) and v.strip(), "a Hub id or a folder in the card's folder",
               where, required=True)
    if "settings" not in metadata:
        raise PairingError(f"{where}.settings is missing from the card's metadata")
    check_settings(metadata["settings"], f"{where}.settings")
    _field(metadata, "algorithm", lambda v: v in ALGORITHMS, f"one of {', '.join(ALGORITHMS)}", where)
    _field(metadata, "lookahead", _lookahead, "null or an integer >= 1", where)
    _field(metadata, "recommended", lambda v: isinstance(v, list), "a list", where)
    for i, entry in enumerate(metadata.get("recommended") or []):
        at = f"{where}.recommended[{i}]"
        if not isinstance(entry, dict):
            raise PairingError(f"{at} must be a mapping, got {type(entry).__name__}")
        _field(entry, "temperature", _real(0), "a real number >= 0", at, required=True)
        _field(entry, "algorithm", lambda v: v in IMPLEMENTED, f"one of {', '.join(IMPLEMENTED)}", at, required=True)
        _field(entry, "lookahead", _lookahead, "null or an integer >= 1", at)
        _field(entry, "speedup", _number, "a number", at)
        check_settings(entry.get("settings", {}), f"{at}.settings")
    _field(metadata, "speedups", lambda v: isinstance(v, list) and all(isinstance(r, dict) for r in v),
           "a list of mappings", where)
    for i, row in enumerate(metadata.get("speedups") or []):
        for key in ("temperature", "speedup", "tokens_per_second", "acceptance_rate"):
            _field(row, key, _number, "a number", f"{where}.speedups[{i}]")
    _field(metadata, "special_tokens", _special_tokens, "a mapping of target and drafter to their unk_token, "
           "unk_token_id, eos_token, eos_token_id (strings, integers or null)", where)
    return metadata


def _special_tokens(value) -> bool:
    """The shape :func:`hf_hetspec.tools.pairing_vllm.special_tokens` writes; a card's values are only printed."""
    def token(v):
        return v is None or isinstance(v, str)

    def token_id(v):
        return v is None or (isinstance(v, int) and not isinstance(v, bool))

    return isinstance(value, dict) and all(
        isinstance(value.get(role), dict)
        and set(value[role]) <= {"unk_token", "unk_token_id", "eos_token", "eos_token_id"}
        and all((token_id if name.endswith("_id") else token)(v) for name, v in value[role].items())
        for role in value
    ) and set(value) <= {"target", "drafter"}


def model_reference(reference: str, card_folder: Path | None) -> str:
    """What to load for a card's ``target`` or ``drafter``: a folder inside the card's folder, or a Hub id.

    Args:
        reference: the card's value, e.g. ``"Qwen/Qwen2.5-Coder-1.5B-Instruct"`` or ``"models/target"``.
        card_folder: the folder holding the card's ``README.md``; ``None`` for a card read from the Hub
            (only its ``README.md`` is downloaded, so only Hub ids can be meant).

    Returns:
        The resolved absolute path of a folder inside ``card_folder``, or ``reference`` as a Hub id.

    Raises:
        PairingError: an absolute path, ``~``, ``..``, a path or a symlink within it that leaves the card's
            folder, a name that is not a valid Hub id, or a Hub id shadowed by a folder of that name in the
            working directory.
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    fix = "name a Hub repository (owner/name) or a folder inside the card's folder"
    parts = Path(reference).parts
    if Path(reference).is_absolute() or reference.startswith("~") or ".." in parts or "\\" in reference:
        raise PairingError(f"model reference {reference!r} points outside the card's folder; {fix}")
    if card_folder is not None and os.path.lexists(card_folder / reference):
        root = _resolved(card_folder, reference)
        path = _resolved(card_folder / reference, reference)
        if not path.is_relative_to(root):
            raise PairingError(f"model reference {reference!r} is a symlink leaving the card's folder; {fix}")
        if not path.is_dir():
            raise PairingError(f"model reference {reference!r} is not a folder; {fix}")
        _refuse_links_leaving(path, root, reference)
        return str(path)
    try:
        validate_repo_id(reference)
    except HFValidationError as err:
        raise PairingError(f"model reference {reference!r} is not a folder in the card's folder nor a valid "
                           f"Hub id ({err}); {fix}") from err
    if os.path.lexists(reference):
        raise PairingError(f"model reference {reference!r}: a file or folder of that name in the working "
                           f"directory ({Path(reference).resolve()}) would be loaded instead of the Hub "
                           "repository; run from another folder")
    return reference


def _resolved(path: Path, reference: str) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError) as err:  # a symlink loop (RuntimeError before Python 3.13)
        raise PairingError(f"model reference {reference!r}: {path} cannot be resolved ({err})") from err


def _refuse_links_leaving(folder: Path, root: Path, reference: str) -> None:
    """Refuse a symlink anywhere under ``folder`` whose target is outside ``root`` (e.g. a ``config.json``
    pointing at another user file)."""
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            entry = Path(dirpath) / name
            if entry.is_symlink() and not _resolved(entry, reference).is_relative_to(root):
                raise PairingError(f"model reference {reference!r}: {entry.relative_to(root)} is a symlink leaving "
                                   "the card's folder; copy the file into the folder instead")
