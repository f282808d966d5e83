"""A drafter cache that rolls recurrent state back exactly, from per-position snapshots.

A recurrent or linear-attention layer (Mamba, Mamba2, the mamba layers of Jamba or Bamba, LFM2's
convolutions, Qwen3-Next's linear attention) folds every position into one state, which transformers 5.x
cannot crop (:mod:`hf_hetspec.support`), and a multi-token forward over a non-empty cache restarts its scan
from a zero state. For a *drafter* both are fixable at small cost, and its state only ever affects speed:

* the drafter steps one token at a time once its cache holds anything (a multi-token forward only from an
  empty cache, where a zero starting state is right), and
* after every forward the states of those layers are snapshotted (cloned) at the new length; a rollback
  restores the snapshot of the target length and crops the attention layers as usual. A length without
  snapshot (older than :data:`MAX_SNAPSHOTS` positions, or inside the prompt's prefill) restarts the cache
  empty, so the drafter re-feeds its context: slower, still exact.

A *target* gets no such treatment: verifying ``k`` drafted tokens one at a time costs ``k`` target forwards,
the cost speculative decoding exists to avoid, so recurrent targets stay refused.
"""

from __future__ import annotations

from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin, LinearAttentionCacheLayerMixin

#: Snapshots kept per drafter (the most recent lengths): a rollback goes back one draft plus a re-tokenization
#: window (SLEM: at most 12 drafter tokens + 4); an older length re-feeds the context instead. Memory: one state
#: per snapshot, 2.95 MB for a Mamba-130M-shaped drafter in float32 (24 layers, 1536 x 16 state), so 94 MB.
MAX_SNAPSHOTS = 32


def is_state_layer(layer) -> bool:
    """Whether ``layer`` holds only recurrent/convolution states (no per-position keys), which
    :class:`SnapshotCache` can roll back. Layers holding both (Zamba's, Falcon-H1's hybrid layers) are not."""
    return isinstance(layer, LinearAttentionCacheLayerMixin) and not isinstance(layer, CacheLayerMixin)


def _clone_states(states: dict) -> dict:
    return {i: None if s is None else s.clone() for i, s in states.items()}


class SnapshotCache(DynamicCache):
    """``DynamicCache(config=config)`` whose recurrent layers are rolled back by snapshots (module docstring).

    The owner feeds it through the model and then calls :meth:`advance` with the number of tokens fed;
    :meth:`get_seq_length` is that count (also for caches without any attention layer, where transformers'
    own raises), and :meth:`crop` restores the states at the shorter length. Attention layers keep all their
    past (sliding windows included) so a crop can go back past a window.

    Args:
        config: the drafter's text config.
    """

    def __init__(self, config):
        super().__init__(config=config)
        self._config = config
        self.length = 0
        self._snapshots: dict[int, list] = {}
        self._prepare()

    def _prepare(self) -> None:
        for layer in self.layers:
            if not is_state_layer(layer) and hasattr(layer, "activate_past_recording"):
                layer.activate_past_recording()

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens fed so far (positions held)."""
        return self.length

    def advance(self, n_tokens: int) -> None:
        """Record that ``n_tokens`` more positions were fed, and snapshot the recurrent states there."""
        self.length += n_tokens
        self._snapshots[self.length] = [
            (_clone_states(layer.conv_states), _clone_states(layer.recurrent_states), dict(layer.has_previous_state))
            if is_state_layer(layer) else None
            for layer in self.layers
        ]
        while len(self._snapshots) > MAX_SNAPSHOTS:
            del self._snapshots[min(self._snapshots)]

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` positions (a negative count, as transformers' ``crop`` takes);
        restarts the cache empty when the shorter length has no snapshot."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative number of positions to drop, got {tokens_to_remove}")
        if tokens_to_remove == 0:
            return
        length = self.length + tokens_to_remove
        snapshot = self._snapshots.get(length)
        if snapshot is None:
            self.restart()
            return
        for layer, saved in zip(self.layers, snapshot):
            if saved is None:
                layer.crop(tokens_to_remove)
                continue
            conv, recurrent, previous = saved
            layer.conv_states, layer.recurrent_states = _clone_states(conv), _clone_states(recurrent)
            layer.has_previous_state = dict(previous)
        self.length = length
        for stale in [k for k in self._snapshots if k > length]:
            del self._snapshots[stale]

    def restart(self) -> None:
        """Forget everything: empty layers, length 0 (the owner re-feeds its context)."""
        self.layers = DynamicCache(config=self._config).layers
        self._prepare()
        self.length = 0
        self._snapshots.clear()
