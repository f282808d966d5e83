"""Publishing a pairing folder as a Hub model repository (``huggingface_hub.HfApi``), optionally with
hf_hetspec's ``custom_generate/`` folder in the same commit.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from huggingface_hub import ModelCard

from .card_policy import PairingError
from .pairing_card import CARD_FILE
from .pairing_load import read_card


# --------------------------------------------------------------------------------------------------------
# Publishing
# --------------------------------------------------------------------------------------------------------


def push(folder: str | os.PathLike, repo_id: str, *, token: str | None = None, private: bool = False,
         with_custom_generate: bool = False) -> str:
    """Publish a pairing folder (its ``README.md`` and plots) as a Hub model repository.

    Uses ``huggingface_hub.HfApi``: ``create_repo(exist_ok=True)`` then ``upload_folder``. The card is read
    and checked before any network call.

    Args:
        folder: a folder written by :func:`write_card`.
        repo_id: ``owner/name`` on the Hub.
        token: a Hub token; default: the logged-in one (``hf auth login``) or ``$HF_TOKEN``.
        private: create the repository as private.
        with_custom_generate: also upload hf_hetspec's ``custom_generate/`` folder
            (:data:`hf_hetspec.custom_generate.FOLDER`), tag the card ``custom_generate`` and add its usage, so
            the published pairing runs with plain transformers: ``generate(..., custom_generate=repo_id,
            trust_remote_code=True, ...)``. The card's settings are unchanged (they never select it).

    Returns:
        The URL of the upload's commit.

    Raises:
        PairingError: not a pairing folder, or a malformed ``repo_id``.
    """
    from huggingface_hub import HfApi

    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise PairingError(f"{folder}: not a folder; pass the folder written by write_card")
    read_card(folder)
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise PairingError(f"repo_id {repo_id!r}: use owner/name, e.g. my-user/qwen2.5-coder-smollm2-pairing")
    api = HfApi(token=token)
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    if not with_custom_generate:
        info = api.upload_folder(repo_id=repo_id, folder_path=folder, repo_type="model",
                                 commit_message="hf_hetspec pairing card")
        return str(getattr(info, "commit_url", info))
    with tempfile.TemporaryDirectory() as staging:  # one commit: the card and the folder together
        _stage_with_custom_generate(folder, Path(staging), repo_id)
        info = api.upload_folder(repo_id=repo_id, folder_path=Path(staging), repo_type="model",
                                 commit_message="hf_hetspec pairing card with its custom_generate folder")
    return str(getattr(info, "commit_url", info))


def _stage_with_custom_generate(folder: Path, staging: Path, repo_id: str) -> None:
    """Copy the card folder and ``custom_generate/`` into ``staging``; tag the card and add the usage."""
    from ..custom_generate import FOLDER

    shutil.copytree(folder, staging, dirs_exist_ok=True)
    shutil.copytree(Path(FOLDER) / "custom_generate", staging / "custom_generate", dirs_exist_ok=True)
    card = ModelCard.load(staging / CARD_FILE)
    tags = list(card.data.tags or [])
    if "custom_generate" not in tags:  # the tag transformers' docs use to list decoding-method repositories
        card.data.tags = tags + ["custom_generate"]
    card.text += f"""
## Use with plain transformers (`custom_generate`)

This repository also holds hf_hetspec's `custom_generate/` folder: with `pip install hf_hetspec`, a model that
was never enabled runs the pairing through transformers' own `custom_generate` channel (same outputs,
statistics in `hf_hetspec.last_stats(target)`):

```python
out = target.generate(ids, custom_generate="{repo_id}", trust_remote_code=True, assistant_model=drafter,
                      tokenizer=target_tokenizer, assistant_tokenizer=drafter_tokenizer, max_new_tokens=128)
```
"""
    card.save(staging / CARD_FILE)
