"""What tree a round drafts: a static shape (branching per depth) or a dynamic node budget.

- Static (Medusa's and EAGLE's fixed trees): ``TreeSpec.static((3, 2, 2, 1))`` gives the pending
  token 3 children, each of them 2, ... : 3 + 6 + 12 + 12 = 33 nodes, depth 4. The chain of
  Leviathan et al. is the shape (1, 1, ..., 1) with children sampled from q.
- Explicit (Sequoia, Chen et al. 2024): any shape, given as each node's parent; a node's children
  are the top-k of its q, k its number of children. ``specviz.theory.sequoia`` chooses one from the
  measured acceptance by depth and sibling rank and the device's verify cost (the ``auto`` tree).
- Dynamic (EAGLE-2, Li et al. 2024, Sec. 4): expand, depth by depth, the ``topk`` nodes whose
  path has the highest product of drafter probabilities, each into its ``topk`` most likely
  children; then keep the ``budget`` nodes of highest path product (an ancestor's product is never
  below its descendants', so the kept set is a tree).

Children of a node are either the top-k of q (distinct and deterministic: verified by recursive
rejection sampling without replacement) or drawn i.i.d. from q (``children="sampled"``, static
shapes only: with replacement, SpecInfer's multi-step speculative sampling); see ``specviz.engine.tree.accept``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specviz.trace import MAX_GAMMA
# The most nodes a round's tree may hold (EAGLE-2 verifies 60 by default): bounds a verify pass,
# its mask and a loaded recording.
from specviz.limits import MAX_TREE_NODES
CHILD_KINDS = ("topk", "sampled")


def parse_shape(text: str) -> tuple[int, ...]:
    """"3,2,2,1" -> (3, 2, 2, 1).

    Raises:
        ValueError: not comma-separated whole numbers from 1 to 16, a depth outside 1..MAX_GAMMA,
            or more than MAX_TREE_NODES nodes.
    """
    try:
        shape = tuple(int(x) for x in str(text).split(","))
    except ValueError:
        raise ValueError(
            "--tree must be comma-separated whole numbers, one branching per depth, e.g. 3,2,2,1"
        ) from None
    TreeSpec.static(shape)  # checks the ranges
    return shape


@dataclass(frozen=True)
class TreeSpec:
    """A round's tree.

    Attributes:
        shape: branching per depth (static trees), else None.
        budget: the most nodes of a dynamic tree (an explicit tree's node count), else None.
        parents: an explicit tree: per node, its parent's index (-1: the pending token), nodes in
            depth order; its children are the top-k of its q in node order. Else None.
        depth: the deepest level (len(shape) for a static tree).
        topk: a dynamic tree's children per expanded node and nodes expanded per depth; for prompt
            lookup, the most branches (distinct earlier matches).
        children: "topk" (distinct, deterministic: judged without replacement) or "sampled" (i.i.d.
            from q: with replacement, SpecInfer's rule; static trees of a drafter model only).

    Build with ``static``, ``explicit`` or ``dynamic``, which check the ranges (ValueError).
    """

    shape: tuple[int, ...] | None = None
    budget: int | None = None
    parents: tuple[int, ...] | None = None
    depth: int = 4
    topk: int = 4
    children: str = "topk"

    @classmethod
    def from_args(cls, args) -> "TreeSpec | None":
        """The tree a command line's ``--tree`` / ``--tree-dynamic`` options ask for, or None for a chain.

        Raises:
            ValueError: a shape or budget out of range.
        """
        if getattr(args, "tree", None):
            return cls.static(parse_shape(args.tree), args.tree_children)
        if getattr(args, "tree_dynamic", None) is not None:
            return cls.dynamic(args.tree_dynamic, args.tree_depth, args.tree_topk)
        return None

    @classmethod
    def static(cls, shape, children: str = "topk") -> "TreeSpec":
        shape = tuple(shape)
        if not shape or not all(isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= 16 for b in shape):
            raise ValueError("a tree shape is one branching from 1 to 16 per depth, e.g. 3,2,2,1")
        if len(shape) > MAX_GAMMA:
            raise ValueError(f"a tree shape has at most {MAX_GAMMA} depths")
        nodes = sum(math.prod(shape[: d + 1]) for d in range(len(shape)))
        if nodes > MAX_TREE_NODES:
            raise ValueError(f"the tree shape makes {nodes} nodes; at most {MAX_TREE_NODES} are allowed")
        if children not in CHILD_KINDS:
            raise ValueError(f"tree children must be one of {', '.join(CHILD_KINDS)}")
        return cls(shape=shape, depth=len(shape), topk=shape[0], children=children)

    @classmethod
    def explicit(cls, parents) -> "TreeSpec":
        """A tree of any shape: ``parents[i]`` is node i's parent (-1: the pending token), every
        parent before its children, depths never decreasing; children are top-k (distinct)."""
        parents = tuple(parents)
        if not parents or len(parents) > MAX_TREE_NODES:
            raise ValueError(f"an explicit tree has 1 to {MAX_TREE_NODES} nodes")
        depths: list[int] = []
        for i, par in enumerate(parents):
            if isinstance(par, bool) or not isinstance(par, int) or not -1 <= par < i:
                raise ValueError(f"node {i}'s parent must be -1 (the pending token) or an earlier node")
            depths.append(1 if par < 0 else depths[par] + 1)
        if depths != sorted(depths):
            raise ValueError("an explicit tree lists its nodes by depth")
        if depths[-1] > MAX_GAMMA:
            raise ValueError(f"a tree has at most {MAX_GAMMA} depths")
        if max(parents.count(p) for p in set(parents)) > 16:
            raise ValueError("a node has at most 16 children")
        return cls(parents=parents, budget=len(parents), depth=depths[-1], topk=parents.count(-1))

    @classmethod
    def dynamic(cls, budget: int, depth: int = 6, topk: int = 4) -> "TreeSpec":
        if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= MAX_TREE_NODES:
            raise ValueError(f"--tree-dynamic (the node budget) must be a whole number from 1 to {MAX_TREE_NODES}")
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_GAMMA:
            raise ValueError(f"a dynamic tree's depth must be a whole number from 1 to {MAX_GAMMA}")
        if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= 16:
            raise ValueError("a dynamic tree's top-k must be a whole number from 1 to 16")
        return cls(budget=budget, depth=depth, topk=topk)

    @property
    def is_static(self) -> bool:
        return self.shape is not None

    @property
    def max_nodes(self) -> int:
        if self.shape is not None:
            return sum(math.prod(self.shape[: d + 1]) for d in range(len(self.shape)))
        return int(self.budget)

    def label(self) -> str:
        """ "tree 3-2-2-1" or "dynamic tree, 24 nodes"."""
        if self.shape is not None:
            return f"tree {'-'.join(map(str, self.shape))}" + (
                ", sampled children" if self.children == "sampled" else ""
            )
        if self.parents is not None:
            return f"tree of {self.budget} nodes, depth {self.depth}"
        return f"dynamic tree, {self.budget} nodes"

    def describe(self) -> dict:
        """What the trace's settings record (JSON-ready names and numbers)."""
        d = {
            "kind": "static" if self.shape is not None else "explicit" if self.parents is not None else "dynamic",
            "depth": self.depth,
            "topk": self.topk,
            "children": self.children,
            "nodes": self.max_nodes,
        }
        if self.shape is not None:
            d["shape"] = ",".join(map(str, self.shape))
        if self.parents is not None:
            d["parents"] = ",".join(map(str, self.parents))
        return d
