"""hf_hetspec through transformers' ``custom_generate`` channel, on a model that was never enabled.

transformers 5.x runs ``model.generate(..., custom_generate=REPO_OR_FOLDER, trust_remote_code=True)`` by
importing ``custom_generate/generate.py`` from that Hub repository or local folder (after checking the
packages named in ``custom_generate/requirements.txt``) and calling its ``generate(model=model, **arguments)``
with every argument of the call except ``custom_generate`` and ``trust_remote_code``
(``transformers.generation.utils.GenerationMixin.generate``, step 0.a). The folder this package ships,
:data:`FOLDER`, holds such a ``generate.py``: it imports :func:`generate` below, which runs exactly the code
path of :func:`hf_hetspec.enable` for that one call, so outputs, ``hf_hetspec.last_stats(model)`` and the
errors of a refused call are the same, and the model is left as it was (no wrapper is installed).
"""

from __future__ import annotations

from pathlib import Path

from .integration import _generate

#: The folder to pass as ``custom_generate=`` (it holds ``custom_generate/generate.py`` and
#: ``custom_generate/requirements.txt``); ``hf-hetspec pairing push --with-custom-generate`` uploads it. A
#: ``str``: transformers loads ``custom_generate`` only when it is a string and ignores a ``Path`` silently.
FOLDER = str(Path(__file__).resolve().parent / "hub")


def generate(*args, model, **kwargs):
    """``model.generate(*args, **kwargs)`` as if :func:`hf_hetspec.enable` had been called on ``model``.

    transformers calls this with ``model=`` and the call's arguments as keywords; a model loaded with
    ``from_pretrained(REPO, trust_remote_code=True)`` from a repository holding :data:`FOLDER`'s files calls it
    as ``partial(generate, model=model)(input_ids, ...)``, hence the positional ``*args``.

    Args:
        model (``transformers.PreTrainedModel``): the target.
        *args, **kwargs: ``generate()``'s arguments, e.g. ``inputs`` (``torch.LongTensor`` of shape ``(1, n)``),
            ``assistant_model=drafter``, ``tokenizer=``, ``assistant_tokenizer=``, ``hetspec_algorithm=``,
            ``max_new_tokens=``. Without ``assistant_model`` the call is transformers' plain ``generate()``.

    Returns:
        What ``generate()`` returns (``torch.LongTensor`` of shape ``(1, n + new tokens)`` or a
        ``GenerateDecoderOnlyOutput``); statistics in ``hf_hetspec.last_stats(model)``.

    Raises:
        ValueError / TypeError / NotImplementedError: as for an enabled model, before any model runs.
    """
    return _generate(model, *args, **kwargs)
