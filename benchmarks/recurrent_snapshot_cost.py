"""What rolling a recurrent drafter back costs: one state snapshot per drafter step (``hf_hetspec.recurrent``).

Times, on random weights in the shape of a real drafter, one cached one-token drafter step against the
``SnapshotCache.advance`` that follows it (cloning every recurrent and convolution state), and a rollback of
5 positions; prints the size of one snapshot. One CPU thread by default::

    python benchmarks/recurrent_snapshot_cost.py            # Mamba-130M shape and a tiny Mamba
    python benchmarks/recurrent_snapshot_cost.py --threads 4 --steps 50
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers
from transformers import AutoModelForCausalLM

from hf_hetspec.recurrent import SnapshotCache

SHAPES = {
    "mamba-130m": transformers.MambaConfig(hidden_size=768, num_hidden_layers=24, state_size=16, expand=2,
                                           vocab_size=50280),
    "tiny-mamba": transformers.MambaConfig(hidden_size=64, num_hidden_layers=2, state_size=4, expand=2,
                                           vocab_size=500),
}


@torch.no_grad()
def measure(config, steps: int) -> dict[str, float]:
    """Mean seconds of a drafter step and of a snapshot, seconds of a 5-position rollback, bytes per snapshot."""
    model = AutoModelForCausalLM.from_config(config).eval()
    cache = SnapshotCache(config)
    model(input_ids=torch.tensor([[1, 2, 3, 4]]), cache=cache, use_cache=True)
    cache.advance(4)
    step = snapshot = 0.0
    for i in range(steps):
        began = time.perf_counter()
        model(input_ids=torch.tensor([[5 + i]]), cache=cache, use_cache=True, logits_to_keep=1)
        stepped = time.perf_counter()
        cache.advance(1)
        step += stepped - began
        snapshot += time.perf_counter() - stepped
    began = time.perf_counter()
    cache.crop(-5)
    rollback = time.perf_counter() - began
    saved = cache._snapshots[cache.length]
    size = sum(t.numel() * t.element_size() for entry in saved if entry for states in entry[:2]
               for t in states.values() if t is not None)
    return {"step_s": step / steps, "snapshot_s": snapshot / steps, "rollback_s": rollback, "bytes": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="drafter steps timed per shape")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name, config in SHAPES.items():
        r = measure(config, args.steps)
        print(f"{name}: step {1e3 * r['step_s']:.2f} ms, snapshot {1e3 * r['snapshot_s']:.3f} ms "
              f"({100 * r['snapshot_s'] / r['step_s']:.1f} % of a step), rollback of 5 {1e3 * r['rollback_s']:.3f} ms, "
              f"{r['bytes'] / 1e6:.2f} MB per snapshot")


if __name__ == "__main__":
    main()
