"""The server's caps: every cap a control shows, enforced again where a request enters, and the server-wide bounds
(queues, wall-clock limits, sessions, uploads, the log's budget).

Read by the checks, the handlers and the layout; environment variables override the server-wide ones. The page's
starting values and words are ``specviz.ui.page.defaults``.
"""

from __future__ import annotations

import os

from specviz.engine.sampling import MIN_TEMPERATURE
from specviz.engine.seeds import SEED_MAX  # noqa: F401  (re-exported: the page checks seeds against it)
from specviz.limits import GAMMA_RANGE, PENALTY_RANGE, TEMPERATURE_RANGE, TOP_K_MAX  # noqa: F401  (one set for every entry point)
from specviz.trace import MAX_GAMMA  # noqa: F401


def whole_number(name: str, default: int, minimum: int) -> int:
    """A whole-number server setting from the environment variable ``name`` (``default`` when unset).

    Raises:
        ValueError: a value that is not a whole number of at least ``minimum`` (the message names the variable).
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ValueError(f"{name} must be a whole number of at least {minimum} (default {default}); got {raw[:40]!r}")
    return value


# Caps shown in the UI and enforced again in the handler (a client can bypass sliders).
MAX_NEW_TOKENS_RANGE = (1, 256)
QUICK_TOKENS = 32  # the Quick button's max new tokens: a lecture's run that finishes while the class watches
# recordings loaded at once: a load of the largest is seconds of pure Python holding the GIL (measured: 2 at once took
# an 8-token generate from 2 s to 25 s)
LOAD_CONCURRENCY = 1
TEMPERATURE_MIN = MIN_TEMPERATURE  # one constant with the engine's (specviz.engine.sampling)
PROMPT_CHARS_MAX = 2000  # a cheap bound checked before tokenizing
# The prompt's real limit, in the pair's tokens (chat template included): a prefill's cost grows with tokens,
# not characters (500 emoji are 1,530 SmolLM2 tokens, 2,000 on the embedded pair's byte-level tokenizer).
PROMPT_TOKENS_MAX = int(os.environ.get("SPECVIZ_PROMPT_TOKENS", "512"))
SWEEP_GAMMAS = tuple(range(1, 9))
BATCH_MAX = 8  # rows the Batch tab decodes together at most
LAB_RUNS_MAX = 5000  # samples one lab run draws at most
LAB_CHUNK = 50  # samples between the lab's cancellation points
LAB_DRAW_EVERY = 250  # samples between redraws of the lab's chart
LAB_SECONDS_MAX = float(os.environ.get("SPECVIZ_LAB_SECONDS", "120"))  # one lab run's wall-clock cap
# Wall-clock caps of the other long jobs, checked between their steps.
COMPARE_SECONDS_MAX = float(os.environ.get("SPECVIZ_COMPARE_SECONDS", "180"))
BATCH_SECONDS_MAX = float(os.environ.get("SPECVIZ_BATCH_SECONDS", "180"))
# Jobs waiting in the queue, per kind of work (Gradio's concurrency id), beyond which a new one is
# refused; the main Generate ("device") keeps the rest of the queue (SPECVIZ_MAX_QUEUE, default 96).
QUEUE_MAX = {"lab": 4, "long": 4, "load": 4, "export": 2}
EXPORT_CONCURRENCY = 1  # HTML exports written at once
LONG_CONCURRENCY = 1  # sweeps, comparisons and batches at once (beside the Generate runs)
BODY_MAX_BYTES = int(os.environ.get("SPECVIZ_BODY_MAX_KB", "256")) * 1024  # a request body, except file uploads
# Wall-clock limits, in seconds, so one visitor cannot hold the device for long.
RUN_SECONDS_MAX = float(os.environ.get("SPECVIZ_RUN_SECONDS", "60"))
SWEEP_SECONDS_MAX = float(os.environ.get("SPECVIZ_SWEEP_SECONDS", "120"))
# The auto tree's calibration (once per pair, device, drafter and sampling setting; then cached) runs in the
# visitor's job before its runs, whose own limits start after it. Teacher-forced (drafter models): 4.2 s greedy and
# 3.6 s at T 0.7 on the English pair on a quiet 2-core CPU with AVX-512 BF16, 276 s with that CPU shared at load 7-9;
# from runs (other drafters) 77.5 s quiet and 145 s busy.
CALIBRATION_SECONDS_MAX = float(os.environ.get("SPECVIZ_CALIBRATION_SECONDS", "240"))


def _runs_at_once() -> int:
    """Generate runs (and /run calls) under way at once, ``SPECVIZ_CONCURRENCY`` (default: 2 on a CPU, 1 with a GPU).

    Their steps take turns on the one device thread either way, short runs' first, then the least-served address's
    (``specviz.serving.device_thread``), and beside a running job another starts only if it is short and of another
    address (``specviz.ui.guard.admission.dispatching``). With one slot a short run that came just after another
    visitor's Generate of a pair not loaded yet waited for that visitor's load and run: a 16-token Generate of the
    embedded pair took 3.2-4.2x its time alone; with two, 1.06-1.61x, and the visitor who switched waited for their own
    load (2-core CPU with AVX-512 BF16, ``python -m specviz.visitors.pair_switch``); 0.97-1.41x once short runs' steps
    went first. With a GPU, one: a model's captured graphs and static cache serve one run at a time, and a second run
    beside it would pass eagerly (``specviz.engine.graphs``)."""
    from specviz.pair.memory import default_device

    return whole_number("SPECVIZ_CONCURRENCY", 1 if default_device().type == "cuda" else 2, 1)


CONCURRENCY = _runs_at_once()
PACES = ("about 10 s (slow motion, or sped up for a run over 10 s)", "true timing")
# Redraw the streamed run at most this often (ms), four times a second: each update renders the text, the stats and
# the round on the decoding path and is serialised to the browser. Every 80 ms, a default Generate on a 2-core CPU
# spent a third of its wall time on updates (70 of them) instead of decoding.
STREAM_INTERVAL_MS = 250
# How long the Stop button waits for a run to reach the end of its round and stop itself.
STOP_WAIT_S = 30.0
# A visitor's state (one compact Recording) and Gradio's cached copies of downloads and uploads
# are dropped this long after last use, so memory and disk stay flat however many come; a session
# unused this long is forgotten whole (specviz.ui.guard.sessions). SPECVIZ_SESSION_TTL_S, seconds.
SESSION_TTL_S = whole_number("SPECVIZ_SESSION_TTL_S", 1800, 10)
# Sessions kept at once (SPECVIZ_MAX_SESSIONS), whatever they hold: memory bounds them first (specviz.ui.guard.sessions:
# SPECVIZ_SESSION_MEMORY_MB, each session priced by what it shows); 2,000 that show nothing take about 40 MB.
MAX_SESSIONS = 2000
# Gradio's cache sweep: uploads and cached files older than this go, checked as often
CACHE_TTL_S = whole_number("SPECVIZ_CACHE_TTL_S", 300, 10)
# Uploads (recordings to replay) per client address and in all within CACHE_TTL_S, after which the sweep removes them.
# Log lines a malformed upload (a body Gradio's multipart parser cannot read) may cost: per client address
# and from everyone within LOG_WINDOW_S; past either budget the refusal (HTTP 400) is not logged.
LOG_CLIENT_MAX_LINES = 5
LOG_TOTAL_MAX_LINES = 100
LOG_WINDOW_S = 600
UPLOAD_CLIENT_MAX_BYTES = int(float(os.environ.get("SPECVIZ_UPLOAD_CLIENT_MB", "48")) * 1024 * 1024)
UPLOAD_TOTAL_MAX_BYTES = int(float(os.environ.get("SPECVIZ_UPLOAD_TOTAL_MB", "512")) * 1024 * 1024)
