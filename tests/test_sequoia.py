"""The auto tree's dynamic programming (specviz.theory.sequoia) against brute force, and the choice's guarantees.

Every tree a drafter could draft under a budget is enumerated (children a prefix of q's ranking, at
most ``max_rank`` per node, at most ``depth_cap`` levels) and scored by the same sum of path
products; the DP's best must equal the enumeration's best to 1e-12 (floating point sums of a few
products, no other tolerance). Rates are depth-dependent so a depth-free shortcut would fail.
"""

from __future__ import annotations

import itertools
import random

import pytest

from specviz.theory import sequoia
from specviz.theory.tree import expected_tokens_per_round


def _forests(n: int, depth_left: int, max_rank: int):
    """Every ordered forest of at most n nodes, depth_left levels, max_rank roots: lists of (children forest)."""
    yield []
    if n == 0 or depth_left == 0:
        return
    for k in range(1, max_rank + 1):
        # k roots; split the n - k remaining nodes among their subtrees.
        if k > n:
            break
        for sizes in itertools.product(range(n - k + 1), repeat=k):
            if sum(sizes) > n - k:
                continue
            for subs in itertools.product(*[list(_forests(s, depth_left - 1, max_rank)) for s in sizes]):
                yield list(subs)


def _parents(forest, me=-1, out=None):
    out = [] if out is None else out
    for sub in forest:
        out.append(me)
        _parents(sub, len(out) - 1, out)
    return out


def _rates(seed: int, depths: int, ranks: int):
    rng = random.Random(seed)
    rows = []
    for _ in range(depths):
        left, row = 1.0, []
        for _ in range(ranks):
            x = rng.uniform(0, left)
            row.append(x)
            left -= x
        rows.append(row)
    return sequoia.RankAcceptance.from_rates(rows)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dp_equals_brute_force(seed):
    acc = _rates(seed, 3, 3)
    for cap in (1, 2, 3):
        trees = sequoia.best_trees(acc.p, 6, cap, 3)
        for n in range(7):
            brute = max(sequoia.expected_accepted(_parents(f), acc.p) for f in _forests(n, cap, 3))
            assert trees[n].value == pytest.approx(brute, abs=1e-12)
            assert trees[n].nodes <= n and trees[n].depth <= cap
            # The tree it returns scores what it claims.
            assert sequoia.expected_accepted(trees[n].parents, acc.p) == pytest.approx(trees[n].value, abs=1e-12)


def test_planted_fault_a_greedy_shape_is_beaten():
    """Control: the brute force is strong enough to tell a wrong tree; a chain of top-1 children of
    the same size is worse where rank 2 carries real mass."""
    acc = sequoia.RankAcceptance.from_rates([[0.5, 0.4]] * 4)
    best = sequoia.best_trees(acc.p, 4, 4, 2)[4]
    chain = sequoia.expected_accepted([-1, 0, 1, 2], acc.p)
    assert best.value > chain + 0.1


def test_value_grows_with_budget_and_depth():
    acc = _rates(5, 6, 4)
    prev_by_cap = None
    for cap in range(1, 7):
        values = [t.value for t in sequoia.best_trees(acc.p, 30, cap, 4)]
        assert all(b >= a - 1e-12 for a, b in zip(values, values[1:]))
        if prev_by_cap is not None:
            assert all(b >= a - 1e-12 for a, b in zip(prev_by_cap, values))
        prev_by_cap = values


def test_trees_are_well_formed():
    acc = _rates(7, 5, 4)
    for t in sequoia.best_trees(acc.p, 40, 5, 4):
        assert all(-1 <= par < i for i, par in enumerate(t.parents))
        depths = []
        for par in t.parents:
            depths.append(1 if par < 0 else depths[par] + 1)
        assert depths == sorted(depths)
        assert all(sum(1 for q in t.parents if q == par) <= 4 for par in set(t.parents))


def test_chain_is_a_candidate_and_never_beaten_in_prediction():
    """Where the chain's acceptance is much higher than the trees' (sampled drafts against top-k ranks),
    the chain wins; the choice never predicts below the best chain."""
    acc = sequoia.RankAcceptance.from_rates([[0.3, 0.05]] * 8)
    curve = {1: 1.0, 8: 1.2, 32: 2.0}
    choice = sequoia.choose(acc, [0.9], curve, tree_pass_cost=0.1, chain_step_cost=0.1, max_nodes=32, max_depth=8)
    assert choice.best.kind == "chain"
    g = choice.best.depth
    assert choice.best.tokens_per_round == pytest.approx(expected_tokens_per_round([0.9] * g))
    for rates in ([0.9], [0.5], [0.1]):
        c = sequoia.choose(sequoia.RankAcceptance.from_rates([[0.6, 0.2, 0.1]] * 8), rates, curve, 0.1, 0.1, 32, 8)
        assert c.best.speedup >= c.best_chain.speedup
        assert "auto:" in c.sentence()


def test_cheap_verify_wants_a_big_tree_and_dear_verify_a_small_one():
    acc = sequoia.RankAcceptance.from_rates([[0.7, 0.15, 0.07]] * 8)
    flat = sequoia.choose(acc, [0.7], {1: 1.0, 64: 1.05}, 0.05, 0.05, 64, 8)
    steep = sequoia.choose(acc, [0.7], {1: 1.0, 64: 5.0}, 0.05, 0.05, 64, 8)
    assert flat.best.nodes > steep.best.nodes


def test_acceptance_by_rank_counts_the_reached_parents():
    from specviz.engine.tree.record import TreeNode, TreeRecord
    from specviz.trace import Round

    def node(parent, depth, verdict):
        return TreeNode(token_id=1, text="a", parent=parent, depth=depth, q=0.5, p=0.5, verdict=verdict)

    # root: children 0 (rejected), 1 (accepted), 2 (discarded); node 1's children 3 (rejected), 4 (rejected).
    nodes = [node(-1, 1, "rejected"), node(-1, 1, "accepted"), node(-1, 1, "discarded"),
             node(1, 2, "rejected"), node(1, 2, "rejected"), node(0, 2, "discarded")]
    rec = TreeRecord(nodes=nodes, path=[1])

    class T:
        rounds = [type("R", (), {"tree": rec})()]

    counts = sequoia.acceptance_by_rank(T)
    assert counts == [[(1, 0), (1, 1), (1, 0)], [(1, 0), (1, 0)]]
    assert Round  # the real class exists; the stand-in above carries only what is read


def test_rank_acceptance_pools_rare_cells():
    acc = sequoia.RankAcceptance.from_counts([[(100, 60), (100, 20)], [(5, 5), (5, 0)]], min_count=20)
    assert acc.p(1, 1) == 0.6
    assert acc.p(2, 1) == pytest.approx(65 / 105)  # 5 offers < 20: rank 1 pooled
    assert acc.p(9, 2) == pytest.approx(20 / 105)  # deeper than measured: pooled
    assert acc.p(1, 3) == 0.0  # never offered


def test_verify_cost_interpolates_measured_points():
    curve = {1: 1.0, 4: 1.3, 16: 2.5}
    assert sequoia.verify_cost_at(curve, 4) == 1.3
    assert sequoia.verify_cost_at(curve, 10) == pytest.approx(1.9)
    assert sequoia.verify_cost_at(curve, 28) == pytest.approx(3.7)
    with pytest.raises(ValueError):
        sequoia.verify_cost_at({}, 3)


def test_a_round_overhead_growing_with_the_nodes_shrinks_the_choice():
    acc = sequoia.RankAcceptance.from_rates([[0.7, 0.15, 0.07]] * 8)
    curve = {1: 1.0, 64: 1.05}
    plain = sequoia.choose(acc, [0.7], curve, 0.05, 0.05, 64, 8)
    loaded = sequoia.choose(acc, [0.7], curve, 0.05, 0.05, 64, 8, overhead={4: 0.05, 40: 1.5})
    assert loaded.best.nodes < plain.best.nodes
    assert loaded.best.cost == pytest.approx(loaded.best.depth * 0.05 + sequoia.verify_cost_at(curve, loaded.best.nodes)
                                             + max(0.0, sequoia.verify_cost_at({4: 0.05, 40: 1.5}, loaded.best.nodes)))


def test_children_available_counts_how_often_the_pending_token_got_k_children():
    from specviz.engine.tree.record import TreeNode, TreeRecord

    def rnd(width):
        nodes = [
            TreeNode(token_id=k, text="a", parent=-1, depth=1, q=0.1, p=0.1, verdict="rejected") for k in range(width)
        ]
        return type("R", (), {"tree": TreeRecord(nodes=nodes, path=[])})()

    class T:  # a shape asking 4 at the pending token; q's nucleus held 4, 2, 1 and 4 tokens
        rounds = [rnd(4), rnd(2), rnd(1), rnd(4), type("R", (), {"tree": None})()]

    assert sequoia.children_available(T) == [(4, 4), (4, 3), (4, 2), (4, 2)]


def test_a_child_counts_as_often_as_it_exists():
    """p(d, k) is the counts' rate given that the k-th child exists, times the chance that it does: the
    predicted tokens per round of a shape equal, on the rounds that measured both, accepted / rounds (the
    planted fault, the rate given existence alone, overstates them whenever a child is sometimes missing)."""
    # 100 rounds; the shape asks 3 children of the pending token; the 2nd existed in 80, the 3rd in 50.
    counts = [[(100, 40), (80, 16), (50, 5)]]
    available = [(100, 100), (100, 80), (100, 50)]
    acc = sequoia.RankAcceptance.from_counts(counts, min_count=1, available=available)
    assert acc.p(1, 2) == pytest.approx(16 / 100) and acc.given(1, 2) == pytest.approx(16 / 80)
    star = (-1, -1, -1)
    assert 1 + sequoia.expected_accepted(star, acc.p) == pytest.approx(1 + (40 + 16 + 5) / 100)
    fault = sequoia.RankAcceptance.from_counts(counts, min_count=1)
    assert 1 + sequoia.expected_accepted(star, fault.p) == pytest.approx(1 + 0.4 + 0.2 + 0.1)
    # Greedy: every child exists, and nothing changes.
    full = sequoia.RankAcceptance.from_counts(counts, min_count=1, available=[(100, 100)] * 3)
    assert full.p(1, 3) == fault.p(1, 3) == 0.1
