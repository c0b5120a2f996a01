"""Feeding a causal LM the tokens it has not seen yet, with a KV cache that can be rolled back.

The invariant the engine keeps: the cache holds the keys and values of a prefix of the
sequence; ``logits`` feeds only the tokens after that prefix (the prefix is never re-fed,
positions follow from the cache length), and ``rollback`` drops what a rejection
invalidated with ``DynamicCache.crop`` (a negative count in transformers 5).

The cache is a plain ``DynamicCache()``, built without the model's config: given the config, a
sliding-window model (Mistral's ``sliding_window``) gets layers that keep only the window and
cannot be rolled back once it is full. A plain cache keeps every position and the model's own
attention mask still applies the window, so the cached run equals the re-fed one.

``cached="re-fed"`` gives the reference path of the tests: the whole sequence is re-fed on every
call and nothing is kept, so a cache bug cannot hide in both paths at once.

``make_runner`` picks a runner by the loops' ``cached`` argument, one of ``Cache``: this module's ("dynamic", or
"re-fed" without a cache), the static cache's (``specviz.engine.cache``, "static") or CUDA graphs over it
(``specviz.engine.graphs``, "graphs").
"auto", the loops' default, is CUDA graphs over the static cache on a CUDA device and this module's
dynamic cache elsewhere (``choose_cache``: on a CPU a pass is bound by its arithmetic, not by launches,
and the dynamic cache measured no slower there). Every runner names what it is (``engine``), says
why where "auto" chose otherwise than graphs on a GPU or captured graphs for this run (``note``), and is
given back when its run ends (``release``: a graphed runner's one cache serves one run at a time).
"""

from __future__ import annotations

from typing import Literal, NamedTuple, get_args

import torch

from transformers import DynamicCache

from specviz.engine.kept_logits import logits_kept
from specviz.engine.vocab import widen  # noqa: F401  (re-exported: the batch runner and the tree read it here too)


class ModelRunner:
    """One model's view of a growing sequence.

    Args:
        model: a transformers causal LM, already on its device and in eval mode.
        vocab_size: logits are cut to this many columns (the tokenizer's size), because
            models of one family pad their embedding tables differently.
        keeps_cache: keep a KV cache (True, "dynamic") or re-feed the whole sequence each call (False, "re-fed").
    """

    def __init__(self, model, vocab_size: int, keeps_cache: bool = True, keep_features: bool = False, note: str = ""):
        self.model = model
        self.engine = "dynamic" if keeps_cache else "re-fed"
        self.note = note
        self.keep_features = keep_features
        # (first position, (k, H) last hidden states of the positions fed by the latest pass),
        # kept when ``keep_features`` (an EAGLE drafter reads them)
        self.features: tuple[int, torch.Tensor] | None = None
        self.vocab_size = vocab_size
        self.keeps_cache = keeps_cache
        self.cache = DynamicCache() if keeps_cache else None  # no config: see the module docstring
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
        extra = {"output_hidden_states": True} if self.keep_features else {}
        if not self.keeps_cache:
            keep = logits_kept(n_last, end, seq.device)
            out = self.model(input_ids=seq[None, :end], use_cache=False, logits_to_keep=keep, **extra)
            if self.keep_features:
                self.features = (0, out.hidden_states[-1][0])
            return widen(out.logits[0], self.vocab_size)
        new = seq[None, self.seen : end]
        keep = logits_kept(n_last, end - self.seen, seq.device)
        out = self.model(input_ids=new, past_key_values=self.cache, use_cache=True, logits_to_keep=keep, **extra)
        if self.keep_features:
            self.features = (self.seen, out.hidden_states[-1][0])
        self.seen = end
        return widen(out.logits[0], self.vocab_size)

    def prefill(self, seq: torch.Tensor, end: int) -> None:
        """Put ``seq[:end]`` in the cache (no-op for an empty prefix or without a cache)."""
        if self.keeps_cache and end > self.seen:
            self.logits(seq, end, 1)

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` positions in the cache (no-op if it holds fewer)."""
        if self.keeps_cache and self.seen > length:
            self.cache.crop(length - self.seen)
            self.seen = length

    def release(self) -> None:
        """The run is over (nothing to give back: the cache is this runner's own)."""


# The passes' KV cache, as the loops' ``cached`` argument names it: "auto" (graphs on a GPU, else dynamic:
# ``choose_cache``), transformers' "dynamic" cache, the "static" cache, CUDA "graphs" over it, or none ("re-fed": the
# whole sequence fed again each pass, the tests' reference).
Cache = Literal["auto", "dynamic", "static", "graphs", "re-fed"]
CACHES: tuple[str, ...] = get_args(Cache)


class CacheChoice(NamedTuple):
    """What "auto" runs a model's passes over: ``cached`` as ``make_runner`` takes it, and why not graphs on a GPU."""

    cached: Cache
    reason: str


def choose_cache(model, keep_features: bool = False) -> CacheChoice:
    """"auto" for ``model``: "graphs" on a device that replays CUDA graphs (``specviz.engine.graphs.supported``),
    unless the run reads the target's features (EAGLE: the dynamic cache keeps them) or the model's layers mix
    sliding and full attention (one static mask cannot serve them); "dynamic" otherwise, with
    the reason where the device could have replayed graphs (none on a CPU, where the dynamic cache is the form)."""
    from specviz.engine import graphs
    from specviz.engine.cache import _window

    if not graphs.supported(model):
        return CacheChoice("dynamic", "")
    if keep_features:
        return CacheChoice(
            "dynamic", "eager passes over the dynamic cache: the EAGLE drafter reads the target's features there"
        )
    try:
        _window(model.config)
    except ValueError as err:
        return CacheChoice("dynamic", f"eager passes over the dynamic cache: {err}")
    return CacheChoice("graphs", "")


def make_runner(
    model,
    vocab_size: int,
    cached: Cache = "auto",
    capacity: int | None = None,
    role: str = "target",
    keep_features: bool = False,
):
    """The runner for ``cached``: "dynamic" a ``DynamicCache`` (``ModelRunner``), "re-fed" the reference without a
    cache,
    "static" a ``StaticRunner`` over a preallocated cache, "graphs" the model's ``specviz.engine.graphs.GraphedRunner``
    (CUDA graphs over a static cache, captured on first use; one per ``role``, "target" or "drafter"), "auto"
    what ``choose_cache`` picks: the graphed runner where it is free (``specviz.engine.graphs.hold``), else the
    dynamic cache with its reason in ``note``. ``keep_features`` keeps each pass's last hidden states (an EAGLE
    drafter reads them). Call the runner's ``release`` when the run ends.

    Raises:
        ValueError: any other ``cached``; "graphs" for a model not on CUDA; ``keep_features`` with a
            static cache or graphs (the EAGLE drafter reads features from the dynamic and re-fed paths).
    """
    if cached == "auto":
        choice = choose_cache(model, keep_features)
        if choice.cached == "graphs":
            from specviz.engine.graphs import hold

            runner, note = hold(model, vocab_size, role)
            if runner is not None:
                return runner
            return ModelRunner(model, vocab_size, True, keep_features=keep_features, note=note)
        return ModelRunner(model, vocab_size, True, keep_features=keep_features, note=choice.reason)
    if keep_features and cached not in ("dynamic", "re-fed"):
        raise ValueError(
            'the EAGLE drafter reads the target\'s features over the dynamic cache: run it with cached="dynamic"'
        )
    if cached == "graphs":
        from specviz.engine.graphs import graphed

        return graphed(model, vocab_size, role=role).acquire()
    if cached == "static":
        from specviz.engine.cache import StaticRunner

        return StaticRunner(model, vocab_size, capacity)
    if cached in ("dynamic", "re-fed"):
        return ModelRunner(model, vocab_size, cached == "dynamic", keep_features=keep_features)
    raise ValueError(f"cached must be one of {', '.join(CACHES)}, got {cached!r}")
