"""The calibration from short runs of a chain and a wide calibration tree: for drafters whose q needs a run (prompt
lookup, EAGLE, a drafter with its own tokenizer)."""

from __future__ import annotations

from specviz import theory as chain_theory
from specviz.engine.sampling import Sampling
from specviz.engine.stopping import ProgressReport, StopCheck, Stopped, asked, run_steps
from specviz.engine.tree.spec import TreeSpec
from specviz.theory import sequoia
from specviz.theory import tree as tree_theory
from specviz.engine.tree.calibration.record import Calibration, NS, _cost, _overhead, refined_counts
from specviz.engine.tree.calibration.timing import pass_ms_steps


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
