"""A gamma sweep: the same prompt and seed decoded with gamma = 1..8, against one baseline.

Each point keeps the counts and times that the theory needs (Leviathan et al. 2023, Sec. 3),
so a sweep saved to JSON can be plotted again without the models (``Sweep`` and ``SweepPoint``
live with the trace, in ``specviz.records.sweep``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from specviz import theory
from specviz.measure.baseline import with_baseline_steps
from specviz.engine.chain import autoregressive_stream
from specviz.engine.schedules import make_schedule
from specviz.engine.stopping import STOPPED, StopCheck, asked
from specviz.records.sweep import Sweep, SweepPoint  # noqa: F401  (the sweep's record lives with the trace; re-exported here)


def sweep_stream(
    input_ids: list[int],
    drafter,
    target,
    gammas: Sequence[int] = range(1, 9),
    schedule: str = "constant",
    stop: StopCheck | None = None,
    **common,
) -> Iterator[Sweep | None]:
    """Run the baseline once (its target step time), then one speculative run per gamma, each in
    turns with a baseline run of its own (``specviz.measure.baseline.with_baseline``), so machine noise falls on
    both sides of each point's speedup; yield the growing Sweep.

    Args:
        input_ids, drafter, target: as ``speculative_stream``.
        gammas: the gammas to try, each >= 1.
        schedule: the gamma schedule's name (``specviz.engine.schedules.SCHEDULES``); each point starts at its gamma.
        stop: asked before each step of every run (``specviz.engine.stopping``); when it answers True the
            sweep ends there, without the point under way (a point is a whole run).
        common: sampling, max_new_tokens, eos_token_id, seed, tokenizer: shared by every run,
            so the runs differ in gamma alone.

    Yields:
        The Sweep after the baseline and after each gamma (nothing when stopped during the baseline), and None after
        every step of every run between them (a server's device thread runs other jobs' steps there; the runs' clocks
        leave that time out, ``specviz.engine.rounds.Clock``).

    Raises:
        ValueError: as ``speculative_stream``.
    """
    baseline = None
    for baseline in autoregressive_stream(input_ids, target, **common):
        if not baseline.stop_reason and asked(stop):
            return
        yield None
    sweep = Sweep(
        baseline_tokens_per_second=baseline.tokens_per_second or 0.0,
        target_step_ms=theory.target_step_ms(baseline) or 0.0,
        schedule=schedule,
    )
    yield sweep
    for gamma in gammas:
        spec, base = yield from with_baseline_steps(
            input_ids,
            drafter,
            target,
            gamma=int(gamma),
            schedule=make_schedule(schedule, int(gamma)),
            stop=stop,
            **common,
        )
        if spec is None or STOPPED in (spec.stop_reason, base.stop_reason if base is not None else None):
            return
        sweep.drafter = (spec.settings.get("drafter") or {}).get("kind", sweep.drafter)
        sweep.points.append(SweepPoint.of(spec, base))
        yield sweep
