"""Jobs run on the device: the GPU halves of Generate, the gamma sweep, Compare and Batch.

Each takes a checked ``RunRequest`` (plain data), yields plain data (traces, sweeps, comparisons,
batch points) and raises only ``gr.Error``: on ZeroGPU each runs in a forked GPU worker, for at
most the duration its sizing function returns (``specviz.serving.gpu_duration``), and what crosses the
process boundary is pickled. Nothing here builds a UI object.
"""

from __future__ import annotations

import time

from specviz import Trace, speculative_stream
from specviz.measure.throughput import batch_sizes_up_to, throughput_stream
from specviz.measure.comparison import compare_stream
from specviz.drafters import KINDS as DRAFTER_KINDS, usable_kinds
from specviz.pair.drafter import pair_drafter
from specviz.serving.gpu import gpu_task
from specviz.serving.gpu_duration import generate_duration, sweep_duration
from specviz.engine.schedules import make_schedule
from specviz.engine.stopping import StopCheck, Stopped
from specviz.measure.baseline import paired
from specviz.measure.sweep import sweep_stream
from specviz.ui.guard.checks import number
from specviz.ui.guard.limits import (
    BATCH_MAX,
    CALIBRATION_SECONDS_MAX,
    MAX_NEW_TOKENS_RANGE,
    RUN_SECONDS_MAX,
    STREAM_INTERVAL_MS,
    SWEEP_GAMMAS,
)
from specviz.ui.running.pairs import encode, failure, resident
from specviz.ui.guard.request import RunRequest
from specviz.ui.tabs.tree import AUTO, resolve_steps, resolve_tree
from specviz.views.text import markdown_literal, measured_so_far, run_label
from specviz.views.verdict import engine_sentence, verdict


CALIBRATING = (
    f"Token tree auto: measuring this pair on this device first, once per sampling setting (at most "
    f"{CALIBRATION_SECONDS_MAX:.0f} s; Stop ends it and keeps what it measured): the target's own text on held-out "
    "prompts, both models read over it once (how often the drafter's k-th candidate is the one accepted, by rank), "
    "and a few timed passes (the verify cost v(n) and the drafter's pass). The run's own time starts after it…"
)
CALIBRATING_RUNS = (
    f"Token tree auto: measuring this pair on this device first, once per sampling setting (at most "
    f"{CALIBRATION_SECONDS_MAX:.0f} s; Stop ends it): short runs of a chain and a wide tree on held-out prompts "
    "(acceptance by depth and sibling rank) and a few timed passes (the verify cost v(n)). The run's own time "
    "starts after it…"
)


def _calibrated(steps, said: str):
    """``resolve_steps``' value, its calibration's steps taken one device step each: ("calibration", None, status or
    None) between them, the status ``said`` with how far it got (``calibration_progress``) at most every
    STREAM_INTERVAL_MS. Yields nothing for a choice that needs no calibration (or one already cached)."""
    started = time.monotonic()
    last_draw = 0.0
    while True:
        try:
            done, total = next(steps)
        except StopIteration as end:
            return end.value
        now = time.perf_counter() * 1000
        status = None
        if now - last_draw >= STREAM_INTERVAL_MS:
            last_draw = now
            status = f"{said} {calibration_progress(done, total, time.monotonic() - started)}".strip()
        yield "calibration", None, status


def calibration_progress(done: int, total: int, elapsed_s: float) -> str:
    """ "Measured 5 of 13 parts in 12 s; about 19 s left at that pace." (``specviz.views.text.measured_so_far``)."""
    return measured_so_far(done, total, "parts", elapsed_s) + "."


def _pair_of(req: RunRequest):
    return resident(req.pair_name, req.custom_drafter, req.custom_target)


def _common(req: RunRequest, pair) -> dict:
    return dict(sampling=req.sampling, eos_token_id=pair.eos_token_ids, seed=req.seed, tokenizer=pair.tokenizer)


def _drafter(req: RunRequest, pair):
    """The request's drafter on the loaded pair; a kind it cannot draft with leaves as a message (``failure``),
    never a traceback. (A preset is refused such a kind before it loads, ``RunRequest.checked``; custom ids
    and the device, as a quantized target off the CPU, are known only here.)"""
    try:
        return pair_drafter(req.drafter_kind, pair)
    except Exception as err:
        raise failure(err, pair) from err


def title(pair_name: str, spec: Trace) -> str:
    """A run's title: the pair, the drafter and schedule, the sampling and the seed (plain text)."""
    s = spec.settings
    sampling = s.get("sampling", {})
    temp = sampling.get("temperature")
    how = "greedy" if temp == 0 else f"T={temp}, top-k {sampling.get('top_k')}, top-p {sampling.get('top_p')}"
    return f"{pair_name}, {run_label(spec)}, {how}, seed {s.get('seed')}"


@gpu_task(duration=lambda req, stop=None: req.duration())
def run_on_device(req: RunRequest, stop: StopCheck | None = None):
    """The device half of Generate and /run: traces in, no UI objects out.

    The speculative run and its autoregressive baseline run in turns (``specviz.measure.speedup.interleave``),
    so whatever else the machine does slows both alike and the speedup compares like with like;
    the baseline stops at the speculative run's token count (equal work). Their shared limit (2 x
    RUN_SECONDS_MAX) starts after the auto tree's calibration, which has its own (``specviz.ui.tabs.tree.resolve``).

    ``stop``: the job's check (Stop, a client gone, its device share; None: never, as on ZeroGPU, where the
    handler asks it between yields), asked after every round of the calibration; the runs are stopped by
    the handler between their yields. A calibration it stops ends the stream with no "done".

    Yields plain data: ("calibrating", None, status) before an auto tree's calibration, ("calibration", None, status
    or None) between its steps (the status with its progress at most every STREAM_INTERVAL_MS), ("round", spec,
    title) at most every STREAM_INTERVAL_MS once the run has a round and None after each other turn of the two runs
    (a step's end, a long prompt's prefill pass among them: nothing to draw; callers skip it, as Compare's stream's),
    ("speculative_done", spec, title), then
    ("done", spec, baseline, title, status, auto): ``auto`` the auto tree's record
    (``specviz.engine.tree.auto.AutoTree.record``) or None. Errors leave as gr.Error.
    """
    pair = _pair_of(req)
    ids = encode(pair, req.prompt, req.chat)
    common = _common(req, pair)
    drafter = _drafter(req, pair)
    said = ""
    if req.tree == AUTO:
        from specviz.engine.tree.calibration import teacher_forcible

        said = CALIBRATING if teacher_forcible(drafter) else CALIBRATING_RUNS
        yield "calibrating", None, said
    try:
        tree, gamma, chosen, auto = yield from _calibrated(
            resolve_steps(req.tree, pair, drafter, req.sampling, req.gamma, stop), said
        )
    except Stopped:
        return
    except Exception as err:
        raise failure(err, pair) from err
    # The two runs share the time of both: RUN_SECONDS_MAX each, taken in turns.
    deadline = time.monotonic() + 2 * RUN_SECONDS_MAX
    timed_out = False
    try:
        last_draw = 0.0
        spec = baseline = None
        runs = paired(
            speculative_stream(
                ids,
                drafter,
                pair.target,
                gamma=gamma,
                max_new_tokens=req.max_new_tokens,
                schedule=make_schedule(req.gamma_schedule, gamma),
                tree=tree,
                **common,
            ),
            ids,
            pair.target,
            max_new_tokens=req.max_new_tokens,
            **common,
        )
        for spec, baseline in runs:
            if time.monotonic() > deadline and spec is not None and not spec.stop_reason:
                timed_out = True
                for t in (spec, baseline):
                    if t is not None and not t.stop_reason:
                        t.stop_reason = "time_limit"
                        t.output_text = pair.tokenizer.decode(t.output_ids)
                break
            now = time.perf_counter() * 1000
            if spec is not None and spec.rounds and now - last_draw >= STREAM_INTERVAL_MS and not spec.stop_reason:
                last_draw = now
                yield "round", spec, title(pair.name, spec)
            else:  # each turn of the two runs is a device step of its own: another visitor's step waits one turn
                yield None
        name = title(pair.name, spec)
        yield "speculative_done", spec, name
    except Exception as err:
        raise failure(err, pair) from err
    how = (
        f"stopped at the time limit of {RUN_SECONDS_MAX:.0f} s per run"
        if timed_out
        else spec.stop_reason.replace("_", " ")
    )
    done = (f"Done: {len(spec.output_ids)} tokens in {len(spec.rounds)} rounds ({how}). Pair: {pair.name}, on "
            f"{pair.device.type}.")
    # The verdict first, then what was chosen, then where and in which form it ran: a class read 90 words on bf16 and
    # oneDNN before the verdict.
    if why := verdict(spec, baseline):
        done += f" {markdown_literal(why)}"
    if chosen:  # the auto tree: what was chosen, from which measurements
        done += f" {markdown_literal(chosen)}."
    if pair.target_source:  # a preset whose target has two possible sources says which one ran
        done += f" Target: {markdown_literal(pair.target_source)}."
    if getattr(pair, "form", None) is not None:  # the dtype both models ran in on this machine, and why
        done += f" Form: {markdown_literal(pair.form.reason)}."
    if engine := engine_sentence(spec, baseline):
        done += f" {markdown_literal(engine)}"
    yield "done", spec, baseline, name, done, auto


def sweep_seconds(req: RunRequest, stop: StopCheck | None = None) -> int:
    """ZeroGPU seconds for the sweep: one speculative run per gamma, the first baseline, and one baseline
    in turns with each gamma's run (``specviz.measure.sweep.sweep_stream``): nine baselines for gamma 1..8."""
    return sweep_duration(
        req.pair_name,
        SWEEP_GAMMAS,
        req.max_new_tokens,
        baseline_runs=1 + len(SWEEP_GAMMAS),
        custom_drafter=req.custom_drafter,
        custom_target=req.custom_target,
    )


@gpu_task(duration=sweep_seconds)
def sweep_on_device(req: RunRequest, stop: StopCheck | None = None):
    """The device half of the gamma sweep: yields the growing Sweep (plain data), and None after every step of its
    runs (each a device step); ``stop`` is asked every round (``specviz.measure.sweep.sweep_stream``); errors leave as
    gr.Error."""
    pair = _pair_of(req)
    ids = encode(pair, req.prompt, req.chat)
    try:
        drafter = pair_drafter(req.drafter_kind, pair)
        yield from sweep_stream(
            ids,
            drafter,
            pair.target,
            gammas=SWEEP_GAMMAS,
            schedule=req.gamma_schedule,
            stop=stop,
            max_new_tokens=req.max_new_tokens,
            **_common(req, pair),
        )
    except Exception as err:
        raise failure(err, pair) from err


@gpu_task(duration=lambda req, stop=None: req.duration(runs=len(DRAFTER_KINDS) + (req.tree != "chain")))
def compare_on_device(req: RunRequest, stop: StopCheck | None = None):
    """The device half of Compare drafters: yields the growing Comparison (plain data), and None between its runs'
    steps; ``stop`` is asked every round (``specviz.measure.comparison.compare_stream``): the kinds not run then are
    left out."""
    pair = _pair_of(req)
    ids = encode(pair, req.prompt, req.chat)
    try:
        tree = resolve_tree(req.tree, pair, pair_drafter(req.drafter_kind, pair), req.sampling, req.gamma, stop)[0]
        # under greedy decoding the drafter model's argmax drafts are its drafts: one column, not two alike
        kinds = [
            k for k in usable_kinds(pair.target, pair.own_tokenizer) if not (k == "argmax" and req.sampling.greedy)
        ]
        yield from compare_stream(
            ids,
            pair.drafter,
            pair.target,
            kinds=kinds,
            drafter_tokenizer=pair.drafter_tokenizer,
            gamma=req.gamma,
            schedule=req.gamma_schedule,
            max_new_tokens=req.max_new_tokens,
            tree=tree,
            stop=stop,
            **_common(req, pair),
        )
    except Stopped:
        return  # during the auto tree's calibration: no kind ran, and the caller's check knows why
    except Exception as err:
        raise failure(err, pair) from err


def batch_duration(
    pair_name,
    prompts_text=None,
    batch_size=BATCH_MAX,
    gamma=4,
    temperature=None,
    top_k=None,
    top_p=None,
    max_new_tokens=MAX_NEW_TOKENS_RANGE[1],
    seed=None,
    chat=None,
    custom_drafter="",
    custom_target="",
    *rest,
    **kwargs,
) -> int:
    """GPU seconds for the Batch tab (its endpoint's arguments, in order): two runs at each measured batch size,
    each a speculative batch and its batched baseline; on a GPU a batch of up to BATCH_MAX rows takes about one
    sequence's passes."""
    size = int(batch_size) if number(batch_size) and 1 <= batch_size <= BATCH_MAX else BATCH_MAX
    one = generate_duration(
        pair_name, None, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat, custom_drafter, custom_target
    )
    return 2 * len(batch_sizes_up_to(size)) * one


def _batch_seconds(req: RunRequest, prompts: list[str], batch_size: int, stop: StopCheck | None = None) -> int:
    s = req.sampling
    return batch_duration(
        req.pair_name,
        None,
        batch_size,
        req.gamma,
        s.temperature,
        s.top_k,
        s.top_p,
        req.max_new_tokens,
        req.seed,
        req.chat,
        req.custom_drafter,
        req.custom_target,
    )


@gpu_task(duration=_batch_seconds)
def batch_on_device(req: RunRequest, prompts: list[str], batch_size: int, stop: StopCheck | None = None):
    """The device half of the Batch tab: yields (BatchResult or None, [BatchPoint]) (plain data) after each
    measurement, and None after every round of every batch (each a device step); ``stop`` is asked every round of
    every batch (``specviz.measure.throughput.throughput_stream``)."""
    pair = _pair_of(req)
    ids = [encode(pair, p, req.chat) for p in prompts]
    drafter = _drafter(req, pair)
    try:
        yield from throughput_stream(
            ids,
            drafter,
            pair.target,
            batch_size,
            gamma=req.gamma,
            schedule=req.gamma_schedule,
            stop=stop,
            max_new_tokens=req.max_new_tokens,
            **_common(req, pair),
        )
    except Exception as err:
        raise failure(err, pair) from err
