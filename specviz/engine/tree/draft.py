"""Growing a token tree: the helpers a drafter's ``propose_tree`` uses (``specviz.engine.drafter``).

A drafter model drafts a tree one depth at a time (``ModelExpander``): one pass over every node of
the level being expanded, under the tree mask (``specviz.engine.tree.attention``), gives each its q;
its children are the top-k of q, or draws i.i.d. from q. Its cache then holds the prefix and every
node it fed; the loop has the drafter compact it to the accepted path (``settle_tree``) with the
target's.

An EAGLE head (``specviz.drafters.eagle``) grows the same trees with an expander of its own over
the target's features; its confidence (the path product of its q, EAGLE-2) picks the nodes of a
dynamic tree (``draft_dynamic``). Prompt lookup builds a trie of its earlier matches
(``draft_lookup``).

Which drafter grows which tree is the drafter's business: the loop calls ``propose_tree`` and never
asks which kind it holds.

Exactness asks only that the candidate list be fixed before the target's draws (recursive rejection
sampling without replacement), or that the children be i.i.d. draws from the q they report (with
replacement: SpecInfer's multi-step rule): see ``specviz.engine.tree.accept``.
"""

from __future__ import annotations

import torch

from specviz.engine.drafter import DraftRequest, DraftTree
from specviz.engine.tree.attention import ancestor_matrix, masked_logits
from specviz.trace.tree import WITH_REPLACEMENT, WITHOUT_REPLACEMENT
from specviz.engine.tree.spec import TreeSpec


def _ranking(logits: torch.Tensor, q: torch.Tensor, greedy: bool) -> torch.Tensor:
    """What top-k children are ranked by: q, or under greedy decoding (q one-hot) the softmax of the logits."""
    return torch.softmax(logits.float(), dim=-1) if greedy else q


class Expander:
    """A drafter's passes over a growing tree: nodes added, levels expanded.

    Subclasses set ``root_q`` and ``root_rank`` ((1, V) each: q at the pending token, and what
    its top-k children are ranked by) and implement ``expand``.
    """

    def __init__(self, r: DraftRequest):
        self.r = r
        self.parents: list[int] = []
        self.depths: list[int] = []
        self.tokens: list[int] = []
        self.slots: list[int] = []  # node ids fed, in cache order after the prefix

    def _root(self, logits: torch.Tensor) -> None:
        """q and the ranking at the pending token from its (1, V) logits."""
        self.root_q = self.r.sampling.probs(logits, self.r.warpers)  # (1, V)
        self.root_rank = _ranking(logits, self.root_q, self.r.sampling.greedy)

    def add(self, parent: int, token: int) -> int:
        self.parents.append(parent)
        self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
        self.tokens.append(token)
        return len(self.tokens) - 1

    def feed(self, nodes: list[int]) -> torch.Tensor:
        """Append ``nodes`` to the fed slots; the (S, S) ancestor matrix of every fed slot, on the device."""
        self.slots.extend(nodes)
        slot_parents = [self.slots.index(self.parents[s]) if self.parents[s] >= 0 else -1 for s in self.slots]
        return ancestor_matrix(slot_parents).to(self.r.seq.device)

    def scored(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(q, ranking) from (k, V) logits, through the run's sampling processors."""
        q = self.r.sampling.probs(logits, self.r.warpers)
        return q, _ranking(logits, q, self.r.sampling.greedy)

    def expand(self, nodes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass over ``nodes``: their (q, ranking), each (len(nodes), V)."""
        raise NotImplementedError


class ModelExpander(Expander):
    """A causal LM's passes over a growing tree through its runner (its cache: prefix, then fed nodes)."""

    def __init__(self, runner, r: DraftRequest):
        super().__init__(r)
        self.runner = runner
        # The pending token and anything not yet cached, fed causally: q at the root.
        self._root(runner.logits(r.seq, r.n, 1))

    def expand(self, nodes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One masked pass over ``nodes``: their (q, ranking), each (len(nodes), V)."""
        allow = self.feed(nodes)
        device = self.r.seq.device
        tokens = torch.tensor([self.tokens[s] for s in self.slots], dtype=torch.long, device=device)
        positions = torch.tensor([self.r.n + self.depths[s] - 1 for s in self.slots], dtype=torch.long, device=device)
        return self.scored(masked_logits(self.runner, self.r.seq, self.r.n, tokens, positions, allow, len(nodes)))


def _children(rank: torch.Tensor, q: torch.Tensor, k: int, sampled: bool, gen) -> list[list[int]]:
    """Per row: k draws i.i.d. from q, or the k tokens ranked highest that q or the ranking gives mass."""
    if sampled:
        return torch.multinomial(q, k, replacement=True, generator=gen).tolist()
    values, ids = rank.topk(min(k, rank.shape[-1]), dim=-1)
    return [
        [t for t, v in zip(row_ids, row_v) if v > 0] or row_ids[:1]
        for row_ids, row_v in zip(ids.tolist(), values.tolist())
    ]


def _finish(x: Expander, keep: list[int], q_rows: dict[int, torch.Tensor], rule: str, r: DraftRequest) -> DraftTree:
    """The kept nodes renumbered in depth order, with their q at the parent (``q_rows[parent]``, -1: the root)."""
    order = sorted(keep, key=lambda i: (x.depths[i], i))
    new = {old: k for k, old in enumerate(order)}
    parents = [new[x.parents[i]] if x.parents[i] >= 0 else -1 for i in order]
    fed_slot = {node: s for s, node in enumerate(x.slots)}
    device = r.seq.device
    q = torch.stack([q_rows[x.parents[i]] for i in order]) if order else torch.zeros(0, r.vocab, device=device)
    return DraftTree(
        tokens=torch.tensor([x.tokens[i] for i in order], dtype=torch.long, device=device),
        parents=parents,
        depths=[x.depths[i] for i in order],
        q=q,
        rule=rule,
        fed=[fed_slot.get(i, -1) for i in order],
    )


def draft_static(x: Expander, r: DraftRequest, spec: TreeSpec, depth: int) -> DraftTree:
    """A tree of ``spec.shape[:depth]`` grown by ``x`` (a drafter model's or an EAGLE head's passes):
    every node of a level gets the next branching's children."""
    sampled = spec.children == "sampled"
    q_rows = {-1: x.root_q[0]}
    level = [x.add(-1, t) for t in _children(x.root_rank, x.root_q, spec.shape[0], sampled, r.gen)[0]]
    for b in spec.shape[1:depth]:
        q, rank = x.expand(level)
        q_rows.update(zip(level, q))
        kids = _children(rank, q, b, sampled, r.gen)
        level = [x.add(parent, t) for parent, row in zip(level, kids) for t in row]
    return _finish(x, list(range(len(x.tokens))), q_rows, WITH_REPLACEMENT if sampled else WITHOUT_REPLACEMENT, r)


def draft_explicit(x: Expander, r: DraftRequest, spec: TreeSpec, depth: int) -> DraftTree:
    """The tree ``spec.parents`` (any shape, Sequoia's) grown by ``x``, level by level down to ``depth``:
    one pass over the level's nodes that have children, each given the top-k of its q, k its number
    of children in the spec (fewer where q gives fewer tokens mass: their subtrees are dropped)."""
    kids: dict[int, list[int]] = {}
    for i, par in enumerate(spec.parents):
        kids.setdefault(par, []).append(i)
    q_rows = {-1: x.root_q[0]}
    made: dict[int, int] = {}  # spec node -> drafted node
    level = []
    for s, t in zip(kids[-1], _children(x.root_rank, x.root_q, len(kids[-1]), False, r.gen)[0]):
        made[s] = x.add(-1, t)
        level.append(s)
    for _ in range(1, depth):
        grow = [s for s in level if s in kids]
        if not grow:
            break
        q, rank = x.expand([made[s] for s in grow])
        q_rows.update(zip([made[s] for s in grow], q))
        rows = _children(rank, q, max(len(kids[s]) for s in grow), False, r.gen)
        level = []
        for s, row in zip(grow, rows):
            for c, t in zip(kids[s], row):
                made[c] = x.add(made[s], t)
                level.append(c)
    return _finish(x, list(range(len(x.tokens))), q_rows, WITHOUT_REPLACEMENT, r)


def draft_dynamic(x: Expander, r: DraftRequest, spec: TreeSpec, depth: int) -> DraftTree:
    """EAGLE-2's dynamic tree (Li et al. 2024, Sec. 4), grown by ``x``: expand the ``topk`` nodes of
    each depth with the highest path product of drafter probabilities (the drafter's own confidence)
    into their ``topk`` best children, then rerank: keep the ``budget`` nodes of highest product
    (ties: shallower first, so the kept set is a tree)."""
    k = spec.topk
    q_rows = {-1: x.root_q[0]}
    score: dict[int, float] = {}
    values, ids = x.root_rank[0].topk(min(k, x.root_rank.shape[-1]))
    level = []
    for t, v in zip(ids.tolist(), values.tolist()):
        if v > 0:
            node = x.add(-1, t)
            score[node] = v
            level.append(node)
    for _ in range(1, depth):
        frontier = sorted(level, key=lambda i: -score[i])[:k]
        if not frontier:
            break
        q, rank = x.expand(frontier)
        q_rows.update(zip(frontier, q))
        values, ids = rank.topk(min(k, rank.shape[-1]), dim=-1)
        level = []
        for parent, row_ids, row_v in zip(frontier, ids.tolist(), values.tolist()):
            for t, v in zip(row_ids, row_v):
                if v > 0:
                    node = x.add(parent, t)
                    score[node] = score[parent] * v
                    level.append(node)
    keep = sorted(score, key=lambda i: (-score[i], x.depths[i], i))[: spec.budget]
    return _finish(x, keep, q_rows, WITHOUT_REPLACEMENT, r)


def find_continuations(
    history: list[int], max_ngram: int, min_ngram: int, depth: int, branches: int
) -> list[tuple[int, list[int]]]:
    """Every distinct continuation of the longest recurring tail n-gram (n = max_ngram .. min_ngram),
    most recent match first: up to ``branches`` of (start position, up to ``depth`` tokens)."""
    size = len(history)
    for n in range(min(max_ngram, size - 1), min_ngram - 1, -1):
        tail = history[size - n :]
        found, seen = [], set()
        for i in range(size - n - 1, -1, -1):
            if history[i : i + n] == tail:
                start = i + n
                cont = tuple(history[start : start + depth])
                if cont and cont not in seen:
                    seen.add(cont)
                    found.append((start, list(cont)))
                    if len(found) == branches:
                        break
        if found:
            return found
    return []


def empty_tree(r: DraftRequest) -> DraftTree:
    """A tree of no nodes: the round verifies no drafts."""
    device = r.seq.device
    return DraftTree(
        tokens=torch.zeros(0, dtype=torch.long, device=device),
        parents=[],
        depths=[],
        q=torch.zeros(0, r.vocab, device=device),
        rule=WITHOUT_REPLACEMENT,
        fed=[],
    )


def grow_tree(x: Expander, r: DraftRequest, spec: TreeSpec, depth: int) -> DraftTree:
    """The tree ``spec`` asks for, no deeper than ``depth``, grown by ``x``: a static shape
    (``draft_static``), an explicit shape of any form (``draft_explicit``, the auto tree's) or EAGLE-2's
    dynamic tree (``draft_dynamic``)."""
    grow = draft_static if spec.is_static else draft_explicit if spec.parents is not None else draft_dynamic
    return grow(x, r, spec, min(depth, spec.depth))


def lookup_branches(spec: TreeSpec) -> int:
    """How many distinct matches prompt lookup's tree keeps: the branching of a static shape, or the
    node budget spread over the depth."""
    return spec.topk if spec.is_static else max(1, spec.budget // spec.depth)


def draft_lookup(r: DraftRequest, max_ngram: int, min_ngram: int, depth: int, branches: int) -> DraftTree:
    """Prompt lookup's tree: one branch per distinct earlier match of the tail n-gram
    (n = max_ngram .. min_ngram) in ``r.history``, merged where they share a prefix (a trie), so
    siblings are distinct: judged without replacement."""
    parents, depths, tokens, sources = [], [], [], []
    child: dict[tuple[int, int], int] = {}
    for start, cont in find_continuations(r.history, max_ngram, min_ngram, depth, branches):
        node = -1
        for j, t in enumerate(cont):
            if (node, t) not in child:
                child[(node, t)] = len(tokens)
                parents.append(node)
                depths.append(1 if node < 0 else depths[node] + 1)
                tokens.append(t)
                sources.append(start + j)
            node = child[(node, t)]
    order = sorted(range(len(tokens)), key=lambda i: (depths[i], i))
    new = {old: k for k, old in enumerate(order)}
    return DraftTree(
        tokens=torch.tensor([tokens[i] for i in order], dtype=torch.long, device=r.seq.device),
        parents=[new[parents[i]] if parents[i] >= 0 else -1 for i in order],
        depths=[depths[i] for i in order],
        q=None,
        rule=WITHOUT_REPLACEMENT,
        sources=[sources[i] for i in order],
        fed=[-1] * len(order),
    )
