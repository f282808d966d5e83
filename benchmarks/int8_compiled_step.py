"""Would ``torch.compile`` make the int8 drafter step cheaper on the CPU? A measured probe, not a runtime.

The ``int8-static`` step (:mod:`hf_hetspec.static_drafter`) runs about 40 small operations per layer from
Python, and its int8 products are PyTorch's dynamic-quantization kernels, whose packed weights
``torch.compile`` cannot trace (a graph break at every linear layer). This script rebuilds the same step for
a Llama-layout drafter (SmolLM2) with the copy's own int8 weights as plain tensors and int8 x int8 products
(``torch._int_mm``, each token's activations scaled symmetrically to int8), so that the whole 30-layer step is
one graph, and times it eager and compiled by inductor (the attention length marked dynamic, so one
compilation serves every context length) against the ``int8-static`` step, interleaved, after a
``--context``-token prefill::

    PYTHONPATH=. python benchmarks/int8_compiled_step.py --threads 1

It only measures: the runtime keeps ``int8-static`` on the CPU unless this probe says otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from hf_hetspec.runtime import prepare_drafter
from hf_hetspec.static_drafter import _norm, _rotate_half


def _int8(linear) -> tuple[torch.Tensor, torch.Tensor]:
    """A dynamically quantized linear layer's int8 weight, transposed (``(in, out)``), and its row scales."""
    weight = linear.weight()
    return weight.int_repr().t().contiguous(), weight.q_per_channel_scales().float().contiguous()


def _product(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``x`` (``(1, in)``, float32) times an int8 weight: ``x`` scaled to int8 by its largest magnitude."""
    scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127
    quantized = torch.round(x / scale).clamp(-127, 127).to(torch.int8)
    return torch._int_mm(quantized, weight).to(torch.float32) * (scale * scales)


class GraphStep(torch.nn.Module):
    """The int8-static decoder's one-token step as one function of plain tensors (Llama layout only)."""

    def __init__(self, decoder):
        super().__init__()
        self.decoder = decoder
        self.weights = [{name: _int8(linear) for name, linear in layer.step.items()} for layer in decoder.layers]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: list, values: list):
        """``x`` (``(1, hidden)``); ``keys[i]``/``values[i]`` (``(1, kv_heads, n + 1, head_dim)``) end with the
        new token's slot, written here."""
        for layer, weights, k_cache, v_cache in zip(self.decoder.layers, self.weights, keys, values):
            q, k, v = _product(_norm(layer.input_norm, x), *weights["qkv"]).split(
                [layer.q_size, layer.kv_size, layer.kv_size], dim=-1)
            q, k, v = (t.view(1, 1, -1, layer.head_dim).transpose(1, 2) for t in (q, k, v))
            q = q * cos + _rotate_half(q) * sin
            k_cache[:, :, -1:].copy_(k * cos + _rotate_half(k) * sin)
            v_cache[:, :, -1:].copy_(v)
            out = F.scaled_dot_product_attention(q, k_cache, v_cache, scale=layer.scaling, enable_gqa=True)
            x = x + _product(out.transpose(1, 2).reshape(1, -1), *weights["o_proj"])
            gate, up = _product(_norm(layer.mlp_in_norm, x), *weights["gate_up"]).chunk(2, dim=-1)
            x = x + _product(layer.act_fn(gate) * up, *weights["down_proj"])
        return _norm(self.decoder.norm, x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--drafter", default="smollm2-135m-instruct")
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from hf_hetspec.tools import zoo

    drafter, _ = zoo.load(args.drafter, dtype=torch.bfloat16)
    decoder = prepare_drafter(drafter, "int8-static").model.get_decoder()
    graph = GraphStep(decoder)
    compiled = torch.compile(graph, fullgraph=True)
    n = args.context
    token = torch.tensor([[5]])
    with torch.no_grad():
        cache = decoder.temporary_cache()
        decoder.hidden_states(torch.randint(100, 1000, (1, n)), cache)
        cache.reserve(n + 2)
        x, rotations = decoder._embed(token, torch.tensor([[n]]))
        cos, sin = rotations[decoder.layers[0].rotary_key]

        def graph_step(function, length: int = n) -> torch.Tensor:
            keys = [k[:, :, : length + 1] for k in cache.keys]
            values = [v[:, :, : length + 1] for v in cache.values]
            return function(x[0], cos, sin, keys, values)

        def static_step() -> torch.Tensor:
            hidden = decoder.hidden_states(token, cache)
            cache.length -= 1
            return hidden[0]

        reference = static_step()
        start = time.perf_counter()
        graph_step(compiled)
        graph_step(compiled, n + 1)  # a second length: marks it dynamic and compiles again, once
        compile_s = time.perf_counter() - start
        runs = {"int8-static": static_step, "graph eager": lambda: graph_step(graph),
                "graph compiled": lambda: graph_step(compiled)}
        for run in runs.values():  # warm-up
            run()
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.steps):
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
        difference = (graph_step(compiled) - reference).abs().max().item()
    print(f"{args.drafter}, {n}-token context, {args.steps} steps each, {args.threads} thread(s), interleaved; "
          f"medians. Compilation: {compile_s:.1f} s; compiled vs int8-static hidden state: max |diff| "
          f"{difference:.3f} (of {reference.abs().max().item():.1f})")
    for name, samples in times.items():
        print(f"{name:<16} {1000 * statistics.median(samples):7.1f} ms")


if __name__ == "__main__":
    main()
