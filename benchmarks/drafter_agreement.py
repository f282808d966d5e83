"""How often the int8 drafter picks what its own float32 copy picks: a measured probe, not a runtime.

Teacher-forces Spec-Bench texts through the drafter one token at a time, after a float32 prefill of each text's
first ``--prefill`` tokens (as decoding does), and counts the positions where the ``int8-static`` copy's
next-token argmax equals the float32 copy's. The int8 layers quantize each token's activations to 7 bits
(``reduce_range=True`` in PyTorch's dynamic-quantization module: saturation-safe on CPUs without VNNI);
``--full-range`` also runs the same weights with 8-bit activations. Agreement with its own float32 self bounds
what quantization can cost the acceptance rate; whether that reaches the target is measured end to end
(``benchmarks/compare_draft_settings.py`` with ``"hetspec_drafter": "float32"``, docs/results.md)::

    PYTHONPATH=. python benchmarks/drafter_agreement.py --texts 20 --full-range --threads 1
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

from hf_hetspec.compat import cache_kwargs
from hf_hetspec.runtime import _eval_copy, prepare_drafter
from hf_hetspec.tools.tasks import DEFAULT_SPEC_BENCH


def _agreement(model, reference, texts: list[torch.Tensor], prefill: int) -> tuple[int, int]:
    """(positions where ``model``'s step argmax equals ``reference``'s, positions) over ``texts``."""
    same = total = 0
    for ids in texts:
        want = reference(input_ids=ids).logits[0].argmax(-1)  # [n]
        cache = model.new_cache()
        model(input_ids=ids[:, :prefill], use_cache=True, **cache_kwargs(model, cache))
        for j in range(prefill, ids.shape[1]):
            logits = model(input_ids=ids[:, j : j + 1], use_cache=True, logits_to_keep=1,
                           **cache_kwargs(model, cache)).logits
            same += int(logits[0, -1].argmax() == want[j])
            total += 1
    return same, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--drafter", default="smollm2-135m-instruct")
    parser.add_argument("--texts", type=int, default=20, help="Spec-Bench questions (every 12th, both turns)")
    parser.add_argument("--prefill", type=int, default=64)
    parser.add_argument("--length", type=int, default=230, help="tokens per text at most")
    parser.add_argument("--full-range", action="store_true", help="also 8-bit activations (reduce_range=False)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from hf_hetspec.tools import zoo

    drafter, tokenizer = zoo.load(args.drafter, dtype=torch.bfloat16)
    reference = _eval_copy(drafter)
    int8 = prepare_drafter(drafter, "int8-static").model
    rows = [json.loads(line) for line in DEFAULT_SPEC_BENCH.read_text().splitlines() if line.strip()]
    texts = [tokenizer(" ".join(r["turns"]), return_tensors="pt").input_ids[:, : args.length] for r in rows[::12]]
    texts = [ids for ids in texts[: args.texts] if ids.shape[1] >= args.prefill + 32]
    variants = {"int8-static (7-bit activations)": True}
    if args.full_range:
        variants["int8-static, 8-bit activations"] = False
    forward = DynamicLinear.forward
    for name, reduce_range in variants.items():

        def linear(self, x, reduce_range=reduce_range):
            packed = self._packed_params._packed_params
            return torch.ops.quantized.linear_dynamic(x, packed, reduce_range=reduce_range).to(x.dtype)

        DynamicLinear.forward = linear
        try:
            with torch.no_grad():
                same, total = _agreement(int8, reference, texts, args.prefill)
        finally:
            DynamicLinear.forward = forward
        print(f"{name:<34} next-token argmax = float32's on {same / total:.1%} of {total} positions")


if __name__ == "__main__":
    main()
