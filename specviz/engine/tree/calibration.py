"""The auto tree's calibration: every input of its choice (``specviz.engine.tree.auto``), measured on this pair and
device.

A short calibration on held-out prompts (the prompt set's last ones, which a benchmark's first
prompts do not reach) measures every input of the choice. For a drafter model (also early exit and
the int8 target: a drafter whose q one forward pass reads) it is teacher-forced (``calibrate_forced``):
- the target's own continuation of each prompt (its greedy text, or a sample), whose steps time the unit;
- one forward pass of each model over prompt + text: at every position the chance that the drafter's
  k-th ranked candidate is the one accepted (p at that candidate, ``position_acceptance``) and that
  a chain's draft is (sum of min(p, q)); from these the acceptance by depth and sibling rank (Sequoia's
  positional acceptance vector, Chen et al. 2024, Sec. 3.1, assumed to depend on depth and rank only) and
  the chain's acceptance by depth are counted by walking rounds over the positions (``walk_tree``,
  ``walk_chain``), exact under greedy decoding;
- the verify cost v(n), a target pass over the pending token and n nodes / its one-token pass, and the
  drafter's passes (c, c_tree), from a few timed passes (``pass_ms``).
Other drafters (prompt lookup, EAGLE, a drafter with its own tokenizer) are measured from short runs of a
chain and a wide calibration tree (``calibrate_by_runs``).

v(n) is timed directly (``pass_ms``, ``verify_cost_curve``): the time of one pass over a prefix's pending
token and n tree nodes under the tree mask, over the time of a one-token step (the same prefix), the
fastest of several passes timed in turns.

A ``Calibration`` is what was measured, in target steps; ``Calibration.from_dict`` reads a stored one back
as data from outside, and ``Calibration.choose`` gives the choice its measurements make.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from specviz import theory as chain_theory
from specviz.engine.rounds import held
from specviz.engine.runner import Cache, make_runner
from specviz.engine.sampling import Sampling, contexts
from specviz.engine.stopping import ProgressReport, StopCheck, Stopped, asked, run_steps
from specviz.engine.tree.attention import ancestor_matrix, masked_logits
from specviz.engine.tree.spec import TreeSpec
from specviz.theory import sequoia
from specviz.theory import tree as tree_theory

NS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# the stored calibration's layout; a change makes older entries miss (and recordings' auto records fail their check)
FORMAT = 1
# how calibrations are measured (2: teacher-forced for drafter models); a change makes older disk entries miss
METHOD = 2
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


def calibrate_by_runs(
    drafter,
    target,
    prompts: list[list[int]],
    sampling: Sampling,
    vocab_size: int,
    max_new_tokens: int = 64,
    max_depth: int = 8,
    max_nodes: int = 64,
    seed: int = 0,
    cached="auto",
    refine: int = 2,
    stop: StopCheck | None = None,
    progress: ProgressReport | None = None,
) -> Calibration:
    """Measure every input of the choice on ``prompts`` from short runs, then refine it: the calibration of
    a drafter teacher forcing cannot read in one pass (prompt lookup, EAGLE, a drafter with its own tokenizer).

    The wide runs (a chain of gamma ``max_depth``, the 40-node calibration tree) start their rounds at
    other places than a smaller shape's do: after a run of 8 accepted drafts, say, where a 4-draft chain
    would have started a round after a rejection, at a harder token. On the embedded pair their depth
    rates predicted 3.68 tokens per round for a chain of gamma 4 whose own rounds gave 3.38 (its own
    counts: 3.42). So the shape the wide runs choose is run on the same prompts, and its own counts
    replace theirs where it measured them (``refined_counts``); then the choice is made again, up to
    ``refine`` times while it changes.

    Args:
        drafter: a ``specviz.drafters.Drafter`` that drafts trees (model, early exit, EAGLE, prompt lookup).
        target: the target model; ``vocab_size``: the tokenizer's size.
        max_new_tokens: tokens per calibration run; ``max_depth``: the chain's gamma and the deepest tree weighed;
            ``max_nodes``: the widest verify pass timed (and the calibration tree's size, at most 40).
        cached: the KV cache v(n) is timed over (as ``specviz.engine.cache.make_runner``).
        stop: asked after every round of every run and before every timed pass size (None: never); the
            calibration is work a visitor's job can start, so it ends within the round under way when asked.
        progress: told (runs done, runs in all) after every round and every timed repeat (None: nobody); the
            refinement's runs count in "in all" at their most (``refine`` x the prompts), so the count may end early.

    Raises:
        ValueError: no prompts, or a run that never drafted (no acceptance to measure).
        specviz.engine.stopping.Stopped: ``stop`` asked to end (nothing is kept: the choice needs every run).
    """
    return run_steps(
        calibrate_by_runs_steps(
            drafter,
            target,
            prompts,
            sampling,
            vocab_size,
            max_new_tokens,
            max_depth,
            max_nodes,
            seed,
            cached,
            refine,
            stop,
        ),
        progress,
    )


def calibrate_by_runs_steps(
    drafter,
    target,
    prompts: list[list[int]],
    sampling: Sampling,
    vocab_size: int,
    max_new_tokens: int = 64,
    max_depth: int = 8,
    max_nodes: int = 64,
    seed: int = 0,
    cached="auto",
    refine: int = 2,
    stop: StopCheck | None = None,
):
    """``calibrate_by_runs`` as steps (``specviz.engine.stopping.run_steps``): a generator that yields (runs done, runs
    in all) after every round of every run and every timed repeat, so a server's device thread can run other jobs'
    steps between them, and returns the Calibration. Arguments and errors as ``calibrate_by_runs``."""
    from specviz.engine.chain import autoregressive_stream, speculative_stream

    if not prompts:
        raise ValueError("calibration needs at least one prompt")
    parts = _Parts(2 + (3 + refine) * len(prompts))

    def run(stream):
        last = None
        for last in stream:
            if asked(stop):
                raise Stopped
            yield parts.now()
        parts.done += 1
        return last

    def runs(make):
        out = []
        for i, ids in enumerate(prompts):
            out.append((yield from run(make(i, ids))))
        return out

    common = dict(sampling=sampling, max_new_tokens=max_new_tokens, vocab_size=vocab_size, eos_token_id=None)
    calib_tree = sequoia.prior_tree(min(40, max_nodes), max_depth)
    yield from run(autoregressive_stream(prompts[0], target, **(common | {"max_new_tokens": 4})))  # warm-up
    base = yield from runs(
        lambda i, ids: autoregressive_stream(
            ids, target, seed=seed + i, **(common | {"max_new_tokens": min(32, max_new_tokens)})
        )
    )
    chains = yield from runs(
        lambda i, ids: speculative_stream(ids, drafter, target, gamma=max_depth, seed=seed + i, **common)
    )
    trees = yield from runs(
        lambda i, ids: speculative_stream(
            ids, drafter, target, tree=TreeSpec.explicit(calib_tree), seed=seed + i, **common
        )
    )
    sizes = sorted({n for n in NS if n < max_nodes} | {max_nodes})
    ms = yield from _parts_of(pass_ms_steps(target, prompts[0], sizes, vocab_size, cached=cached, stop=stop), parts)
    curve = {n: ms[n] / ms[0] for n in sizes}
    step = chain_theory.target_step_ms(*base)
    chain_counts = tree_theory.acceptance_by_depth(*chains)
    if not chain_counts:
        raise ValueError("the calibration's chain drafted nothing: no acceptance to measure")
    cal = Calibration(
        rank_counts=sequoia.acceptance_by_rank(*trees),
        chain_counts=chain_counts,
        verify_curve=curve,
        tree_pass_cost=_cost(chain_theory.drafter_step_ms(*trees), step),
        chain_step_cost=_cost(chain_theory.drafter_step_ms(*chains), step),
        target_step_ms=step,
        calibration_tree=calib_tree,
        prompts=len(prompts),
        tokens=max_new_tokens,
        overhead=_overhead(chains, trees, step, curve),
        available=tuple(sequoia.children_available(*trees)),
    )

    def measured(cal: Calibration, best: sequoia.Candidate):
        shape = dict(tree=TreeSpec.explicit(best.parents)) if best.kind == "tree" else dict(gamma=best.depth)
        own = yield from runs(lambda i, ids: speculative_stream(ids, drafter, target, seed=seed + i, **common, **shape))
        return refined_counts(cal, best, own)

    return (yield from refined_steps(cal, refine, max_nodes, max_depth, measured))


def refined_steps(cal: Calibration, refine: int, max_nodes: int, max_depth: int, measure):
    """Decide, measure the chosen shape, decide again: at most ``refine`` times, stopping when a shape is chosen a
    second time (its counts are the calibration's own by then). ``measure(cal, best)``: a generator whose value is the
    new Calibration; its steps are yielded as they come. Returns the last Calibration."""
    tried: set = set()
    for _ in range(refine):
        best = cal.choose(max_nodes, max_depth).best
        shape = best.parents if best.kind == "tree" else best.depth
        if shape in tried:
            break
        tried.add(shape)
        cal = yield from measure(cal, best)
    return cal


class _Parts:
    """A calibration's parts counted as they finish, ``now()`` the (done, in all) its steps yield (done capped at in
    all)."""

    def __init__(self, total: int):
        self.done, self.total = 0, total

    def now(self) -> tuple[int, int]:
        return min(self.done, self.total), self.total


def _parts_of(steps, parts: _Parts, count: int = 1):
    """Yield ``parts.now()`` at each of ``steps``' steps; then ``count`` parts more are done; returns its value."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            parts.done += count
            return end.value
        yield parts.now()


# ---- the teacher-forced calibration (a drafter model): seconds, not minutes ----------------------------------

MAX_RANK = 8  # sibling ranks measured at each position (the widest node a chosen tree may have)
TREE_LEVEL = 4  # nodes in the drafter pass timed as one tree level (c_tree)
WALKS = 4  # walks over the measured positions under sampling (greedy walks are deterministic: one)
# each target pass size timed this many times in turns, the fastest kept (the drafter's, cheaper, 3 times as many)
TIMING_REPEATS = 4


@dataclass(frozen=True)
class PositionAcceptance:
    """What one teacher-forced text says at each of its positions i (the drafter and the target both read
    the text up to i; each row is about the token after it).

    Attributes:
        by_rank: by_rank[i][k - 1], k = 1 .. the children that exist there (at most MAX_RANK): the chance
            that the drafter's k-th candidate (its ranking: q, or under greedy decoding the softmax of its
            logits; only tokens q gives mass) is the one recursive rejection sampling without replacement
            accepts, = p_i(x_k). Greedy: 1 for the candidate equal to the target's argmax, else 0.
        chain: chain[i] = sum_x min(p_i(x), q_i(x)): the chance a draft drawn from q_i is accepted
            (Leviathan et al. 2023, Sec. 3.1); greedy: 1 when the drafter's argmax is the target's.
    """

    by_rank: tuple
    chain: tuple


def position_acceptance(
    p: torch.Tensor, q: torch.Tensor, ranking: torch.Tensor, max_rank: int = MAX_RANK
) -> PositionAcceptance:
    """Per-position acceptance from the target's processed p, the drafter's q and what its children are
    ranked by, each (L, V) float over the same L positions.

    Without replacement (the rule top-k children are judged by, ``specviz.engine.tree.accept``) the k-th
    sibling x_k is tested against p with x_1 .. x_{k-1} removed and renormalised, so it is the accepted one
    with probability prod_{j<k} (1 - p(x_j) / (1 - S_{j-1})) p(x_k) / (1 - S_{k-1}) = p(x_k), S_j the mass
    of x_1 .. x_j: the per-rank acceptance is p at the k-th candidate.

    Raises:
        ValueError: shapes that differ, or max_rank under 1."""
    if p.shape != q.shape or p.shape != ranking.shape or p.dim() != 2:
        raise ValueError("p, q and the ranking must be (positions, vocabulary) tensors of one shape")
    if max_rank < 1:
        raise ValueError("max_rank must be at least 1")
    p, q, ranking = p.float(), q.float(), ranking.float()
    values, ids = ranking.topk(min(max_rank, ranking.shape[-1]), dim=-1)
    exists = values > 0  # the children a node gets: the top-k the ranking gives mass (at least one)
    exists[:, 0] = True
    at = p.gather(1, ids)
    chain = torch.minimum(p, q).sum(-1)
    by_rank = tuple(tuple(float(x) for x, e in zip(row, ok) if e) for row, ok in zip(at.tolist(), exists.tolist()))
    return PositionAcceptance(by_rank=by_rank, chain=tuple(float(x) for x in chain.tolist()))


def _children_of(parents) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for i, par in enumerate(parents):
        kids.setdefault(par, []).append(i)
    return kids


def walk_tree(texts: list[PositionAcceptance], parents, walks: int = 1, seed: int = 0):
    """Rounds of the top-k tree ``parents`` walked over the measured positions: ``sequoia.acceptance_by_rank``'s
    counts, ``sequoia.children_available``'s, and (tokens, rounds).

    A round starts at a text's first position and each next round where the last ended (after its accepted
    drafts and the correction or bonus token), as a run's rounds do. At depth d the round is at position
    t + d - 1; the node's children there are its shape's first k that exist (``PositionAcceptance.by_rank``);
    the accepted one (if any) is drawn from their per-rank chances and the walk goes on below it at the next
    position. Under greedy decoding the chances are 0 or 1 and the walk is the run's own (the accepted token
    is the target's, the text's next token). Otherwise the position after an accepted sibling stands for
    its context (Sequoia's assumption: acceptance depends on depth and rank only). A round the text ends
    is counted as far as it went."""
    import random

    kids = _children_of(parents)
    counts: list[list[list[int]]] = []
    widths: list[int] = []
    tokens = rounds = 0
    rng = random.Random(seed)
    for _ in range(walks):
        for text in texts:
            end, t = len(text.by_rank), 0
            while t < end:
                node, i, depth = -1, t, 1
                while i < end:
                    offered = kids.get(node, [])[: len(text.by_rank[i])]
                    if depth == 1:
                        widths.append(len(offered))
                    if not offered:
                        break
                    row = sequoia.count_row(counts, depth, len(offered))
                    u, mass, chosen = rng.random(), 0.0, None
                    for k in range(len(offered)):
                        row[k][0] += 1
                        mass += text.by_rank[i][k]
                        if chosen is None and u < mass:
                            chosen = k
                    if chosen is None:
                        break
                    row[chosen][1] += 1
                    node, i, depth = offered[chosen], i + 1, depth + 1
                tokens += i - t + 1
                rounds += 1
                t = i + 1
    available = [
        (len([w for w in widths if w]), sum(w >= k for w in widths)) for k in range(1, max(widths, default=0) + 1)
    ]
    return [[(o, a) for o, a in row] for row in counts], available, (tokens, rounds)


def walk_chain(texts: list[PositionAcceptance], gamma: int, walks: int = 1, seed: int = 0) -> list[tuple[int, int]]:
    """``tree_theory.acceptance_by_depth``'s counts of a chain of ``gamma`` drafts walked over the measured
    positions as ``walk_tree`` walks a tree: at depth d a draft is accepted with the chance chain[t + d - 1]."""
    import random

    counts = [[0, 0] for _ in range(gamma)]
    rng = random.Random(seed)
    for _ in range(walks):
        for text in texts:
            end, t = len(text.chain), 0
            while t < end:
                i = t
                while i < end and i - t < gamma:
                    counts[i - t][0] += 1
                    if not rng.random() < text.chain[i]:
                        break
                    counts[i - t][1] += 1
                    i += 1
                t = i + 1
    return [(o, a) for o, a in counts if o]


def teacher_forced(
    drafter_model,
    target,
    prompt: list[int],
    text: list[int],
    sampling: Sampling,
    vocab_size: int,
    max_rank: int = MAX_RANK,
) -> PositionAcceptance:
    """One forward pass of each model over ``prompt`` + ``text`` (no cache): ``position_acceptance`` at the
    positions whose next token is in ``text`` (the prompt's last token first), p and q through ``sampling``'s
    processors (the repetition penalty with each position's context)."""
    device = next(target.parameters()).device
    seq = torch.tensor(list(prompt) + list(text), dtype=torch.long, device=device)
    first, count = len(prompt) - 1, len(text)
    ctx = contexts(seq, range(first + 1, first + 1 + count), vocab_size) if sampling.needs_context else None
    warpers = sampling.warpers()
    with torch.inference_mode():
        p_logits = make_runner(target, vocab_size, "re-fed").logits(seq, len(seq), len(seq))[first : first + count]
        q_logits = (
            make_runner(drafter_model, vocab_size, "re-fed")
            .logits(seq.to(next(drafter_model.parameters()).device), len(seq), len(seq))[first : first + count]
            .to(device)
        )
        p = sampling.probs(p_logits, warpers, ctx)
        q = sampling.probs(q_logits, warpers, ctx)
        ranking = torch.softmax(q_logits.float(), dim=-1) if sampling.greedy else q
    return position_acceptance(p, q, ranking, max_rank)


def teacher_forcible(drafter) -> bool:
    """Whether ``calibrate`` reads this drafter teacher-forced (``calibrate_forced``), not from runs."""
    return _forced_model(drafter) is not None


def _forced_model(drafter):
    """The drafter's model when teacher forcing can read its q in one pass (a drafter model, early exit,
    the int8 target), else None (prompt lookup, EAGLE, a drafter with its own tokenizer)."""
    from specviz.engine.model_drafter import as_drafter

    try:
        return as_drafter(drafter).forced_model
    except TypeError:
        return None


def calibrate(
    drafter,
    target,
    prompts: list[list[int]],
    sampling: Sampling,
    vocab_size: int,
    max_new_tokens: int = 64,
    max_depth: int = 8,
    max_nodes: int = 64,
    seed: int = 0,
    cached="auto",
    refine: int = 2,
    stop: StopCheck | None = None,
    partial: dict | None = None,
    keep=None,
    progress: ProgressReport | None = None,
) -> Calibration:
    """Every input of the choice, teacher-forced where the drafter is a model (``calibrate_forced``), from
    short runs otherwise (``calibrate_by_runs``). Arguments and errors as theirs."""
    return run_steps(
        calibrate_steps(
            drafter,
            target,
            prompts,
            sampling,
            vocab_size,
            max_new_tokens,
            max_depth,
            max_nodes,
            seed,
            cached,
            refine,
            stop,
            partial,
            keep,
        ),
        progress,
    )


def calibrate_steps(
    drafter,
    target,
    prompts: list[list[int]],
    sampling: Sampling,
    vocab_size: int,
    max_new_tokens: int = 64,
    max_depth: int = 8,
    max_nodes: int = 64,
    seed: int = 0,
    cached="auto",
    refine: int = 2,
    stop: StopCheck | None = None,
    partial: dict | None = None,
    keep=None,
):
    """``calibrate`` as steps: a generator yielding (parts done, parts in all) between short pieces of work, whose value
    is the Calibration (``calibrate_forced_steps``, ``calibrate_by_runs_steps``). Arguments and errors as
    ``calibrate``."""
    if _forced_model(drafter) is None:
        return (
            yield from calibrate_by_runs_steps(
                drafter,
                target,
                prompts,
                sampling,
                vocab_size,
                max_new_tokens,
                max_depth,
                max_nodes,
                seed,
                cached,
                refine,
                stop,
            )
        )
    return (
        yield from calibrate_forced_steps(
            drafter,
            target,
            prompts,
            sampling,
            vocab_size,
            max_new_tokens,
            max_depth,
            max_nodes,
            seed,
            cached,
            refine,
            stop,
            partial,
            keep,
        )
    )


def calibrate_forced(
    drafter,
    target,
    prompts: list[list[int]],
    sampling: Sampling,
    vocab_size: int,
    max_new_tokens: int = 64,
    max_depth: int = 8,
    max_nodes: int = 64,
    seed: int = 0,
    cached="auto",
    refine: int = 2,
    stop: StopCheck | None = None,
    partial: dict | None = None,
    keep=None,
    progress: ProgressReport | None = None,
) -> Calibration:
    """The choice's inputs from teacher-forced passes over the target's own text, and a few timed passes.

    What it measures, in order, each part kept (``keep``) as soon as it is measured:
    1. the text: the target's own continuation of each prompt, ``max_new_tokens`` tokens under ``sampling``
       (greedy: its greedy text; else a sample), the prompts in one batch (``autoregressive_generate_batch``:
       on a CPU a step of 8 rows costs little more than a step of one);
    2. v(n) and the drafter's passes: the fastest of TIMING_REPEATS passes of each size, timed in turns
       (``pass_ms``): v(n) = target pass over n nodes / its one-token pass (the
       unit, ``target_step_ms``); c = the drafter's one-token pass / the target's, c_tree = its pass over
       TREE_LEVEL nodes / the target's;
    3. per position of each text, one forward pass of each model over prompt + text (``teacher_forced``):
       the acceptance of the drafter's k-th ranked candidate (``position_acceptance``).
    From 3 the counts Sequoia's programme needs are walked, not run (``walk_tree``, ``walk_chain``): the
    calibration tree's rounds (``sequoia.prior_tree``), a chain of gamma ``max_depth``, then the chosen shape's
    own rounds (``refined_counts``'s rule, up to ``refine`` times while the choice changes). The programme
    reads them as Sequoia's positional acceptance vector (Chen et al. 2024, Sec. 3.1: the chance that a
    node's k-th child is the one accepted, given its depth and rank only). Under greedy decoding each walk
    is the run's own rounds exactly; under sampling WALKS walks draw each verdict from the measured chances.
    No overhead line is measured (``Calibration.overhead`` None): the prediction's round cost is drafting
    and v(n).

    Args:
        as ``calibrate_by_runs``; ``partial``: what an earlier, stopped calibration of the same key kept
        (``specviz.pair.auto_tree.load_partial``), reused instead of measured again; ``keep``: called with that record
        (plain data) after each part; ``progress``: told (parts done, parts in all) after every TEXT_STEP tokens of the
        texts, every timed repeat and each prompt's teacher-forced passes (None: nobody).

    Raises:
        ValueError: no prompts, no positions, or a drafter that is not a model.
        specviz.engine.stopping.Stopped: ``stop`` asked to end (what was measured has been given to ``keep``).
    """
    return run_steps(
        calibrate_forced_steps(
            drafter,
            target,
            prompts,
            sampling,
            vocab_size,
            max_new_tokens,
            max_depth,
            max_nodes,
            seed,
            cached,
            refine,
            stop,
            partial,
            keep,
        ),
        progress,
    )


TEXT_STEP = 8  # tokens of the texts' batch a step decodes: a step of the device's, short beside a visitor's run


def calibrate_forced_steps(
    drafter,
    target,
    prompts: list[list[int]],
    sampling: Sampling,
    vocab_size: int,
    max_new_tokens: int = 64,
    max_depth: int = 8,
    max_nodes: int = 64,
    seed: int = 0,
    cached="auto",
    refine: int = 2,
    stop: StopCheck | None = None,
    partial: dict | None = None,
    keep=None,
):
    """``calibrate_forced`` as steps (``specviz.engine.stopping.run_steps``): a generator that yields (parts done, parts
    in all) after every TEXT_STEP tokens of the texts, every timed repeat and each prompt's teacher-forced passes, so a
    server's device thread runs other jobs' steps between them, and returns the Calibration. Arguments and errors as
    ``calibrate_forced``."""
    from specviz.engine import batch

    model = _forced_model(drafter)
    if model is None:
        raise ValueError("the teacher-forced calibration needs a drafter model")
    if not prompts:
        raise ValueError("calibration needs at least one prompt")
    record = {"texts": [[] for _ in prompts], "target_ms": None, "drafter_ms": None}
    if partial and len(partial.get("texts") or ()) == len(prompts):
        record.update({k: v for k, v in partial.items() if k in record})
    keep = keep or (lambda r: None)
    sizes = sorted({n for n in NS if n < max_nodes} | {max_nodes})
    parts = _Parts(math.ceil(max_new_tokens / TEXT_STEP) + 2 + len(prompts))
    parts.done = min(len(t) for t in record["texts"]) // TEXT_STEP
    # The texts, TEXT_STEP tokens a batch (each row as far as its text is; the seed moves on with its length).
    while left := [i for i, t in enumerate(record["texts"]) if len(t) < max_new_tokens]:
        at = len(record["texts"][left[0]])
        rows = [i for i in left if len(record["texts"][i]) == at]
        out = batch.autoregressive_generate_batch(
            [list(prompts[i]) + record["texts"][i] for i in rows],
            target,
            sampling=sampling,
            max_new_tokens=min(TEXT_STEP, max_new_tokens - at),
            seed=seed + at,
            vocab_size=vocab_size,
            stop=stop,
        )
        for i, trace in zip(rows, out.traces):
            record["texts"][i] = record["texts"][i] + list(trace.output_ids)
        keep(record)
        if out.stopped:
            raise Stopped
        parts.done = min(len(t) for t in record["texts"]) // TEXT_STEP
        yield parts.now()
    parts.done = math.ceil(max_new_tokens / TEXT_STEP)
    for key, timed_model, timed_sizes, repeats in (
        ("target_ms", target, sizes, TIMING_REPEATS),
        ("drafter_ms", model, [TREE_LEVEL], 3 * TIMING_REPEATS),
    ):
        if record[key] is None:
            try:
                ms = yield from _parts_of(
                    pass_ms_steps(timed_model, prompts[0], timed_sizes, vocab_size, repeats, cached, stop), parts, 0
                )
            except Stopped:
                keep(record)
                raise
            record[key] = {str(n): v for n, v in ms.items()}
            keep(record)
        parts.done += 1
        yield parts.now()
    texts = []
    for ids, text in zip(prompts, record["texts"]):
        if asked(stop):
            raise Stopped
        if text:
            with torch.inference_mode():
                texts.append(teacher_forced(model, target, ids, text, sampling, vocab_size))
        parts.done += 1
        yield parts.now()
    if not any(t.chain for t in texts):
        raise ValueError("the calibration's texts are empty: no acceptance to measure")
    walks = 1 if sampling.greedy else WALKS
    target_ms, drafter_ms = (
        {int(n): v for n, v in record["target_ms"].items()},
        {int(n): v for n, v in record["drafter_ms"].items()},
    )
    step_ms = target_ms[0]
    calib_tree = sequoia.prior_tree(min(40, max_nodes), max_depth)
    rank_counts, available, _ = walk_tree(texts, calib_tree, walks, seed)
    cal = Calibration(
        rank_counts=rank_counts,
        chain_counts=walk_chain(texts, max_depth, walks, seed),
        verify_curve={n: target_ms[n] / target_ms[0] for n in sizes},
        tree_pass_cost=drafter_ms[TREE_LEVEL] / target_ms[0],
        chain_step_cost=drafter_ms[0] / target_ms[0],
        target_step_ms=step_ms,
        calibration_tree=calib_tree,
        prompts=len(texts),
        tokens=max_new_tokens,
        available=tuple(available),
    )

    def walked(cal: Calibration, best: sequoia.Candidate):
        counts = (
            walk_tree(texts, best.parents, walks, seed)[0]
            if best.kind == "tree"
            else walk_chain(texts, best.depth, walks, seed)
        )
        return merged_counts(cal, best, counts)
        yield  # no step of its own: walking the measured positions runs no model

    return (yield from refined_steps(cal, refine, max_nodes, max_depth, walked))


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


# ---- v(n) and the drafter's passes, timed --------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def pass_ms(
    model,
    prompt_ids: list[int],
    nodes: list[int],
    vocab: int,
    repeats: int = 7,
    cached: Cache = "auto",
    stop: StopCheck | None = None,
) -> dict[int, float]:
    """{n: ms} of ``model``'s fastest masked pass over the pending token and n nodes after ``prompt_ids``,
    for 0 (a one-token cached step) and each n in ``nodes``, timed in turns as ``verify_cost_curve``
    says; ``stop`` as there.

    Raises:
        specviz.engine.stopping.Stopped: ``stop`` asked to end."""
    return run_steps(pass_ms_steps(model, prompt_ids, nodes, vocab, repeats, cached, stop))


def pass_ms_steps(
    model,
    prompt_ids: list[int],
    nodes: list[int],
    vocab: int,
    repeats: int = 7,
    cached: Cache = "auto",
    stop: StopCheck | None = None,
):
    """``pass_ms`` as steps: yields None after the warm-up and after each repeat (every size timed once), returns
    its {n: ms}. Other work between steps costs nothing measured: a pass is timed whole or not at all."""
    device = model.device
    seq = torch.tensor(list(prompt_ids) + [0] * 130, dtype=torch.long, device=device)
    prefix = len(prompt_ids) - 1
    runner = make_runner(model, vocab, cached)
    sizes = [0, *nodes]
    times: dict[int, list[float]] = {n: [] for n in sizes}

    def timed(n: int) -> float:
        if asked(stop):
            raise Stopped
        tokens = seq[prefix : prefix + n + 1].clone()
        positions = torch.arange(prefix, prefix + n + 1, device=device)
        allow = ancestor_matrix(list(range(-1, n))).to(device)
        _sync(device)
        t0 = time.perf_counter()
        masked_logits(runner, seq, prefix, tokens, positions, allow, n + 1)
        _sync(device)
        runner.rollback(prefix)
        return time.perf_counter() - t0

    with held(runner):
        with torch.inference_mode():  # per step: inference mode is thread-local, and other jobs run between steps
            runner.prefill(seq, prefix)
            for n in sizes:  # a warm-up pass of each size, not counted
                timed(n)
        yield
        for r in range(repeats):
            with torch.inference_mode():
                for n in sizes[r % len(sizes) :] + sizes[: r % len(sizes)]:
                    times[n].append(timed(n))
            yield
    return {n: min(t) * 1000.0 for n, t in times.items()}


def verify_cost_curve(
    target,
    prompt_ids: list[int],
    nodes: list[int],
    vocab: int,
    repeats: int = 7,
    cached: Cache = "auto",
    stop: StopCheck | None = None,
) -> dict[int, float]:
    """v(n) for each n in ``nodes``: the fastest of ``repeats`` masked target passes over the pending token
    and n nodes / the fastest of as many one-token cached steps, after ``prompt_ids`` (dimensionless);
    ``cached`` the KV cache both are timed over (``specviz.engine.cache.make_runner``: True, "static", "graphs").
    ``stop`` is asked before each timed pass (None: never); raises ``specviz.engine.stopping.Stopped`` when it asks.

    The pass's cost depends on how many tokens it scores, not on the tree's shape (the mask only
    hides entries), so a chain of n nodes stands for any tree of n. The sizes are timed in turns
    (every size once per repeat, the order rotated), so a burst of other work on the machine slows
    several sizes a little rather than one size a lot, and the fastest pass of each size is kept:
    other work only adds time, so the fastest is the closest to the pass's own cost (both sides of
    the ratio alike). On a busy 2-core CPU, medians timed one size after another gave v(2) 0.86 and
    v(3) 0.83 against v(1) 0.99, and medians timed in turns v(4) 1.41 against v(6) 1.17.
    """
    ms = pass_ms(target, prompt_ids, nodes, vocab, repeats, cached, stop)
    return {n: ms[n] / ms[0] for n in nodes}
