"""Tree attention through unpatched transformers models, and compacting a KV cache to one path.

A tree's nodes are fed after a settled prefix in one pass. transformers' models take a custom 4-D
float ``attention_mask`` of shape (1, 1, fed, cached + fed): 0 where a query may look, the dtype's
minimum elsewhere. Every node sees the whole prefix and its own ancestors (itself included), never
a sibling or a cousin; its ``position_ids`` entry is prefix + depth - 1, the position it would have
on its own path. A model with a sliding window gets it applied in positions (``specviz.engine.window``):
a node then sees only the prefix positions and ancestors inside the window from its own position, as
the model's own mask would on the node's path; layers of different kinds get a mask each. With a
``DynamicCache`` holding the prefix, each node then gets the logits of a separate pass over the prefix
and its path (checked in tests/test_tree.py to fp32 tolerance, and in tests/test_sliding_window.py
against the target's own greedy decoding over windows smaller than the prompt and the tree).

After a round the cache holds the prefix and every fed node; it must keep only the accepted path.
Two ways, both here:
- ``gather`` (the default): keep the prefix's entries and the path's, in path order, by
  ``index_select`` on every layer's keys and values (the runner's cache is a plain ``DynamicCache`` whose layers keep
  every column, a sliding window's included: ``specviz.engine.runner``). Each path node's key and value were computed
  from its own ancestors at its own depth position, i.e. exactly the entries a sequential pass over
  the path would have made, so nothing is recomputed: a copy of the cache, no model pass.
- ``refeed``: crop back to the prefix (``DynamicCache.crop``, a negative count) and feed the path's
  tokens again: one more model pass per round.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from specviz.engine.runner import ModelRunner, widen
from specviz.engine.window import FULL, additive, additive_masks, layer_windows

COMPACTIONS = ("gather", "refeed")


def ancestor_matrix(parents: list[int]) -> torch.Tensor:
    """(S, S) bool: [i, j] when slot j is slot i or one of its ancestors; ``parents[i]`` < i, -1 for none."""
    size = len(parents)
    allow = torch.eye(size, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            allow[i] |= allow[parent]
    return allow


def float_mask(prefix: int, allow: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(1, 1, rows, prefix + cols) additive mask: 0 over the prefix and where ``allow`` (rows, cols), dtype min
    elsewhere.

    No window: for attention over the whole context (the EAGLE head's own layer); a model's tree
    pass takes ``tree_masks``."""
    rows = allow.shape[0]
    return additive(torch.cat([torch.ones(rows, prefix, dtype=torch.bool, device=allow.device), allow], dim=1), dtype)


def tree_masks(
    config, prefix: int, allow: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype, windowed: bool = True
):
    """The mask of a pass feeding the last ``rows`` tree slots after a cached prefix, with the model's windows.

    Args:
        config: the model's config (its sliding windows: ``specviz.engine.window.layer_windows``).
        prefix: cached positions 0..prefix-1 (key column j holds position j).
        allow: (rows, S) bool, the ancestor-or-self rows of the slots fed, over every slot fed so far.
        positions: (S,) each slot's position id (prefix + depth - 1); the fed rows are the last ``rows``.
        windowed: False ignores the model's windows (a planted fault of the exactness tests, never
            the engine's own choice).

    Returns:
        (1, 1, rows, prefix + S) float, or a dict of them by layer kind
        (``specviz.engine.window.additive_masks``).
    """
    rows, device = allow.shape[0], allow.device
    full = torch.cat([torch.ones(rows, prefix, dtype=torch.bool, device=device), allow], dim=1)
    keys = torch.cat([torch.arange(prefix, device=device), positions])
    return additive_masks(full, positions[-rows:], keys, _windows(config, windowed), dtype)


def _windows(config, windowed: bool) -> dict[str, int | None]:
    return layer_windows(config) if windowed else {FULL: None}


def masked_logits(
    runner: ModelRunner,
    seq: torch.Tensor,
    prefix: int,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    allow: torch.Tensor,
    new: int,
    windowed: bool = True,
) -> torch.Tensor:
    """Logits of the last ``new`` tree slots, each under its own path.

    Args:
        runner: the model's runner; with a cache, it must hold ``seq[:prefix]`` and the slots
            before the new ones (``runner.seen == prefix + len(tokens) - new``).
        seq: the sequence; ``seq[:prefix]`` is the settled prefix.
        tokens: (S,) every tree slot fed this round so far, the ``new`` ones last (on the device).
        positions: (S,) each slot's position id (prefix + depth - 1 of its node).
        allow: (S, S) bool ancestor-or-self matrix of the slots (``ancestor_matrix``), on the device.
        new: slots fed by this pass (>= 1).
        windowed: False ignores the model's sliding windows (``tree_masks``: a planted fault only).

    Returns:
        (new, vocab) logits in the model's dtype. Without a cache (the tests' reference path)
        the prefix and every slot are re-fed, the prefix under a causal mask. Every mask carries
        the model's sliding windows, measured in positions (``tree_masks``).

    A runner that ``keep_features`` (its drafter is an EAGLE head) keeps the pass's last hidden
    states in ``runner.features``: (first position, (k, H)), the rows of positions first.. of the
    re-fed prefix (none with a cache), then one row per fed slot (the new ones last).
    """
    if hasattr(runner, "tree_logits"):  # a static cache (specviz.engine.cache.StaticRunner)
        return runner.tree_logits(seq, prefix, tokens, positions, allow, new, windowed)
    model, dtype = runner.model, runner.model.dtype
    keep = getattr(runner, "keep_features", False)
    extra = {"output_hidden_states": True} if keep else {}
    if runner.keeps_cache:
        mask = tree_masks(model.config, prefix, allow[-new:], positions, dtype, windowed)
        out = model(
            input_ids=tokens[None, -new:],
            attention_mask=mask,
            position_ids=positions[None, -new:],
            past_key_values=runner.cache,
            use_cache=True,
            **extra,
        )
        runner.seen = prefix + tokens.shape[0]
        runner.passes += 1
        if keep:
            runner.features = (prefix, out.hidden_states[-1][0])
        return widen(out.logits[0], runner.vocab_size)
    device = tokens.device
    causal = torch.ones(prefix, prefix, dtype=torch.bool, device=device).tril()
    top = torch.cat([causal, torch.zeros(prefix, tokens.shape[0], dtype=torch.bool, device=device)], dim=1)
    bottom = torch.cat([torch.ones(tokens.shape[0], prefix, dtype=torch.bool, device=device), allow], dim=1)
    pos = torch.cat([torch.arange(prefix, device=device), positions])
    mask = additive_masks(torch.cat([top, bottom]), pos, pos, _windows(model.config, windowed), dtype)
    ids = torch.cat([seq[:prefix], tokens])[None]
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos[None], use_cache=False, **extra)
    runner.passes += 1
    if keep:
        runner.features = (0, out.hidden_states[-1][0])
    return widen(out.logits[0, -new:], runner.vocab_size)


def compact(runner: ModelRunner, seq: torch.Tensor, prefix: int, keep: list[int], how: str = "gather") -> None:
    """Make ``runner``'s cache hold ``seq[:prefix]`` and then the tree slots ``keep`` (the accepted
    path, in order), dropping every other slot; no-op without a cache.

    ``how``: "gather" copies the kept entries (no model pass); "refeed" crops to the prefix and
    feeds ``seq[prefix : prefix + len(keep)]``, which must hold the kept slots' tokens.

    Raises:
        ValueError: an unknown ``how``; TypeError: "gather" on a cache whose layers are not plain
            dynamic layers (a sliding window, say): use "refeed" there.
    """
    if how not in COMPACTIONS:
        raise ValueError(f"cache compaction must be one of {', '.join(COMPACTIONS)}")
    if not runner.keeps_cache:
        return
    if hasattr(runner, "compact") and how == "gather":  # a static cache: in place, by index
        runner.compact(prefix, keep)
        return
    if how == "refeed":
        runner.rollback(prefix)
        runner.prefill(seq, prefix + len(keep))
        return
    if keep == list(range(len(keep))):  # the kept slots come first: a crop is enough
        runner.rollback(prefix + len(keep))
        return
    device = seq.device
    index = torch.cat(
        [torch.arange(prefix, device=device), prefix + torch.tensor(keep, dtype=torch.long, device=device)]
    )
    for layer in runner.cache.layers:
        if type(layer) is not DynamicLayer:
            raise TypeError(
                f"gathering a path needs plain dynamic cache layers, got {type(layer).__name__}; use refeed"
            )
        if layer.is_initialized and layer.keys.numel():
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)
    runner.seen = prefix + len(keep)
