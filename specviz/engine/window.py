"""Sliding attention windows in masks built by hand.

A model with a sliding window w on a layer (Mistral 7B v0.1 on every layer; Gemma 2 and 3, Qwen2
with ``use_sliding_window`` on some) lets the query at position q see the key at position k only
when q - w < k <= q: transformers' own mask (``masking_utils.sliding_window_overlay``:
``kv_idx > q_idx - sliding_window``). transformers uses a 4-D ``attention_mask`` as given, so a
mask built by hand (a token tree's, the static cache's) must apply the window itself, and it must
measure the window in positions, not in cache columns: a tree node at depth d sits at position
prefix + d - 1 whatever its column, and sees its ancestors and the prefix positions inside the
window from there, exactly as on its own path.

Layers of different kinds need different masks; the models that mix them (Gemma 2 and 3, Qwen2)
take a dict from layer kind (``config.layer_types``) to mask, and ``additive_masks`` gives one.
"""

from __future__ import annotations

import torch

FULL = "full_attention"
SLIDING = "sliding_attention"


def _text_config(config):
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def layer_windows(config) -> dict[str, int | None]:
    """Each kind of attention layer of a model, with its window in tokens (None: the whole context).

    Args:
        config: a transformers config (a multimodal one gives its text decoder's).

    Returns:
        {"full_attention": None} for a model without a window; {"sliding_attention": w} for one
        whose every layer slides (Mistral: ``sliding_window`` and no ``layer_types``); both keys
        for a model that mixes them.
    """
    config = _text_config(config)
    window = getattr(config, "sliding_window", None) or None
    kinds = set(getattr(config, "layer_types", None) or [])
    if not kinds:
        kinds = {SLIDING if window is not None else FULL}
    if window is None:  # "sliding" layers without a window attend to everything (Qwen2 with it off)
        return {FULL: None}
    return {kind: (int(window) if kind == SLIDING else None) for kind in sorted(kinds)}


def within(query_positions: torch.Tensor, key_positions: torch.Tensor, window: int | None) -> torch.Tensor:
    """(rows, cols) bool: the key at ``key_positions[j]`` lies inside the window of the query at
    ``query_positions[i]`` (k > q - window, transformers' ``sliding_window_overlay``); all True
    without a window. Causality is the caller's mask's: this only removes what lies too far back.

    Args:
        query_positions: (rows,) long; key_positions: (cols,) long, on one device.
    """
    if window is None:
        return torch.ones(
            query_positions.shape[0], key_positions.shape[0], dtype=torch.bool, device=key_positions.device
        )
    return key_positions[None, :] > query_positions[:, None] - window


def additive(allow: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(1, 1, rows, cols) float mask from (rows, cols) bool: 0 where allowed, the dtype's minimum elsewhere."""
    return torch.zeros(allow.shape, dtype=dtype, device=allow.device).masked_fill_(~allow, torch.finfo(dtype).min)[
        None, None
    ]


def additive_masks(
    allow: torch.Tensor,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    windows: dict[str, int | None],
    dtype: torch.dtype,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The float mask a model takes for ``allow`` with each layer kind's window applied.

    Args:
        allow: (rows, cols) bool, what a query may see before any window (causal, tree, valid columns).
        query_positions: (rows,) each query's position id; key_positions: (cols,) each key column's.
        windows: ``layer_windows(model.config)``.
        dtype: the model's dtype.

    Returns:
        (1, 1, rows, cols) when every layer is of one kind; else a dict from layer kind to such a
        mask (what Gemma 2 and 3 and Qwen2 take as ``attention_mask``).
    """
    masks = {kind: additive(allow & within(query_positions, key_positions, w), dtype) for kind, w in windows.items()}
    return next(iter(masks.values())) if len(masks) == 1 else masks
