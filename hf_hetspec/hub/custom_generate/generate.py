"""Heterogeneous-vocabulary speculative decoding (hf_hetspec: SLEM, TLI, SLRS) as a transformers
``custom_generate`` method: ``model.generate(..., custom_generate=<this repo>, trust_remote_code=True,
assistant_model=drafter, tokenizer=target_tokenizer, assistant_tokenizer=drafter_tokenizer)``.

All the work is done by the installed ``hf_hetspec`` package; this file only hands the call over to it.
"""

try:  # inside try: transformers' import scan skips it, so a missing package gets the message below
    from hf_hetspec.custom_generate import generate
except ImportError as error:
    raise ImportError(
        "This custom_generate repository runs hf_hetspec, which cannot be imported here "
        f"({error}): install it with `pip install hf_hetspec`, then call generate() again."
    ) from error

__all__ = ["generate"]
