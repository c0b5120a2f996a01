"""Token trees keep the target's distribution: chi-square against the enumerated law, with planted faults.

The harness is the exactness lab's (specviz.lab, as tests/test_exactness.py): tiny models with a
vocabulary of 8, the exact law of the first two tokens from the target's own passes, Pearson's
chi-square (cells expected under 5 pooled) at ALPHA = 1e-4. Each run generates two tokens, so the
first round's tree is judged to depth 2: the first token comes from the pending token's children
(or the residual they leave), the second from the accepted child's own children.

Both forms of recursive rejection sampling (see specviz.engine.tree.accept): without replacement for
distinct fixed children (top-k of q, static and EAGLE-2 dynamic trees) and with replacement
(SpecInfer's multi-step speculative sampling) for children drawn i.i.d. from q; with top-k and
top-p applied to q and p alike.

The EAGLE drafter's trees (tests/test_eagle.py's tiny untrained head over five of the eight tokens, on
a tiny Llama target): EAGLE-2's dynamic tree (its own confidence picks the nodes) and a static tree of
children drawn from q; control: its top-k children verified with min(1, p/q) (``topk_ratio``), caught at
500 runs with p = 0 where the correct rule gives p = 0.098 at 2,000. (``siblings_against_p`` and
``residual_unnormalised`` are the same fault for distinct children and shift this head's law too little
to be caught at that size: its first child is rarely accepted and p' at the second barely differs from p.)

A target with a sliding window (tests/test_sliding_window.py's tiny Mistral, vocabulary 8, window 2:
shorter than the prompt, so the pending token and every node see only part of their path) and a drafter
close to it with the same window: the law is enumerated from the target's own passes, whose mask
applies the window; control: the tree mask blind to the window (``window_ignored``, the fault the trees
had), which shifts the first token's law already.

Controls: three faults seen in tree implementations are passed to the rules' own code path (specviz.lab.tree_faults,
``judge``'s fault argument) and the same test must reject them. At 2,000 correct runs the faults gave p-values below
1e-14 (1e-22 at 1,000); the controls use 500 runs, under half of the sample the correct rules pass at (``runs_to_catch``
of each law: 1,100-1,600 runs, a wrong law at Cohen's w 0.25 rejected with probability 0.99), so a control that fails
says the fault is caught with room to spare.
"""

from __future__ import annotations

import pytest

from specviz import Sampling
from specviz.lab import ALPHA, chi_square, models
from specviz.engine.tree.spec import TreeSpec

pytestmark = pytest.mark.slow

RUNS = None  # chi_square's own: runs_to_catch of each case's two-token law (specviz.lab.MIN_EFFECT; 2,000 before)
CONTROL_RUNS = 500

CASES = [
    # (id, models, sampling, tree)
    ("without-replacement-static-topk", "different", Sampling(temperature=1.0, top_k=5), TreeSpec.static((3, 2))),
    (
        "without-replacement-dynamic-topk-topp",
        "different",
        Sampling(temperature=0.8, top_k=5, top_p=0.9),
        TreeSpec.dynamic(8, depth=2, topk=3),
    ),
    (
        "with-replacement-static-topp",
        "different",
        Sampling(temperature=0.8, top_p=0.9),
        TreeSpec.static((3, 2), "sampled"),
    ),
    (
        "with-replacement-static-topk-unlike",
        "unlike",
        Sampling(temperature=1.0, top_k=4),
        TreeSpec.static((3, 2), "sampled"),
    ),
]


@pytest.mark.parametrize("kind, sampling, tree", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_tree_output_distribution_is_the_targets(kind, sampling, tree):
    drafter, target = models(kind)
    stat, pvalue, acceptance = chi_square(drafter, target, sampling, 2, runs=RUNS, tree=tree)
    print(f"\n{kind} {sampling} {tree.label()}: chi2={stat:.1f} p={pvalue:.3g} draft acceptance rate={acceptance:.3f}")
    assert pvalue > ALPHA


@pytest.mark.parametrize(
    "fault, sampling, tree",
    [
        ("siblings_against_p", Sampling(temperature=1.0), TreeSpec.static((3, 2), "sampled")),
        ("topk_ratio", Sampling(temperature=1.0), TreeSpec.static((3, 2))),
        ("residual_unnormalised", Sampling(temperature=1.0), TreeSpec.static((3, 2), "sampled")),
        ("residual_unnormalised", Sampling(temperature=0.8, top_k=5, top_p=0.9), TreeSpec.dynamic(8, depth=2, topk=3)),
    ],
    ids=["against-p", "topk-ratio", "unnormalised-with-replacement", "unnormalised-without-replacement-dynamic"],
)
def test_planted_tree_faults_are_caught(fault, sampling, tree):
    drafter, target = models("different")
    stat, pvalue, _ = chi_square(drafter, target, sampling, 2, runs=CONTROL_RUNS, tree=tree, fault=fault)
    print(f"\nplanted {fault} {tree.label()}: chi2={stat:.1f} p={pvalue:.3g}")
    assert pvalue < ALPHA


EAGLE_CASES = [
    ("eagle-dynamic", Sampling(temperature=1.0), TreeSpec.dynamic(8, depth=2, topk=3)),
    ("eagle-dynamic-topk-topp", Sampling(temperature=0.8, top_k=6, top_p=0.9), TreeSpec.dynamic(6, depth=2, topk=2)),
    ("eagle-static-with-replacement", Sampling(temperature=1.0), TreeSpec.static((3, 2), "sampled")),
]


def eagle_pair():
    from tests.test_drafters import outlier_llama
    from tests.test_eagle import tiny_eagle

    target = outlier_llama(outlier=20.0)
    return tiny_eagle(target), target


@pytest.mark.parametrize("sampling, tree", [c[1:] for c in EAGLE_CASES], ids=[c[0] for c in EAGLE_CASES])
def test_eagle_tree_output_distribution_is_the_targets(sampling, tree):
    drafter, target = eagle_pair()
    stat, pvalue, acceptance = chi_square(drafter, target, sampling, 2, runs=RUNS, tree=tree)
    print(f"\neagle {sampling} {tree.label()}: chi2={stat:.1f} p={pvalue:.3g} draft acceptance rate={acceptance:.3f}")
    assert acceptance > 0.0
    assert pvalue > ALPHA


def test_planted_tree_fault_is_caught_with_eagle():
    drafter, target = eagle_pair()
    stat, pvalue, _ = chi_square(
        drafter,
        target,
        Sampling(temperature=1.0),
        2,
        runs=CONTROL_RUNS,
        tree=TreeSpec.dynamic(8, depth=2, topk=3),
        fault="topk_ratio",
    )
    print(f"\nplanted topk_ratio with eagle, dynamic tree: chi2={stat:.1f} p={pvalue:.3g}")
    assert pvalue < ALPHA


# An auto tree's shape (specviz.theory.sequoia's DP, from depth-dependent rank rates): irregular, any
# shape; two levels, as deep as a two-token law can see. Its children are top-k: judged without replacement.
def _auto_shape():
    from specviz.theory import sequoia

    rates = sequoia.RankAcceptance.from_rates([[0.45, 0.3, 0.1], [0.6, 0.2]])
    return sequoia.best_trees(rates.p, 6, 2, 3)[6].parents


@pytest.mark.parametrize(
    "sampling", [Sampling(temperature=1.0, top_k=5), Sampling(temperature=0.7, top_p=0.9)], ids=["topk", "topp"]
)
def test_auto_tree_output_distribution_is_the_targets(sampling):
    shape = _auto_shape()
    assert shape.count(-1) == 3 and len({shape.count(i) for i in range(3)}) > 1  # not one branching per depth
    drafter, target = models("different")
    stat, pvalue, acceptance = chi_square(drafter, target, sampling, 2, runs=RUNS, tree=TreeSpec.explicit(shape))
    print(f"\nauto shape {shape} {sampling}: chi2={stat:.1f} p={pvalue:.3g} draft acceptance rate={acceptance:.3f}")
    assert pvalue > ALPHA


def test_planted_tree_fault_is_caught_on_an_auto_tree():
    drafter, target = models("different")
    stat, pvalue, _ = chi_square(
        drafter,
        target,
        Sampling(temperature=1.0),
        2,
        runs=CONTROL_RUNS,
        tree=TreeSpec.explicit(_auto_shape()),
        fault="topk_ratio",
    )
    print(f"\nplanted topk_ratio on the auto shape: chi2={stat:.1f} p={pvalue:.3g}")
    assert pvalue < ALPHA


def window_pair():
    from specviz.lab.models import noisy_copy
    from tests.test_sliding_window import tiny_mistral

    target = tiny_mistral(window=2, seed=0, vocab=8, eos=None, init=0.1)
    return noisy_copy(target, 0.05, seed=1), target


def test_tree_output_distribution_over_a_sliding_window_is_the_targets():
    drafter, target = window_pair()
    sampling = Sampling(temperature=1.0)
    stat, pvalue, acceptance = chi_square(drafter, target, sampling, 2, runs=RUNS, tree=TreeSpec.static((3, 2)))
    print(f"\nsliding window 2, tree 3-2: chi2={stat:.1f} p={pvalue:.3g} draft acceptance rate={acceptance:.3f}")
    assert acceptance > 0.05  # 0.087 of the 9 nodes: most runs accept a child, the path the window shapes
    assert pvalue > ALPHA


def test_planted_window_ignored_fault_is_caught():
    """At 500 runs this fault gave chi2 = 100.3, p = 4.3e-6 (the window shifts the tiny target's logits less
    than the rule faults shift their laws), at 1,000 chi2 = 288.5, p = 1.4e-30: the control runs 1,000, half
    the correct rule's sample, to be caught with room to spare."""
    drafter, target = window_pair()
    stat, pvalue, _ = chi_square(
        drafter,
        target,
        Sampling(temperature=1.0),
        2,
        runs=2 * CONTROL_RUNS,
        tree=TreeSpec.static((3, 2)),
        fault="window_ignored",
    )
    print(f"\nplanted window_ignored, tree 3-2: chi2={stat:.1f} p={pvalue:.3g}")
    assert pvalue < ALPHA


@pytest.mark.parametrize(
    "tree",
    [TreeSpec.static((3, 2)), TreeSpec.static((3, 2), "sampled")],
    ids=["without-replacement", "with-replacement"],
)
def test_trees_judged_on_the_columns_with_mass_keep_the_targets_law(tree, monkeypatch):
    """On a CPU a sampled round is judged over the columns where some slot's p is positive
    (``specviz.engine.tree.loop.mass_columns``); with a vocabulary of 8 every column has mass, so these
    runs use one of 64 under top-k 3, where a round's columns are a fraction of it (checked), against the
    same enumerated law and threshold."""
    from specviz.engine.tree import loop

    seen = {"columns": 0, "rounds": 0}
    real = loop.mass_columns

    def counted(p, logits, tokens, top_k):
        cols = real(p, logits, tokens, top_k)
        seen["rounds"] += 1
        seen["columns"] += cols is not None
        return cols

    monkeypatch.setattr(loop, "mass_columns", counted)
    drafter, target = models("similar", vocab=64)
    stat, pvalue, acceptance = chi_square(drafter, target, Sampling(temperature=1.0, top_k=3), 2, runs=RUNS, tree=tree)
    print(f"\ncolumns {tree.label()}: chi2={stat:.1f} p={pvalue:.3g} draft acceptance rate={acceptance:.3f}, {seen}")
    assert seen["columns"] == seen["rounds"] > 0
    assert pvalue > ALPHA


def test_planted_tree_fault_is_caught_on_the_columns_with_mass():
    """The control of the test above: siblings tested against p instead of the residual, on the same
    vocabulary of 64 under top-k 3 (p = 1.6e-11 at 500 runs when written)."""
    drafter, target = models("similar", vocab=64)
    stat, pvalue, _ = chi_square(
        drafter,
        target,
        Sampling(temperature=1.0, top_k=3),
        2,
        runs=CONTROL_RUNS,
        tree=TreeSpec.static((3, 2)),
        fault="siblings_against_p",
    )
    assert pvalue < ALPHA
