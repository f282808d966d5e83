"""Tree drafts: the chain of drafted target ids plus sibling branches, verified by the target in one forward.

A greedy SLEM draft is one chain; where the target disagrees with it, the round ends. The drafter's runner-up
token at a draft position is often the target's choice there (on Spec-Bench's tuning half, the SmolLM2-135M
drafter's second choice was the target's token at 11-75% of the positions where its first choice was not), so
SLEM also proposes, for some positions ``i``, the chain's first ``i`` drafter tokens followed by the runner-up
(:meth:`hf_hetspec.slem.SLEMProposer._propose`), each re-tokenized for the target like the chain. All branches
share the accepted context; in target ids they form a prefix tree (:class:`DraftTree`) that the target scores
in one forward, each node attending to the context and its own ancestors only (:func:`tree_attention_mask`,
positions by depth: :func:`tree_position_ids`), as in SpecInfer (Miao et al. 2024) and Medusa (Cai et al. 2024).

Why it is exact: a node's logits are the target's logits for the context followed by the node's path, as if
that path had been fed as a sequence (the mask hides every other branch, the positions are the path's). The
walk (:func:`walk_tree`) starts at the root; at each node the target chooses its token from those logits
after its own processors -- the argmax in a greedy call, a sample in a sampled one -- and the walk moves to
the child holding that token, or stops and emits it. Every emitted token is therefore the target's own
choice given the tokens before it: token for token what greedy decoding writes, and in a sampled call a draw
from exactly the target's distribution (exact-match sampling, Timor et al. 2025, Algorithm 2, with several
candidates per position: what the drafts hold decides only how far one forward gets). Then the accepted
nodes' keys and values are moved to the positions right after the context (:func:`keep_path`), so the cache
holds what a sequential forward over the accepted tokens would have written.

Trees are verified by hf_hetspec's own loop for one row, for drafts verified by exact match (SLEM's, and TLI's
and SLRS's argmax drafts when a schedule asks for siblings: with no ``q``), on targets whose cache and attention
allow them (:func:`supports_tree`); anything else verifies the
chain alone, which is exact too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

#: Attention implementations that take a custom float mask of shape ``(1, 1, q, kv)`` as given.
TREE_ATTENTION = ("sdpa", "eager")
#: At most this many nodes in one verified tree (the chain's included): a forward of a few dozen tokens costs
#: about one target step on a memory-bound target (``v`` = 0.03 per token, :data:`hf_hetspec.schedule.VERIFY_COSTS`).
MAX_TREE_NODES = 48


class RunnerUps:
    """The drafter's runner-ups of one draft, for sibling branches (``Schedule.sibling_runner_ups``): per drafted
    position, the chosen token's probability and the next ``count`` tokens with their probabilities. Its
    :meth:`select` is a drafter selector (:meth:`~hf_hetspec.drafter.DrafterContext.draft`) drafting the argmax
    (SLEM); :meth:`top` takes a distribution (TLI's over the vocabulary intersection, SLRS's psi)."""

    def __init__(self, count: int = 1):
        self.count = count
        self._top: list[tuple[torch.Tensor, torch.Tensor]] = []

    def top(self, probs: torch.Tensor, to_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep the ``1 + count`` likeliest columns of ``probs`` (``(1, N)``, a distribution) as ids
        (``to_ids[column]``, or the column itself); returns the argmax column and its probability (``(1, 1)``
        each)."""
        probs, columns = probs.topk(min(1 + self.count, probs.shape[-1]), dim=-1)  # [1, 1 + count] each
        self._top.append((probs, columns if to_ids is None else to_ids[columns]))
        return columns[:, :1], probs[:, :1]

    def select(self, logits: torch.Tensor) -> tuple[torch.Tensor, None, torch.Tensor]:
        """The argmax of ``logits`` (``(1, V)``), no ``q``, and its probability for the draft's confidence stop."""
        column, chosen_p = self.top(logits.float().softmax(dim=-1))
        return column, None, chosen_p

    def values(self) -> tuple[list[float], list[list[int]], list[list[float]]]:
        """Per drafted position: the chosen token's probability, the runner-up ids (best first), their
        probabilities (one host sync for the whole draft)."""
        if not self._top:
            return [], [], []
        probs = torch.cat([p for p, _ in self._top]).tolist()
        ids = torch.cat([i for _, i in self._top]).tolist()
        return [p[0] for p in probs], [i[1:] for i in ids], [p[1:] for p in probs]

    def siblings(self, min_joint: float, positions: int) -> list[tuple[int, int]]:
        """``(i, runner-up id)`` for each of the first ``positions`` draft positions and each runner-up there whose
        estimate that the draft's first ``i`` tokens and then that runner-up are what the target writes (the
        product of the chosen tokens' probabilities before ``i``, times the runner-up's) is at least
        ``min_joint``. A sibling costs no drafter step, only its tokens in the verification: it pays while that
        chance exceeds about ``v`` (``Schedule.sibling_min_joint``)."""
        chosen_p, runner_ids, runner_ps = self.values()
        found, joint = [], 1.0
        for i in range(min(positions, len(runner_ids))):
            for runner_id, runner_p in zip(runner_ids[i], runner_ps[i]):
                if joint * runner_p < min_joint:
                    break  # the next runner-up is less likely still
                found.append((i, runner_id))
            joint *= chosen_p[i]
        return found


@dataclass
class DraftTree:
    """A prefix tree of drafted target ids below the last accepted token (the root).

    Attributes:
        tokens: target id of each node, in insertion order (a parent always before its children).
        parents: index of each node's parent, ``-1`` for a child of the root.
        depth: each node's depth (1 for a child of the root).
        children: ``{(parent, token): node}``.
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    children: dict[tuple[int, int], int] = field(default_factory=dict)

    @classmethod
    def from_branches(cls, chain: list[int], branches: list[list[int]], max_nodes: int = MAX_TREE_NODES) -> "DraftTree":
        """The tree of ``chain`` (its nodes first, in order: node ``i`` is the chain's token ``i``) and of each
        branch (a list of target ids after the root), merged where they share a prefix; a branch that would
        pass ``max_nodes`` nodes is cut there."""
        tree = cls()
        for branch in (chain, *branches):
            parent = -1
            for token in branch:
                node = tree.children.get((parent, token))
                if node is None:
                    if len(tree.tokens) >= max_nodes:
                        break
                    node = len(tree.tokens)
                    tree.tokens.append(token)
                    tree.parents.append(parent)
                    tree.depth.append(1 if parent < 0 else tree.depth[parent] + 1)
                    tree.children[(parent, token)] = node
                parent = node
        return tree

    def __len__(self) -> int:
        return len(self.tokens)

    def is_chain(self) -> bool:
        """Whether every node has the one before it as its parent (a plain draft)."""
        return all(parent == node - 1 for node, parent in enumerate(self.parents))

    def ancestors(self, node: int) -> list[int]:
        """``node`` and its ancestors, root side first."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


def tree_attention_mask(tree: DraftTree, past: int, tail: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The additive attention mask of a forward over ``tail`` context tokens followed by the tree's nodes.

    Args:
        tree: the draft tree (``N`` nodes).
        past: positions already in the cache.
        tail: context tokens fed before the nodes (the last accepted token, at least).
        dtype: the target's attention dtype (masked entries get its most negative value).

    Returns:
        ``torch.Tensor`` of shape ``(1, 1, tail + N, past + tail + N)``: 0 where a query attends (the cache,
        the context causally, a node's ancestors and itself), the dtype's minimum elsewhere.
    """
    n = len(tree)
    allowed = torch.zeros(tail + n, past + tail + n, dtype=torch.bool)
    allowed[:, :past] = True
    allowed[:tail, past : past + tail] = torch.ones(tail, tail, dtype=torch.bool).tril()
    allowed[tail:, past : past + tail] = True
    for node in range(n):
        allowed[tail + node, [past + tail + a for a in tree.ancestors(node)]] = True
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def tree_position_ids(tree: DraftTree, tail_positions: torch.LongTensor) -> torch.LongTensor:
    """Position ids (``(1, tail + N)``): the context tail's own (``tail_positions``, shape ``(tail,)``), then each
    node's, the last context position plus the node's depth."""
    depth = torch.tensor(tree.depth, dtype=tail_positions.dtype, device=tail_positions.device)
    return torch.cat([tail_positions, tail_positions[-1] + depth])[None]


def walk_tree(tree: DraftTree, choose) -> tuple[list[int], list[int]]:
    """The walk from the root: at each node the target chooses its next token, and the walk moves to the child
    holding it, or stops.

    Args:
        tree: the draft tree.
        choose: ``choose(node, path_tokens) -> int``, the target's next token after ``node`` (``-1``: the
            root), ``path_tokens`` being the tokens emitted so far this round: its processed argmax (greedy)
            or a sample from its processed distribution (exact-match sampling).

    Returns:
        ``(path, tokens)``: the accepted nodes, root side first, and the emitted tokens (the accepted nodes'
        tokens, then the target's token after the last of them): ``len(tokens) == len(path) + 1``.
    """
    node, path, tokens = -1, [], []
    while True:
        token = choose(node, tokens)
        tokens.append(token)
        child = tree.children.get((node, token))
        if child is None:
            return path, tokens
        path.append(child)
        node = child


def keep_path(cache: DynamicCache, start: int, path: list[int]) -> None:
    """Move the keys and values of the accepted nodes ``path`` (indices into the nodes that were fed at cache
    positions ``start, start + 1, ...``) to positions ``start .. start + len(path) - 1``, in order; the caller
    then crops the cache after them. Nothing moves when the path is the nodes' own prefix (a chain)."""
    if path == list(range(len(path))):
        return
    source = torch.tensor([start + node for node in path])
    for layer in cache.layers:
        index = source.to(layer.keys.device)
        layer.keys[..., start : start + len(path), :] = layer.keys[..., index, :]
        layer.values[..., start : start + len(path), :] = layer.values[..., index, :]


def supports_tree(target, cache) -> bool:
    """Whether ``target`` can verify a tree with ``cache``: a :class:`~transformers.DynamicCache` whose layers all
    are plain full-attention :class:`~transformers.cache_utils.DynamicLayer` (no sliding window, no recurrent
    state, no quantized or offloaded layer: their keys could not be moved in place), and an attention that takes
    a custom 4D mask (:data:`TREE_ATTENTION`)."""
    config = getattr(target, "config", None)
    attention = getattr(config, "_attn_implementation", None)
    if attention not in TREE_ATTENTION or type(cache) is not DynamicCache or getattr(cache, "offloading", False):
        return False
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return False
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return not getattr(text, "sliding_window", None) or not getattr(text, "use_sliding_window", True)
