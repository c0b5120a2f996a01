"""Teaching faults of tree verification, planted one at a time into ``specviz.engine.tree.accept``.

Each was seen in public implementations of tree speculation (pitfalls: "Token trees"):

- ``siblings_against_p``: every sibling tested against the target's original p instead of the
  residual p' its earlier siblings left.
- ``topk_ratio``: distinct top-k children verified with min(1, p'/q) and the residual
  max(0, p' - q), as if they had been drawn i.i.d. from q.
- ``residual_unnormalised``: the residual after a rejected sibling is left unnormalised.

The chi-square test of tests/test_tree_exactness.py must reject each at the sample size that
accepts the correct rules.
"""

from __future__ import annotations

import contextlib

from specviz.engine.tree import accept

TREE_FAULTS = {
    "siblings_against_p": "siblings tested against p instead of the updated residual",
    "topk_ratio": "top-k children verified with min(1, p/q) as if drawn from q",
    "residual_unnormalised": "the residual after a rejected sibling left unnormalised",
}


@contextlib.contextmanager
def planted_tree(name: str):
    """Replace one step of ``specviz.engine.tree.accept`` with the named fault inside the ``with`` block
    (tests only: not thread-aware, unlike ``specviz.lab.faults.planted``).

    Raises:
        KeyError: an unknown fault.
    """
    if name not in TREE_FAULTS:
        raise KeyError(name)
    saved = {k: getattr(accept, k) for k in ("tested_against", "normalise", "rule_of")}
    patch = {
        "siblings_against_p": {"tested_against": lambda p, p_residual: p},
        "topk_ratio": {"rule_of": lambda rule: "specinfer"},
        "residual_unnormalised": {"normalise": lambda r, fallback: (r, r.sum(dim=-1))},
    }[name]
    try:
        for key, fn in patch.items():
            setattr(accept, key, fn)
        yield TREE_FAULTS[name]
    finally:
        for key, fn in saved.items():
            setattr(accept, key, fn)
