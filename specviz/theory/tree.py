"""What a tree's measured per-depth acceptance predicts, beside the chain's Eq. (1).

A round walks down its tree while some child of the current node is accepted. With a_d the
measured chance that the walk, having reached depth d - 1 at a node with children, accepts one
of them (``acceptance_by_depth``), the expected tokens per round are

    E[tokens] = 1 + sum_{d=1..D} prod_{j<=d} a_j

(the correction or bonus token, plus one per depth the path reaches). For a chain with a_j =
alpha for every j and D = gamma this is Leviathan et al. 2023, Eq. (1): (1 - alpha^(gamma+1)) / (1 - alpha).

The verify cost v(n) (a target pass over the pending token and n nodes, in target steps) grows
with n; the predicted speedup of a tree is E[tokens] / (c_round + v(n)), with c_round the drafting
time of a round in target steps (Leviathan et al. 2023, Thm 3.8 with both costs measured).
"""

from __future__ import annotations

from specviz.trace import Trace


def acceptance_by_depth(*traces: Trace) -> list[tuple[int, int]]:
    """(rounds that offered children at depth d, rounds whose path reached depth d) for d = 1, 2, ...

    A round offers children at depth d when its path reached depth d - 1 and the node there has
    children in the tree. Chain rounds count too (a chain's node has one child). Rounds cut short
    by an EOS or the token budget count as they were judged.
    """
    counts: list[list[int]] = []
    for trace in traces:
        for r in trace.rounds:
            if r.tree is not None:
                nodes, path = r.tree.nodes, r.tree.path
                end = -1
                depth = 0
                while True:
                    if not any(n.parent == end for n in nodes):
                        break
                    depth += 1
                    while len(counts) < depth:
                        counts.append([0, 0])
                    counts[depth - 1][0] += 1
                    if depth > len(path):
                        break
                    counts[depth - 1][1] += 1
                    end = path[depth - 1]
            else:
                for i, d in enumerate(r.drafts):
                    if d.verdict == "discarded":
                        break
                    while len(counts) <= i:
                        counts.append([0, 0])
                    counts[i][0] += 1
                    counts[i][1] += d.accepted
    return [(a, b) for a, b in counts]


def depth_rates(counts: list[tuple[int, int]]) -> list[float]:
    """a_d = accepted / offered per depth, up to the first depth never offered."""
    rates = []
    for offered, accepted in counts:
        if not offered:
            break
        rates.append(accepted / offered)
    return rates


def expected_tokens_per_round(rates: list[float]) -> float:
    """1 + sum_d prod_{j<=d} a_j (see the module docstring); Eq. (1) for a constant rate alpha."""
    total, reach = 1.0, 1.0
    for a in rates:
        reach *= a
        total += reach
    return total


def path_length_distribution(rates: list[float], depth: int) -> list[float]:
    """P(the accepted path has k nodes), k = 0..depth, from the acceptance by depth a_d: the walk
    reaches depth k with prod_{j<=k} a_j and stops there with 1 - a_{k+1} (a_d = 0 where never
    measured); at the tree's depth it stops. Leviathan et al.'s capped geometric law when every a_d = alpha."""
    rates = list(rates[:depth]) + [0.0] * max(0, depth - len(rates))
    out, reach = [], 1.0
    for k in range(depth + 1):
        out.append(reach * (1.0 - rates[k]) if k < depth else reach)
        reach *= rates[k] if k < depth else 1.0
    return out


def path_lengths(trace: Trace, depth: int) -> list[int]:
    """Accepted path length of each tree round whose tree is ``depth`` deep (rounds cut short by the
    token budget, with shallower trees, are left out)."""
    return [len(r.tree.path) for r in trace.rounds if r.tree is not None and r.tree.depth == depth]


def typical_depth(trace: Trace) -> int | None:
    """The depth most tree rounds had; None without tree rounds."""
    depths = [r.tree.depth for r in trace.rounds if r.tree is not None]
    return max(set(depths), key=depths.count) if depths else None


def nodes_per_round(trace: Trace) -> float | None:
    """Drafted nodes / rounds (tokens drafted per round, for a chain)."""
    return trace.drafted / len(trace.rounds) if trace.rounds else None


def verify_ms_by_nodes(*traces: Trace) -> dict[int, tuple[float, int]]:
    """Per node count n: (mean verify pass time in ms, rounds) over the rounds that verified n drafted tokens."""
    sums: dict[int, list[float]] = {}
    for trace in traces:
        for r in trace.rounds:
            sums.setdefault(r.drafted_count, []).append(r.verify_ms)
    return {n: (sum(v) / len(v), len(v)) for n, v in sorted(sums.items())}


def predicted_speedup(rates: list[float], draft_steps: float, v: float) -> float:
    """E[tokens per round] / (draft_steps + v): draft_steps is a round's drafting time and v its
    verify pass, both in target steps (ms / target step ms)."""
    return expected_tokens_per_round(rates) / (draft_steps + v)
