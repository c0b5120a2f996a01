"""The Gradio page: controls in, engine, trace, views out.

Only this module and ``app.py`` know Gradio. Every failure a visitor can cause is turned
into a ``gr.Error`` with a clear message, and the app keeps serving the next visitor.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import math
import shutil
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import gradio as gr  # noqa: E402
import torch  # noqa: E402

from specviz import Sampling, Trace, autoregressive_generate, autoregressive_stream, speculative_stream  # noqa: E402
from specviz.sampling import DEFAULT_SAMPLING  # noqa: E402
from specviz.trace import MAX_GAMMA  # noqa: E402
from specviz.gpu import gpu_task, on_zerogpu  # noqa: E402
from specviz.gpu_duration import generate_duration, sweep_duration  # noqa: E402
from specviz.pair import (  # noqa: E402
    ASSETS,
    EMBEDDED,
    PRESETS,
    Pair,
    PairError,
    custom_models_allowed,
    encode_prompt,
    free_memory,
    load_pair,
    loaded_pair,
)
from specviz.pair import preload as preload_pairs  # noqa: E402
from specviz.recording import MAX_BYTES, Recording  # noqa: E402
from specviz.speedup import estimate, interleave  # noqa: E402
from specviz.sweep import sweep_stream  # noqa: E402
from specviz.lab.experiment import stream as lab_stream  # noqa: E402
from specviz.lab.faults import FAULTS, planted  # noqa: E402
from specviz.lab.models import KINDS as LAB_KINDS  # noqa: E402
from specviz.lab.models import models as lab_models  # noqa: E402
from specviz.views.export import export_html  # noqa: E402
from specviz.views.lab import lab_figure, lab_html  # noqa: E402
from specviz.views.text import markdown_literal, run_label  # noqa: E402
from specviz.views.compare import compare_figure, compare_html  # noqa: E402
from specviz.comparison import compare_stream  # noqa: E402
from specviz.sampling import MIN_TEMPERATURE  # noqa: E402
from specviz.seeds import SEED_MAX  # noqa: E402
from specviz.throughput import batch_sizes_up_to, throughput_stream  # noqa: E402
from specviz.pair.prompt import join_prompts, split_prompts  # noqa: E402
from specviz.views.batch import batch_figure, batch_lanes_html  # noqa: E402
from specviz.drafters import KINDS as DRAFTER_KINDS, LABELS as DRAFTER_LABELS, make_drafter  # noqa: E402
from specviz.schedules import LABELS as SCHEDULE_LABELS, SCHEDULES, make_schedule  # noqa: E402
from specviz.views import (  # noqa: E402
    acceptance_figure,
    accepted_histogram_figure,
    BATCH_NOTE,
    THEORY_NOTE,
    explanation_markdown,
    legend_html,
    position_figure,
    race_html,
    round_html,
    slowdown_for,
    speedup_figure,
    stats_html,
    summary,
    sweep_figure,
    timeline_figure,
    tokens_html,
)

# Caps shown in the UI and enforced again in the handler (a client can bypass sliders).
GAMMA_RANGE = (1, MAX_GAMMA)
TEMPERATURE_RANGE = (0.0, 2.0)
MAX_NEW_TOKENS_RANGE = (1, 256)
TOP_K_MAX = 1000
PENALTY_RANGE = (1.0, 2.0)  # transformers' repetition penalty; 1 is off
LOAD_CONCURRENCY = 2  # recordings loaded at once (each is bounded work: see specviz.validation)
TEMPERATURE_MIN = MIN_TEMPERATURE  # one constant with the engine's (specviz.sampling)
PROMPT_CHARS_MAX = 2000
SWEEP_GAMMAS = tuple(range(1, 9))
BATCH_MAX = 8  # rows the Batch tab decodes together at most
# Wall-clock limits, in seconds, so one visitor cannot hold the device for long.
RUN_SECONDS_MAX = float(os.environ.get("SPECVIZ_RUN_SECONDS", "60"))
SWEEP_SECONDS_MAX = float(os.environ.get("SPECVIZ_SWEEP_SECONDS", "120"))
# Runs sharing the device at once (generate and sweep share this limit): 1 per GPU.
CONCURRENCY = int(os.environ.get("SPECVIZ_CONCURRENCY", "1"))
PACES = ("slow motion (about 10 s)", "true timing")
# Redraw the streamed text at most this often (ms): drawing is not free for the browser.
STREAM_INTERVAL_MS = 80

DEFAULTS = dict(gamma=4, temperature=DEFAULT_SAMPLING.temperature, top_k=DEFAULT_SAMPLING.top_k, top_p=DEFAULT_SAMPLING.top_p,
                max_new_tokens=128, seed=0, drafter_kind="model", gamma_schedule="constant",
                repetition_penalty=DEFAULT_SAMPLING.repetition_penalty)
DRAFTER_CHOICES = [(DRAFTER_LABELS[k], k) for k in DRAFTER_KINDS]
SCHEDULE_CHOICES = [(SCHEDULE_LABELS[k], k) for k in SCHEDULES]
# Prompts end at a colon, not a newline: the tokenizer merges a newline with the indentation
# that follows, so the models continue best from there.
EXAMPLES = [
    "def is_prime(n):",
    "class Stack:\n    def __init__(self):",
    "import os\n\n\ndef read_lines(path):",
    "    def __repr__(self):",
    "def parse_args(argv=None):\n    parser = argparse.ArgumentParser(",
]

INTRO = """\
# specviz — speculative decoding, round by round
A small **drafter** proposes `gamma` tokens; the large **target** scores them all in one forward pass. Each draft x is
accepted when u < min(1, p(x)/q(x)); the first rejected one is replaced by a **correction** sampled from
norm(max(0, p − q)); when every draft is accepted a **bonus** token comes from p. The output is distributed exactly as
the target's own (Leviathan et al. 2023; Chen et al. 2023). Temperature 0 is greedy: the output is the target's greedy text.
"""


def _check(prompt: str, gamma, temperature, top_k, top_p, max_new_tokens, seed, repetition_penalty=1.0) -> Sampling:
    """Validate the controls; raise gr.Error with what to change."""
    if not prompt or not prompt.strip():
        raise _mistake("The prompt is empty: type some text (or pick an example) to continue.", title="Empty prompt")
    if len(prompt) > PROMPT_CHARS_MAX:
        raise _mistake(f"The prompt has {len(prompt)} characters; the limit is {PROMPT_CHARS_MAX}.", title="Prompt too long")
    if not isinstance(prompt, str):
        raise _mistake("The prompt must be text.", title="Bad prompt")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise _mistake("The prompt holds characters that are not valid text (a lone surrogate): retype or paste it again.", title="Bad prompt") from None
    checks = [
        (gamma, *GAMMA_RANGE, "gamma"),
        (max_new_tokens, *MAX_NEW_TOKENS_RANGE, "max new tokens"),
        (top_k, 0, TOP_K_MAX, "top-k"),
        (seed, 0, SEED_MAX, "seed"),
    ]
    for value, lo, hi, name in checks:
        if not _number(value) or value != int(value) or not lo <= value <= hi:
            raise _mistake(f"{name} must be a whole number from {lo} to {hi}, got {_shown(value)}.", title=f"{name.capitalize()} out of range")
    if not _number(temperature) or not (temperature == 0 or TEMPERATURE_MIN <= temperature <= TEMPERATURE_RANGE[1]):
        raise _mistake(f"temperature must be 0 (greedy) or from {TEMPERATURE_MIN} to {TEMPERATURE_RANGE[1]}, got {_shown(temperature)}.",
                       title="Temperature out of range")
    if not _number(top_p) or not 0 < top_p <= 1:
        raise _mistake(f"top-p must be above 0 and at most 1 (1 keeps every token), got {_shown(top_p)}.", title="Top-p out of range")
    if not _number(repetition_penalty) or not PENALTY_RANGE[0] <= repetition_penalty <= PENALTY_RANGE[1]:
        raise _mistake(f"repetition penalty must be from {PENALTY_RANGE[0]} (off) to {PENALTY_RANGE[1]}, got {_shown(repetition_penalty)}.",
                       title="Repetition penalty out of range")
    try:
        return Sampling(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p), repetition_penalty=float(repetition_penalty))
    except ValueError as err:
        raise _mistake(str(err), title="Bad sampling settings") from err


log = logging.getLogger("specviz")


def _mistake(message: str, title: str) -> gr.Error:
    """A visitor's mistake (a bad setting, a file that is not a recording): the visitor gets the
    message with its title, the server log one line, no traceback (an unexpected failure keeps it)."""
    log.info("%s: %s", title, message[:200])
    return gr.Error(message, title=title, print_exception=False)


def _number(value) -> bool:
    """A finite int or float (not a bool, not NaN or infinity): checked before any int() conversion."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _shown(value) -> str:
    """A control's value for a message, short whatever a client sent."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _Numeric:
    """A number control that checks what a client sent before Gradio converts it: a value that is
    not a finite number, or is outside the control's range, gets a message naming the control
    and the range (Gradio's own checks fail with a bare "Error" and a logged traceback)."""

    def preprocess(self, payload):
        if not _number(payload):
            raise _mistake(f"{self.label} must be a finite number, got {_shown(payload)}.", title=f"Bad {self.label}")
        lo, hi = self.minimum, self.maximum
        if (lo is not None and payload < lo) or (hi is not None and payload > hi):
            raise _mistake(f"{self.label} must be from {lo} to {hi}, got {_shown(payload)}.", title=f"{self.label} out of range")
        return super().preprocess(payload)


class CheckedSlider(_Numeric, gr.Slider):
    def get_block_name(self) -> str:
        return "slider"


class CheckedNumber(_Numeric, gr.Number):
    def get_block_name(self) -> str:
        return "number"


RECORDINGS = ASSETS / "recordings"
# Each finished run is written here for the download button; only the newest few are kept.
_DOWNLOADS = Path(tempfile.mkdtemp(prefix="specviz-"))
atexit.register(shutil.rmtree, _DOWNLOADS, ignore_errors=True)  # the folder does not outlive the app
_KEEP_DOWNLOADS = 16
# A visitor's state (one compact Recording) and Gradio's cached copies of downloads and uploads
# are dropped this long after last use, so memory and disk stay flat however many come.
SESSION_TTL_S = 1800
MAX_SESSIONS = 100  # sessions whose state is kept at once (SPECVIZ_MAX_SESSIONS)
CACHE_TTL_S = 900
_race_nonce = itertools.count(1)


def _save_for_download(rec: Recording) -> str:
    path = _DOWNLOADS / f"specviz-run-{time.strftime('%Y%m%d-%H%M%S')}-{next(_race_nonce)}.json"
    rec.save(path)
    for old in sorted(_DOWNLOADS.glob("*.json"), key=lambda p: p.stat().st_mtime)[:-_KEEP_DOWNLOADS]:
        old.unlink(missing_ok=True)
    return str(path)


def _replay_slider(trace: Trace | None, value: int | None = None):
    n = max(1, len(trace.rounds)) if trace is not None else 1
    # Gradio needs maximum > minimum; a one-round run gets a fixed slider (the handlers clamp).
    return gr.Slider(minimum=1, maximum=max(n, 2), value=min(value or n, n), step=1, interactive=n > 1)


def _everything(rec: Recording, status: str, download: str | None):
    """Every output of a finished run, in the order of build_demo's ``outputs``."""
    spec, base = rec.speculative, rec.baseline
    return (
        tokens_html(spec), stats_html(spec, base), acceptance_figure(spec), timeline_figure(spec, base), status, rec,
        _replay_slider(spec, 1), round_html(spec, 0),  # a finished run or a loaded one replays from round 1
        speedup_figure(spec, base), accepted_histogram_figure(spec), position_figure(spec), sweep_figure(rec.sweep),
        race_html(spec, base, slowdown_for(spec, base), next(_race_nonce)),
        gr.DownloadButton(value=download, interactive=download is not None),
    )


def _pair_ids(pair_name, custom_drafter, custom_target) -> dict:
    """load_pair's arguments: the custom ids when the visitor gave any, else the preset name."""
    drafter, target = (custom_drafter or "").strip(), (custom_target or "").strip()
    return dict(drafter=drafter, target=target) if drafter or target else dict(name=pair_name)


def _pair(pair_name, custom_drafter, custom_target, progress) -> Pair:
    """Load (or reuse) the pair outside any GPU call, reporting progress to the page."""
    try:
        return load_pair(**_pair_ids(pair_name, custom_drafter, custom_target), progress=lambda f, m: progress(f, desc=m))
    except PairError as err:
        raise _mistake(str(err), title="Model pair unavailable") from err


def _resident(pair_name, custom_drafter, custom_target) -> Pair:
    """The pair ``_pair`` loaded. It may be missing here: on ZeroGPU this runs in a worker process
    forked before a later-loaded pair existed, and elsewhere another visitor's pair may have
    replaced it; then it is loaded here (on ZeroGPU, once per worker)."""
    ids = _pair_ids(pair_name, custom_drafter, custom_target)
    pair = loaded_pair(**ids)
    if pair is None:
        try:
            pair = load_pair(**ids)
        except PairError as err:
            raise _mistake(str(err), title="Model pair unavailable") from err
    return pair


def _encode(pair: Pair, prompt: str, chat: bool) -> list[int]:
    try:
        return encode_prompt(pair, prompt, bool(chat) and pair.instruct)
    except PairError as err:
        raise _mistake(str(err), title="Cannot use the chat template") from err


def _failure(err: Exception, pair: Pair | None = None) -> gr.Error:
    """A visitor-facing message for an error raised while generating; frees memory after an OOM."""
    if isinstance(err, gr.Error):
        return err
    if isinstance(err, ValueError):
        return _mistake(str(err), title="Cannot generate")
    if isinstance(err, (MemoryError, torch.OutOfMemoryError)):
        free_memory(pair.device if pair is not None else None)
        log.warning("out of memory while generating; memory freed")
        return _mistake("Out of memory: ask for fewer tokens, a shorter prompt or a smaller pair. The app is still running.", title="Out of memory")
    # the app must keep serving; the visitor gets what failed, the log gets the traceback
    log.exception("generation failed")
    return gr.Error(f"Generation failed ({type(err).__name__}: {err}). The app is still running: try again or change the settings.", title="Generation failed")


def generate(pair_name, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat=True,
             custom_drafter="", custom_target="", drafter_kind="model", gamma_schedule="constant", repetition_penalty=1.0,
             progress=gr.Progress(), request: gr.Request = None):
    """Stream a speculative run round by round, then measure the autoregressive baseline.

    Yields every output in the order of build_demo's ``outputs`` (tokens HTML, stats HTML, two figures, status
    Markdown, the Recording, the replay slider and panel, four theory figures, the race, the
    download button); while streaming, the outputs that do not change are skipped. A run stops
    at RUN_SECONDS_MAX; the Stop button cancels it between rounds.
    """
    _check(prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, repetition_penalty)
    _drafting(drafter_kind, gamma_schedule)
    _pair(pair_name, custom_drafter, custom_target, progress)
    session = _session(request)
    _following[session] = True
    skip = gr.skip()
    try:
        for event in _run_on_device(pair_name, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat, custom_drafter, custom_target,
                                    drafter_kind, gamma_schedule, repetition_penalty):
            kind, spec = event[0], event[1]
            if kind == "round":
                status = f"Speculative decoding: round {len(spec.rounds)}, {len(spec.output_ids)} tokens (the baseline runs in turns beside it)…"
                yield (tokens_html(spec), stats_html(spec), skip, skip, status, Recording(spec, title=event[2]), *_replay_outputs(spec, session),
                       skip, skip, skip, skip, skip, skip)
            elif kind == "speculative_done":
                yield (tokens_html(spec), stats_html(spec), acceptance_figure(spec), timeline_figure(spec), "Finishing…",
                       Recording(spec, title=event[2]), *_replay_outputs(spec, session), skip, accepted_histogram_figure(spec), position_figure(spec),
                       sweep_figure(None), skip, skip)
            else:  # "done"
                _, spec, baseline, title, done = event
                rec = Recording(spec, baseline, title=title, prompt=prompt, chat=bool(chat))
                final = _everything(rec, done, _save_for_download(rec))
                if not _following.get(session, True):  # the visitor is reading an earlier round: leave it in view
                    n = len(spec.rounds)
                    final = (*final[:6], gr.Slider(maximum=max(n, 2), interactive=n > 1), skip, *final[8:])
                yield final
    finally:
        _following.pop(session, None)
        # A long-lived server gives each run's memory back: collect, then trim (measured: a trim
        # without the collection leaves RSS creeping up, 526 -> 542 MB over 30 runs).
        free_memory(None if not on_zerogpu() else "cpu")


@gpu_task(duration=generate_duration)
def _run_on_device(pair_name, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat, custom_drafter, custom_target,
                   drafter_kind="model", gamma_schedule="constant", repetition_penalty=1.0):
    """The device half of ``generate``: traces in, no UI objects out.

    The speculative run and its autoregressive baseline run in turns (``specviz.speedup.interleave``),
    so whatever else the machine does slows both alike and the speedup compares like with like;
    the baseline stops at the speculative run's token count (equal work).

    On ZeroGPU this runs in a GPU worker process and what it yields is pickled, so it yields
    plain data: ("round", spec, title) at most every STREAM_INTERVAL_MS, ("speculative_done",
    spec, title), then ("done", spec, baseline, title, status). Errors leave as gr.Error.
    """
    sampling = _check(prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, repetition_penalty)
    drafter_kind, gamma_schedule = _drafting(drafter_kind, gamma_schedule)
    gamma, max_new_tokens, seed = int(gamma), int(max_new_tokens), int(seed)
    pair = _resident(pair_name, custom_drafter, custom_target)
    ids = _encode(pair, prompt, chat)
    common = dict(sampling=sampling, eos_token_id=pair.eos_token_ids, seed=seed, tokenizer=pair.tokenizer)
    drafter = make_drafter(drafter_kind, drafter_model=pair.drafter, target=pair.target)
    # The two runs share the time of both: RUN_SECONDS_MAX each, taken in turns.
    deadline = time.monotonic() + 2 * RUN_SECONDS_MAX
    timed_out = False
    try:
        last_draw = 0.0
        spec = baseline = None
        runs = interleave(speculative_stream(ids, drafter, pair.target, gamma=gamma, max_new_tokens=max_new_tokens,
                                             schedule=make_schedule(gamma_schedule, gamma), **common),
                          autoregressive_stream(ids, pair.target, max_new_tokens=max_new_tokens, **common))
        for spec, baseline in runs:
            if time.monotonic() > deadline and spec is not None and not spec.stop_reason:
                timed_out = True
                for t in (spec, baseline):
                    if t is not None and not t.stop_reason:
                        t.stop_reason = "time_limit"
                        t.output_text = pair.tokenizer.decode(t.output_ids)
                break
            now = time.perf_counter() * 1000
            if spec is not None and now - last_draw >= STREAM_INTERVAL_MS and not spec.stop_reason:
                last_draw = now
                yield "round", spec, _title(pair.name, spec)
        title = _title(pair.name, spec)
        yield "speculative_done", spec, title
    except Exception as err:
        raise _failure(err, pair) from err
    how = f"stopped at the time limit of {RUN_SECONDS_MAX:.0f} s per run" if timed_out else spec.stop_reason.replace("_", " ")
    done = f"Done: {len(spec.output_ids)} tokens in {len(spec.rounds)} rounds ({how}). Pair: {pair.name}, on {pair.device.type}."
    yield "done", spec, baseline, title, done


def _title(pair_name: str, spec: Trace) -> str:
    s = spec.settings
    sampling = s.get("sampling", {})
    temp = sampling.get("temperature")
    how = "greedy" if temp == 0 else f"T={temp}, top-k {sampling.get('top_k')}, top-p {sampling.get('top_p')}"
    return f"{pair_name}, {run_label(spec)}, {how}, seed {s.get('seed')}"


def _drafting(drafter_kind, gamma_schedule) -> tuple[str, str]:
    """The drafter kind and schedule name, checked against the menus (an API call can send anything)."""
    if drafter_kind not in DRAFTER_KINDS:
        raise _mistake(f"drafter must be one of {', '.join(DRAFTER_KINDS)}; got {_shown(drafter_kind)}.", title="Invalid drafter")
    if gamma_schedule not in SCHEDULES:
        raise _mistake(f"gamma schedule must be one of {', '.join(SCHEDULES)}; got {_shown(gamma_schedule)}.", title="Invalid gamma schedule")
    return drafter_kind, gamma_schedule


# Sessions with a run streaming -> whether their replay follows the newest round. A visitor who
# steps back stops the following; stepping forward to the newest round resumes it.
_following: dict[str, bool] = {}


def _session(request: gr.Request | None) -> str | None:
    return getattr(request, "session_hash", None)


def replay_step(rec: Recording | None, current, delta: int, request: gr.Request | None = None):
    """Move the replay by ``delta`` rounds; returns the slider and the round panel."""
    if rec is None or not rec.speculative.rounds:
        return gr.skip(), round_html(Trace(mode="speculative", prompt_ids=[]), 0)
    n = len(rec.speculative.rounds)
    index = min(max(int(current or 1) + delta, 1), n)
    session = _session(request)
    if session in _following:
        _following[session] = index == n
    return _replay_slider(rec.speculative, index), round_html(rec.speculative, index - 1)


def replay_previous(rec: Recording | None, current, request: gr.Request):
    return replay_step(rec, current, -1, request)


def replay_next(rec: Recording | None, current, request: gr.Request):
    return replay_step(rec, current, +1, request)


def replay_show(rec: Recording | None, current, request: gr.Request):
    """The round panel for the slider's value."""
    return replay_step(rec, current, 0, request)[1]


def _replay_outputs(spec: Trace, session: str | None):
    """Slider and panel while streaming: the newest round, or only a longer slider if the visitor stepped back."""
    if _following.get(session, True):
        return _replay_slider(spec), round_html(spec, len(spec.rounds) - 1)
    n = len(spec.rounds)
    return gr.Slider(maximum=max(n, 2), interactive=n > 1), gr.skip()


def run_sweep(pair_name, prompt, temperature, top_k, top_p, max_new_tokens, seed, rec: Recording | None, chat=True,
              custom_drafter="", custom_target="", repetition_penalty=1.0, progress=gr.Progress()):
    """Decode the prompt with gamma = 1..8 (same seed and settings) and plot each against the theory.

    Yields (sweep figure, sweep status Markdown, Recording with the sweep attached).
    """
    _check(prompt, SWEEP_GAMMAS[-1], temperature, top_k, top_p, max_new_tokens, seed, repetition_penalty)
    _pair(pair_name, custom_drafter, custom_target, progress)
    sweep = None
    for sweep in _sweep_on_device(pair_name, prompt, temperature, top_k, top_p, max_new_tokens, seed, chat, custom_drafter, custom_target,
                                  repetition_penalty):
        done = len(sweep.points)
        yield sweep_figure(sweep), f"Sweep: {'baseline measured' if not done else f'gamma {sweep.points[-1].gamma} done'} ({done} of {len(SWEEP_GAMMAS)})…", gr.skip()
    if not sweep.points:
        yield sweep_figure(sweep), f"Sweep stopped at the time limit of {SWEEP_SECONDS_MAX:.0f} s before any gamma finished.", gr.skip()
        return
    if rec is not None:
        rec = Recording(rec.speculative, rec.baseline, sweep, rec.title, rec.prompt, rec.chat)
    best = max(sweep.points, key=lambda p: sweep.speedup(p) or 0.0)
    cut = "" if len(sweep.points) == len(SWEEP_GAMMAS) else f" Stopped at the time limit of {SWEEP_SECONDS_MAX:.0f} s after gamma {sweep.points[-1].gamma}."
    yield sweep_figure(sweep), f"Sweep done: fastest measured gamma {best.gamma} ({sweep.speedup(best):.2f}×).{cut}", rec if rec is not None else gr.skip()


def _sweep_duration(pair_name, prompt, temperature, top_k, top_p, max_new_tokens, seed=None, chat=None, custom_drafter="", custom_target="", *rest, **kwargs) -> int:
    try:
        n = int(max_new_tokens)
    except (TypeError, ValueError):
        n = MAX_NEW_TOKENS_RANGE[1]
    return sweep_duration(pair_name, SWEEP_GAMMAS, n, custom_drafter=custom_drafter, custom_target=custom_target)


@gpu_task(duration=_sweep_duration)
def _sweep_on_device(pair_name, prompt, temperature, top_k, top_p, max_new_tokens, seed, chat, custom_drafter, custom_target,
                     repetition_penalty=1.0):
    """The device half of ``run_sweep``: yields the growing Sweep (plain data); errors leave as gr.Error."""
    sampling = _check(prompt, SWEEP_GAMMAS[-1], temperature, top_k, top_p, max_new_tokens, seed, repetition_penalty)
    pair = _resident(pair_name, custom_drafter, custom_target)
    ids = _encode(pair, prompt, chat)
    common = dict(sampling=sampling, max_new_tokens=int(max_new_tokens), eos_token_id=pair.eos_token_ids, seed=int(seed), tokenizer=pair.tokenizer)
    deadline = time.monotonic() + SWEEP_SECONDS_MAX
    try:
        for sweep in sweep_stream(ids, pair.drafter, pair.target, gammas=SWEEP_GAMMAS, **common):
            yield sweep
            if time.monotonic() > deadline:
                break
    except Exception as err:
        raise _failure(err, pair) from err


def run_api(pair_name: str = EMBEDDED, prompt: str = "def is_prime(n):", gamma: int = 4, temperature: float = 0.7, top_k: int = 40,
        top_p: float = 0.95, max_new_tokens: int = 128, seed: int = 0, chat: bool = True, drafter_kind: str = "model",
        gamma_schedule: str = "constant", repetition_penalty: float = 1.0) -> dict:
    """Run speculative decoding and its autoregressive baseline (interleaved) and return the results as JSON.

    Arguments are the page's controls: a preset pair name, the prompt, gamma (1-16), temperature
    (0 greedy, or 0.01-2), top-k (0 off), top-p (0-1], max new tokens (1-256), seed (0 to 2^63 - 1),
    whether instruct pairs get their chat template, the drafter kind ("model", "ngram" for prompt
    lookup, "early-exit"), the gamma schedule ("constant", "heuristic", "confidence", "optimal") and the
    repetition penalty (1 off, up to 2; applied to q and p alike).

    Returns a dict: "summary" (the numbers the page shows, each named with its denominator:
    draft_acceptance_rate, alpha, mean_beta, mean_tokens_per_round, tokens/s of both runs,
    speedup with speedup_low and speedup_high (the middle half of the run's stretches),
    cost_coefficient, verify_cost, predicted speedups), "status", and "trace" and "baseline"
    (every round, as ``specviz.Trace.to_dict``; ``Trace.from_dict`` reads them back).
    Errors come back as messages naming the control and its allowed range.
    """
    _pair(pair_name, "", "", lambda *args, **kwargs: None)
    final = None
    for final in _run_on_device(pair_name, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat, "", "",
                                drafter_kind, gamma_schedule, repetition_penalty):
        pass
    _, spec, baseline, _title_text, done = final
    numbers = summary(spec, baseline)
    est = estimate(spec, baseline)
    numbers.update(speedup_low=est.low if est else None, speedup_high=est.high if est else None)
    return {"summary": numbers, "status": done, "trace": spec.to_dict(), "baseline": baseline.to_dict()}


def run_compare(pair_name, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat=True, custom_drafter="", custom_target="",
                gamma_schedule="constant", repetition_penalty=1.0, progress=gr.Progress()):
    """Decode the prompt with each drafter kind (same seed and settings); stream the columns as each finishes.

    Yields (compare HTML, acceptance-by-position figure).
    """
    _check(prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, repetition_penalty)
    _drafting("model", gamma_schedule)
    _pair(pair_name, custom_drafter, custom_target, progress)
    try:
        for comparison in _compare_on_device(pair_name, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat,
                                             custom_drafter, custom_target, gamma_schedule, repetition_penalty):
            yield compare_html(comparison), compare_figure(comparison)
    finally:
        free_memory(None if not on_zerogpu() else "cpu")


def _compare_duration(*args, **kwargs) -> int:
    return len(DRAFTER_KINDS) * generate_duration(*args, **kwargs)


@gpu_task(duration=_compare_duration)
def _compare_on_device(pair_name, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat, custom_drafter, custom_target,
                       gamma_schedule, repetition_penalty=1.0):
    """The device half of ``run_compare``: yields the growing Comparison (plain data)."""
    sampling = _check(prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, repetition_penalty)
    pair = _resident(pair_name, custom_drafter, custom_target)
    ids = _encode(pair, prompt, chat)
    common = dict(sampling=sampling, eos_token_id=pair.eos_token_ids, seed=int(seed), tokenizer=pair.tokenizer, max_new_tokens=int(max_new_tokens))
    try:
        yield from compare_stream(ids, pair.drafter, pair.target, gamma=int(gamma), schedule=gamma_schedule, **common)
    except Exception as err:
        raise _failure(err, pair) from err


def _batch_prompts(text, batch_size) -> list[str]:
    """The Batch tab's prompts, validated; raise gr.Error naming the field."""
    if not isinstance(text, str) or not text.strip():
        raise _mistake("The batch prompts are empty: write one prompt per line.", title="Empty batch")
    if len(text) > BATCH_MAX * PROMPT_CHARS_MAX:
        raise _mistake(f"The batch prompts have {len(text)} characters; the limit is {BATCH_MAX * PROMPT_CHARS_MAX}.", title="Batch too long")
    prompts = split_prompts(text)
    if len(prompts) > BATCH_MAX:
        raise _mistake(f"The batch prompts hold {len(prompts)} lines; give at most {BATCH_MAX}, one prompt per line.", title="Too many prompts")
    if not _number(batch_size) or batch_size != int(batch_size) or not 1 <= batch_size <= BATCH_MAX:
        raise _mistake(f"batch size must be a whole number from 1 to {BATCH_MAX}, got {_shown(batch_size)}.", title="Batch size out of range")
    return prompts


def run_batch(pair_name, prompts_text, batch_size, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat=True,
              custom_drafter="", custom_target="", drafter_kind="model", gamma_schedule="constant", repetition_penalty=1.0,
              progress=gr.Progress()):
    """Decode up to 8 prompts together (one per line; rows beyond the prompts repeat them), then
    measure throughput at the smaller batch sizes.

    Yields (lanes HTML, throughput-against-batch-size figure, status Markdown) as measurements come.
    """
    for p in _batch_prompts(prompts_text, batch_size):
        _check(p, gamma, temperature, top_k, top_p, max_new_tokens, seed, repetition_penalty)
    _drafting(drafter_kind, gamma_schedule)
    _pair(pair_name, custom_drafter, custom_target, progress)
    sizes = batch_sizes_up_to(int(batch_size))
    try:
        for main, points in _batch_on_device(pair_name, prompts_text, batch_size, gamma, temperature, top_k, top_p, max_new_tokens, seed,
                                             chat, custom_drafter, custom_target, drafter_kind, gamma_schedule, repetition_penalty):
            done = sum(len(p.speculative) for p in points)
            status = (f"Measured {done} of {2 * len(sizes)} batches (batch sizes {', '.join(map(str, sizes))}, two runs each, "
                      "speculative and autoregressive in turns)…")
            main_point = next((p for p in points if p.batch_size == int(batch_size)), None)
            shown = batch_lanes_html(main, main_point), batch_figure(points)
            yield *shown, status
        yield *shown, f"Done: batch sizes {', '.join(map(str, sizes))}, each measured twice."
    finally:
        free_memory(None if not on_zerogpu() else "cpu")


def _batch_duration(pair_name, prompts_text=None, batch_size=BATCH_MAX, gamma=4, temperature=None, top_k=None, top_p=None,
                    max_new_tokens=MAX_NEW_TOKENS_RANGE[1], seed=None, chat=None, custom_drafter="", custom_target="", *rest, **kwargs) -> int:
    """GPU seconds for ``run_batch``: two runs at each measured batch size, each a speculative batch and
    its batched baseline; on a GPU a batch of up to BATCH_MAX rows takes about one sequence's passes."""
    size = int(batch_size) if _number(batch_size) and 1 <= batch_size <= BATCH_MAX else BATCH_MAX
    one = generate_duration(pair_name, None, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat, custom_drafter, custom_target)
    return 2 * len(batch_sizes_up_to(size)) * one


@gpu_task(duration=_batch_duration)
def _batch_on_device(pair_name, prompts_text, batch_size, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat,
                     custom_drafter, custom_target, drafter_kind, gamma_schedule, repetition_penalty=1.0):
    """The device half of ``run_batch``: yields (BatchResult or None, [BatchPoint]) (plain data)."""
    prompts = _batch_prompts(prompts_text, batch_size)
    sampling = _check(prompts[0], gamma, temperature, top_k, top_p, max_new_tokens, seed, repetition_penalty)
    drafter_kind, gamma_schedule = _drafting(drafter_kind, gamma_schedule)
    pair = _resident(pair_name, custom_drafter, custom_target)
    ids = [_encode(pair, p, chat) for p in prompts]
    drafter = make_drafter(drafter_kind, drafter_model=pair.drafter, target=pair.target)
    common = dict(sampling=sampling, eos_token_id=pair.eos_token_ids, seed=int(seed), tokenizer=pair.tokenizer,
                  max_new_tokens=int(max_new_tokens))
    try:
        yield from throughput_stream(ids, drafter, pair.target, int(batch_size), gamma=int(gamma), schedule=gamma_schedule,
                                     deadline=time.monotonic() + 2 * RUN_SECONDS_MAX, **common)
    except Exception as err:
        raise _failure(err, pair) from err


def stopped(rec: Recording | None):
    """After the Stop button: every output shows the rounds done (stats, charts, replay from round 1);
    the speedup needs the baseline, which a stopped run does not finish."""
    if rec is None or not rec.speculative.rounds:
        return (gr.skip(),) * 4 + ("Stopped before the first round.",) + (gr.skip(),) * 9
    spec = rec.speculative
    status = (f"Stopped by you after {len(spec.output_ids)} tokens in {len(spec.rounds)} rounds: the stats, charts and replay "
              "show those rounds; the speedup needs a finished baseline, so it is left out.")
    return _everything(Recording(spec, None, rec.sweep, rec.title, rec.prompt, rec.chat), status, None)


def start_race(rec: Recording | None, pace: str):
    """The race HTML for the current run, restarted."""
    if rec is None:
        raise _mistake("Generate a run (or load a recording) first: the race replays it.", title="Nothing to race")
    spec, base = rec.speculative, rec.baseline
    slow = 1.0 if pace == PACES[1] else slowdown_for(spec, base)
    return race_html(spec, base, slow, next(_race_nonce))


def load_recording(path):
    """Show a saved recording (uploaded file or prepared example) without any model."""
    if not path:
        raise _mistake("Choose a recording first.", title="No file")
    try:
        rec = Recording.load(path)
        status = f"Replaying a recording{': ' + markdown_literal(rec.title) if rec.title else ''}. No model was run."
        return _everything(rec, status, _save_for_download(rec))
    except (ValueError, OSError) as err:
        raise _mistake(f"This file cannot be replayed: {err}", title="Not a specviz recording") from err
    finally:
        # Parsing and drawing a large recording peaks at about 100 MB of short-lived objects; give the
        # heap's free pages back, or each visitor's load leaves RSS a few MB higher (measured: +6 MB per
        # session over 20 sessions loading a 0.8 MB recording, before this).
        free_memory("cpu")


def _preset_of(rec: Recording) -> str | None:
    """The preset whose drafter and target the recording names, if this app offers it."""
    models = list(rec.speculative.settings.get("models") or [])
    own_drafter = (rec.speculative.settings.get("drafter") or {"kind": "model"}).get("kind") == "model"
    for name, preset in PRESETS.items():
        names = []
        for ref in (preset.drafter, preset.target):
            parts = Path(ref).parts
            names.append("/".join(parts[-2:]) if Path(ref).is_absolute() else ref)
        # Prompt lookup and early exit run on the pair's target alone: only the target must match.
        if (names == models) if own_drafter else (models[-1:] == names[-1:]):
            return name
    return None


def restore_controls(rec: Recording | None):
    """Set every control to what the recording ran with, so Generate reproduces it (same tokens
    for the same seed); says which pair it came from when this app does not offer that pair.

    Returns updates for: pair, prompt, chat toggle, gamma, temperature, top-k, top-p, max new
    tokens, seed, the status line, the drafter kind, the gamma schedule and the repetition penalty.
    """
    if rec is None:
        return (gr.skip(),) * 13
    s = rec.speculative.settings
    sampling = s.get("sampling") or {}
    drafter = s.get("drafter") or {"kind": "model"}
    schedule = s.get("gamma_schedule") or {"name": "constant"}
    preset = _preset_of(rec)
    prompt = rec.prompt or rec.speculative.prompt_text
    models = " -> ".join(markdown_literal(str(m)) for m in s.get("models") or []) or "unknown models"
    where = "" if preset else f" It was recorded with {models}, which this app does not offer: the pair menu is unchanged."
    status = f"Replaying a recording{': ' + markdown_literal(rec.title) if rec.title else ''}. No model was run. The controls are set to its settings.{where}"
    value = lambda key, default: s.get(key) if s.get(key) is not None else default  # noqa: E731
    return (
        gr.update(value=preset) if preset else gr.skip(),
        gr.update(value=prompt[:PROMPT_CHARS_MAX]),
        gr.update(value=bool(rec.chat)) if rec.chat is not None else gr.skip(),
        gr.update(value=value("gamma", DEFAULTS["gamma"])),
        gr.update(value=sampling.get("temperature", DEFAULTS["temperature"])),
        gr.update(value=sampling.get("top_k", DEFAULTS["top_k"])),
        gr.update(value=sampling.get("top_p", DEFAULTS["top_p"])),
        gr.update(value=value("max_new_tokens", DEFAULTS["max_new_tokens"])),
        gr.update(value=value("seed", DEFAULTS["seed"])),
        status,
        gr.update(value=drafter.get("kind")) if drafter.get("kind") in DRAFTER_KINDS else gr.skip(),
        gr.update(value=schedule.get("name")) if schedule.get("name") in SCHEDULES else gr.skip(),
        gr.update(value=sampling.get("repetition_penalty", 1.0)),
    )


LAB_RUNS_MAX = 5000


def run_lab(kind, fault, temperature, top_k, top_p, gamma, runs):
    """The exactness lab: stream seeded speculative samples of tiny models against the exact law,
    with one teaching fault planted (or none); yields (figure, verdict HTML) every 250 samples."""
    if kind not in LAB_KINDS or fault not in FAULTS:
        raise _mistake("Pick a drafter and a fault from the menus.", title="Unknown lab setting")
    for value, lo, hi, name in ((gamma, 1, 8, "gamma"), (top_k, 0, 8, "top-k"), (runs, 100, LAB_RUNS_MAX, "samples")):
        if not _number(value) or value != int(value) or not lo <= value <= hi:
            raise _mistake(f"{name} must be a whole number from {lo} to {hi}, got {_shown(value)}.", title=f"Bad {name}")
    try:
        sampling = Sampling(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p))
    except (TypeError, ValueError) as err:
        raise _mistake(str(err), title="Bad sampling settings") from err
    drafter, target = lab_models(kind)
    results = lab_stream(drafter, target, sampling, int(gamma), int(runs))
    while True:
        # The fault is planted for one chunk at a time, on this thread only (see lab.faults.planted).
        with planted(fault) as planted_fault:
            result = next(results, None)
        if result is None:
            return
        yield lab_figure(result), lab_html(result, planted_fault)


def export_recording(rec: Recording | None) -> str:
    """Write the shown run as one self-contained HTML file (specviz.views.export) and return its path."""
    if rec is None or not rec.speculative.rounds:
        raise _mistake("Run or load something first: there is nothing to export yet.", title="Nothing to export")
    path = _DOWNLOADS / f"specviz-run-{time.strftime('%Y%m%d-%H%M%S')}-{next(_race_nonce)}.html"
    path.write_text(export_html(rec), encoding="utf-8")
    return str(path)


def load_example(name):
    """Load one of the recordings shipped in assets/recordings."""
    path = RECORDINGS / f"{name}.json"
    if not name or not path.is_file():
        raise _mistake(f"No prepared recording named {name!r}.", title="Unknown recording")
    return load_recording(str(path))


def _examples() -> list[str]:
    return sorted(p.stem for p in RECORDINGS.glob("*.json"))


def _pair_info(name: str | None) -> str:
    preset = PRESETS.get(name or EMBEDDED)
    return f"<small>{preset.summary}</small>" if preset else ""


def _caps(max_queue: int) -> str:
    return (
        f"<small>Limits here: prompt up to {PROMPT_CHARS_MAX} characters · gamma {GAMMA_RANGE[0]}–{GAMMA_RANGE[1]} · "
        f"up to {MAX_NEW_TOKENS_RANGE[1]} new tokens · {RUN_SECONDS_MAX:.0f} s per run (and as long again for the baseline) · "
        f"{SWEEP_SECONDS_MAX:.0f} s per sweep · {CONCURRENCY} run at a time, up to {max_queue} waiting.</small>"
    )


def build_demo(preload: bool = True, max_queue: int | None = None) -> gr.Blocks:
    """The Blocks app.

    Args:
        preload: load the embedded pair now so the first Generate is quick.
        max_queue: waiting requests beyond which new ones are refused with Gradio's
            queue-full message (default: env ``SPECVIZ_MAX_QUEUE``, else 32).
    """
    max_queue = max_queue if max_queue is not None else int(os.environ.get("SPECVIZ_MAX_QUEUE", "32"))
    if preload:
        # SPECVIZ_PRELOAD's pairs (default: embedded) load before launch; on ZeroGPU they must.
        for name, result in preload_pairs().items():
            if isinstance(result, PairError):
                print(f"specviz: could not preload {name}: {result}")  # the app still serves the others
            elif result.device.type == "cpu":
                # One short run pays the first-call costs before any visitor does.
                autoregressive_generate([result.eos_token_id or 0], result.target, max_new_tokens=2)
    latex = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}]
    with gr.Blocks(title="specviz: speculative decoding, round by round", delete_cache=(CACHE_TTL_S, CACHE_TTL_S)) as demo:
        recording = gr.State(None, time_to_live=SESSION_TTL_S)
        gr.Markdown(INTRO)
        with gr.Row():
            with gr.Column(scale=2, min_width=320):
                pair_name = gr.Dropdown(list(PRESETS), value=EMBEDDED, label="Model pair (drafter -> target)",
                                        info="Hub pairs are downloaded on first use; one pair stays loaded at a time.", elem_id="sv-pair")
                pair_info = gr.Markdown(_pair_info(EMBEDDED), elem_id="sv-pair-info")
                chat = gr.Checkbox(value=True, label="Apply the chat template (instruct pairs only)")
                with gr.Row(visible=custom_models_allowed()):
                    custom_drafter = gr.Textbox("", label="Custom drafter (hub id[@revision])", placeholder="owner/name", max_length=200)
                    custom_target = gr.Textbox("", label="Custom target (hub id[@revision])", placeholder="owner/name", max_length=200)
                prompt = gr.Textbox(value=EXAMPLES[0], label="Prompt", lines=5, max_length=PROMPT_CHARS_MAX)
                gr.Examples(EXAMPLES, inputs=prompt, label="Example prompts (Python: the embedded pair was trained on the standard library)")
                drafter_kind = gr.Radio(DRAFTER_CHOICES, value=DEFAULTS["drafter_kind"], label="drafter", elem_id="sv-drafter-kind",
                                        info="the pair's drafter model; prompt lookup (copies from earlier text); the target's own early layers")
                gamma = CheckedSlider(*GAMMA_RANGE, value=DEFAULTS["gamma"], step=1, label="gamma (drafted tokens per round)")
                gamma_schedule = gr.Dropdown(SCHEDULE_CHOICES, value=DEFAULTS["gamma_schedule"], label="gamma schedule",
                                             info="constant, or gamma set each round (the first round uses the slider's gamma)",
                                             elem_id="sv-schedule")
                temperature = CheckedSlider(*TEMPERATURE_RANGE, value=DEFAULTS["temperature"], step=0.05, label="temperature (0 = greedy)")
                with gr.Row():
                    top_k = CheckedNumber(value=DEFAULTS["top_k"], minimum=0, maximum=TOP_K_MAX, precision=0, label="top-k (0 = off)")
                    top_p = CheckedSlider(0.05, 1.0, value=DEFAULTS["top_p"], step=0.05, label="top-p (1 = off)")
                repetition_penalty = CheckedSlider(*PENALTY_RANGE, value=DEFAULTS["repetition_penalty"], step=0.05,
                                                   label="repetition penalty (1 = off)", elem_id="sv-penalty",
                                                   info="transformers' repetition penalty, applied to q and p alike at every position")
                with gr.Row():
                    max_new_tokens = CheckedSlider(*MAX_NEW_TOKENS_RANGE, value=DEFAULTS["max_new_tokens"], step=1, label="max new tokens")
                    seed = CheckedNumber(value=DEFAULTS["seed"], minimum=0, maximum=SEED_MAX, precision=0, label="seed")
                with gr.Row():
                    run = gr.Button("Generate", variant="primary", scale=3)
                    stop = gr.Button("Stop", variant="stop", scale=1, elem_id="sv-stop")
                gr.Markdown(_caps(max_queue), elem_id="sv-caps")
            with gr.Column(scale=3, min_width=400):
                gr.HTML(legend_html())
                tokens = gr.HTML(label="Output", elem_id="sv-output")
                status = gr.Markdown(elem_id="sv-status")
                stats = gr.HTML(elem_id="sv-stats")
        with gr.Tabs(overflow_behavior="wrap"):  # on a phone every tab stays in view, on two rows
            with gr.Tab("Charts", id="charts"):
                with gr.Row():
                    acceptance_plot = gr.Plot(label="Drafts per round", show_label=False, elem_id="sv-acceptance")
                    timeline_plot = gr.Plot(label="Tokens over time", show_label=False, elem_id="sv-timeline")
            with gr.Tab("Replay", id="replay"):
                gr.Markdown("Step through the rounds: the drafts with q(x) and p(x), the uniform u against min(1, p/q), and where the correction or bonus token came from.")
                with gr.Row(equal_height=True):
                    prev_round = gr.Button("◀ Previous round", size="sm", elem_id="sv-prev", scale=1)
                    replay_slider = gr.Slider(1, 2, value=1, interactive=False, step=1, label="round", elem_id="sv-round", scale=6)
                    next_round = gr.Button("Next round ▶", size="sm", elem_id="sv-next", scale=1)
                replay = gr.HTML(round_html(Trace(mode="speculative", prompt_ids=[]), 0), elem_id="sv-replay")
            with gr.Tab("Theory", id="theory"):
                gr.Markdown(THEORY_NOTE, latex_delimiters=[{"left": "$", "right": "$", "display": False}])
                speedup_plot = gr.Plot(show_label=False, elem_id="sv-speedup")
                with gr.Row():
                    histogram_plot = gr.Plot(show_label=False, elem_id="sv-histogram")
                    position_plot = gr.Plot(show_label=False, elem_id="sv-position")
                with gr.Row(equal_height=True):
                    sweep_button = gr.Button(f"Run gamma sweep ({SWEEP_GAMMAS[0]}..{SWEEP_GAMMAS[-1]})", elem_id="sv-sweep-button", scale=1)
                    sweep_status = gr.Markdown("Same prompt, seed and sampling settings; one baseline, then one run per gamma.", elem_id="sv-sweep-status")
                sweep_plot = gr.Plot(sweep_figure(None), show_label=False, elem_id="sv-sweep")
            with gr.Tab("Race", id="race"):
                with gr.Row(equal_height=True):
                    pace = gr.Radio(list(PACES), value=PACES[0], label="pace", scale=3)
                    race_button = gr.Button("Start race", elem_id="sv-race-button", scale=1)
                race = gr.HTML(elem_id="sv-race")
            with gr.Tab("Save / load", id="files"):
                gr.Markdown(
                    "Save a run as JSON and replay it later with no model: prepare runs on a GPU, show them on a laptop offline. "
                    f"Files are checked against the trace schema; at most {MAX_BYTES // (1024 * 1024)} MB."
                )
                with gr.Row():
                    download = gr.DownloadButton("Download this run (JSON)", interactive=False, elem_id="sv-download")
                    upload = gr.File(label="Load a recording (.json)", file_types=[".json"], type="filepath", elem_id="sv-upload")
                with gr.Row(equal_height=True):
                    example = gr.Dropdown(_examples(), value=(_examples() or [None])[0], label="Prepared recordings (embedded pair)", scale=3)
                    example_button = gr.Button("Load prepared recording", elem_id="sv-example-button", scale=1)
                with gr.Row(equal_height=True):
                    export_button = gr.Button("Export this run as one HTML file", elem_id="sv-export-button", scale=1)
                    export_file = gr.File(label="A page that replays the run from disk: no server, no network (about 5 MB)",
                                          interactive=False, elem_id="sv-export", scale=3)
            with gr.Tab("Compare drafters", id="compare"):
                gr.Markdown("One prompt, seed and sampling (the controls on the left), decoded with each drafter kind: which tokens "
                            "each one gets right, its tokens per round, alpha, cost and speedup. Each runs in turns with its own "
                            "baseline; the output text is the same for all three when sampling is greedy.")
                compare_button = gr.Button("Compare drafters", variant="primary", elem_id="sv-compare-button")
                compare_view = gr.HTML(compare_html(None), elem_id="sv-compare")
                compare_plot = gr.Plot(compare_figure(None), show_label=False, elem_id="sv-compare-plot")
            with gr.Tab("Batch", id="batch"):
                gr.Markdown(BATCH_NOTE)
                batch_prompts = gr.Textbox(join_prompts(EXAMPLES), label="Batch prompts (one per line; \\n inside a line is a newline)",
                                           lines=6, max_length=BATCH_MAX * PROMPT_CHARS_MAX, elem_id="sv-batch-prompts")
                with gr.Row(equal_height=True):
                    batch_size = CheckedSlider(1, BATCH_MAX, value=4, step=1, label="batch size (rows; beyond the prompts they repeat)",
                                               scale=3)
                    batch_button = gr.Button("Run batch", variant="primary", elem_id="sv-batch-button", scale=1)
                batch_status = gr.Markdown(elem_id="sv-batch-status")
                batch_view = gr.HTML(batch_lanes_html(None), elem_id="sv-batch")
                batch_plot = gr.Plot(batch_figure(None), show_label=False, elem_id="sv-batch-plot")
            with gr.Tab("Exactness lab", id="lab"):
                gr.Markdown("Why is the output exactly the target's? Watch it: tiny models with a vocabulary of 8, the exact "
                            "law of the first two tokens enumerated from the target, and thousands of seeded speculative samples "
                            "counted as they come, with a chi-square test. Plant a fault seen in public code and watch it fail.")
                with gr.Row():
                    lab_kind = gr.Dropdown(list(LAB_KINDS), value="different", label="drafter")
                    lab_fault = gr.Dropdown([(f.name, k) for k, f in FAULTS.items()], value="none", label="planted fault")
                with gr.Row():
                    lab_temperature = CheckedSlider(0.1, 2.0, value=1.0, step=0.1, label="temperature")
                    lab_top_k = CheckedSlider(0, 8, value=5, step=1, label="top-k (0 = off)")
                    lab_top_p = CheckedSlider(0.1, 1.0, value=1.0, step=0.05, label="top-p")
                    lab_gamma = CheckedSlider(1, 8, value=3, step=1, label="gamma")
                    lab_runs = CheckedSlider(500, LAB_RUNS_MAX, value=2000, step=500, label="samples")
                lab_button = gr.Button("Run the experiment", variant="primary", elem_id="sv-lab-run")
                lab_verdict = gr.HTML(elem_id="sv-lab-verdict")
                lab_plot = gr.Plot(lab_figure(None), show_label=False, elem_id="sv-lab-plot")
            with gr.Tab("Explanation", id="explain"):
                gr.Markdown(explanation_markdown(), latex_delimiters=latex, elem_id="sv-explain")

        # Views of a recording are cheap: they do not wait behind a generation.
        view = dict(concurrency_limit=None, show_progress="hidden")
        outputs = [tokens, stats, acceptance_plot, timeline_plot, status, recording, replay_slider, replay,
                   speedup_plot, histogram_plot, position_plot, sweep_plot, race, download]
        run_event = run.click(
            generate,
            inputs=[pair_name, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat, custom_drafter, custom_target,
                    drafter_kind, gamma_schedule, repetition_penalty],
            outputs=outputs,
            api_name="generate",
            concurrency_limit=CONCURRENCY,
            concurrency_id="device",
        )
        prev_round.click(replay_previous, [recording, replay_slider], [replay_slider, replay], api_visibility="private", **view)
        next_round.click(replay_next, [recording, replay_slider], [replay_slider, replay], api_visibility="private", **view)
        replay_slider.release(replay_show, [recording, replay_slider], replay, api_visibility="private", **view)
        replay_slider.input(replay_show, [recording, replay_slider], replay, api_visibility="private", **view)
        sweep_event = sweep_button.click(
            run_sweep, [pair_name, prompt, temperature, top_k, top_p, max_new_tokens, seed, recording, chat, custom_drafter, custom_target,
                        repetition_penalty],
            [sweep_plot, sweep_status, recording], api_name="sweep", concurrency_limit=CONCURRENCY, concurrency_id="device",
        )
        # Stop cancels the run or sweep between rounds; what was generated stays on the page.
        stop.click(stopped, recording, outputs, cancels=[run_event, sweep_event], api_name="stop", **view)
        lab_button.click(run_lab, [lab_kind, lab_fault, lab_temperature, lab_top_k, lab_top_p, lab_gamma, lab_runs], [lab_plot, lab_verdict],
                         api_name="lab", concurrency_limit=1, concurrency_id="lab", show_progress="hidden")
        gr.api(run_api, api_name="run", concurrency_limit=CONCURRENCY, concurrency_id="device")
        compare_button.click(run_compare, [pair_name, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat, custom_drafter,
                                           custom_target, gamma_schedule, repetition_penalty], [compare_view, compare_plot],
                             api_name="compare", concurrency_limit=CONCURRENCY, concurrency_id="device")
        batch_button.click(run_batch, [pair_name, batch_prompts, batch_size, gamma, temperature, top_k, top_p, max_new_tokens, seed, chat,
                                       custom_drafter, custom_target, drafter_kind, gamma_schedule, repetition_penalty],
                           [batch_view, batch_plot, batch_status],
                           api_name="batch", concurrency_limit=CONCURRENCY, concurrency_id="device")
        pair_name.change(_pair_info, pair_name, pair_info, api_visibility="private", **view)
        race_button.click(start_race, [recording, pace], race, api_visibility="private", **view)
        # Loading runs in the queue with its own limit, so uploads cannot starve generation.
        loads = dict(show_progress="hidden", concurrency_limit=LOAD_CONCURRENCY, concurrency_id="load")
        restore = dict(fn=restore_controls, inputs=recording, api_visibility="private", show_progress="hidden",
                       outputs=[pair_name, prompt, chat, gamma, temperature, top_k, top_p, max_new_tokens, seed, status,
                                drafter_kind, gamma_schedule, repetition_penalty])
        loaded = upload.upload(load_recording, upload, outputs, api_name="load_recording", **loads)
        loaded.success(**restore)
        # The drop area is emptied after every load, good or refused, so the next file can go in.
        clear = dict(fn=lambda: None, inputs=None, outputs=upload, api_visibility="private", show_progress="hidden")
        loaded.success(**clear)
        loaded.failure(**clear)
        example_button.click(load_example, example, outputs, api_name="load_prepared", **loads).success(**restore)
        export_button.click(export_recording, recording, export_file, api_visibility="private", **loads)
    demo.queue(max_size=max_queue, default_concurrency_limit=1)
    return demo


# Content-Security-Policy on every response: the page may load and connect only to its own
# origin (and data: or blob: URLs), so markup that slipped into a page could not fetch an outside
# image, script or font, nor send data anywhere. Gradio's front end needs inline scripts and
# styles and plotly.js needs eval, so those stay allowed; frames may embed the app (a Space does).
CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self' ws: wss:; media-src 'self' blob: data:; "
       "object-src 'none'; base-uri 'self'; form-action 'self'")


# Touch screens have no hover: a tapped token (focusable) shows its details below it.
CSS = """
.sv-tokens [data-tip] { position: relative; cursor: pointer; }
.sv-tokens [data-tip]:focus { outline: 2px solid #333; }
.sv-tokens [data-tip]:focus::after {
  content: attr(data-tip); position: absolute; left: 0; top: 1.7em; z-index: 20; white-space: pre;
  background: #111; color: #fff; font-size: 12px; line-height: 1.4; padding: 6px 8px; border-radius: 4px;
}
"""


class _ContentSecurityPolicy:
    """ASGI middleware adding the CSP header to every HTTP response."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_csp(message):
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [(b"content-security-policy", CSP.encode())]
            await send(message)

        return await self.app(scope, receive, with_csp)


def launch_kwargs(port: int | None = None) -> dict:
    """Arguments for ``demo.launch``: local only, no share link, the app's theme, a Content-Security-Policy."""
    from starlette.middleware import Middleware

    return dict(
        app_kwargs={"middleware": [Middleware(_ContentSecurityPolicy)]},
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=port or int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        theme=gr.themes.Soft(),
        css=CSS,
        show_error=False,
        max_file_size=MAX_BYTES,  # uploads are recordings; Gradio refuses larger files itself
        # Gradio keeps each session's state (its Recording: about 1.2 MB of objects for the largest
        # recording the engine writes) and its last outputs (the rendered HTML) until the session
        # expires (SESSION_TTL_S); past this many sessions the oldest are dropped, so memory is
        # bounded by design (measured: about 5 MB of RSS per session holding a 0.8 MB recording).
        state_session_capacity=int(os.environ.get("SPECVIZ_MAX_SESSIONS", str(MAX_SESSIONS))),
    )
