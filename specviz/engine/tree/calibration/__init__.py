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

Its modules, one section each: ``record`` (the Calibration and its checks), ``forced`` (teacher-forced), ``runs``
(from short runs), ``timing`` (v(n) and the drafter's passes); ``calibrate`` here picks the way for a drafter.
"""

from __future__ import annotations

from specviz.engine.sampling import Sampling
from specviz.engine.stopping import ProgressReport, StopCheck, run_steps
from specviz.engine.tree.calibration.forced import (
    MAX_RANK,
    TEXT_STEP,
    TIMING_REPEATS,
    TREE_LEVEL,
    WALKS,
    PositionAcceptance,
    _forced_model,
    calibrate_forced,
    calibrate_forced_steps,
    position_acceptance,
    teacher_forced,
    teacher_forcible,
    walk_chain,
    walk_tree,
)
from specviz.engine.tree.calibration.record import (
    FORMAT,
    MAX_COST,
    MAX_COUNT,
    METHOD,
    NS,
    Calibration,
    check_partial,
    merged_counts,
    refined_counts,
)
from specviz.engine.tree.calibration.runs import calibrate_by_runs, calibrate_by_runs_steps, refined_steps
from specviz.engine.tree.calibration.timing import pass_ms, pass_ms_steps, verify_cost_curve

__all__ = [
    "FORMAT", "MAX_COST", "MAX_COUNT", "MAX_RANK", "METHOD", "NS", "TEXT_STEP", "TIMING_REPEATS", "TREE_LEVEL",
    "WALKS", "Calibration", "PositionAcceptance", "calibrate", "calibrate_by_runs", "calibrate_by_runs_steps",
    "calibrate_forced", "calibrate_forced_steps", "calibrate_steps", "check_partial", "merged_counts", "pass_ms",
    "pass_ms_steps", "position_acceptance", "refined_counts", "refined_steps", "teacher_forced", "teacher_forcible",
    "verify_cost_curve", "walk_chain", "walk_tree",
]


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
    steps = calibrate_steps(drafter, target, prompts, sampling, vocab_size, max_new_tokens, max_depth, max_nodes, seed,
                            cached, refine, stop, partial, keep)
    return run_steps(steps, progress)


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
    runs = (drafter, target, prompts, sampling, vocab_size, max_new_tokens, max_depth, max_nodes, seed, cached, refine,
            stop)
    if _forced_model(drafter) is None:
        return (yield from calibrate_by_runs_steps(*runs))
    return (yield from calibrate_forced_steps(*runs, partial, keep))
