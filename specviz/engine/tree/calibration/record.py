"""A calibration's record: what was measured, in target steps (``Calibration``), read back from a store as data
from outside (``Calibration.from_dict``, ``check_partial``), and the choice its measurements make."""

from __future__ import annotations

import math
from dataclasses import dataclass
from specviz.engine.tree.spec import TreeSpec
from specviz.theory import sequoia
from specviz.theory import tree as tree_theory


NS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


NS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# the stored calibration's layout; a change makes older entries miss (and recordings' auto records fail their check)
FORMAT = 1


FORMAT = 1
# how calibrations are measured (2: teacher-forced for drafter models); a change makes older disk entries miss
METHOD = 2


METHOD = 2
MAX_COUNT = 10**9  # offered / accepted counts a stored calibration may hold


MAX_COUNT = 10**9  # offered / accepted counts a stored calibration may hold
MAX_COST = 1e4  # target steps: any stored cost or v(n) beyond this is not a measurement


@dataclass(frozen=True)
class Calibration:
    """What a calibration measured (costs in target steps: ms / the target's one-token step in ms).

    Attributes:
        rank_counts: ``sequoia.acceptance_by_rank`` of the calibration tree's rounds (run, or walked over
            teacher-forced positions: ``walk_tree``).
        chain_counts: ``tree_theory.acceptance_by_depth`` of the chain's rounds (offered, accepted; run or walked).
        verify_curve: {n: v(n)}.
        tree_pass_cost: drafting ms per drafter pass in tree rounds / target step ms (c_tree); teacher-forced:
            the drafter's fastest pass over TREE_LEVEL nodes / the target's fastest one-token pass.
        chain_step_cost: drafting ms per drafter pass in chain rounds / target step ms (c); teacher-forced:
            the drafter's fastest one-token pass / the target's.
        overhead: {mean nodes per round: a round's time beyond its drafting and the bare verify pass v(n) /
            target step ms}, from the chain's and the tree's runs: judging (the target's p at every node under the run's
            sampling processors: under top-p a ranking of the most probable tokens per node), recording; it grows with
            the nodes.
        available: ``sequoia.children_available`` of the calibration tree's rounds: how often a node's k-th
            child exists at all (under top-p or top-k sampling q's nucleus may hold fewer tokens than the
            shape asks); empty in calibrations stored before it was measured (every child then exists).
        refined: the shape whose own rounds replaced the wide runs' counts where it measured them
            (``calibrate``'s refinement), "" where none did.
        target_step_ms: the unit.
        calibration_tree: the parents of the tree it drafted.
        prompts, tokens: held-out prompts used, tokens generated per run.
    """

    rank_counts: list
    chain_counts: list
    verify_curve: dict
    tree_pass_cost: float
    chain_step_cost: float
    target_step_ms: float
    calibration_tree: tuple
    prompts: int
    tokens: int
    overhead: dict | None = None
    refined: str = ""
    available: tuple = ()

    def rank_acceptance(self) -> sequoia.RankAcceptance:
        return sequoia.RankAcceptance.from_counts(self.rank_counts, available=self.available)

    def to_dict(self) -> dict:
        """JSON-ready (dict keys as text); ``from_dict`` reads it back."""
        return {
            "format": FORMAT,
            "rank_counts": [[list(c) for c in row] for row in self.rank_counts],
            "chain_counts": [list(c) for c in self.chain_counts],
            "verify_curve": {str(n): v for n, v in self.verify_curve.items()},
            "tree_pass_cost": self.tree_pass_cost,
            "chain_step_cost": self.chain_step_cost,
            "target_step_ms": self.target_step_ms,
            "calibration_tree": list(self.calibration_tree),
            "prompts": self.prompts,
            "tokens": self.tokens,
            "overhead": {repr(float(n)): v for n, v in self.overhead.items()} if self.overhead else None,
            "refined": self.refined,
            "available": [list(c) for c in self.available],
        }

    @classmethod
    def from_dict(cls, d) -> "Calibration":
        """A calibration from ``to_dict``'s data, checked as data from outside: counts whole numbers with
        0 <= accepted <= offered, at most ``MAX_TREE_NODES`` ranks and ``MAX_GAMMA`` depths; costs and
        v(n) finite and in range (v(n) > 0); the calibration tree a valid explicit tree.

        Raises:
            ValueError: naming the first field that is wrong."""
        from specviz.limits import MAX_GAMMA, MAX_TREE_NODES

        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError("not a stored calibration of this version")

        def whole(x, lo, hi, what):
            if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
                raise ValueError(f"{what}: must be a whole number from {lo} to {hi}")
            return x

        def real(x, lo, hi, what, open_low=False):
            if (
                isinstance(x, bool)
                or not isinstance(x, (int, float))
                or not math.isfinite(x)
                or not lo <= x <= hi
                or (open_low and x <= lo)
            ):
                raise ValueError(f"{what}: must be a finite number in [{lo}, {hi}]")
            return float(x)

        def counts(rows, what, width):
            if not isinstance(rows, list) or len(rows) > width:
                raise ValueError(f"{what}: must be a list of at most {width} (offered, accepted) pairs")
            out = []
            for c in rows:
                if not isinstance(c, list) or len(c) != 2:
                    raise ValueError(f"{what}: each entry is [offered, accepted]")
                o = whole(c[0], 0, MAX_COUNT, what)
                out.append((o, whole(c[1], 0, o, what)))
            return out

        rank = d.get("rank_counts")
        if not isinstance(rank, list) or len(rank) > MAX_GAMMA:
            raise ValueError(f"rank_counts: must be a list of at most {MAX_GAMMA} depths")
        rank_counts = [counts(row, "rank_counts", MAX_TREE_NODES) for row in rank]
        chain_counts = counts(d.get("chain_counts"), "chain_counts", MAX_GAMMA)
        if not chain_counts:
            raise ValueError("chain_counts: empty (no acceptance measured)")
        curve = d.get("verify_curve")
        if not isinstance(curve, dict) or not 1 <= len(curve) <= 64:
            raise ValueError("verify_curve: must map 1 to 64 node counts to v(n)")
        verify_curve = {}
        for n, v in curve.items():
            if not isinstance(n, str) or not n.isdigit() or len(n) > 4:
                raise ValueError("verify_curve: its keys are node counts")
            verify_curve[whole(int(n), 1, MAX_TREE_NODES, "verify_curve")] = real(
                v, 0, MAX_COST, "verify_curve", open_low=True
            )
        overhead = d.get("overhead")
        if overhead is not None:
            if not isinstance(overhead, dict) or len(overhead) > 8:
                raise ValueError("overhead: must map at most 8 node counts to target steps")
            try:
                overhead = {
                    real(float(n), 0, MAX_TREE_NODES, "overhead"): real(v, 0, MAX_COST, "overhead")
                    for n, v in overhead.items()
                }
            except (TypeError, ValueError) as e:
                raise ValueError(f"overhead: {e}") from None
        tree = d.get("calibration_tree")
        if not isinstance(tree, list):
            raise ValueError("calibration_tree: must be a list of parents")
        TreeSpec.explicit(tree)  # raises ValueError naming what is wrong
        available = tuple(counts(d["available"], "available", MAX_TREE_NODES)) if d.get("available") is not None else ()
        refined = d.get("refined", "")
        if not isinstance(refined, str) or len(refined) > 80:
            raise ValueError("refined: must be text of at most 80 characters")
        return cls(
            rank_counts=rank_counts,
            chain_counts=chain_counts,
            verify_curve=verify_curve,
            tree_pass_cost=real(d.get("tree_pass_cost"), 0, MAX_COST, "tree_pass_cost"),
            chain_step_cost=real(d.get("chain_step_cost"), 0, MAX_COST, "chain_step_cost"),
            target_step_ms=real(d.get("target_step_ms"), 0, 1e7, "target_step_ms", open_low=True),
            calibration_tree=tuple(tree),
            prompts=whole(d.get("prompts"), 1, 1000, "prompts"),
            tokens=whole(d.get("tokens"), 1, 10**6, "tokens"),
            overhead=overhead or None,
            refined=refined,
            available=available,
        )

    def chain_rates(self) -> list[float]:
        return tree_theory.depth_rates(self.chain_counts)

    def choose(self, max_nodes: int = 64, max_depth: int = 8) -> sequoia.AutoChoice:
        """The choice these measurements give (no model runs): ``sequoia.choose`` over trees of at most
        ``max_nodes`` nodes and ``max_depth`` levels and chains of at most ``max_depth`` drafts."""
        return sequoia.choose(
            self.rank_acceptance(),
            self.chain_rates(),
            self.verify_curve,
            self.tree_pass_cost,
            self.chain_step_cost,
            max_nodes=max_nodes,
            max_depth=max_depth,
            overhead=self.overhead,
        )


def _cost(ms: float | None, step_ms: float) -> float:
    return ms / step_ms if ms else 0.0


def _overhead(chains, trees, step_ms: float, curve: dict[int, float]) -> dict[float, float] | None:
    """{mean nodes per round: ms per round beyond the drafting and the bare verify pass / step_ms} for the
    chain's and the tree's runs (two points of a line in n); None when they drafted as many nodes.

    The bare pass is v(n) of ``curve`` (``verify_cost_curve``: the target's logits and nothing else) at each
    round's node count. The loop's verify phase also judges: the target's p at every node through the run's
    sampling processors, which under top-p rank the most probable tokens once per node (``specviz.engine.top_p``;
    on the English pair with EAGLE at T 0.7, ranking 1,024 of them, a 4-4 tree's verify phase took 1.26 target
    steps against v(8) = 1.03). So that time, and the
    recording's, is what this line predicts; under greedy decoding judging is an argmax and the line stays low."""
    points = {}
    for ts in (chains, trees):
        rounds = [r for t in ts for r in t.rounds]
        bare = sum(sequoia.verify_cost_at(curve, max(1, r.drafted_count)) for r in rounds) * step_ms
        phases = sum(r.draft_ms for r in rounds) + bare
        walls = sum(t.total_ms - t.prefill_ms for t in ts)
        if rounds:
            points[sum(t.drafted for t in ts) / len(rounds)] = max(0.0, (walls - phases) / len(rounds)) / step_ms
    return points if len(points) == 2 else None


def check_partial(d, prompts: int, max_new_tokens: int, vocab_size: int) -> dict:
    """A stopped calibration's record (``calibrate_forced``'s ``keep``), checked as data from outside: one
    text per prompt (``prompts``) of at most ``max_new_tokens`` token ids below ``vocab_size``, and pass
    times {n: ms} (0 among them) finite and positive, or None.

    Raises:
        ValueError: naming the first field that is wrong."""
    if not isinstance(d, dict) or set(d) - {"texts", "target_ms", "drafter_ms"}:
        raise ValueError("not a partial calibration")
    texts = d.get("texts")
    if not isinstance(texts, list) or len(texts) != prompts:
        raise ValueError(f"texts: one per prompt ({prompts})")
    for text in texts:
        if (
            not isinstance(text, list)
            or len(text) > max_new_tokens
            or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in text)
        ):
            raise ValueError(f"texts: lists of at most {max_new_tokens} token ids")
    for field in ("target_ms", "drafter_ms"):
        v = d.get(field)
        if v is not None and not (
            isinstance(v, dict)
            and 0 < len(v) <= 64
            and "0" in v
            and all(
                isinstance(n, str)
                and n.isdigit()
                and len(n) <= 4
                and isinstance(x, (int, float))
                and not isinstance(x, bool)
                and math.isfinite(x)
                and 0 < x <= 1e7
                for n, x in v.items()
            )
        ):
            raise ValueError(f"{field}: must map node counts (with 0) to ms")
    return {"texts": texts, "target_ms": d.get("target_ms"), "drafter_ms": d.get("drafter_ms")}


def refined_counts(cal: Calibration, best: sequoia.Candidate, own: list) -> Calibration:
    """``cal`` with the counts of ``best``'s own rounds (traces ``own``) in place of the wide runs':
    a chain's acceptance by depth for depths 1..gamma; a tree's (depth, rank) cells it offered at least
    ``sequoia.MIN_COUNT`` times (a rarer cell adds its counts to the wide tree's)."""
    mine = tree_theory.acceptance_by_depth(*own) if best.kind != "tree" else sequoia.acceptance_by_rank(*own)
    return merged_counts(cal, best, mine)


def merged_counts(cal: Calibration, best: sequoia.Candidate, mine: list) -> Calibration:
    """``refined_counts`` from ``best``'s own counts ``mine``: ``tree_theory.acceptance_by_depth``'s for a
    chain, ``sequoia.acceptance_by_rank``'s for a tree."""
    from dataclasses import replace

    if best.kind != "tree":
        if not mine:
            return cal
        counts = list(mine[: best.depth]) + list(cal.chain_counts[len(mine[: best.depth]) :])
        return replace(cal, chain_counts=counts, refined=_joined(cal.refined, best.label()))
    rows = [list(row) for row in cal.rank_counts]
    for d, row in enumerate(mine):
        while len(rows) <= d:
            rows.append([])
        for k, (o, a) in enumerate(row):
            while len(rows[d]) <= k:
                rows[d].append((0, 0))
            base = rows[d][k]
            rows[d][k] = (o, a) if o >= sequoia.MIN_COUNT else (base[0] + o, base[1] + a)
    return replace(cal, rank_counts=rows, refined=_joined(cal.refined, best.label()))


def _joined(before: str, label: str) -> str:
    return f"{before}; {label}"[:80] if before else label
