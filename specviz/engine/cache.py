"""A static KV cache for every decoding loop: preallocated once, written at explicit positions,
read under an explicit 4-D mask, rolled back by moving an index.

Built on transformers' own cache classes: a ``Cache`` whose layers are ``StaticLayer``s. A
``StaticLayer`` holds keys and values of shape (batch, heads, capacity, head_dim), allocated on its
first write, and writes a pass's new entries at its ``cumulative_length`` (a device tensor) and
onwards. Setting that index is therefore the whole of positioning and rollback here: entries at or
past it are stale, and the mask this module builds never lets a query see them. Nothing is cropped
and nothing is reallocated during a run, so the tensors keep their addresses (what a CUDA graph
replays over: ``specviz.engine.graphs``).

Every pass gives the model ``position_ids`` and a float mask of shape (batch, 1, queries, capacity),
0 where a query may look and the dtype's minimum elsewhere; transformers uses a 4-D mask as given.
The masks:

- a chain (``causal_mask``): the token at position p sees positions 0..p (and, for a model with
  a sliding window w on every layer, only those above p - w, as the model's own mask would);
- a tree (``tree_mask``): every node sees the settled prefix and its own ancestors, never a sibling
  or a cousin (Miao et al. 2024, SpecInfer, Sec. 4.2), and with a sliding window only those inside
  it from the node's own position (prefix + depth - 1); the accepted path is compacted in place
  (``StaticKV.compact``).

The re-fed uncached path (``specviz.engine.runner.ModelRunner(keeps_cache=False)``) stays the tests' reference;
``specviz.engine.runner.make_runner`` picks a runner by the loops' ``cached`` argument.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, StaticLayer

from specviz.engine.kept_logits import logits_kept
from specviz.engine.vocab import widen
from specviz.engine.window import SLIDING, layer_windows, within


def _window(config) -> int | None:
    """The sliding window shared by every layer (None: full attention).

    Raises:
        ValueError: layers of different kinds (sliding and full), which one mask cannot serve.
    """
    windows = layer_windows(config)
    if len(windows) > 1:
        raise ValueError(f"the static cache takes one mask for every layer; this model mixes {sorted(windows)} "
                         f"(a sliding window of {windows[SLIDING]} tokens on some layers): use the dynamic cache")
    return next(iter(windows.values()))


def _layers(config) -> int:
    config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return int(getattr(config, "num_hidden_layers", None) or config.n_layer)


class StaticKV:
    """One model's preallocated keys and values for ``batch`` rows and ``capacity`` positions.

    Args:
        model: a transformers causal LM (its config gives the layers and the sliding window).
        capacity: positions held per row: prompt + max_new_tokens + the largest round's tokens.

    Raises:
        ValueError: capacity < 1; a model whose layers mix sliding and full attention.
    """

    def __init__(self, model, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.window = _window(model.config)
        self.dtype = model.dtype
        self.device = model.device
        self.cache = Cache(layers=[StaticLayer(self.capacity) for _ in range(_layers(model.config))])
        self.length = 0  # positions written and valid, the same in every layer

    def set_length(self, length: int) -> None:
        """Make the next write start at ``length`` (rollback, or a jump forward over written entries).

        Raises:
            ValueError: length outside 0..capacity.
        """
        if not 0 <= length <= self.capacity:
            raise ValueError(f"cache length {length} is outside 0..{self.capacity}")
        # In place (the tensors' addresses stay, as a graph needs), one fused kernel pair for every
        # layer on a GPU rather than a launch per layer.
        # The lengths are made inside the passes' inference mode, so they may only change inside it.
        lengths = [layer.cumulative_length for layer in self.cache.layers]
        with torch.inference_mode():
            torch._foreach_mul_(lengths, 0)
            torch._foreach_add_(lengths, length)
        self.length = length

    def _blocked(self, allow: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(allow.shape, dtype=self.dtype, device=allow.device)
        return mask.masked_fill_(~allow, torch.finfo(self.dtype).min)

    def causal_mask(self, positions: torch.Tensor) -> torch.Tensor:
        """(1, 1, len(positions), capacity) mask: the token at position p sees keys 0..p
        (and only those above p - window with a sliding window)."""
        keys = torch.arange(self.capacity, device=positions.device)
        allow = (keys[None, :] <= positions[:, None]) & within(positions, keys, self.window)
        return self._blocked(allow)[None, None]

    def tree_mask(
        self, prefix: int, allow: torch.Tensor, positions: torch.Tensor, windowed: bool = True
    ) -> torch.Tensor:
        """(1, 1, rows, capacity) mask: every row sees keys 0..prefix-1, and key prefix + j where
        ``allow[row, j]`` (rows, slots: the ancestor-or-self matrix's rows of the nodes fed), and with
        a sliding window only the keys inside it, measured in positions: ``positions`` (slots,) holds
        each slot's position id (prefix + depth - 1), the fed rows last (``specviz.engine.window``).
        ``windowed`` False ignores the window (a planted fault of the exactness tests only)."""
        rows, slots = allow.shape
        device = allow.device
        full = torch.zeros(rows, self.capacity, dtype=torch.bool, device=device)
        full[:, :prefix] = True
        full[:, prefix : prefix + slots] = allow
        if self.window is not None and windowed:
            # Key columns past the slots are blocked above; their position (0 here) does not matter.
            keys = torch.zeros(self.capacity, dtype=torch.long, device=device)
            keys[:prefix] = torch.arange(prefix, device=device)
            keys[prefix : prefix + slots] = positions
            full &= within(positions[-rows:], keys, self.window)
        return self._blocked(full)[None, None]

    def compact(self, prefix: int, keep: list[int]) -> None:
        """Keep the entries of positions 0..prefix-1 and then of tree slots ``keep`` (prefix + slot),
        in order, in place: the accepted path's keys and values move down to prefix, prefix + 1, ...

        Each kept node's entry was computed from its own ancestors at its depth's position, i.e. the
        entry a sequential pass over the path would have written, so no model pass is needed.
        """
        if keep != list(range(len(keep))):
            src = prefix + torch.tensor(keep, dtype=torch.long, device=self.device)
            for layer in self.cache.layers:
                if layer.is_initialized:
                    # index_select copies first, so overlapping source and destination are safe.
                    layer.keys[:, :, prefix : prefix + len(keep)] = layer.keys.index_select(2, src)
                    layer.values[:, :, prefix : prefix + len(keep)] = layer.values.index_select(2, src)
        self.set_length(prefix + len(keep))


class StaticRunner:
    """``specviz.engine.runner.ModelRunner``'s verbs (``logits``, ``prefill``, ``rollback``) over a ``StaticKV``.

    Args:
        model: a transformers causal LM on its device, in eval mode.
        vocab_size: logits are cut to this many columns.
        capacity: positions to preallocate; None: the length of the first ``seq`` fed (the loops
            allocate their token buffer with room for the whole run and its largest chain round)
            plus ``MAX_TREE_NODES`` (a token tree's slots are fed past the settled prefix).

    Raises:
        ValueError: a model mixing sliding and full layers, here before any pass.
    """

    keeps_cache = True

    def __init__(self, model, vocab_size: int, capacity: int | None = None):
        _window(model.config)  # refuse a model one mask cannot serve now, not at its first pass
        self.model = model
        self.vocab_size = vocab_size
        self.capacity = capacity
        self.kv: StaticKV | None = None
        self.seen = 0  # tokens whose keys and values are in the cache
        self.passes = 0
        self.engine = "static"
        self.note = ""

    def release(self) -> None:
        """The run is over (nothing to give back: the cache is this runner's own)."""

    @property
    def cache(self) -> Cache | None:
        return self.kv.cache if self.kv is not None else None

    def _kv(self, seq: torch.Tensor) -> StaticKV:
        if self.kv is None:
            from specviz.limits import MAX_TREE_NODES

            self.kv = StaticKV(self.model, self.capacity or seq.numel() + MAX_TREE_NODES)
        return self.kv

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, start: int, n_last: int):
        """One pass writing ``ids`` (1, n) at cache positions start.. under ``mask``; logits (n_last, vocab)."""
        kv = self.kv
        if start + ids.shape[1] > kv.capacity:
            raise ValueError(f"the static cache holds {kv.capacity} positions; this pass needs {start + ids.shape[1]}")
        self.passes += 1
        kv.set_length(start)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions[None],
            past_key_values=kv.cache,
            use_cache=True,
            logits_to_keep=logits_kept(n_last, ids.shape[1], ids.device),
        )
        kv.length = start + ids.shape[1]
        return widen(out.logits[0], self.vocab_size)

    def logits(self, seq: torch.Tensor, end: int, n_last: int) -> torch.Tensor:
        """Feed ``seq[seen:end]`` causally; the logits of the last ``n_last`` positions, (n_last, vocab_size)."""
        kv = self._kv(seq)
        positions = torch.arange(self.seen, end, device=seq.device)
        out = self.forward(seq[None, self.seen : end], positions, kv.causal_mask(positions), self.seen, n_last)
        self.seen = end
        return out

    def prefill(self, seq: torch.Tensor, end: int) -> None:
        """Put ``seq[:end]`` in the cache (no-op for an empty prefix)."""
        if end > self.seen:
            self.logits(seq, end, 1)

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` positions: the write index moves, nothing is freed."""
        if self.seen > length:
            self.seen = length
            if self.kv is not None:
                self.kv.set_length(length)

    def tree_logits(
        self,
        seq: torch.Tensor,
        prefix: int,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        allow: torch.Tensor,
        new: int,
        windowed: bool = True,
    ) -> torch.Tensor:
        """``specviz.engine.tree.attention.masked_logits`` over the static cache: the last ``new`` slots of
        ``tokens`` (S,) fed at cache positions prefix + S - new.., each under its ancestors inside the
        model's window; (new, vocab)."""
        kv = self._kv(seq)
        start = prefix + tokens.shape[0] - new
        mask = kv.tree_mask(prefix, allow[-new:], positions, windowed)
        out = self.forward(tokens[None, -new:], positions[-new:], mask, start, new)
        self.seen = prefix + tokens.shape[0]
        return out

    def compact(self, prefix: int, keep: list[int]) -> None:
        """Keep ``seq[:prefix]`` and then tree slots ``keep`` in order (``StaticKV.compact``)."""
        if self.kv is not None:
            self.kv.compact(prefix, keep)
        self.seen = prefix + len(keep)
