"""The target's features f_t over the EAGLE corpus: recomputed from the token ids on the trainer's device, never stored.

f_t is the hidden state the target's output layer reads at position t (``target.model(...).last_hidden_state``,
after the final norm), (L, H) per sequence, kept in bfloat16 in memory only.

A sequence's features are always computed in the same company, so they do not depend on the order in which
training asks for them, nor on whether a run was interrupted and resumed: each shard's sequences, sorted by
(length, index), are cut into **canonical groups** of ``group`` sequences, and a group is one right-padded
teacher-forced pass (a causal model's positions before the padding see only their own sequence). On a GPU every
group is computed before training (``precompute``: about 5.2 GB of bf16 per 25,000 answers of the English pair,
179 tokens each on average); on a CPU a group is computed the first time a batch needs one of its sequences, and
kept while the cache holds less than ``max_cached_bytes``.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict

import torch
from tqdm import tqdm

from specviz.training.eagle_corpus import Corpus


class Features:
    """f_t of every corpus sequence, on ``device``, computed by ``target`` in canonical groups.

    Args:
        target: a transformers causal LM (its ``.model`` gives the last hidden state), on ``device``.
        corpus: the token ids.
        group: sequences per canonical group (part of what decides the features' last bits).
        max_cached_bytes: stop keeping new groups past this (they are then recomputed when asked for again).
    """

    def __init__(self, target, corpus: Corpus, group: int = 16, max_cached_bytes: float = 8e9):
        if group < 1:
            raise ValueError("group must be at least 1")
        self.target, self.corpus, self.group = target, corpus, group
        self.device = next(target.parameters()).device
        self.max_cached_bytes = max_cached_bytes
        self.cached_bytes = 0
        self.passes = 0
        self._cache: dict[int, torch.Tensor] = {}
        by_shard: dict[int, list[int]] = defaultdict(list)
        for i, s in enumerate(corpus.shard.tolist()):
            by_shard[s].append(i)
        self.groups: list[list[int]] = []
        self._group_of: list[int] = [0] * len(corpus)
        lengths = corpus.lengths.tolist()
        for s in sorted(by_shard):
            members = sorted(by_shard[s], key=lambda i: (lengths[i], i))
            for start in range(0, len(members), group):
                for i in members[start:start + group]:
                    self._group_of[i] = len(self.groups)
                self.groups.append(members[start:start + group])

    @torch.no_grad()
    def _compute(self, g: int) -> dict[int, torch.Tensor]:
        """One teacher-forced pass over canonical group ``g``: {sequence: (L, H) bf16 on the device}."""
        members = self.groups[g]
        width = max(int(self.corpus.lengths[i]) for i in members)
        ids = torch.zeros(len(members), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, i in enumerate(members):
            seq = self.corpus.sequence(i)
            ids[r, :len(seq)] = seq
            mask[r, :len(seq)] = 1
        hidden = self.target.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).last_hidden_state
        self.passes += 1
        return {i: hidden[r, :int(self.corpus.lengths[i])].to(torch.bfloat16).clone() for r, i in enumerate(members)}

    def get(self, i: int) -> torch.Tensor:
        """f_t of sequence ``i``: (lengths[i], H) bf16 on the device."""
        if i in self._cache:
            return self._cache[i]
        out = self._compute(self._group_of[i])
        size = sum(t.numel() * t.element_size() for t in out.values())
        if self.cached_bytes + size <= self.max_cached_bytes:
            self._cache.update(out)
            self.cached_bytes += size
        return out[i]

    def precompute(self, deadline: float = math.inf) -> float:
        """Compute and keep every group until ``deadline`` (time.time()) or until the cache holds
        ``max_cached_bytes`` (the rest is then computed when asked for); returns the seconds spent."""
        t0 = time.time()
        for g in tqdm(range(len(self.groups)), desc="features", unit="group", mininterval=5):
            if time.time() > deadline or self.cached_bytes >= self.max_cached_bytes:
                break
            if self.groups[g][0] not in self._cache:
                out = self._compute(g)
                self._cache.update(out)
                self.cached_bytes += sum(t.numel() * t.element_size() for t in out.values())
        return time.time() - t0

    def batch(self, rows: list[int]):
        """A training batch of sequences ``rows``, right-padded, on the device:
        ids (B, T) long, f (B, T, H) bf16, loss mask (B, T) bool.

        The loss mask marks the inputs t = (f_t, x_{t+1}) whose targets are f_{t+1} and p(x_{t+2}) with x_{t+2}
        an answer token: from the prompt's second-last position to the sequence's third-last.
        """
        seqs = [self.corpus.sequence(i) for i in rows]
        width = max(len(s) for s in seqs)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for r, (i, seq) in enumerate(zip(rows, seqs)):
            ids[r, :len(seq)] = seq
            n = int(self.corpus.prompt_lengths[i])
            mask[r, max(0, n - 2):len(seq) - 2] = True
        feats = torch.nn.utils.rnn.pad_sequence([self.get(i) for i in rows], batch_first=True)
        return ids.to(self.device, non_blocking=True), feats, mask.to(self.device, non_blocking=True)
