"""The ``auto`` tree's choice: from a calibration of this pair on this device (``specviz.engine.tree.calibration``),
``specviz.theory.sequoia`` chooses.

``decide(...)`` returns an ``AutoTree``: the TreeSpec to draft (None: the chain won) and the
gamma to run a chain at, with the choice and its inputs to state; ``from_record`` decides again from what a
recording kept. Calibrating a loaded pair, and keeping its calibrations for the process and on disk, is
``specviz.pair.auto_tree`` (``auto_tree``, ``auto_for_pair``).
"""

from __future__ import annotations

from dataclasses import dataclass

from specviz.engine.tree.calibration import Calibration
from specviz.engine.tree.spec import TreeSpec
from specviz.theory import sequoia

AUTO = "auto"
CALIBRATION_PROMPTS = 8
HAND_MADE = ((3, 2, 2, 1), (2, 2, 2, 1))  # the page's hand-made shapes, predicted beside the choice


@dataclass(frozen=True)
class AutoTree:
    """The auto choice: ``tree`` (None: a chain) and ``gamma`` (the chain's; a tree's depth), the
    sequoia ``choice`` and the ``calibration`` it came from."""

    tree: TreeSpec | None
    gamma: int
    choice: sequoia.AutoChoice
    calibration: Calibration
    max_nodes: int = 64
    max_depth: int = 8
    device: str = ""  # what it was measured on ("cpu", "cuda: <GPU name>"), for the sentence that says why

    def describe(self) -> dict:
        """JSON-ready: the choice, its prediction, the best chain, and the inputs."""
        b, c = self.choice.best, self.choice.best_chain
        cal = self.calibration
        return {
            "chosen": b.label(),
            "kind": b.kind,
            "nodes": b.nodes,
            "depth": b.depth,
            "nodes_by_depth": nodes_by_depth(b.parents) if b.parents else [1] * b.depth,
            "parents": list(b.parents) if b.parents else None,
            "predicted_tokens_per_round": b.tokens_per_round,
            "predicted_cost": b.cost,
            "predicted_speedup": b.speedup,
            "best_chain": {
                "gamma": c.depth,
                "predicted_tokens_per_round": c.tokens_per_round,
                "predicted_cost": c.cost,
                "predicted_speedup": c.speedup,
            },
            "speedup_by_budget": sequoia.speedup_by_budget(self.choice),
            "by_budget": [dict(_cand(c), budget=n) for n, c in self.choice.by_budget],
            "chains": [_cand(c) for c in self.choice.chains],
            "hand_made": [
                dict(_cand(self.predict(sequoia.static_parents(shape))), label=f"tree {'-'.join(map(str, shape))}")
                for shape in HAND_MADE
            ],
            "inputs": {
                "acceptance_by_rank": cal.rank_counts,
                "chain_acceptance_by_depth": cal.chain_counts,
                "verify_cost_by_nodes": cal.verify_curve,
                "tree_pass_cost": cal.tree_pass_cost,
                "chain_step_cost": cal.chain_step_cost,
                "target_step_ms": cal.target_step_ms,
                "overhead_by_nodes": cal.overhead,
                "children_available": [list(c) for c in cal.available],
                "calibration_prompts": cal.prompts,
                "calibration_tokens": cal.tokens,
                "refined_with": cal.refined,
            },
            "sentence": self.choice.sentence(),
            "device": self.device,
        }

    def predict(self, parents) -> sequoia.Candidate:
        """Any tree's prediction from this calibration, on the choice's terms (``sequoia.tree_candidate``)."""
        cal = self.calibration
        return sequoia.tree_candidate(
            parents, cal.rank_acceptance().p, cal.verify_curve, cal.tree_pass_cost, cal.overhead
        )

    def record(self) -> dict:
        """What a recording keeps of the choice: the calibration and the bounds it was decided under
        (``from_record`` decides again, so a file cannot carry a choice its measurements do not give)."""
        return {
            "calibration": self.calibration.to_dict(),
            "max_nodes": self.max_nodes,
            "max_depth": self.max_depth,
            "device": self.device,
        }


def from_record(d) -> AutoTree:
    """``AutoTree.record``'s data, checked (``Calibration.from_dict``, bounds in range) and decided again.

    Raises:
        ValueError: naming the first field that is wrong."""
    from specviz.limits import MAX_GAMMA

    if not isinstance(d, dict) or set(d) - {"calibration", "max_nodes", "max_depth", "device"}:
        raise ValueError("auto: must be an object of calibration, max_nodes, max_depth and device")
    nodes, depth, device = d.get("max_nodes"), d.get("max_depth"), d.get("device", "")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= 64:
        raise ValueError("auto.max_nodes: must be a whole number from 1 to 64")
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= min(MAX_GAMMA, 8):
        raise ValueError("auto.max_depth: must be a whole number from 1 to 8")
    if not isinstance(device, str) or len(device) > 80:
        raise ValueError("auto.device: must be text of at most 80 characters")
    try:
        cal = Calibration.from_dict(d.get("calibration"))
    except ValueError as e:
        raise ValueError(f"auto.calibration: {e}") from None
    return decide(cal, nodes, depth, device)


def nodes_by_depth(parents) -> list[int]:
    """How many nodes a tree has at depth 1, 2, ... (its shape in one line: 4-6-5-3-2)."""
    depth: list[int] = []
    for par in parents:
        depth.append(1 if par < 0 else depth[par] + 1)
    return [depth.count(d) for d in range(1, max(depth, default=0) + 1)]


def _cand(c: sequoia.Candidate) -> dict:
    return {
        "kind": c.kind,
        "nodes": c.nodes,
        "depth": c.depth,
        "tokens_per_round": c.tokens_per_round,
        "cost": c.cost,
        "speedup": c.speedup,
    }


def calibration_prompt_ids(
    tokenize, texts: list[str], reserved: int, count: int = CALIBRATION_PROMPTS
) -> list[list[int]]:
    """The last ``count`` of ``texts`` tokenised by ``tokenize`` (text -> ids), held out from the
    first ``reserved`` (a benchmark's prompts).

    Raises:
        ValueError: fewer than ``reserved + count`` prompts."""
    if len(texts) < reserved + count:
        raise ValueError(
            f"the auto tree calibrates on {count} prompts after the {reserved} measured; the set has {len(texts)}"
        )
    return [tokenize(t) for t in texts[len(texts) - count :]]


def decide(cal: Calibration, max_nodes: int = 64, max_depth: int = 8, device: str = "") -> AutoTree:
    """The choice from a calibration (no model runs): ``sequoia.choose``; ``device`` names where it was measured."""
    choice = cal.choose(max_nodes, max_depth)
    best = choice.best
    tree = TreeSpec.explicit(best.parents) if best.kind == "tree" else None
    return AutoTree(
        tree=tree,
        gamma=best.depth,
        choice=choice,
        calibration=cal,
        max_nodes=max_nodes,
        max_depth=max_depth,
        device=device,
    )
