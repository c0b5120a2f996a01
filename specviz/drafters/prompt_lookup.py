"""Prompt lookup (n-gram) drafting: drafts copied from an earlier place in the prompt and output.

Saxena 2023 ("prompt lookup decoding"); transformers' ``prompt_lookup_num_tokens``, vLLM's
``ngram`` method. The last n tokens of the sequence are searched for earlier in it, n from
``max_ngram`` down to ``min_ngram``; the tokens that followed the match become the drafts.

Which match: the **most recent** one (transformers takes the first in the sequence). Text that
repeats tends to repeat what was written last: in code, the latest use of a name or the method
just written is the better guide to what comes next, and the latest match sits closest to the
tokens being drafted.

Exactness: a copied draft is deterministic given the sequence, so its q is one-hot at the draft.
The acceptance test u < min(1, p(x)/q(x)) becomes u < p(x), and a rejected draft's correction comes
from norm(max(0, p - onehot(x))), p with x removed: the output follows the target's law at any
temperature. With no match the round proposes no drafts: one target pass, one token from p.
"""

from __future__ import annotations

import torch

from specviz.engine.drafter import Drafter, DraftRequest, Proposal
from specviz.engine.tree.draft import DraftTree, draft_lookup, lookup_branches
from specviz.engine.tree.spec import TreeSpec


def find_continuation(history: list[int], max_ngram: int, min_ngram: int, gamma: int) -> tuple[int, list[int]] | None:
    """The most recent earlier occurrence of the last n tokens of ``history`` (n = max_ngram .. min_ngram).

    Returns:
        (start, tokens): the up to ``gamma`` tokens that followed the match, which begin at
        position ``start`` of ``history``; None when no n-gram recurs.
    """
    size = len(history)
    for n in range(min(max_ngram, size - 1), min_ngram - 1, -1):
        tail = history[size - n:]
        # Latest first; a match must end before the tail begins so something follows it.
        for i in range(size - n - 1, -1, -1):
            if history[i:i + n] == tail:
                start = i + n
                return start, history[start:start + gamma]
    return None


class PromptLookupDrafter(Drafter):
    """Drafts copied from the sequence itself; no model and no forward pass.

    Args:
        max_ngram: the longest n-gram searched for (>= 1); transformers' ``max_matching_ngram_size``
            defaults to 2, vLLM's ``prompt_lookup_max`` is commonly 4.
        min_ngram: the shortest (1 <= min_ngram <= max_ngram).

    Raises:
        ValueError: n-gram sizes out of range.
    """

    kind = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not (isinstance(max_ngram, int) and isinstance(min_ngram, int) and 1 <= min_ngram <= max_ngram <= 64):
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_ngram <= max_ngram <= 64, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def start(self, seq: torch.Tensor, n: int, vocab: int, cached: bool) -> None:
        pass

    def propose(self, request: DraftRequest) -> Proposal:
        found = find_continuation(request.history, self.max_ngram, self.min_ngram, request.gamma)
        if not found or not found[1]:
            return Proposal(q=self.empty(request), sources=[])
        start, tokens = found
        drafts = torch.tensor(tokens, dtype=torch.long, device=request.seq.device)
        request.seq[request.n:request.n + len(tokens)] = drafts
        q = torch.zeros(len(tokens), request.vocab, device=drafts.device).scatter_(1, drafts[:, None], 1.0)  # one-hot
        return Proposal(q=q, sources=list(range(start, start + len(tokens))))

    def propose_tree(self, request: DraftRequest, spec: TreeSpec, depth: int) -> DraftTree:
        """One branch per distinct earlier match, merged into a trie (``specviz.engine.tree.draft.draft_lookup``)."""
        return draft_lookup(request, self.max_ngram, self.min_ngram, min(depth, spec.depth), lookup_branches(spec))

    def describe(self) -> dict:
        return {"kind": self.kind, "max_ngram": self.max_ngram, "min_ngram": self.min_ngram}
