"""The trace's record of a round's tree, and the checks a loaded one must pass.

No torch and no import of ``specviz.trace`` here: the trace imports this module.

A round of tree speculation keeps its accepted path in ``Round.drafts`` (so every view of the
output reads it as a chain) and the whole tree in ``Round.tree``. Node 0 of ``TreeRecord.nodes``
is the first child of the pending token; ``parent`` -1 names the pending token itself (the
tree's root, whose children are depth 1).

The rules, recursive rejection sampling in two forms (Jeon et al. 2024, "Recursive Speculative
Decoding"; see ``specviz.engine.tree.accept``):
- "with-replacement": children drawn i.i.d. from q (with replacement). Child x is accepted when
  u < min(1, p'(x)/q(x)); after a rejection p' becomes norm(max(0, p' - q)); after all, the
  correction comes from the last p' (SpecInfer's multi-step speculative sampling, Miao et al. 2024).
- "without-replacement": distinct children fixed before the target's draws (top-k of q, prompt
  lookup's branches). x is accepted when u < p'(x); a rejected x is removed from p' (zeroed,
  renormalised) before the next sibling.
In both, p' starts as the target's p at the parent. Recordings made before these names carry
"specinfer" and "one-hot" (``OLD_RULE_NAMES``); they load under the new names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from specviz.limits import MAX_TREE_NODES

TreeVerdict = Literal["accepted", "rejected", "discarded"]
WITH_REPLACEMENT = "with-replacement"
WITHOUT_REPLACEMENT = "without-replacement"
Rule = Literal["with-replacement", "without-replacement"]
OLD_RULE_NAMES = {"specinfer": WITH_REPLACEMENT, "one-hot": WITHOUT_REPLACEMENT}  # recordings before the rename
# Verdicts are decided in float32; the trace keeps float64 (see specviz.trace.validation).
TOLERANCE = 1e-5


@dataclass(slots=True)
class TreeNode:
    """One node of a drafted tree and the test that judged it.

    Attributes:
        token_id, text: the drafted token.
        parent: index of the parent in ``TreeRecord.nodes``; -1 for the pending token.
        depth: 1 for the pending token's children, parent's depth + 1 below.
        q: the drafter's q(x) at the parent (the distribution the child was drawn from, or ranked
            by for top-k children; 1 for a prompt-lookup copy).
        p: the target's p(x) at the parent.
        p_residual: p'(x), the residual this child was tested against (p itself for the first
            sibling); None when never tested.
        accept_prob: min(1, p'(x)/q(x)) with replacement, p'(x) without; None when never tested.
        u: the uniform draw in [0, 1) of its test; None when never tested.
        verdict: accepted (on the path), rejected (tested and failed), discarded (never tested: a
            sibling after the accepted one, or below a node that was not accepted).
        mass: the share of the target's p at the parent that the earlier siblings left unclaimed
            (the product of the residual's normalisers, = the chance that they were all
            rejected); 1 for the first child; None when never tested.
        source: for a prompt-lookup copy, the position in the sequence it was copied from.
        q_entropy: the drafter's entropy H(q) = -sum_x q(x) log2 q(x), in bits, of the q at the
            parent this node was drawn from (shared by its siblings); None for prompt lookup
            (a one-hot copy) and in recordings made before it was kept.
    """

    token_id: int
    text: str
    parent: int
    depth: int
    q: float
    p: float
    verdict: TreeVerdict
    p_residual: float | None = None
    accept_prob: float | None = None
    u: float | None = None
    mass: float | None = None
    source: int | None = None
    q_entropy: float | None = None


@dataclass(slots=True)
class TreeRecord:
    """A round's tree: its nodes (parents before children), the accepted path (node indices from
    depth 1 down) and the acceptance rule its children were judged by."""

    nodes: list[TreeNode]
    path: list[int] = field(default_factory=list)
    rule: Rule = WITHOUT_REPLACEMENT
    drafter_passes: int | None = None

    @property
    def depth(self) -> int:
        return max((n.depth for n in self.nodes), default=0)

    @property
    def rejected(self) -> int:
        return sum(n.verdict == "rejected" for n in self.nodes)

    def children(self, parent: int) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.parent == parent]

    def final_kind(self) -> str:
        """"correction" when the node the path ends at had children (all rejected), else "bonus";
        "target" for an empty tree (prompt lookup found nothing: one token from p)."""
        if not self.nodes:
            return "target"
        end = self.path[-1] if self.path else -1
        return "correction" if self.children(end) else "bonus"


def renamed_rules(d: dict) -> dict:
    """A parsed trace dict whose tree rounds name their rule the old way ("specinfer", "one-hot")
    with the current names; ``d`` itself when none does (it is never changed in place)."""
    rounds = d.get("rounds") if isinstance(d, dict) else None
    if not isinstance(rounds, list) or not any(
        isinstance(r, dict) and isinstance(r.get("tree"), dict) and r["tree"].get("rule") in OLD_RULE_NAMES
        for r in rounds
    ):
        return d
    renamed = []
    for r in rounds:
        tree = r.get("tree") if isinstance(r, dict) else None
        if isinstance(tree, dict) and tree.get("rule") in OLD_RULE_NAMES:
            r = {**r, "tree": {**tree, "rule": OLD_RULE_NAMES[tree["rule"]]}}
        renamed.append(r)
    return {**d, "rounds": renamed}


def _fail(where: str, what: str) -> ValueError:
    return ValueError(f"not a specviz recording: {where}: {what}")


def _unit(x, where: str, upper_open: bool = False) -> None:
    if x is None:
        return
    if (
        not isinstance(x, (int, float))
        or isinstance(x, bool)
        or not math.isfinite(x)
        or x < 0
        or x > 1
        or (upper_open and x >= 1)
    ):
        raise _fail(where, f"must be a finite number in [0, {'1)' if upper_open else '1]'}")


def check_tree(tree: TreeRecord, where: str, path_tokens: list[int], max_depth: int, max_token: int) -> None:
    """A loaded tree to its meaning: structure, probabilities, verdicts, siblings, path.

    Args:
        path_tokens: the round's accepted drafts (``Round.drafts``), which must be the path's tokens.
        max_depth: the deepest level allowed (MAX_GAMMA); max_token: token ids must be below it.

    Raises:
        ValueError: naming the first field out of range or inconsistent.
    """
    nodes = tree.nodes
    if tree.drafter_passes is not None and (
        isinstance(tree.drafter_passes, bool) or not 0 <= tree.drafter_passes <= max_depth
    ):
        raise _fail(
            f"{where}.drafter_passes", f"must be a whole number from 0 to {max_depth} (one pass per depth at most)"
        )
    if len(nodes) > MAX_TREE_NODES:
        raise _fail(f"{where}.nodes", f"at most {MAX_TREE_NODES} nodes are allowed")
    for i, n in enumerate(nodes):
        at = f"{where}.nodes.{i}"
        if isinstance(n.parent, bool) or not -1 <= n.parent < i:
            raise _fail(f"{at}.parent", f"must be -1 (the pending token) or an earlier node, from -1 to {i - 1}")
        wanted = 1 if n.parent == -1 else nodes[n.parent].depth + 1
        if n.depth != wanted or not 1 <= n.depth <= max_depth:
            raise _fail(f"{at}.depth", f"must be its parent's depth + 1 ({wanted}) and at most {max_depth}")
        if isinstance(n.token_id, bool) or not 0 <= n.token_id < max_token:
            raise _fail(f"{at}.token_id", f"must be a token id from 0 to {max_token - 1}")
        for key in ("q", "p", "p_residual", "accept_prob", "mass"):
            _unit(getattr(n, key), f"{at}.{key}")
        _unit(n.u, f"{at}.u", upper_open=True)
        if n.source is not None and (isinstance(n.source, bool) or n.source < 0):
            raise _fail(f"{at}.source", "must be a position >= 0")
        if n.q_entropy is not None and (
            not math.isfinite(n.q_entropy) or not 0 <= n.q_entropy <= math.log2(max_token) + TOLERANCE
        ):
            raise _fail(
                f"{at}.q_entropy",
                f"must be an entropy in bits from 0 to {math.log2(max_token):g} (log2 of the largest vocabulary "
                "allowed)",
            )
        if n.verdict == "discarded":
            continue
        if n.u is None or n.accept_prob is None or n.p_residual is None:
            raise _fail(at, "a tested node records u, accept_prob and p_residual")
        if tree.rule == WITHOUT_REPLACEMENT:
            expected = n.p_residual
        else:
            expected = min(1.0, n.p_residual / n.q) if n.q > 0 else 0.0
        if abs(n.accept_prob - expected) > TOLERANCE:
            raise _fail(
                f"{at}.accept_prob",
                f"is not {'p_residual' if tree.rule == WITHOUT_REPLACEMENT else 'min(1, p_residual / q)'}",
            )
        if n.verdict == "accepted" and not n.u < n.accept_prob + TOLERANCE:
            raise _fail(at, "accepted although u is not below accept_prob")
        if n.verdict == "rejected" and not n.u > n.accept_prob - TOLERANCE:
            raise _fail(at, "rejected although u is below accept_prob")
    # Siblings: a reached parent's children are rejected ones, then at most one accepted, then
    # discarded ones; an unreached parent's children are all discarded.
    path, node = [], -1
    while True:
        kids = tree.children(node)
        verdicts = [nodes[k].verdict for k in kids]
        n_rej = next((i for i, v in enumerate(verdicts) if v != "rejected"), len(verdicts))
        tail = verdicts[n_rej:]
        if tail and (tail[0] not in ("accepted",) or any(v != "discarded" for v in tail[1:])):
            raise _fail(
                f"{where}.nodes",
                f"the children of node {node} are not rejected ones, then at most one accepted, then discarded ones",
            )
        if not tail:
            break
        node = kids[n_rej]
        path.append(node)
    if sum(n.verdict != "discarded" for n in nodes) != sum(
        len(tree.children(k)) - sum(nodes[c].verdict == "discarded" for c in tree.children(k)) for k in [-1] + path
    ):
        raise _fail(f"{where}.nodes", "only the children of the pending token and of accepted nodes are tested")
    if tree.path != path:
        raise _fail(f"{where}.path", "is not the chain of accepted nodes from the pending token down")
    if [nodes[k].token_id for k in path] != list(path_tokens):
        raise _fail(f"{where}.path", "its tokens are not the round's accepted drafts")
