"""Prompt lookup (n-gram) drafting: drafts copied from an earlier place in the prompt and output.

Saxena 2023 ("prompt lookup decoding"); transformers' ``prompt_lookup_num_tokens``, vLLM's
``ngram`` method. The last n tokens of the sequence are searched for earlier in it, n from
``max_ngram`` down to ``min_ngram``; the tokens that followed the match become the drafts.

Which match: the **most recent** one (transformers takes the first in the sequence). Text that
repeats tends to repeat what was written last: in code, the latest use of a name or the method
just written is the better guide to what comes next, and the latest match sits closest to the
tokens being drafted.

Never a special token: a chat's markers (``<|im_start|>``, ``<|im_end|>``, end-of-text) recur in every turn, so the
lookup would copy them as drafts, which the page then shows struck through as rejected markers. Given ``skip_ids`` (or
a tokenizer, whose special tokens they become: ``special_ids``), a continuation stops before the first of them, and a
match whose continuation starts with one gives way to the next match. A match may still run through a marker: only
the drafts skip them.

Exactness: a copied draft is deterministic given the sequence, so its q is one-hot at the draft.
The acceptance test u < min(1, p(x)/q(x)) becomes u < p(x), and a rejected draft's correction comes
from norm(max(0, p - onehot(x))), p with x removed: the output follows the target's law at any
temperature. With no match the round proposes no drafts: one target pass, one token from p.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from specviz.engine.drafter import Drafter, DraftRequest, Proposal
from specviz.engine.tree.draft import DraftTree, draft_lookup, lookup_branches
from specviz.engine.tree.spec import TreeSpec


def special_ids(tokenizer) -> frozenset[int]:
    """The ids a tokenizer marks special: its special tokens (``all_special_ids``) and the added tokens flagged
    special (a chat template's markers); empty without a tokenizer."""
    if tokenizer is None:
        return frozenset()
    ids = {int(i) for i in (getattr(tokenizer, "all_special_ids", None) or ())}
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids |= {int(i) for i, token in added.items() if getattr(token, "special", False)}
    return frozenset(ids)


def find_continuation(history: list[int], max_ngram: int, min_ngram: int, gamma: int,
                      skip: frozenset[int] = frozenset()) -> tuple[int, list[int]] | None:
    """The most recent earlier occurrence of the last n tokens of ``history`` (n = max_ngram .. min_ngram).

    Args:
        skip: token ids never drafted (``special_ids``): a continuation stops before the first; a match whose
            continuation starts with one gives way to the next match (older, then a shorter n-gram).

    Returns:
        (start, tokens): the up to ``gamma`` tokens that followed the match, which begin at
        position ``start`` of ``history``; None when no n-gram recurs (with a continuation to draft).
    """
    size = len(history)
    for n in range(min(max_ngram, size - 1), min_ngram - 1, -1):
        tail = history[size - n:]
        # Latest first; a match must end before the tail begins so something follows it.
        for i in range(size - n - 1, -1, -1):
            if history[i:i + n] == tail:
                start = i + n
                tokens = history[start:start + gamma]
                if skip:
                    cut = next((k for k, t in enumerate(tokens) if t in skip), len(tokens))
                    tokens = tokens[:cut]
                if tokens:
                    return start, tokens
    return None


def _pruned(tree: DraftTree, skip: frozenset[int]) -> DraftTree:
    """``tree`` without its nodes of a ``skip`` id and their descendants (nodes stay in depth order, parents first)."""
    if not skip or not tree.size:
        return tree
    tokens = tree.tokens.tolist()
    kept: dict[int, int] = {}
    for i, (t, parent) in enumerate(zip(tokens, tree.parents)):
        if t not in skip and (parent < 0 or parent in kept):
            kept[i] = len(kept)
    if len(kept) == tree.size:
        return tree
    order = list(kept)
    index = torch.tensor(order, dtype=torch.long, device=tree.tokens.device)
    return replace(
        tree,
        tokens=tree.tokens[index],
        parents=[kept[tree.parents[i]] if tree.parents[i] >= 0 else -1 for i in order],
        depths=[tree.depths[i] for i in order],
        q=tree.q[index] if tree.q is not None else None,
        sources=[tree.sources[i] for i in order] if tree.sources is not None else None,
        fed=[tree.fed[i] for i in order] if tree.fed is not None else None,
    )


class PromptLookupDrafter(Drafter):
    """Drafts copied from the sequence itself; no model and no forward pass.

    Args:
        max_ngram: the longest n-gram searched for (>= 1); transformers' ``max_matching_ngram_size``
            defaults to 2, vLLM's ``prompt_lookup_max`` is commonly 4.
        min_ngram: the shortest (1 <= min_ngram <= max_ngram).
        skip_ids: token ids never proposed as drafts (chat markers, end-of-text).
        tokenizer: a tokenizer whose special tokens (``special_ids``) join ``skip_ids``.

    Raises:
        ValueError: n-gram sizes out of range.
    """

    kind = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, skip_ids=(), tokenizer=None):
        if not (isinstance(max_ngram, int) and isinstance(min_ngram, int) and 1 <= min_ngram <= max_ngram <= 64):
            raise ValueError(
                f"n-gram sizes must satisfy 1 <= min_ngram <= max_ngram <= 64, got {min_ngram}, {max_ngram}"
            )
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.skip = frozenset(int(t) for t in skip_ids) | special_ids(tokenizer)

    def start(self, seq: torch.Tensor, n: int, vocab: int, cached: str) -> None:
        pass

    def propose(self, request: DraftRequest) -> Proposal:
        found = find_continuation(request.history, self.max_ngram, self.min_ngram, request.gamma, self.skip)
        if not found or not found[1]:
            return Proposal(q=self.empty(request), sources=[])
        start, tokens = found
        drafts = torch.tensor(tokens, dtype=torch.long, device=request.seq.device)
        request.seq[request.n : request.n + len(tokens)] = drafts
        q = torch.zeros(len(tokens), request.vocab, device=drafts.device).scatter_(1, drafts[:, None], 1.0)  # one-hot
        return Proposal(q=q, sources=list(range(start, start + len(tokens))))

    drafts_trees = True  # propose_tree and settle_tree below

    def propose_tree(self, request: DraftRequest, spec: TreeSpec, depth: int) -> DraftTree:
        """One branch per distinct earlier match, merged into a trie (``specviz.engine.tree.draft.draft_lookup``)."""
        return _pruned(
            draft_lookup(request, self.max_ngram, self.min_ngram, min(depth, spec.depth), lookup_branches(spec)),
            self.skip,
        )

    def describe(self) -> dict:
        skips = {"skipped_special_tokens": len(self.skip)} if self.skip else {}
        return {"kind": self.kind, "max_ngram": self.max_ngram, "min_ngram": self.min_ngram, **skips}
