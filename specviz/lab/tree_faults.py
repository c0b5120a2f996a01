"""Teaching faults of tree verification, passed one at a time to a tree run (``specviz.engine.tree.accept.TreeFault``).

Each was seen in public implementations of tree speculation (pitfalls: "Token trees"):

- ``siblings_against_p``: every sibling tested against the target's original p instead of the
  residual p' its earlier siblings left.
- ``topk_ratio``: distinct top-k children verified with min(1, p'/q) and the residual
  max(0, p' - q), as if they had been drawn i.i.d. from q.
- ``residual_unnormalised``: the residual after a rejected sibling is left unnormalised.
- ``window_ignored``: the target's tree mask ignores its sliding window (a fault only on a model
  with one: a node sees positions further back than its own path would let it).

The chi-square test of tests/test_tree_exactness.py must reject each at the sample size that
accepts the correct rules.
"""

from __future__ import annotations

from specviz.engine.tree.accept import TreeFault
from specviz.trace.tree import WITH_REPLACEMENT

TREE_FAULTS = {
    "siblings_against_p": "siblings tested against p instead of the updated residual",
    "topk_ratio": "top-k children verified with min(1, p/q) as if drawn from q",
    "residual_unnormalised": "the residual after a rejected sibling left unnormalised",
    "window_ignored": "the target's sliding window ignored by the tree mask",
}


def tree_fault(name: str) -> TreeFault:
    """The named fault as a ``specviz.engine.tree.accept.TreeFault``, to pass to a tree run as its ``fault``
    (only that run has it; nothing of ``specviz.engine.tree.accept`` is replaced).

    Raises:
        KeyError: an unknown fault.
    """
    if name not in TREE_FAULTS:
        raise KeyError(name)
    return {
        "siblings_against_p": TreeFault(against_p=True),
        "topk_ratio": TreeFault(rule=WITH_REPLACEMENT),
        "residual_unnormalised": TreeFault(unnormalised=True),
        "window_ignored": TreeFault(window_ignored=True),
    }[name]
