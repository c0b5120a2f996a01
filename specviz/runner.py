"""Feeding a causal LM the tokens it has not seen yet, with a KV cache that can be rolled back.

The invariant the engine keeps: the cache holds the keys and values of a prefix of the
sequence; ``logits`` feeds only the tokens after that prefix (the prefix is never re-fed,
positions follow from the cache length), and ``rollback`` drops what a rejection
invalidated with ``DynamicCache.crop`` (a negative count in transformers 5).

The cache is a plain ``DynamicCache()``, built without the model's config: given the config, a
sliding-window model (Mistral's ``sliding_window``) gets layers that keep only the window and
cannot be rolled back once it is full. A plain cache keeps every position and the model's own
attention mask still applies the window, so the cached run equals the re-fed one.

``cached=False`` gives the reference path of the tests: the whole sequence is re-fed on every
call and nothing is kept, so a cache bug cannot hide in both paths at once.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def widen(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """``logits`` (..., columns) cut or padded to (..., vocab): columns past a narrow output layer
    (a drafter head that scores fewer tokens than the target's vocabulary) get the dtype's lowest
    value, so after softmax their q is exactly 0 (FR-Spec's reading, Zhao et al. 2025)."""
    cols = logits.shape[-1]
    if cols >= vocab:
        return logits[..., :vocab]
    pad = logits.new_full((*logits.shape[:-1], vocab - cols), torch.finfo(logits.dtype).min)
    return torch.cat([logits, pad], dim=-1)


class ModelRunner:
    """One model's view of a growing sequence.

    Args:
        model: a transformers causal LM, already on its device and in eval mode.
        vocab_size: logits are cut to this many columns (the tokenizer's size), because
            models of one family pad their embedding tables differently.
        cached: keep a KV cache (True) or re-feed the whole sequence each call (False).
    """

    def __init__(self, model, vocab_size: int, cached: bool = True):
        self.model = model
        self.vocab_size = vocab_size
        self.cached = cached
        self.cache = DynamicCache() if cached else None  # no config: see the module docstring
        self.seen = 0  # tokens whose keys and values are in the cache
        self.passes = 0  # forward passes made

    def logits(self, seq: torch.Tensor, end: int, n_last: int) -> torch.Tensor:
        """Feed ``seq[seen:end]`` and return the logits of the last ``n_last`` positions.

        Args:
            seq: 1-D LongTensor on the model's device holding the whole sequence so far.
            end: length of the sequence to process (positions >= end are ignored).
            n_last: how many final positions to return logits for (1 <= n_last <= end - seen).

        Returns:
            Tensor of shape (n_last, vocab_size) in the model's dtype.
        """
        self.passes += 1
        if not self.cached:
            out = self.model(input_ids=seq[None, :end], use_cache=False, logits_to_keep=n_last)
            return widen(out.logits[0], self.vocab_size)
        new = seq[None, self.seen : end]
        out = self.model(input_ids=new, past_key_values=self.cache, use_cache=True, logits_to_keep=n_last)
        self.seen = end
        return widen(out.logits[0], self.vocab_size)

    def prefill(self, seq: torch.Tensor, end: int) -> None:
        """Put ``seq[:end]`` in the cache (no-op for an empty prefix or without a cache)."""
        if self.cached and end > self.seen:
            self.logits(seq, end, 1)

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` positions in the cache (no-op if it holds fewer)."""
        if self.cached and self.seen > length:
            self.cache.crop(length - self.seen)
            self.seen = length
