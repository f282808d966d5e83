"""Token-level vs block verification on the toy pairs: accepted tokens per target forward, TLI and SLRS.

Both verifications keep the target's distribution; block verification (Sun et al. 2025) accepts at least as
many draft tokens in expectation for the same draft. This measures how many on the two self-made toy pairs
of ``hf_hetspec.testing.toy`` (byte-level BPE <-> SentencePiece, the test fixtures ``toy_pair`` and
``toy_pair_reversed``), sampling at ``--temperature`` with the toy models' default top-k (50), each call
decoded twice from the same seed (``hetspec_verification="token"`` and ``"block"``). Two draft schedules: the
default +2/-1 rule (block verification's longer accepted runs also lengthen the next drafts) and a fixed
``--lookahead`` (the same draft length for both: the verification alone). Prompts: the first words of the
toy corpus documents (``toy.TOY_PROMPTS``, which the toy models continue almost deterministically) and short
ambiguous ones (``AMBIGUOUS``, where the target spreads its probability and drafts are rejected often).

Printed per pair, algorithm, schedule and prompt kind: target forwards, new tokens, new tokens per target
forward (bonus/correction token included, ``DecodingStats.mean_accepted_per_forward`` summed over calls),
accepted draft tokens per round, and the paired difference block - token of tokens per forward per call
with its standard error. The sampled numbers are noisy (each rule runs its own trajectory), so the last two
columns remove that noise: for every round of the token-level runs, the *expected* accepted length given
that round's draft under each rule (token level ``sum_i prod_{j <= i} min(1, p/q)``; block
``sum_i (1 - prod_{j >= i} (1 - h_j))`` from :func:`hf_hetspec.verify.block_weights`), averaged over the
rounds: both rules on exactly the same drafts. Toy models only: they say nothing about wall-clock speed on
real models.

    python benchmarks/block_verification.py --seeds 8 --max-new-tokens 48
"""

from __future__ import annotations

import argparse
import contextlib
import statistics

import torch

import hf_hetspec
import hf_hetspec.decoding
from hf_hetspec.testing import toy
from hf_hetspec.verify import block_weights

AMBIGUOUS = ("the", "a", "    ", "The cat", "1")
SCHEDULES = {"+2/-1": {}, "fixed": None}  # "fixed": num_assistant_tokens=--lookahead, constant


def expected_accepted(draft_ids, draft_probs, target_probs) -> tuple[float, float]:
    """``(E[n | draft] token level, E[tau | draft] block)`` for one round's draft."""
    k = draft_ids.shape[0]
    rows = torch.arange(k)
    ratio = (target_probs[rows, draft_ids] / draft_probs[rows, draft_ids]).clamp(max=1.0)  # [k]
    token = float(ratio.cumprod(0).sum())
    _, h = block_weights(draft_ids, draft_probs, target_probs)
    below = (1.0 - h[1:]).flip(0).cumprod(0).flip(0)  # [k]: P(tau < i | draft) = prod_{j >= i} (1 - h_j)
    return token, float((1.0 - below).sum())


@contextlib.contextmanager
def rounds_recorded(into: list):
    """Record :func:`expected_accepted` for every token-level verification the decoding loop runs
    (measurement only: the verification itself is unchanged; the loop's own function is restored after)."""
    original = hf_hetspec.decoding.verify_speculative_sampling

    def recording(draft_ids, draft_probs, target_probs, generator=None):
        into.append(expected_accepted(draft_ids, draft_probs, target_probs))
        return original(draft_ids, draft_probs, target_probs, generator)

    hf_hetspec.decoding.verify_speculative_sampling = recording
    try:
        yield
    finally:
        hf_hetspec.decoding.verify_speculative_sampling = original


def run(pair, prompt: str, algorithm: str, verification: str, seed: int, args, schedule: dict) -> tuple:
    ids = pair.target_tokenizer(prompt, return_tensors="pt").input_ids
    pair.target.generate(ids, assistant_model=pair.drafter, tokenizer=pair.target_tokenizer,
                         assistant_tokenizer=pair.drafter_tokenizer, hetspec_algorithm=algorithm,
                         hetspec_verification=verification, do_sample=True, temperature=args.temperature,
                         max_new_tokens=args.max_new_tokens, hetspec_generator=torch.Generator().manual_seed(seed),
                         **schedule)
    stats = hf_hetspec.last_stats(pair.target)
    return stats.new_tokens, stats.target_forwards, stats.accepted_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--lookahead", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bpe, sentencepiece = toy.byte_level_bpe_tokenizer(), toy.sentencepiece_bpe_tokenizer()
    pairs = {
        "toy_pair": toy.correlated_pair(bpe, sentencepiece, seed=0),
        "toy_pair_reversed": toy.correlated_pair(sentencepiece, bpe, seed=1, drafter_kwargs={"pad_vocab_to": 64}),
    }
    kinds = {"corpus": toy.TOY_PROMPTS, "ambiguous": AMBIGUOUS}
    print(f"temperature {args.temperature}, {args.max_new_tokens} new tokens, seeds 0..{args.seeds - 1}, "
          f"fixed lookahead {args.lookahead}")
    print("pair               algorithm schedule kind       verification forwards  tokens  tok/fwd  acc/round  "
          "block-token tok/fwd per call (SE)  E[acc|draft]/round token, block (rounds)")
    for pair_name, pair in pairs.items():
        hf_hetspec.enable(pair.target)
        for algorithm in ("tli", "slrs"):
            for schedule_name, schedule in SCHEDULES.items():
                if schedule is None:
                    schedule = dict(num_assistant_tokens=args.lookahead, num_assistant_tokens_schedule="constant")
                for kind, prompts in kinds.items():
                    totals = {v: [0, 0, 0] for v in ("token", "block")}
                    differences, rounds = [], []
                    for prompt in prompts:
                        for seed in range(args.seeds):
                            per_call = {}
                            for verification in ("token", "block"):
                                with rounds_recorded(rounds):
                                    new, forwards, accepted = run(pair, prompt, algorithm, verification, seed,
                                                                  args, schedule)
                                for i, value in enumerate((new, forwards, accepted)):
                                    totals[verification][i] += value
                                per_call[verification] = new / forwards
                            differences.append(per_call["block"] - per_call["token"])
                    se = statistics.stdev(differences) / len(differences) ** 0.5
                    exact_token, exact_block = (statistics.mean(column) for column in zip(*rounds))
                    for verification, (new, forwards, accepted) in totals.items():
                        tail = (f"  {statistics.mean(differences):+.3f} ({se:.3f})            "
                                f"{exact_token:.3f}, {exact_block:.3f} ({len(rounds)})" if verification == "block"
                                else "")
                        print(f"{pair_name:18s} {algorithm:9s} {schedule_name:8s} {kind:10s} {verification:12s} "
                              f"{forwards:8d} {new:7d} {new / forwards:8.3f} {accepted / forwards:10.3f}{tail}",
                              flush=True)
        hf_hetspec.disable(pair.target)


if __name__ == "__main__":
    main()
