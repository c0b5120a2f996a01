"""The tree with the most expected accepted tokens for each node budget, and the budget this device wants.

Sequoia (Chen et al. 2024, Sec. 3.1-3.2) scores a tree of top-k children by positional acceptance:
with p(d, k) the chance that, at a node of depth d - 1 the round's walk has reached, its k-th child
(k-th of q's ranking, the siblings tried in that order) is the one accepted, the walk reaches a node
v with probability prod_{u on the path to v} p(depth(u), rank(u)), so

    E[accepted drafts] = sum_v prod_{u <= v} p(depth(u), rank(u)),   E[tokens per round] = 1 + that

(the correction or bonus token, plus one per depth the path reaches). The assumption is Sequoia's:
the chance depends on the child's depth and sibling rank only, not on which parent it hangs from.

``best_trees`` solves, by dynamic programming over (depth, rank, nodes), for the tree (any shape:
each node's children are a prefix of its ranking) maximising that sum under a node budget n and a
depth cap D. ``choose`` then divides by a round's cost in target steps, D c_tree + v(n) (a drafter
pass per level, Sequoia's Sec. 3.3 with both costs measured; plus, where measured, the round's time
outside drafting and verifying), and compares with the chain's
E[tokens] / (gamma c_chain + v(gamma)) from its own measured acceptance by depth: the chain is a
candidate, so the choice never predicts worse than the best chain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from specviz.theory.tree import expected_tokens_per_round
from specviz.trace import Trace

# A (depth, rank) cell offered fewer times than this is estimated from its rank pooled over all depths.
MIN_COUNT = 20


def count_row(counts: list[list[list[int]]], depth: int, width: int) -> list[list[int]]:
    """Row ``depth`` (1-based) of ragged (offered, accepted) counts, grown to at least ``depth`` rows and ``width``
    cells, as ``acceptance_by_rank`` and a teacher-forced walk (``specviz.engine.tree.calibration``) fill them."""
    while len(counts) < depth:
        counts.append([])
    row = counts[depth - 1]
    while len(row) < width:
        row.append([0, 0])
    return row


def acceptance_by_rank(*traces: Trace) -> list[list[tuple[int, int]]]:
    """counts[d - 1][k - 1] = (offered, accepted): over tree rounds, the nodes of depth d - 1 the
    walk reached (the pending token is depth 0) that had at least k children, and those whose k-th
    child (in the order the siblings were tried) was the one accepted. Chain rounds are left out
    (their drafts are draws from q, not a ranking: ``specviz.theory.tree.acceptance_by_depth``)."""
    counts: list[list[list[int]]] = []
    for trace in traces:
        for r in trace.rounds:
            if r.tree is None:
                continue
            for depth, parent in enumerate([-1, *r.tree.path], start=1):
                kids = r.tree.children(parent)
                if not kids:  # the path ended at a leaf: nothing offered below it
                    continue
                row = count_row(counts, depth, len(kids))
                for k, kid in enumerate(kids):
                    row[k][0] += 1
                    row[k][1] += r.tree.nodes[kid].verdict == "accepted"
    return [[(a, b) for a, b in row] for row in counts]


def children_available(*traces: Trace) -> list[tuple[int, int]]:
    """counts[k - 1] = (rounds, rounds whose pending token got at least k children), over the tree rounds
    of ``traces`` whose pending token got any.

    A node gets its top-k children only among the tokens its q gives mass to, so under top-p or top-k
    sampling a node often gets fewer than its shape asks (never under greedy decoding: the ranking
    is then a softmax). Measured at the pending token of a tree whose shape asks the same number there
    every round (the calibration tree), this is the chance that a k-th child exists at all."""
    widths = [w for t in traces for r in t.rounds if r.tree is not None and (w := len(r.tree.children(-1)))]
    return [(len(widths), sum(w >= k for w in widths)) for k in range(1, max(widths, default=0) + 1)]


@dataclass(frozen=True)
class RankAcceptance:
    """p(d, k) estimated from ``acceptance_by_rank`` counts.

    A cell offered at least ``min_count`` times gives accepted / offered; a rarer one, or a depth
    deeper than the counts reach, takes its rank's rate pooled over all depths (Sequoia's
    depth-free assumption); a rank never offered gets 0 (no credit without evidence).

    A cell's rate is conditional on the k-th child existing (offered: the parent got at least k
    children). With ``available`` (``children_available``'s counts) p(d, k) is multiplied by the
    chance that it exists, so a shape's prediction counts a child it asks for only as often as q's
    nucleus holds one; without it, every child asked for is taken to exist.
    """

    counts: tuple[tuple[tuple[int, int], ...], ...]
    min_count: int = MIN_COUNT
    available: tuple[tuple[int, int], ...] = ()

    @classmethod
    def from_counts(cls, counts, min_count: int = MIN_COUNT, available=()) -> "RankAcceptance":
        return cls(tuple(tuple((int(a), int(b)) for a, b in row) for row in counts), min_count,
                   tuple((int(a), int(b)) for a, b in available or ()))

    def exists(self, rank: int) -> float:
        """The chance that a node's ``rank``-th child exists (``children_available``); 1 without counts
        or for a rank they do not reach (its p is 0 or pooled from where it existed)."""
        if rank <= len(self.available):
            rounds, with_k = self.available[rank - 1]
            return with_k / rounds if rounds else 1.0
        return 1.0

    @classmethod
    def from_rates(cls, rates: list[list[float]], weight: int = 10**6) -> "RankAcceptance":
        """Counts standing for exact rates (tests, priors): rates[d - 1][k - 1] at ``weight`` offers each."""
        return cls.from_counts([[(weight, round(p * weight)) for p in row] for row in rates], min_count=1)

    @property
    def max_rank(self) -> int:
        return max((len(row) for row in self.counts), default=0)

    def pooled(self, rank: int) -> float:
        """accepted / offered of the ``rank``-th child over all depths; 0 where never offered."""
        offered = sum(row[rank - 1][0] for row in self.counts if len(row) >= rank)
        accepted = sum(row[rank - 1][1] for row in self.counts if len(row) >= rank)
        return accepted / offered if offered else 0.0

    def p(self, depth: int, rank: int) -> float:
        """p(depth, rank), depth and rank from 1 (see the class docstring), times ``exists(rank)``."""
        return self.given(depth, rank) * self.exists(rank)

    def given(self, depth: int, rank: int) -> float:
        """p(depth, rank) given that the child exists: the counts' rate (see the class docstring)."""
        if depth <= len(self.counts) and rank <= len(self.counts[depth - 1]):
            offered, accepted = self.counts[depth - 1][rank - 1]
            if offered >= self.min_count:
                return accepted / offered
        return self.pooled(rank)


def expected_accepted(parents: tuple[int, ...] | list[int], p: Callable[[int, int], float]) -> float:
    """sum over nodes of the product of p(depth, rank) along the path (the module docstring).

    ``parents``: per node, its parent's index (-1: the pending token), parents before children;
    a node's rank is its place among its parent's children in node order (1 for the first)."""
    reach: list[float] = []
    depth: list[int] = []
    seen: dict[int, int] = {}
    for par in parents:
        seen[par] = seen.get(par, 0) + 1
        d = 1 if par < 0 else depth[par] + 1
        depth.append(d)
        reach.append((1.0 if par < 0 else reach[par]) * p(d, seen[par]))
    return sum(reach)


def tree_depth(parents) -> int:
    depth: list[int] = []
    for par in parents:
        depth.append(1 if par < 0 else depth[par] + 1)
    return max(depth, default=0)


@dataclass(frozen=True)
class BestTree:
    """The best tree of at most ``budget`` nodes and ``depth_cap`` levels: ``parents`` (node order
    by depth, siblings in rank order), its ``nodes`` and ``depth``, and E[accepted drafts] ``value``."""

    budget: int
    depth_cap: int
    parents: tuple[int, ...]
    value: float

    @property
    def nodes(self) -> int:
        return len(self.parents)

    @property
    def depth(self) -> int:
        return tree_depth(self.parents)

    @property
    def tokens_per_round(self) -> float:
        return 1.0 + self.value


def best_trees(p: Callable[[int, int], float], max_nodes: int, depth_cap: int, max_rank: int) -> list[BestTree]:
    """For each budget n = 0..max_nodes, the tree of at most n nodes and ``depth_cap`` levels, each
    node's children ranks 1..k with k <= ``max_rank``, with the largest ``expected_accepted``.

    G[d][n]: the best sum below a node of depth d using at most n nodes (G[depth_cap][.] = 0).
    H[k][n]: the best from its children of rank k, k + 1, ... (none after a rank left out):
    H[k][n] = max(0, max_m p(d + 1, k) (1 + G[d + 1][m]) + H[k + 1][n - 1 - m]); G[d][n] = H[1][n].
    O(depth_cap max_rank max_nodes^2) steps. Ties keep the smaller tree.

    Raises:
        ValueError: a negative budget, a depth cap or rank bound under 1.
    """
    if max_nodes < 0 or depth_cap < 1 or max_rank < 1:
        raise ValueError("need max_nodes >= 0, depth_cap >= 1 and max_rank >= 1")
    N = max_nodes
    G = [[0.0] * (N + 1) for _ in range(depth_cap + 1)]
    # choice[d][k][n]: the size m of rank k's subtree below a node of depth d, or -1 (no child of rank k).
    choice = [[[-1] * (N + 1) for _ in range(max_rank + 2)] for _ in range(depth_cap)]
    for d in range(depth_cap - 1, -1, -1):
        H = [0.0] * (N + 1)  # H[max_rank + 1][.] = 0
        for k in range(max_rank, 0, -1):
            pk = p(d + 1, k)
            new = [0.0] * (N + 1)
            if pk > 0:
                below = G[d + 1]
                for n in range(1, N + 1):
                    best, arg = 0.0, -1
                    for m in range(n):
                        val = pk * (1.0 + below[m]) + H[n - 1 - m]
                        if val > best + 1e-15:
                            best, arg = val, m
                    new[n], choice[d][k][n] = best, arg
            H = new
        G[d] = H
    out = []
    for n in range(N + 1):
        parents: list[int] = []
        _build(choice, max_rank, 0, n, -1, parents)
        order = _depth_order(parents)
        out.append(BestTree(budget=n, depth_cap=depth_cap, parents=order, value=G[0][n]))
    return out


def _build(choice, max_rank: int, d: int, n: int, me: int, parents: list[int]) -> None:
    """Append the subtree below node ``me`` (depth d, n nodes allowed) to ``parents``, depth first."""
    k = 1
    while k <= max_rank and d < len(choice) and n > 0:
        m = choice[d][k][n]
        if m < 0:
            return
        parents.append(me)
        _build(choice, max_rank, d + 1, m, len(parents) - 1, parents)
        n -= 1 + m
        k += 1


def _depth_order(parents: list[int]) -> tuple[int, ...]:
    """The same tree renumbered by depth (stable: siblings keep their order)."""
    depth: list[int] = []
    for par in parents:
        depth.append(1 if par < 0 else depth[par] + 1)
    order = sorted(range(len(parents)), key=lambda i: (depth[i], i))
    new = {old: i for i, old in enumerate(order)}
    return tuple(-1 if parents[i] < 0 else new[parents[i]] for i in order)


def verify_cost_at(curve: dict[int, float], n: int) -> float:
    """v(n) from measured points ``curve`` {nodes: v}: linear between them, the nearest segment's
    line beyond them (a single point: that v). Measured, never assumed.

    Raises:
        ValueError: an empty curve."""
    if not curve:
        raise ValueError("v(n) needs at least one measured point")
    xs = sorted(curve)
    if len(xs) == 1:
        return curve[xs[0]]
    if n <= xs[0]:
        a, b = xs[0], xs[1]
    elif n >= xs[-1]:
        a, b = xs[-2], xs[-1]
    else:
        b = next(x for x in xs if x >= n)
        a = xs[xs.index(b) - 1]
        if b == n:
            return curve[b]
    return curve[a] + (curve[b] - curve[a]) * (n - a) / (b - a)


@dataclass(frozen=True)
class Candidate:
    """One shape the choice weighed: a chain of ``gamma`` drafts (``parents`` None) or a tree.

    ``tokens_per_round``: predicted E[tokens per round]; ``cost``: predicted round time in target
    steps (drafting + v(nodes)); ``speedup`` = tokens_per_round / cost."""

    kind: str
    nodes: int
    depth: int
    tokens_per_round: float
    cost: float
    parents: tuple[int, ...] | None = None

    @property
    def speedup(self) -> float:
        return self.tokens_per_round / self.cost

    def label(self) -> str:
        if self.kind == "chain":
            return f"chain of gamma {self.depth}"
        return f"tree of {self.nodes} nodes, depth {self.depth}"


@dataclass(frozen=True)
class AutoChoice:
    """What ``choose`` picked, the best chain, the best tree per node budget, and the inputs."""

    best: Candidate
    best_chain: Candidate
    trees: tuple[tuple[int, Candidate], ...]  # (node budget n, the fastest tree of at most n nodes)
    inputs: dict = field(default_factory=dict)
    # (n, the fastest tree the DP builds with budget n): rises, then falls
    by_budget: tuple[tuple[int, Candidate], ...] = ()
    chains: tuple[Candidate, ...] = ()  # the chain of every gamma weighed

    def sentence(self) -> str:
        """One line: the choice, its prediction, against the best chain, and why this size."""
        b, c = self.best, self.best_chain
        drafting = ("c_tree", "tree_pass_cost") if b.kind == "tree" else ("c", "chain_step_cost")
        why = (
            f"{drafting[0]} {self.inputs[drafting[1]]:.2f} per drafter pass and v({b.nodes}) "
            f"{self.inputs['v_at_best']:.2f}, "
            f"in target steps"
            if drafting[1] in self.inputs
            else ""
        )
        return (
            f"auto: {b.label()}, predicted {b.tokens_per_round:.2f} tokens per round at {b.cost:.2f} target steps "
            f"({b.speedup:.2f}x); best chain (gamma {c.depth}): {c.tokens_per_round:.2f} at {c.cost:.2f} "
            f"({c.speedup:.2f}x)"
            + (f"; {why}" if why else "")
        )


def choose(
    rank_acceptance: RankAcceptance,
    chain_rates: list[float],
    verify_curve: dict[int, float],
    tree_pass_cost: float,
    chain_step_cost: float,
    max_nodes: int = 64,
    max_depth: int = 8,
    max_rank: int | None = None,
    overhead: dict[int, float] | None = None,
) -> AutoChoice:
    """The chain or tree with the largest predicted E[tokens per round] / (drafting + v(nodes)).

    Args:
        rank_acceptance: p(d, k) for top-k trees.
        chain_rates: the chain's measured acceptance by depth a_1, a_2, ... (``specviz.theory.tree``);
            depths past the list take its last rate.
        verify_curve: measured v(n) {nodes: target steps} (``verify_cost_at``).
        tree_pass_cost: a drafter pass over one tree level, in target steps (c_tree).
        chain_step_cost: a chain's drafter step, in target steps (the cost coefficient c).
        max_nodes, max_depth: the trees and chains weighed (depth and gamma 1..max_depth).
        max_rank: the widest sibling list (default: the widest measured).
        overhead: a round's time outside drafting and the verify pass (judging, recording), in target
            steps, measured at a few node counts {nodes: steps}; interpolated as v(n) is, never below 0.
            None: left out.

    Raises:
        ValueError: no chain rate, an empty v(n) curve, or bounds under 1.
    """
    if not chain_rates:
        raise ValueError("choosing a tree needs the chain's acceptance by depth")
    if max_nodes < 1 or max_depth < 1:
        raise ValueError("max_nodes and max_depth must be at least 1")

    def extra(n: int) -> float:
        return _extra(overhead, n)

    chains = []
    for g in range(1, max_depth + 1):
        rates = [chain_rates[min(i, len(chain_rates) - 1)] for i in range(g)]
        chains.append(
            Candidate(
                "chain",
                g,
                g,
                expected_tokens_per_round(rates),
                g * chain_step_cost + verify_cost_at(verify_curve, g) + extra(g),
            )
        )
    best_chain = max(chains, key=lambda c: c.speedup)
    rank = max_rank or max(1, rank_acceptance.max_rank)
    trees: dict[int, Candidate] = {}
    for cap in range(1, max_depth + 1):
        for t in best_trees(rank_acceptance.p, max_nodes, cap, rank)[1:]:
            if t.nodes == 0:
                continue
            cand = Candidate(
                "tree",
                t.nodes,
                t.depth,
                t.tokens_per_round,
                t.depth * tree_pass_cost + verify_cost_at(verify_curve, t.nodes) + extra(t.nodes),
                t.parents,
            )
            if t.budget not in trees or cand.speedup > trees[t.budget].speedup:
                trees[t.budget] = cand
    exact = tuple((n, trees[n]) for n in sorted(trees))
    per_budget, best_so_far = [], None
    for n in sorted(trees):
        if best_so_far is None or trees[n].speedup > best_so_far.speedup:
            best_so_far = trees[n]
        per_budget.append((n, best_so_far))
    best = max([best_chain, *(c for _, c in per_budget)], key=lambda c: c.speedup)
    inputs = {
        "chain_rates": list(chain_rates),
        "verify_curve": dict(verify_curve),
        "tree_pass_cost": tree_pass_cost,
        "chain_step_cost": chain_step_cost,
        "v_at_best": verify_cost_at(verify_curve, best.nodes),
        "overhead": dict(overhead or {}),
        "max_nodes": max_nodes,
        "max_depth": max_depth,
        "max_rank": rank,
    }
    return AutoChoice(
        best=best, best_chain=best_chain, trees=tuple(per_budget), inputs=inputs, by_budget=exact, chains=tuple(chains)
    )


def _extra(overhead: dict | None, n: float) -> float:
    """A round's time outside drafting and verifying at n nodes (``choose``'s ``overhead``), never below 0."""
    return max(0.0, verify_cost_at(overhead, n)) if overhead else 0.0


def tree_candidate(
    parents,
    p: Callable[[int, int], float],
    verify_curve: dict[int, float],
    tree_pass_cost: float,
    overhead: dict | None = None,
) -> Candidate:
    """Any tree's prediction on the same terms as ``choose``'s: E[tokens per round] = 1 + ``expected_accepted``,
    cost = depth c_tree + v(nodes) + overhead(nodes) (a hand-made shape, for comparison with the choice)."""
    parents = tuple(parents)
    n, d = len(parents), tree_depth(parents)
    return Candidate(
        "tree",
        n,
        d,
        1.0 + expected_accepted(parents, p),
        d * tree_pass_cost + verify_cost_at(verify_curve, n) + _extra(overhead, n),
        parents,
    )


def static_parents(shape) -> tuple[int, ...]:
    """The parents of a branching-per-depth shape (3-2-2-1: 3 children of the pending token, 2 of each of those, ...),
    nodes by depth, siblings together."""
    parents: list[int] = []
    level = [-1]
    for branching in shape:
        nxt = []
        for par in level:
            for _ in range(branching):
                parents.append(par)
                nxt.append(len(parents) - 1)
        level = nxt
    return tuple(parents)


def prior_tree(budget: int = 40, depth_cap: int = 8) -> tuple[int, ...]:
    """A calibration tree before anything is measured: the best tree under a typical geometric prior
    (p(d, 1) = 0.7, then 0.15, 0.07, 0.04, 0.02 ...), wide enough to measure ranks 1-5 near the root."""
    prior = [0.7, 0.15, 0.07, 0.04, 0.02, 0.01]
    return best_trees(lambda d, k: prior[k - 1] if k <= len(prior) else 0.0, budget, depth_cap, len(prior))[
        budget
    ].parents


def speedup_by_budget(choice: AutoChoice) -> list[tuple[int, float]]:
    """(node budget, predicted speedup of the fastest tree within it): the Theory tab's curve."""
    return [(n, c.speedup) for n, c in choice.trees if math.isfinite(c.speedup)]
